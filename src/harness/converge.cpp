#include "harness/converge.hpp"

#include <algorithm>
#include <cmath>
#include <map>

#include "core/generator.hpp"
#include "harness/registry.hpp"
#include "reference/deep_diff.hpp"
#include "reference/mp.hpp"
#include "reference/ref_common.hpp"

namespace qkmla {

namespace {

double fit_slope(const std::vector<std::pair<int, double>>& pts, size_t from) {
  double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (size_t i = from; i < pts.size(); ++i) {
    if (!(pts[i].second > 0)) continue;
    const double x = pts[i].first, y = std::log2(pts[i].second);
    n += 1, sx += x, sy += y, sxx += x * x, sxy += x * y;
  }
  return n < 2 ? std::nan("") : (n * sxy - sx * sy) / (n * sxx - sx * sx);
}

// Turns deep capture on for its lifetime (every exact remainder of every stored value).
struct DeepCapture {
  DeepCapture() { ref::set_deep_capture(true); }
  ~DeepCapture() { ref::set_deep_capture(false); }
};

}  // namespace

ConvergeResult run_converge(const MlaConfig& base, std::vector<int> bits) {
  const auto owned = ref::own_precision();  // the ladder sets the process-wide precision
  std::sort(bits.begin(), bits.end());
  ConvergeResult res{base, bits, 4 * bits.back(), {}};
  std::vector<ImplId> ids;
  for (const ImplId& id : registered_ids(base, kConverge)) {
    const std::string sc = id.family == Family::Mutant && !mutant_of(id).exposed_by.empty()
                               ? mutant_of(id).exposed_by
                               : base.scenario;
    res.series.push_back({to_string(id), sc, id.family == Family::Mutant, {}, 0, 0});
    ids.push_back(id);
  }
  std::map<std::string, std::pair<Case, ref::Dots>> cases;
  std::map<std::string, Outputs> truth;
  DeepCapture capture;
  for (const ConvergeSeries& s : res.series)
    if (!cases.count(s.scenario)) {
      MlaConfig c = base;
      c.scenario = s.scenario;
      Case k = generate_case(c);
      ref::Dots d = ref::exact_dots(k);
      ref::PrecisionScope scope(res.reference_bits);
      truth[s.scenario] = ref::ref_explicit(k, d, false);
      cases.emplace(s.scenario, std::make_pair(std::move(k), std::move(d)));
    }
  for (int p : bits) {
    ref::PrecisionScope scope(p);
    for (size_t n = 0; n < ids.size(); ++n) {
      ConvergeSeries& s = res.series[n];
      const auto& [k, d] = cases.at(s.scenario);
      const Outputs o = run_impls(k, {ids[n]}, RunContext{&d}).at(0);
      s.points.emplace_back(p, ref::deep_rel_diff(k, o, truth.at(s.scenario), {"out", "lse"}));
    }
  }
  for (ConvergeSeries& s : res.series) {
    s.slope = fit_slope(s.points, 0);
    s.tail_slope = fit_slope(s.points, s.points.size() >= 4 ? s.points.size() - 4 : 0);
  }
  return res;
}

}  // namespace qkmla
