#include "io/case_io.hpp"

#include "io/safetensors.hpp"

namespace qkmla {

CaseFile read_case(const std::string& path) {
  SafetensorsFile f = read_safetensors(path);
  if (f.metadata["qkmla.format"] != "1")
    throw InputError(path, "__metadata__.qkmla.format",
                     "must be \"1\" (got \"" + f.metadata["qkmla.format"] + "\")");
  if (!f.metadata.count("qkmla.config"))
    throw InputError(path, "__metadata__.qkmla.config", "missing");
  CaseFile out;
  out.metadata = f.metadata;
  try {
    out.k.cfg = config_from_json(f.metadata["qkmla.config"]);
  } catch (const ConfigError& e) {
    throw InputError(path, "qkmla.config." + e.field, e.problem);
  }
  for (auto& [name, t] : f.tensors) {
    if (name.rfind("ref.", 0) == 0)
      out.refs[name] = std::move(t);
    else
      out.k.tensors[name] = std::move(t);
  }
  complete_nope(out.k);
  try {
    validate_case(out.k);
  } catch (const ConfigError& e) {
    throw InputError(path, e.field, e.problem);
  }
  attach_latent(out.k);
  return out;
}

void write_case(const std::string& path, const Case& k, const std::map<std::string, Tensor>& refs,
                const std::map<std::string, std::string>& extra_metadata) {
  SafetensorsFile f;
  f.metadata = extra_metadata;
  f.metadata["qkmla.format"] = "1";
  f.metadata["qkmla.config"] = config_to_json(k.cfg);
  f.tensors = k.tensors;
  for (const auto& [name, t] : refs) f.tensors[name] = t;
  write_safetensors(path, f);
}

}  // namespace qkmla
