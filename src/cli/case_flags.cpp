#include "cli/case_flags.hpp"

#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/generator.hpp"
#include "core/presets.hpp"
#include "io/safetensors.hpp"
#include "io/toml_text.hpp"

namespace qkmla::cli {

void add_case_flags(CLI::App& app, CaseFlags& f, int default_seqlen) {
  f.app = &app;
  app.add_option("--preset", f.preset, "model shape (qkmla presets lists them)")
      ->capture_default_str();
  app.add_option("--config", f.config_file,
                 "a config file (JSON or TOML, conventions §9 keys; flags given override it)");
  app.add_option("--heads", f.heads, "query heads H (overrides the preset)")
      ->check(CLI::Range(1, std::numeric_limits<int>::max()));
  app.add_option("--groups", f.groups, "key groups G, H % G == 0 (overrides the preset)")
      ->check(CLI::Range(1, std::numeric_limits<int>::max()));
  app.add_option("--latent-rank", f.latent_rank, "latent rank r (overrides the preset)")
      ->check(CLI::Range(1, std::numeric_limits<int>::max()));
  app.add_option("--d-c", f.d_c, "content head dim d_c (overrides the preset)")
      ->check(CLI::Range(1, std::numeric_limits<int>::max()));
  app.add_option("--d-r", f.d_r, "rope head dim d_r, even; 0 = NoPE (overrides the preset)")
      ->check(CLI::Range(0, std::numeric_limits<int>::max()));
  app.add_option("--d-v", f.d_v, "value head dim d_v (overrides the preset)")
      ->check(CLI::Range(1, std::numeric_limits<int>::max()));
  app.add_option("--batch", f.batch, "sequences in the batch (each of --seqlen tokens)")
      ->check(CLI::Range(1, std::numeric_limits<int>::max()));
  auto* one =
      app.add_option("--seqlen", f.seqlen,
                     "cached tokens per sequence (default " + std::to_string(default_seqlen) + ")")
          ->check(CLI::Range(0, std::numeric_limits<int>::max()));
  app.add_option("--seqlens", f.seqlens,
                 "cached tokens of each sequence, comma separated (varlen batch)")
      ->delimiter(',')
      ->excludes(one);
  app.add_option("--sq", f.sq, "query tokens per sequence (1 = decode)")
      ->check(CLI::Range(1, std::numeric_limits<int>::max()))
      ->capture_default_str();
  app.add_option("--norm", f.norm, "blockwise|unified|none (none: plain MLA, no QK-norm)")
      ->check(CLI::IsMember({"blockwise", "unified", "none"}))
      ->capture_default_str();
  app.add_option("--rope-order", f.rope_order, "norm_then_rope|rope_then_norm")
      ->check(CLI::IsMember({"norm_then_rope", "rope_then_norm"}))
      ->capture_default_str();
  app.add_option("--rope-style", f.rope_style, "interleaved|half")
      ->check(CLI::IsMember({"interleaved", "half"}))
      ->capture_default_str();
  app.add_option("--eps", f.eps, "RMSNorm epsilon (default 1e-6)");
  app.add_option("--softmax-scale", f.softmax_scale, "softmax scale (default 1/sqrt(d_c + d_r))");
  app.add_flag("--causal,!--no-causal", f.causal, "causal mask over the query tokens (default on)");
  app.add_option("--topk", f.topk,
                 "sparse top-k: each query attends at most K drawn cache slots (indices, -1 pads)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--attn-sink", f.attn_sink,
               "per-head sink logits: out x exp(lse)/(exp(lse)+exp(s_h)), lse unchanged");
  app.add_option("--scenario", f.scenario, "input distribution")
      ->check(CLI::IsMember(scenario_names()))
      ->capture_default_str();
  app.add_option("--seed", f.seed, "generator seed, 0 to 2^64 - 1")
      ->check(CLI::Validator(
          [](std::string& v) {  // strtoull would take "-1" as 2^64 - 1
            return !v.empty() && v.find_first_not_of("0123456789") == std::string::npos
                       ? std::string()
                       : "Value " + v + " is not a whole number from 0 to 2^64 - 1";
          },
          "UINT64"))
      ->capture_default_str();
  app.add_option("--profile,--profiles", f.profiles,
                 "precision profiles, comma separated (fp64,fp32,bf16,fp16,fp8)")
      ->delimiter(',')
      ->check(CLI::IsMember({"fp64", "fp32", "bf16", "fp16", "fp8", "fp8-block128"}));
  refuse_repeats(app, f.profiles, "--profiles");
}

void refuse_repeats(CLI::App& app, const std::vector<std::string>& values,
                    const std::string& flag) {
  app.parse_complete_callback([&values, flag] {
    for (size_t i = 0; i < values.size(); ++i)
      for (size_t j = 0; j < i; ++j)
        if (values[i] == values[j])
          throw CLI::ValidationError(flag, values[i] + " is given twice (each value runs once)");
  });
}

std::string config_file_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError(path, "file", "cannot be opened");
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (path.size() < 5 || path.compare(path.size() - 5, 5, ".toml") != 0) return text;
  std::ostringstream json;
  json << toml::json_formatter{parse_toml(text, path)};
  return json.str();
}

namespace {

// Applies a --config file; returns the keys it set.
std::set<std::string> apply_file(MlaConfig& c, const std::string& path) {
  const std::string text = config_file_json(path);
  std::set<std::string> keys;
  try {
    apply_config_json(c, text);
    const nlohmann::json j = nlohmann::json::parse(text);  // named: items() must not outlive it
    for (const auto& [key, v] : j.items()) keys.insert(key);
  } catch (const ConfigError& e) {
    throw InputError(path, e.field, e.problem);
  }
  return keys;
}

}  // namespace

