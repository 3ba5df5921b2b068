// Cases as safetensors files: inputs, the config in __metadata__, optional ref.* tensors.
#pragma once
#include <map>
#include <string>

#include "core/case.hpp"

namespace qkmla {

struct CaseFile {
  Case k;
  std::map<std::string, Tensor> refs;           // "ref.out" -> ..., as stored
  std::map<std::string, std::string> metadata;  // every __metadata__ entry
};

CaseFile read_case(const std::string& path);  // InputError naming file and tensor
void write_case(const std::string& path, const Case& k, const std::map<std::string, Tensor>& refs,
                const std::map<std::string, std::string>& extra_metadata = {});

}  // namespace qkmla
