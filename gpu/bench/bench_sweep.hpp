// `qkmla bench --sweep`: the sweep's definition and its JSON-lines output, apart from the device
// (a backend gives each row's measurement), so that both are tested without a GPU.
#pragma once
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "gpu/qkmla_gpu.hpp"

namespace qkmla::gpu {

struct SweepPoint {
  int batch = 4, context = 4096, heads = 16, groups = 16;
};

// B in {1, 4, 16, 64} x context in {4k, 16k, 64k} x H in {16, 128} (G = H: MLA's one latent
// group per head), in that nesting order: 24 rows.
std::vector<SweepPoint> default_sweep();

struct BenchBackend {
  std::string device;
  std::function<double()> copy_gbs;  // device-to-device copy, (read + written bytes) / time
  std::function<BenchRow(const BenchOptions&, int context)> row;
};
// The device's backend (throws without a device; bench.cu).
BenchBackend device_bench_backend();

constexpr double kDatasheetGBs = 4800.0;  // H200 HBM3e, datasheet

// One JSON object per line, flushed as each is done: first {"copy_baseline": ...}, then one row
// per point ({"batch","context","heads","groups","ms_qknorm",...,"of_copy","of_datasheet"}).
// A row whose measurement throws gets {"error": ...} and the sweep goes on. Returns the rows
// that failed. `echo` (if set) gets every line too (the console, when `out` is a file).
int run_sweep(const std::vector<SweepPoint>& points, const BenchOptions& base,
              const BenchBackend& be, std::ostream& out, std::ostream* echo = nullptr);

// One row as a JSON line (no newline).
std::string json_row(const BenchRow& r, double copy_gbs);

}  // namespace qkmla::gpu
