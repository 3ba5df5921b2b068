// A third party's outputs: one safetensors file, or a folder of .npy files named after the
// tensors (out.npy, lse.npy, latent_out.npy, ...).
#pragma once
#include <map>
#include <string>
#include <vector>

#include "core/tensor.hpp"

namespace qkmla {

std::map<std::string, Tensor> read_outputs(const std::string& path);  // InputError on bad input
// One .npy file (little-endian f8, f4, f2, i4; C order). InputError names the file and problem.
Tensor read_npy(const std::string& path);
Tensor parse_npy(const std::vector<unsigned char>& bytes, const std::string& name);

}  // namespace qkmla
