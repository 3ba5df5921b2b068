// safetensors files (conventions §9): 8-byte little-endian header length, JSON header, raw data.
#pragma once
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/tensor.hpp"

namespace qkmla {

// Bad input: names the file, the tensor (or header field) and the problem. Exit code 2.
struct InputError : std::runtime_error {
  InputError(const std::string& file, const std::string& what, const std::string& problem)
      : std::runtime_error(file + ": " + what + ": " + problem),
        file(file),
        field(what),
        problem(problem) {}
  std::string file, field, problem;  // the parts, so a caller can rename the file it reports
};

struct SafetensorsFile {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;
};

constexpr uint64_t kMaxHeaderBytes = 100u << 20;

SafetensorsFile read_safetensors(const std::string& path);
// The same on bytes already in memory; `name` is what messages call the file.
SafetensorsFile parse_safetensors(const std::vector<unsigned char>& bytes, const std::string& name);
void write_safetensors(const std::string& path, const SafetensorsFile& f);

}  // namespace qkmla
