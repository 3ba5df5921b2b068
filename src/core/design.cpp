#include "core/design.hpp"

#include <vector>

namespace qkmla {

std::string form_name(Form f) {
  switch (f) {
    case Form::Explicit:
      return "explicit";
    case Form::Absorbed:
      return "absorbed";
    case Form::Kernel:
      return "kernel";
  }
  return "?";
}

Form parse_form(const std::string& s) {
  for (Form f : {Form::Explicit, Form::Absorbed, Form::Kernel})
    if (s == form_name(f)) return f;
  throw ConfigError("form", "unknown form '" + s + "' (expected explicit|absorbed|kernel)");
}

bool rounds_at(DType point, DType A) { return format_of(point).precision < format_of(A).precision; }

Design spec_design(Profile p, Form f) {
  const DType D = stored_dtype(p), A = accumulate_dtype(p);
  return {f, D, D, D, A, A, A, D, D};
}

Design accumulate_design(Profile p, Form f) {
  const DType A = accumulate_dtype(p);
  return {f, A, A, A, A, A, A, A, A};
}

std::string format_word(DType d) {
  switch (d) {
    case DType::F64:
      return "fp64";
    case DType::F32:
      return "fp32";
    case DType::BF16:
      return "bf16";
    case DType::F16:
      return "fp16";
    case DType::F8_E4M3:
      return "fp8";
    default:
      return "?";
  }
}

namespace {

DType parse_dtype_word(const std::string& key, const std::string& v, Profile p) {
  if (v == "stored") return stored_dtype(p);
  if (v == "acc") return accumulate_dtype(p);
  for (DType d : {DType::F64, DType::F32, DType::BF16, DType::F16})
    if (v == format_word(d)) return d;
  throw ConfigError("design." + key,
                    "unknown format '" + v + "' (fp64, fp32, bf16, fp16, stored, acc)");
}

}  // namespace

Design parse_design(const std::string& text, Profile p, Form default_form) {
  std::vector<std::pair<std::string, std::string>> kv;
  size_t at = 0;
  while (at <= text.size() && !text.empty()) {
    const size_t comma = text.find(',', at);
    const std::string item =
        text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0)
      throw ConfigError("design", "expected key=value, got '" + item + "'");
    kv.emplace_back(item.substr(0, eq), item.substr(eq + 1));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  Form f = default_form;
  for (const auto& [k, v] : kv)
    if (k == "form") f = parse_form(v);
  Design d = spec_design(p, f);
  for (const auto& [k, v] : kv) {
    if (k == "form") continue;
    if (k == "gains") {
      if (v != "merged" && v != "runtime")
        throw ConfigError("design.gains", "expected merged|runtime, got '" + v + "'");
      d.gains_merged = v == "merged";
      continue;
    }
    bool Design::*const option = k == "scale_in_q"     ? &Design::scale_in_q
                                 : k == "exp2"         ? &Design::exp2
                                 : k == "rsqrt"        ? &Design::approx_rsqrt
                                 : k == "p_normalized" ? &Design::p_normalized
                                 : k == "sink_in_p"    ? &Design::sink_in_p
                                 : k == "p_sum_stored" ? &Design::p_sum_stored
                                 : k == "gram_alpha_k" ? &Design::gram_alpha_k
                                                       : nullptr;
    if (option) {
      if (v != "yes" && v != "no" && v != "approx" && v != "exact")
        throw ConfigError("design." + k, "expected yes|no (rsqrt: approx|exact), got '" + v + "'");
      d.*option = v == "yes" || v == "approx";
      continue;
    }
    if (k == "score" || k == "cache" || k == "alpha_q" || k == "eager" || k == "lse" ||
        k == "latent_file" || k == "sigma" || k == "key_fold" || k == "q_normed" ||
        k == "partials" || k == "prelude") {
      const DType x = parse_dtype_word(k, v, p);  // F64: not rounded
      DType& point = k == "score"         ? d.score
                     : k == "cache"       ? d.cache
                     : k == "eager"       ? d.eager
                     : k == "lse"         ? d.lse
                     : k == "latent_file" ? d.latent_file
                     : k == "sigma"       ? d.sigma
                     : k == "key_fold"    ? d.key_fold
                     : k == "q_normed"    ? d.q_normed
                     : k == "partials"    ? d.partials
                     : k == "prelude"     ? d.prelude
                                          : d.alpha_q;
      point = rounds_at(x, accumulate_dtype(p)) ? x : DType::F64;
      continue;
    }
    DType Design::*const point = k == "q_latent" || k == "q" ? &Design::q
                                 : k == "rope"               ? &Design::rope
                                 : k == "kv"                 ? &Design::kv
                                 : k == "rope_key"           ? &Design::rope_key
                                 : k == "alpha_k"            ? &Design::alpha_k
                                 : k == "p"                  ? &Design::p
                                 : k == "latent_out"         ? &Design::latent_out
                                 : k == "out"                ? &Design::out
                                                             : nullptr;
    if (!point)  // the key first: "zz=1" is an unknown point, not an unknown format
      throw ConfigError(
          "design." + k,
          "unknown rounding point (form, q_latent, rope, kv, rope_key, alpha_k, p, "
          "latent_out, out, score, cache, eager, lse, latent_file, sigma, key_fold, partials, "
          "prelude, gains, scale_in_q, exp2, rsqrt)");
    if (v == "fp8") {  // an all-FP8 kernel's query and P (e4m3; conventions §5)
      if (point != &Design::q && point != &Design::p)
        throw ConfigError("design." + k, "fp8 is a format of q_latent and p only");
      if (d.form == Form::Explicit)
        throw ConfigError("design." + k, "fp8 is a point of the absorbed and kernel forms");
      d.*point = DType::F8_E4M3;
      continue;
    }
    d.*point = parse_dtype_word(k, v, p);
  }
  return d;
}

std::string to_string(const Design& d) {
  std::string s =
      "form=" + form_name(d.form) + ",q=" + format_word(d.q) + ",rope=" + format_word(d.rope);
  if (d.form == Form::Explicit)
    s += ",kv=" + format_word(d.kv) + ",rope_key=" + format_word(d.rope_key);
  s += ",alpha_k=" + format_word(d.alpha_k) + ",p=" + format_word(d.p);
  if (d.form != Form::Explicit) s += ",latent_out=" + format_word(d.latent_out);
  s += ",out=" + format_word(d.out);
  if (d.score != DType::F64) s += ",score=" + format_word(d.score);
  if (d.alpha_q != DType::F64) s += ",alpha_q=" + format_word(d.alpha_q);
  if (d.q_normed != DType::F64) s += ",q_normed=" + format_word(d.q_normed);
  if (d.cache != DType::F64) s += ",cache=" + format_word(d.cache);
  if (d.eager != DType::F64) s += ",eager=" + format_word(d.eager);
  if (d.lse != DType::F64) s += ",lse=" + format_word(d.lse);
  if (d.latent_file != DType::F64) s += ",latent_file=" + format_word(d.latent_file);
  if (d.sigma != DType::F64) s += ",sigma=" + format_word(d.sigma);
  if (d.key_fold != DType::F64) s += ",key_fold=" + format_word(d.key_fold);
  if (d.partials != DType::F64) s += ",partials=" + format_word(d.partials);
  if (d.prelude != DType::F64) s += ",prelude=" + format_word(d.prelude);
  if (d.scale_in_q) s += ",scale_in_q=yes";
  if (d.exp2) s += ",exp2=yes";
  if (d.approx_rsqrt) s += ",rsqrt=approx";
  if (d.p_normalized) s += ",p_normalized=yes";
  if (d.sink_in_p) s += ",sink_in_p=yes";
  if (d.p_sum_stored) s += ",p_sum_stored=yes";
  if (d.gram_alpha_k) s += ",gram_alpha_k=yes";
  return d.gains_merged ? s + ",gains=merged" : s;
}

}  // namespace qkmla
