// libFuzzer target: the safetensors and .npy readers and the config parser on arbitrary bytes.
// Bad input must end in qkmla::InputError / ConfigError (exit 2 in the CLI), never a crash.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/config.hpp"
#include "io/outputs_io.hpp"
#include "io/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<unsigned char> bytes(data, data + size);
  try {
    const qkmla::SafetensorsFile f = qkmla::parse_safetensors(bytes, "fuzz.safetensors");
    if (auto it = f.metadata.find("qkmla.config"); it != f.metadata.end()) {
      try {
        qkmla::config_from_json(it->second);
      } catch (const qkmla::ConfigError&) {
      }
    }
  } catch (const qkmla::InputError&) {
  }
  try {
    qkmla::parse_npy(bytes, "fuzz.npy");
  } catch (const qkmla::InputError&) {
  }
  return 0;
}
