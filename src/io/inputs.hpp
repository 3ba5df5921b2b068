// A user's own inputs (trained gains, real activations) as a case (`qkmla golden --inputs`): the
// conventions §2 tensors from a safetensors file, the config from the file's metadata, from shapes
// and dtypes where they are unambiguous, and from the flags given (which win, and must agree with
// the shapes). Values the chosen profile cannot store are refused with tensor and index, or rounded
// once (round-to-nearest-even) when asked, and the case records it.
#pragma once
#include <map>
#include <string>

#include "core/case.hpp"
#include "io/safetensors.hpp"

namespace qkmla {

struct InputsRequest {
  std::string path;
  // Config keys given on the command line (a JSON object of conventions §9 keys): applied last.
  std::string overrides_json = "{}";
  bool round_inputs = false;
};

struct InputsCase {
  Case k;
  std::map<std::string, std::string>
      metadata;  // qkmla.inputs: where the config came from, rounding
};

// InputError naming the file, the tensor (or config key) and the problem.
InputsCase case_from_inputs(const InputsRequest& r);
// The same on a file already read (r.path names it in messages): the fuzz target's entry.
InputsCase case_from_file(SafetensorsFile f, const InputsRequest& r);

// The config a set of input tensors implies (dims, batch, S_q, seqlens, norm, profile); the
// remaining keys keep their defaults. InputError names the tensor whose shape is inconsistent.
MlaConfig infer_config(const std::map<std::string, Tensor>& t, const std::string& path);

}  // namespace qkmla
