// qkmla reference: the multiprecision truth of one case (ref.explicit at P and its check at P + 64)
// with what it cost: wall time, peak memory and how far from the machine's limit it ran. The
// long-context benchmark (reports/long_context.sh) runs it at 32k-256k tokens.
#include <fmt/format.h>

#include <chrono>
#include <memory>

#include "cli/case_flags.hpp"
#include "cli/commands.hpp"
#include "cli/output.hpp"
#include "cli/progress.hpp"
#include "cli/provenance.hpp"
#include "core/generator.hpp"
#include "harness/fma_rate.hpp"
#include "harness/resources.hpp"
#include "harness/truth.hpp"

namespace qkmla::cli {

namespace {

struct ReferenceFlags {
  CaseFlags c;
  std::string output;
  int threads = 2;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

Runner add_reference(CLI::App& app, const std::string& command_line) {
  auto f = std::make_shared<ReferenceFlags>();
  auto* cmd = app.add_subcommand(
      "reference", "the multiprecision truth of one case: time, peak memory, agreeing bits");
  add_case_flags(*cmd, f->c, 4096);
  cmd->add_option("--threads", f->threads, "threads (exact products overlap the runs)")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--output,-o", f->output, "write to FILE instead of stdout");
  return [f, command_line] {
    const auto t0 = std::chrono::steady_clock::now();
    MlaConfig cfg = build_config(f->c, 4096);
    cfg.profile = build_profiles(f->c, {Profile::BF16}).at(0);
    if (reference_peak_bytes(cfg) > available_bytes(nullptr))
      throw ResourceError(fmt::format("qkmla reference: this case needs about {}; {} available",
                                      human_bytes(reference_peak_bytes(cfg)),
                                      human_bytes(available_bytes(nullptr))));
    const Case k = generate_case(cfg);
    const double generate_s = seconds_since(t0);
    const std::string case_rss = human_bytes(peak_rss_bytes());
    const auto t1 = std::chrono::steady_clock::now();
    TruthOptions o;
    o.threads = f->threads;
    const ref::Dots dots = ref::exact_dots(k);
    o.dots = &dots;
    Truth t;
    {  // ref.explicit reads every k0c block once, at P and again at the check precision
      const ProgressWatch watch([&] { return double(dots.blocks_read()); },
                                2.0 * double(dots.blocks_per_product()));
      t = compute_truth(k, o);
    }
    const double truth_s = seconds_since(t1);
    int64_t tokens = 0;
    for (int n : cfg.seqlens) tokens += n;
    // The explicit form's exact product k0c: T G d_c r multiply-adds, each at least one FMA.
    const double macs = double(tokens) * cfg.groups * cfg.d_c * cfg.latent_rank;
    const double rate = measured_fma_rate(f->threads);
    const std::string text = fmt::format(
        "qkmla reference: preset {} (H={} G={} r={} d_c={} d_r={} d_v={}), seqlens [{}], S_q {}, "
        "{} norm, scenario {}, seed {}, profile {}\nMade by {}\n"
        "  products           {} (streamed: {}, blocks formed {}); {}\n"
        "  generate case      {:.1f} s (peak RSS so far {})\n"
        "  truth              {:.1f} s (exact products {:.1f} s of thread time, ref.explicit "
        "{:.1f} "
        "s at {} bits, check {:.1f} s at {} bits)\n"
        "  agreeing bits      {:.1f} (required {:.0f}: {})\n"
        "  peak RSS           {}\n"
        "  exact MACs         {:.3g}; fp64 FMA rate {:.3g}/s on {} threads: limit {:.1f} s, "
        "truth at {:.1f} % of it\n",
        cfg.preset, cfg.heads, cfg.groups, cfg.latent_rank, cfg.d_c, cfg.d_r, cfg.d_v,
        fmt::join(cfg.seqlens, ","), cfg.s_q, to_string(cfg.norm), cfg.scenario, cfg.seed,
        to_string(cfg.profile), provenance(command_line, f->threads),
        t.dots.streaming() ? "256-token blocks" : "whole", t.dots.streaming() ? "yes" : "no",
        t.dots.blocks_formed(), t.dots.method(), generate_s, case_rss, truth_s, t.dots.seconds(),
        t.explicit_p.seconds, t.bits, t.check.seconds, t.check_bits, t.agreeing_bits,
        t.required_bits, t.ok() ? "ok" : "NOT ENOUGH", human_bytes(peak_rss_bytes()), macs, rate,
        f->threads, macs / rate, 100.0 * macs / rate / truth_s);
    if (const int w = write_output(text, f->output)) return w;
    return t.ok() ? 0 : 1;
  };
}

}  // namespace qkmla::cli
