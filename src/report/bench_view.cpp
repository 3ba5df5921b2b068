#include "report/bench_view.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <nlohmann/json.hpp>

namespace qkmla {

std::string bench_json(const std::vector<gpu::BenchRow>& rows, const std::string& how,
                       const std::string& device) {
  nlohmann::ordered_json j;
  j["how"] = how;
  j["device"] = device;
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
  return j.dump(2) + "\n";
}

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
  // One list of columns: markdown name, text name and width; each cell is formatted once (literal
  // format strings, checked at compile time) and laid out as a markdown or an aligned text row.
  struct Column {
    const char *md, *text;
    int width;
  };
  static const Column cols[] = {{"context", "context", 8},
                                {"ms QK-norm", "ms_qknorm", 11},
                                {"spread", "spread", 7},
                                {"ms plain", "ms_plain", 9},
                                {"spread", "spread", 7},
                                {"overhead %", "overhead%", 10},
                                {"GB/s", "GB/s", 8},
                                {"of 4.8 TB/s", "of_HBM", 8},
                                {"cache MB", "cache_MB", 10},
                                {"+alpha_k MB", "+alpha_MB", 11},
                                {"pages/split", "pps", 5},
                                {"splits", "splits", 6},
                                {"partial MB", "partial_MB", 10}};
  auto line = [&](const std::vector<std::string>& cells) {
    std::string l;
    for (size_t i = 0; i < cells.size(); ++i)
      l += md ? "| " + cells[i] + " "
              : fmt::format("{}{:>{}}", i ? " " : "", cells[i], cols[i].width);
    return l + (md ? "|\n" : "\n");
  };
  std::vector<std::string> head, rule;
  for (const Column& c : cols) head.push_back(md ? c.md : c.text), rule.push_back("---");
  s += (md ? "\n" : "") + line(head);
  if (md) s += "|" + fmt::format("{}", fmt::join(rule, "|")) + "|\n";
  double mean = 0;
  for (const gpu::BenchRow& r : rows) {
    mean += r.overhead_pct / double(rows.size());
    s += line({fmt::format("{}", r.context), fmt::format("{:.4f}", r.ms_norm),
               fmt::format("{:.3f}", r.spread_norm), fmt::format("{:.4f}", r.ms_plain),
               fmt::format("{:.3f}", r.spread_plain), fmt::format("{:+.2f}", r.overhead_pct),
               fmt::format("{:.0f}", r.gbs_norm), fmt::format("{:.1f}%", 100.0 * r.hbm_fraction),
               fmt::format("{:.1f}", r.cache_bytes / 1e6),
               fmt::format("{:.2f}", (r.cache_bytes_alpha - r.cache_bytes) / 1e6),
               fmt::format("{}", r.pages_per_split), fmt::format("{}", r.splits),
               fmt::format("{:.2f}", r.partial_bytes / 1e6)});
  }
  s += fmt::format(
      "{}mean overhead over {} contexts: {:+.2f} % (paper, H800 + torch.compile: 1.40 %)\n",
      md ? "\n" : "", rows.size(), mean);
  return s;
}

}  // namespace qkmla
