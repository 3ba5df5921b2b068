// `qkmla bench`: the paper's decode table on the GPU (conventions §12): latency with QK-norm (the
// alpha_q * alpha_k scaling) and without it (the same kernel, plain MLA), overhead, bandwidth.
// GPU only: without a device it says why and exits 2.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <fstream>
#include <iostream>
#include <memory>
#include <vector>

#include "cli/commands.hpp"
#include "cli/output.hpp"
#include "cli/provenance.hpp"
#include "gpu/bench/bench_sweep.hpp"
#include "gpu/qkmla_gpu.hpp"
#include "report/bench_view.hpp"

namespace qkmla::cli {

namespace {

struct BenchFlags {
  gpu::BenchOptions o;
  std::string format = "table", output;
  bool sweep = false;
};

// --sweep and jsonl: each row is written as it finishes.
int run_streamed(const BenchFlags& f) {
  std::vector<gpu::SweepPoint> points = gpu::default_sweep();
  if (!f.sweep) {
    points.clear();
    for (int c : f.o.contexts) points.push_back({f.o.batch, c, f.o.heads, f.o.groups});
  }
  std::ofstream file;
  if (!f.output.empty()) file.open(f.output);
  if (!f.output.empty() && !file) {
    std::cerr << "qkmla bench: cannot write " << f.output << "\n";
    return 2;
  }
  std::ostream& out = f.output.empty() ? std::cout : file;
  return gpu::run_sweep(points, f.o, gpu::device_bench_backend(), out,
                        f.output.empty() ? nullptr : &std::cerr)
             ? 1
             : 0;
}

}  // namespace

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
  cmd->add_option("--heads", f->o.heads, "query heads H")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  cmd->add_option("--groups", f->o.groups, "latent groups G (H % G == 0)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  cmd->add_flag("--sweep", f->sweep,
                "B {1,4,16,64} x context {4k,16k,64k} x H {16,128} (G = H), one JSON line per row "
                "as it finishes, after a device-to-device copy baseline (implies --format jsonl)");
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
  cmd->add_option("--format", f->format,
                  "table|md|json|jsonl (jsonl: one line per row as it finishes)")
      ->check(CLI::IsMember({"table", "md", "json", "jsonl"}))
      ->capture_default_str();
  cmd->add_option("--output,-o", f->output, "write to FILE instead of stdout");
  return [f, command_line] {
    std::string why;
    if (!gpu::device_available(&why)) {
      std::cerr << "qkmla bench: needs a CUDA device: " << why << "\n";
      return 2;
    }
    if (f->o.heads % f->o.groups != 0) {
      std::cerr << "qkmla bench: --heads must be a multiple of --groups\n";
      return 2;
    }
    if (f->sweep || f->format == "jsonl") return run_streamed(*f);
    std::string device;
    const std::vector<gpu::BenchRow> rows = gpu::run_bench(f->o, &device);
    const std::string how = provenance(command_line, 1);
    const std::string text =
        f->format == "json"
            ? bench_json(rows, how, gpu::device_description())
            : render_bench(rows, how, gpu::device_description(), f->o, f->format == "md");
    return write_output(text, f->output);
  };
}

}  // namespace qkmla::cli
