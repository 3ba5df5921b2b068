#include "metrics/compare.hpp"

#include <cmath>
#include <limits>

namespace qkmla {

namespace {
bool same_nonfinite(double a, double b) {
  return (std::isnan(a) && std::isnan(b)) || (std::isinf(a) && a == b);
}
}  // namespace

Metrics compare(const Tensor& x, const Tensor& y, DType ulp_dtype, const std::vector<bool>& mask,
                const Tensor* x_lo, const Tensor* y_lo) {
  Metrics m;
  long double diff2 = 0, x2 = 0, y2 = 0;
  for (int64_t i = 0; i < y.numel(); ++i) {
    if (!mask.empty() && !mask[size_t(i)]) continue;
    const double a = x[i], b = y[i];
    if (!std::isfinite(a) || !std::isfinite(b)) {
      if (!same_nonfinite(a, b)) ++m.nonfinite_mismatch;
      continue;
    }
    // (a - b) is exact when a and b are close (Sterbenz); the remainders refine it.
    double d = a - b;
    if (x_lo) d += (*x_lo)[i];
    if (y_lo) d -= (*y_lo)[i];
    const double ad = std::fabs(d);
    ++m.compared;
    diff2 += (long double)d * d;
    x2 += (long double)a * a;
    y2 += (long double)b * b;
    if (m.worst.index.empty() || ad > m.max_abs) {
      m.max_abs = ad;
      m.worst = {y.unravel(i), a, b};
    }
    m.max_ulp = std::max(m.max_ulp, ad / ulp_in(ulp_dtype, b));
  }
  const double inf = std::numeric_limits<double>::infinity();
  m.rel_l2 = y2 > 0 ? double(std::sqrt(diff2 / y2)) : (diff2 > 0 ? inf : 0.0);
  // 1 - 2<x,y>/(|x|^2+|y|^2) == |x-y|^2/(|x|^2+|y|^2): the right side has no cancellation.
  m.cos_diff = (x2 + y2) > 0 ? double(diff2 / (x2 + y2)) : 0.0;
  return m;
}

double bound_ratio(const Tensor& x, const Tensor& y, const Tensor& bound,
                   const std::vector<bool>& mask) {
  double worst = 0;
  for (int64_t i = 0; i < y.numel(); ++i) {
    if ((!mask.empty() && !mask[size_t(i)]) || !std::isfinite(x[i]) || !std::isfinite(y[i]))
      continue;
    const double lim = bound[i] + std::ldexp(std::fabs(y[i]), -100);
    const double err = std::fabs(x[i] - y[i]);
    if (err > 0)
      worst = std::max(worst, lim > 0 ? err / lim : std::numeric_limits<double>::infinity());
  }
  return worst;
}

double agreeing_bits(const Case& k, const Outputs& a, const Outputs& b,
                     const std::vector<std::string>& tensors) {
  double worst = 0;
  for (const std::string& name : tensors) {
    const Tensor& x = a.tensors.at(name);
    const Tensor& y = b.tensors.at(name);
    const Tensor* xl = a.lo.count(name) ? &a.lo.at(name) : nullptr;
    const Tensor* yl = b.lo.count(name) ? &b.lo.at(name) : nullptr;
    const std::vector<bool> mask = valid_mask(k, name);
    const bool vector_rows = name == "out" || name == "latent_out" || name == "q_latent";
    const int64_t width = vector_rows ? y.shape.back() : 1;
    for (int64_t row = 0; row < y.numel() / width; ++row) {
      double dmax = 0, ymax = name == "lse" ? 1.0 : 0.0;
      for (int64_t j = row * width; j < (row + 1) * width; ++j) {
        if (!mask.empty() && !mask[size_t(j)]) continue;
        if (!std::isfinite(x[j]) || !std::isfinite(y[j])) {
          if (!same_nonfinite(x[j], y[j])) return 0.0;
          continue;
        }
        double d = x[j] - y[j];
        if (xl) d += (*xl)[j];
        if (yl) d -= (*yl)[j];
        dmax = std::max(dmax, std::fabs(d));
        ymax = std::max(ymax, std::fabs(y[j]));
      }
      if (dmax > 0) worst = std::max(worst, ymax > 0 ? dmax / ymax : 1.0);
    }
  }
  return worst == 0 ? 120.0 : std::min(120.0, -std::log2(worst));
}

}  // namespace qkmla
