// `qkmla bench`: the paper's decode table on the GPU (SPEC §12): latency with QK-norm (the
// alpha_q * alpha_k scaling) and without it (the same kernel, plain MLA), overhead, bandwidth.
// GPU only: without a device it says why and exits 2.
#include <fmt/format.h>

#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "cli/provenance.hpp"
#include "gpu/qkmla_gpu.hpp"

namespace qkmla::cli {

namespace {

struct BenchFlags {
  gpu::BenchOptions o;
  std::string format = "table", output;
};

}  // namespace

std::string render_bench(const std::vector<gpu::BenchRow>& rows, const std::string& how,
                         const std::string& device, const gpu::BenchOptions& o, bool md) {
  std::string s = md ? "# qkmla bench\n\n" : "qkmla bench\n";
  s += fmt::format(
      "{}device: {}; {}\n{}shape: batch {}, H {}, G {}, r {}, d_c {}, d_r {}, bf16 cache, S_q 1; "
      "{} warm-up + {} timed repetitions per row, CUDA events around decode + combine, L2 "
      "flushed before each (a 2x-L2 memset)\n{}bytes counted for GB/s: the latent cache (r + d_r "
      "bf16 values per token) and alpha_k (G fp32 per token), each read once; not counted: the "
      "query, the block table and the fp32 split partials (B x H x splits x (r + 1) floats, "
      "written once and read once: partial_MB); split plan: {}\n",
      md ? "- " : "", device, how, md ? "- " : "", o.batch, o.heads, o.groups, o.r, o.d_c, o.d_r,
      o.warmup, o.reps, md ? "- " : "",
      o.pages_per_split ? fmt::format("{} pages per split (--pages-per-split)", o.pages_per_split)
                        : std::string("the plan's (two work items per multiprocessor)"));
  s += md ? "\n| context | ms QK-norm | spread | ms plain | spread | overhead % | GB/s | of 4.8 "
            "TB/s | cache MB | +alpha_k MB | pages/split | splits | partial MB |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
          : fmt::format(
                "{:>8} {:>11} {:>7} {:>9} {:>7} {:>10} {:>8} {:>8} {:>10} {:>11} {:>5} {:>6} "
                "{:>10}\n",
                "context", "ms_qknorm", "spread", "ms_plain", "spread", "overhead%", "GB/s",
                "of_HBM", "cache_MB", "+alpha_MB", "pps", "splits", "partial_MB");
  double mean = 0;
  for (const gpu::BenchRow& r : rows) {
    mean += r.overhead_pct / double(rows.size());
    // Literal format strings, checked at compile time (a runtime one hid an invalid "%" type).
    const double pct = 100.0 * r.hbm_fraction,
                 alpha_mb = (r.cache_bytes_alpha - r.cache_bytes) / 1e6;
    if (md)
      s += fmt::format(
          "| {} | {:.4f} | {:.3f} | {:.4f} | {:.3f} | {:+.2f} | {:.0f} | {:.1f}% | {:.1f} | {:.2f} "
          "| {} | {} | {:.2f} |\n",
          r.context, r.ms_norm, r.spread_norm, r.ms_plain, r.spread_plain, r.overhead_pct,
          r.gbs_norm, pct, r.cache_bytes / 1e6, alpha_mb, r.pages_per_split, r.splits,
          r.partial_bytes / 1e6);
    else
      s += fmt::format(
          "{:>8} {:>11.4f} {:>7.3f} {:>9.4f} {:>7.3f} {:>+10.2f} {:>8.0f} {:>7.1f}% {:>10.1f} "
          "{:>11.2f} {:>5} {:>6} {:>10.2f}\n",
          r.context, r.ms_norm, r.spread_norm, r.ms_plain, r.spread_plain, r.overhead_pct,
          r.gbs_norm, pct, r.cache_bytes / 1e6, alpha_mb, r.pages_per_split, r.splits,
          r.partial_bytes / 1e6);
  }
  s += fmt::format(
      "{}mean overhead over {} contexts: {:+.2f} % (paper, H800 + torch.compile: 1.40 %)\n",
      md ? "\n" : "", rows.size(), mean);
  return s;
}

Runner add_bench(CLI::App& app, const std::string& command_line) {
  auto f = std::make_shared<BenchFlags>();
  auto* cmd = app.add_subcommand(
      "bench", "GPU decode latency with and without QK-norm (the paper's table; GPU only)");
  cmd->add_option("--contexts", f->o.contexts, "context lengths, comma separated")
      ->delimiter(',')
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--batch", f->o.batch, "batch size")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd->add_option("--warmup", f->o.warmup, "untimed repetitions per row")
      ->check(CLI::Range(0, 10000))
      ->capture_default_str();
  cmd->add_option("--reps", f->o.reps, "timed repetitions per row and mode")
      ->check(CLI::Range(3, 100000))
      ->capture_default_str();
  cmd->add_option("--pages-per-split", f->o.pages_per_split,
                  "pages (64 tokens) per split-KV split; 0: the plan's choice")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--format", f->format, "table|md|json")
      ->check(CLI::IsMember({"table", "md", "json"}))
      ->capture_default_str();
  cmd->add_option("--output,-o", f->output, "write to FILE instead of stdout");
  return [f, command_line] {
    std::string why;
    if (!gpu::device_available(&why)) {
      std::cerr << "qkmla bench: needs a CUDA device: " << why << "\n";
      return 2;
    }
    std::string device;
    const std::vector<gpu::BenchRow> rows = gpu::run_bench(f->o, &device);
    const std::string how = provenance(command_line, 1);
    std::string text;
    if (f->format == "json") {
      nlohmann::ordered_json j;
      j["how"] = how;
      j["device"] = gpu::device_description();
      for (const gpu::BenchRow& r : rows)
        j["rows"].push_back({{"context", r.context},
                             {"ms_qknorm", r.ms_norm},
                             {"spread_qknorm", r.spread_norm},
                             {"ms_plain", r.ms_plain},
                             {"spread_plain", r.spread_plain},
                             {"overhead_pct", r.overhead_pct},
                             {"gbs", r.gbs_norm},
                             {"hbm_fraction", r.hbm_fraction},
                             {"cache_bytes", r.cache_bytes},
                             {"cache_bytes_with_alpha_k", r.cache_bytes_alpha},
                             {"pages_per_split", r.pages_per_split},
                             {"splits", r.splits},
                             {"partial_bytes", r.partial_bytes}});
      text = j.dump(2) + "\n";
    } else {
      text = render_bench(rows, how, gpu::device_description(), f->o, f->format == "md");
    }
    return write_output(text, f->output);
  };
}

}  // namespace qkmla::cli
