// qkmla certify: the explicit and absorbed forms agree exactly in rational arithmetic (or a
// mutant is refuted exactly).
#include <fmt/format.h>

#include <chrono>
#include <iostream>
#include <memory>

#include "cli/case_flags.hpp"
#include "cli/commands.hpp"
#include "cli/output.hpp"
#include "cli/provenance.hpp"
#include "core/generator.hpp"
#include "harness/resources.hpp"
#include "impl/mutants.hpp"
#include "reference/certify.hpp"

namespace qkmla::cli {

namespace {
struct CertifyFlags {
  CaseFlags c;
  std::string mutant, output;
};
}  // namespace

Runner add_certify(CLI::App& app, const std::string& command_line) {
  auto f = std::make_shared<CertifyFlags>();
  auto* cmd = app.add_subcommand(
      "certify", "exact rational check that absorbed == explicit (or refute a mutant exactly)");
  add_case_flags(*cmd, f->c, 256);
  cmd->add_option("--mutant", f->mutant,
                  "run a mutant of conventions §7 on the absorbed side; it must be refuted");
  cmd->add_option("--output,-o", f->output, "write to FILE instead of stdout");
  return [f, command_line] {
    MlaConfig cfg = build_config(f->c, 256);
    cfg.profile = build_profiles(f->c, {Profile::BF16}).at(0);
    const Perturbation p = f->mutant.empty() ? Perturbation{} : impl::find_mutant(f->mutant).p;
    require_memory({cfg}, "certify on this case", "a shorter --seqlen or a smaller shape",
                   certify_peak_bytes);
    const Case k = generate_case(cfg);
    const auto t0 = std::chrono::steady_clock::now();
    const ref::CertifyResult r = ref::certify(k, p);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::string text = fmt::format(
        "qkmla certify: preset {} (H={} G={} r={} d_c={} d_r={} d_v={}), seqlens [{}], S_q {}, {} "
        "norm, {}, {}, scenario {}, seed {}, "
        "profile {} (inputs are exact binary floats)\nMade by {}\n"
        "checked exactly (GMP rationals) in {:.1f} s:\n"
        "  (a) content scores  sum_j q_j gq_j gk_j k0c_j == q_latent . c     {:>9}\n"
        "  (b) key statistics  |c WK_g|^2 == c (WK_g WK_g^T) c^T (Gram)       {:>9}\n"
        "  (b') query stats    alpha_q of both forms                         {:>9}\n"
        "  (c) logits          explicit == absorbed, S^q, S^k exact inputs   {:>9}\n"
        "  (d) value path      latent_out . WV == sum_t p v, p exact         {:>9}\n"
        "  (e) masks           same visible tokens                           {:>9}\n"
        "  (f) lse             natural log of the row's sum                  {:>9}\n"
        "  (g) sink            out x 1/(1+exp(s_h-lse)), lse without it      {:>9}\n",
        cfg.preset, cfg.heads, cfg.groups, cfg.latent_rank, cfg.d_c, cfg.d_r, cfg.d_v,
        fmt::join(cfg.seqlens, ","), cfg.s_q, to_string(cfg.norm), to_string(cfg.rope_order),
        to_string(cfg.rope_style), cfg.scenario, cfg.seed, to_string(cfg.profile),
        provenance(command_line, 1), s, r.content_scores, r.key_statistics, r.query_statistics,
        r.logits, r.value_paths, r.masks, r.lse_rows, r.sink_rows);
    int rc = 0;
    if (p.is_none()) {
      text += r.refuted ? "NOT EQUIVALENT: " + r.first + "\n"
                        : "all equal: the absorbed form is the explicit form, exactly\n";
      rc = r.refuted ? 1 : 0;
    } else if (p.rounding_only()) {
      text += fmt::format(
          "mutant {} changes only rounding: in exact arithmetic it is the correct form ({})\n",
          f->mutant, r.refuted ? "but a difference was found: " + r.first : "no difference found");
      rc = r.refuted ? 1 : 0;
    } else {
      text += r.refuted ? fmt::format("mutant {} refuted exactly: {}\n", f->mutant, r.first)
                        : fmt::format("mutant {} NOT refuted on this case (every check equal)\n",
                                      f->mutant);
      rc = r.refuted ? 1 : 0;
    }
    if (const int w = write_output(text, f->output)) return w;
    return rc;
  };
}

}  // namespace qkmla::cli
