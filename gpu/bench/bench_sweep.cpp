// gpu/bench/bench_sweep.hpp: the sweep and its JSON lines (no CUDA here).
#include "gpu/bench/bench_sweep.hpp"

#include <cmath>
#include <cstdio>
#include <exception>

namespace qkmla::gpu {

std::vector<SweepPoint> default_sweep() {
  std::vector<SweepPoint> v;
  for (int b : {1, 4, 16, 64})
    for (int ctx : {4096, 16384, 65536})
      for (int h : {16, 128}) v.push_back({b, ctx, h, h});
  return v;
}

namespace {
std::string num(double x) {
  if (!std::isfinite(x)) return "null";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.6g", x);
  return buf;
}
std::string quoted(const std::string& s) {
  std::string q = "\"";
  for (char c : s)
    q += c == '"' || c == '\\' ? std::string("\\") + c : c < 32 ? " " : std::string(1, c);
  return q + "\"";
}
}  // namespace

std::string json_row(const BenchRow& r, double copy_gbs) {
  return "{\"batch\":" + std::to_string(r.batch) + ",\"context\":" + std::to_string(r.context) +
         ",\"heads\":" + std::to_string(r.heads) + ",\"groups\":" + std::to_string(r.groups) +
         ",\"ms_qknorm\":" + num(r.ms_norm) + ",\"spread_qknorm\":" + num(r.spread_norm) +
         ",\"ms_plain\":" + num(r.ms_plain) + ",\"spread_plain\":" + num(r.spread_plain) +
         ",\"overhead_pct\":" + num(r.overhead_pct) + ",\"gbs\":" + num(r.gbs_norm) +
         ",\"of_copy\":" + num(copy_gbs > 0 ? r.gbs_norm / copy_gbs : NAN) +
         ",\"of_datasheet\":" + num(r.gbs_norm / kDatasheetGBs) +
         ",\"cache_bytes_with_alpha_k\":" + num(r.cache_bytes_alpha) +
         ",\"pages_per_split\":" + std::to_string(r.pages_per_split) +
         ",\"splits\":" + std::to_string(r.splits) + ",\"partial_bytes\":" + num(r.partial_bytes) +
         "}";
}

int run_sweep(const std::vector<SweepPoint>& points, const BenchOptions& base,
              const BenchBackend& be, std::ostream& out, std::ostream* echo) {
  auto emit = [&](const std::string& line) {  // flushed: a time-out keeps every finished row
    out << line << std::endl;
    if (echo) *echo << line << std::endl;
  };
  double copy = 0;
  try {
    copy = be.copy_gbs();
    emit("{\"copy_baseline\":{\"gbs\":" + num(copy) + ",\"of_datasheet\":" +
         num(copy / kDatasheetGBs) + ",\"device\":" + quoted(be.device) + "}}");
  } catch (const std::exception& e) {
    emit("{\"copy_baseline\":{\"error\":" + quoted(e.what()) + "}}");
  }
  int failed = 0;
  for (const SweepPoint& p : points) {
    BenchOptions o = base;
    o.batch = p.batch, o.heads = p.heads, o.groups = p.groups;
    try {
      emit(json_row(be.row(o, p.context), copy));
    } catch (const std::exception& e) {
      ++failed;
      emit("{\"batch\":" + std::to_string(p.batch) + ",\"context\":" + std::to_string(p.context) +
           ",\"heads\":" + std::to_string(p.heads) + ",\"groups\":" + std::to_string(p.groups) +
           ",\"error\":" + quoted(e.what()) + "}");
    }
  }
  return failed;
}

}  // namespace qkmla::gpu