MlaConfig build_config(const CaseFlags& f, int default_seqlen) {
  auto given = [&](const char* flag) { return f.app && f.app->count(flag) > 0; };
  MlaConfig c = config_for(find_preset(f.preset), f.seqlen.value_or(default_seqlen));
  const std::set<std::string> file =
      f.config_file.empty() ? std::set<std::string>{} : apply_file(c, f.config_file);
  const bool file_scale = file.count("softmax_scale") > 0;
  for (auto [flag, value, field] :
       {std::tuple{"--heads", f.heads, &c.heads}, std::tuple{"--groups", f.groups, &c.groups},
        std::tuple{"--latent-rank", f.latent_rank, &c.latent_rank},
        std::tuple{"--d-c", f.d_c, &c.d_c}, std::tuple{"--d-r", f.d_r, &c.d_r},
        std::tuple{"--d-v", f.d_v, &c.d_v}})
    if (value) *field = *value;
  if (!f.seqlens.empty()) {
    if (f.batch && *f.batch != int(f.seqlens.size()))
      throw ConfigError("batch", "--batch " + std::to_string(*f.batch) + " disagrees with the " +
                                     std::to_string(f.seqlens.size()) + " entries of --seqlens");
    c.seqlens = f.seqlens;
  } else if (f.batch || f.seqlen || f.config_file.empty()) {
    if (f.batch && *f.batch > kMaxBatch)  // before a vector of that many lengths is allocated
      throw ConfigError("batch", "--batch " + std::to_string(*f.batch) + ": at most " +
                                     std::to_string(kMaxBatch) + " sequences");
    const int t = f.seqlen.value_or(c.seqlens.empty() ? default_seqlen : c.seqlens[0]);
    c.seqlens.assign(size_t(f.batch.value_or(f.config_file.empty() ? 1 : int(c.seqlens.size()))),
                     t);
  }
  c.batch = int(c.seqlens.size());
  if (given("--sq") || f.config_file.empty()) c.s_q = f.sq;
  if (given("--norm") || f.config_file.empty()) c.norm = parse_norm(f.norm);
  if (given("--rope-order") || f.config_file.empty()) c.rope_order = parse_rope_order(f.rope_order);
  if (given("--rope-style") || f.config_file.empty()) c.rope_style = parse_rope_style(f.rope_style);
  if (f.eps) c.eps = *f.eps;
  if (given("--causal") || given("--no-causal") || f.config_file.empty()) c.causal = f.causal;
  if (f.topk) c.topk = *f.topk;
  if (f.attn_sink) c.attn_sink = true;
  if (given("--scenario") || f.config_file.empty()) c.scenario = f.scenario;
  if (given("--seed") || f.config_file.empty()) c.seed = f.seed;
  if (given("--preset")) c.preset = f.preset;
  // The scale: the flag, else the file's, else the default of the final dims.
  if (f.softmax_scale)
    c.softmax_scale = *f.softmax_scale;
  else if (!file_scale)
    c.softmax_scale = 0.0, c.set_default_scale();
  c.validate();
  return c;
}

std::string given_overrides_json(const CaseFlags& f) {
  auto given = [&](const char* flag) { return f.app && f.app->count(flag) > 0; };
  nlohmann::json j = nlohmann::json::object();
  if (!f.config_file.empty()) j = nlohmann::json::parse(config_file_json(f.config_file));
  if (given("--preset")) {
    const Preset& p = find_preset(f.preset);
    j.update({{"heads", p.heads},
              {"groups", p.groups},
              {"latent_rank", p.latent_rank},
              {"d_c", p.d_c},
              {"d_r", p.d_r},
              {"d_v", p.d_v}});
  }
  for (auto [key, v] : {std::pair{"heads", f.heads}, std::pair{"groups", f.groups},
                        std::pair{"latent_rank", f.latent_rank}, std::pair{"d_c", f.d_c},
                        std::pair{"d_r", f.d_r}, std::pair{"d_v", f.d_v}})
    if (v) j[key] = *v;
  if (!f.seqlens.empty()) j["seqlens"] = f.seqlens, j["batch"] = f.seqlens.size();
  if (given("--sq")) j["s_q"] = f.sq;
  if (given("--norm")) j["norm"] = f.norm;
  if (given("--rope-order")) j["rope_order"] = f.rope_order;
  if (given("--rope-style")) j["rope_style"] = f.rope_style;
  if (f.eps) j["eps"] = *f.eps;
  if (f.softmax_scale) j["softmax_scale"] = *f.softmax_scale;
  if (given("--causal") || given("--no-causal")) j["causal"] = f.causal;
  if (f.profiles.size() == 1) j["profile"] = f.profiles[0];
  return j.dump();
}

std::vector<Profile> build_profiles(const CaseFlags& f, const std::vector<Profile>& defaults) {
  if (f.profiles.empty() && !f.config_file.empty()) {  // the file's profile, if it names one
    MlaConfig c;
    if (apply_file(c, f.config_file).count("profile")) return {c.profile};
  }
  if (f.profiles.empty()) return defaults;
  std::vector<Profile> out;
  for (const std::string& p : f.profiles) out.push_back(parse_profile(p));
  return out;
}

void parse_args(CLI::App& app, const std::vector<std::string>& args) {
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 parses from the back
  try {
    app.parse(reversed);
  } catch (const CLI::Error&) {
    throw;
  } catch (const std::exception& e) {
    std::string given;
    for (const std::string& a : args) given += (given.empty() ? "" : " ") + a;
    throw CLI::ConversionError("a flag value cannot be converted (" + std::string(e.what()) +
                               ": out of range or malformed) in: " + given);
  }
}

}  // namespace qkmla::cli
