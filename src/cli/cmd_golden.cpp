// qkmla golden: a case file with the inputs rounded to a profile, the config, the fp64 reference
// outputs and the same-profile baseline's error (so an audit applies conventions §6 without
// recomputing).
#include <fmt/format.h>
#include <unistd.h>

#include <iostream>
#include <memory>

#include "cli/case_flags.hpp"
#include "cli/commands.hpp"
#include "core/generator.hpp"
#include "harness/golden.hpp"
#include "harness/layouts.hpp"
#include "harness/resources.hpp"
#include "io/case_io.hpp"
#include "io/inputs.hpp"

namespace qkmla::cli {

namespace {

struct GoldenFlags {
  CaseFlags c;
  std::string level = "module", output, inputs, layout = "dense";
  int page_size = 64;
  bool round_inputs = false;
  int ref_bits = 113;
};

// The module-level case: generated from the case flags, or the user's inputs (--inputs).
Case module_case(const GoldenFlags& f, std::map<std::string, std::string>& metadata) {
  if (!f.inputs.empty()) {
    if (f.c.profiles.size() > 1) throw ConfigError("profile", "golden writes one profile");
    if (f.c.seqlen || (f.c.app && f.c.app->count("--batch")))
      throw ConfigError(
          "seqlen", "--inputs: the sequence lengths come from the seqlens tensor (or --seqlens)");
    InputsCase in = case_from_inputs({f.inputs, given_overrides_json(f.c), f.round_inputs});
    metadata = in.metadata;
    return std::move(in.k);
  }
  MlaConfig cfg = build_config(f.c, 64);
  const std::vector<Profile> ps = build_profiles(f.c, {Profile::BF16});
  if (ps.size() != 1)
    throw ConfigError("profile",
                      "golden writes one profile (got " + std::to_string(ps.size()) + ")");
  cfg.profile = ps[0];
  require_memory({cfg}, "this case",
                 "a shorter --seqlen, fewer --batch sequences or a smaller shape");
  return generate_case(cfg);
}

}  // namespace

Runner add_golden(CLI::App& app, const std::string& command_line) {
  auto f = std::make_shared<GoldenFlags>();
  auto* cmd = app.add_subcommand("golden",
                                 "write a golden case: inputs in one profile, the config, fp64 "
                                 "reference outputs, baseline error");
  add_case_flags(*cmd, f->c, 64);
  cmd->add_option("--level", f->level, "module|kernel")
      ->check(CLI::IsMember({"module", "kernel"}))
      ->capture_default_str();
  cmd->add_option("--ref-bits", f->ref_bits, "reference precision P (checked at P + 64)")
      ->check(CLI::Range(64, 4096))
      ->capture_default_str();
  cmd->add_option("--output,-o", f->output, "the .safetensors file to write")->required();
  cmd->add_option(
         "--inputs", f->inputs,
         "the inputs from a safetensors file (conventions §2 names; config from its metadata, "
         "else from shapes and dtypes; "
         "case flags given override)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--layout", f->layout,
                  "also write the kernel-level inputs as FlashMLA or FlashInfer take them "
                  "(docs/layouts.md; implies --level kernel)")
      ->check(CLI::IsMember({"dense", "flashmla", "flashinfer"}))
      ->capture_default_str();
  cmd->add_option("--page-size", f->page_size, "tokens per cache page of --layout")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_flag("--round-inputs", f->round_inputs,
                "with --inputs: round values the profile cannot store once (RNE) instead of "
                "refusing them (recorded in the case)");
  return [f, command_line] {
    std::map<std::string, std::string> extra;
    const Layout layout = parse_layout(f->layout);
    if (layout != Layout::Dense) f->level = "kernel";  // a layout is a kernel's interface
    if (layout == Layout::FlashMla && f->inputs.empty() &&
        build_profiles(f->c, {Profile::BF16}) == std::vector<Profile>{Profile::FP8})
      throw ConfigError("layout",
                        "flashmla with the fp8 profile (one scale per token): FlashMLA's fp8 "
                        "cache has one scale per 128 values; use --profile fp8-block128");
    const Case k = module_case(*f, extra);
    if (isatty(2))
      std::cerr << "[qkmla] golden: reference at P and its check at P + 64, baseline\n";
    Golden g = make_golden(k, parse_level(f->level), f->ref_bits, command_line);
    g.metadata.insert(extra.begin(), extra.end());
    if (!g.truth.ok()) {
      std::cerr << fmt::format(
          "qkmla golden: refused: reference agrees on {:.1f} bits < {:.0f}; raise --ref-bits\n",
          g.truth.agreeing_bits, g.truth.required_bits);
      return 1;
    }
    if (layout != Layout::Dense) {
      for (auto& [name, t] : paged_inputs(g.k, layout, f->page_size)) g.k.tensors[name] = t;
      g.metadata["qkmla.layout"] = f->layout + ", page_size " + std::to_string(f->page_size);
    }
    write_case(f->output, g.k, g.refs, g.metadata);
    std::cout << fmt::format(
        "wrote {} ({} level, profile {}, reference {} bits agreeing on {:.1f}; baseline {})\n",
        f->output, f->level, to_string(g.k.cfg.profile), g.truth.bits, g.truth.agreeing_bits,
        g.baseline_impl);
    return 0;
  };
}

}  // namespace qkmla::cli
