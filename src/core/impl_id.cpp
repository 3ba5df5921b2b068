#include "core/impl_id.hpp"

#include <vector>

namespace qkmla {

namespace {

bool parse_form(const std::string& s, Form& f) {
  for (Form x : {Form::Explicit, Form::Absorbed, Form::Kernel})
    if (s == form_name(x)) {
      f = x;
      return true;
    }
  return false;
}

bool parse_profile_token(const std::string& s, Profile& p) {
  for (Profile x : {Profile::FP64, Profile::FP32, Profile::BF16, Profile::FP16, Profile::FP8,
                    Profile::FP8_B128})
    if (s == to_string(x)) {
      p = x;
      return true;
    }
  return false;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out(1);
  for (char c : s) {
    if (c == '.')
      out.emplace_back();
    else
      out.back() += c;
  }
  return out;
}

// ".<token>" (appended, not "." + s: GCC 12 warns falsely about that form, -Wrestrict).
std::string dotted(const std::string& token) {
  std::string s(1, '.');
  s += token;
  return s;
}
std::string suffix(const std::optional<Profile>& p) { return p ? dotted(to_string(*p)) : ""; }
std::string suffix(Variant v) { return v == Variant::Default ? "" : dotted(variant_name(v)); }

}  // namespace

std::string to_string(const ImplId& id) {
  switch (id.family) {
    case Family::Ref:
      return "ref." + form_name(id.form) + suffix(id.variant);
    case Family::Cpu:
      return "cpu." + form_name(id.form) + suffix(id.profile) + suffix(id.variant);
    case Family::GpuModel:
      return std::string("gpu.model") + (id.form == Form::Explicit ? ".explicit" : "") +
             suffix(id.profile);
    case Family::Gpu:
      return "gpu." + form_name(id.form) + suffix(id.profile);
    case Family::Mutant:
      return "mutant." + id.name + suffix(id.profile);
    case Family::Audit:
      return "audit." + id.name;
    case Family::Quant:
      return "quant" + suffix(id.profile);
  }
  return "?";
}

std::string brief(const ImplId& id) {
  if (id.family == Family::Cpu) return form_name(id.form) + suffix(id.variant);
  return to_string(id.without_profile());
}

ImplId parse_impl_id(const std::string& text) {
  const std::vector<std::string> t = split(text);
  auto bad = [&](const std::string& why) { return ConfigError("impl", "'" + text + "': " + why); };
  ImplId id;
  size_t k = 1;
  // Optional trailing tokens in a fixed order; each parser consumes one token if it matches.
  auto take_profile = [&] {
    Profile p;
    if (k < t.size() && parse_profile_token(t[k], p)) id.profile = p, ++k;
  };
  auto take_variant = [&] {
    Variant v;
    if (k < t.size() && parse_variant(t[k], v)) id.variant = v, ++k;
  };
  const std::string& fam = t[0];
  if (fam == "ref" || fam == "cpu") {
    id.family = fam == "ref" ? Family::Ref : Family::Cpu;
    if (t.size() < 2 || !parse_form(t[1], id.form))
      throw bad("expected " + fam + ".explicit, " + fam + ".absorbed or " + fam + ".kernel");
    k = 2;
    if (id.family == Family::Cpu) take_profile();
    take_variant();
  } else if (fam == "gpu") {
    if (t.size() >= 2 && t[1] == "model") {
      id.family = Family::GpuModel;
      k = 2;
      if (k < t.size() && t[k] == "explicit") id.form = Form::Explicit, ++k;
    } else {
      id.family = Family::Gpu;
      if (t.size() < 2 || !parse_form(t[1], id.form) || id.form == Form::Kernel)
        throw bad("expected gpu.model, gpu.absorbed or gpu.explicit");
      k = 2;
    }
    take_profile();
  } else if (fam == "mutant") {
    id.family = Family::Mutant;
    if (t.size() < 2 || t[1].empty()) throw bad("expected mutant.<name>");
    id.name = t[1];
    k = 2;
    take_profile();
  } else if (fam == "audit") {
    id.family = Family::Audit;
    id.name = text.size() > 6 ? std::string(text.begin() + 6, text.end()) : "";
    if (id.name.empty()) throw bad("expected audit.<label>");
    return id;
  } else if (fam == "quant") {
    id.family = Family::Quant;
    take_profile();
  } else {
    throw bad("unknown family '" + fam + "' (ref, cpu, gpu, mutant, audit, quant)");
  }
  if (k != t.size()) throw bad("unexpected '" + t[k] + "'");
  return id;
}

bool id_matches(const std::string& pattern, const ImplId& id) {
  if (pattern == "*") return true;
  if (!pattern.empty() && pattern.back() == '*') {
    const std::string printed = to_string(id);
    const size_t n = pattern.size() - 1;
    return printed.size() >= n && printed.compare(0, n, pattern, 0, n) == 0;
  }
  ImplId p;
  try {
    p = parse_impl_id(pattern);
  } catch (const ConfigError&) {
    return false;
  }
  if (!p.profile) p.profile = id.profile;
  return p == id;
}

}  // namespace qkmla
