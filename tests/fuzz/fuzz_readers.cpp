// libFuzzer target for the file readers: the safetensors and .npy readers, the config in a case's
// metadata, and a user's own inputs (`golden --inputs`: config inferred from shapes, values checked
// against the profile, the case validated). Bad input must end in qkmla::InputError / ConfigError
// (exit 2 in the CLI, naming file, tensor and problem), never a crash, a leak or undefined
// behaviour.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/config.hpp"
#include "io/inputs.hpp"
#include "io/outputs_io.hpp"
#include "io/safetensors.hpp"

namespace {

void case_inputs(qkmla::SafetensorsFile f, bool round_inputs) {
  qkmla::InputsRequest r;
  r.path = "fuzz.safetensors";
  r.round_inputs = round_inputs;
  int64_t values = 0;  // a real run could hold the case; the fuzzer's 2 GB limit could not
  for (const auto& [name, t] : f.tensors) values += t.numel();
  if (values < (1 << 20)) qkmla::case_from_file(std::move(f), r);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<unsigned char> bytes(data, data + size);
  try {
    qkmla::SafetensorsFile f = qkmla::parse_safetensors(bytes, "fuzz.safetensors");
    if (auto it = f.metadata.find("qkmla.config"); it != f.metadata.end()) {
      try {
        qkmla::config_from_json(it->second);
      } catch (const qkmla::ConfigError&) {
      }
    }
    case_inputs(std::move(f), size % 2 == 1);
  } catch (const qkmla::InputError&) {
  }
  try {
    qkmla::parse_npy(bytes, "fuzz.npy");
  } catch (const qkmla::InputError&) {
  }
  return 0;
}
