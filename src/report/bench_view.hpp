// `qkmla bench`'s table (text or Markdown) of measured rows: what was timed and how, one row per
// context. No device is needed to render it.
#pragma once
#include <string>
#include <vector>

#include "gpu/qkmla_gpu.hpp"

namespace qkmla {

std::string render_bench(const std::vector<gpu::BenchRow>& rows, const std::string& how,
                         const std::string& device, const gpu::BenchOptions& o, bool md);
// The same rows as JSON: how, device, one object per row.
std::string bench_json(const std::vector<gpu::BenchRow>& rows, const std::string& how,
                       const std::string& device);

}  // namespace qkmla
