#include "reference/deep_diff.hpp"

#include <mpfr.h>

#include <algorithm>
#include <cmath>

namespace qkmla::ref {

namespace {
// x = hi + lo + deep... exactly (at 8192 bits every partial sum of these doubles is exact).
void value(mpfr_t x, const Outputs& o, const std::string& name, int64_t i) {
  mpfr_set_d(x, o.tensors.at(name)[i], MPFR_RNDN);
  if (o.lo.count(name)) mpfr_add_d(x, x, o.lo.at(name)[i], MPFR_RNDN);
  if (o.deep.count(name))
    for (const Tensor& t : o.deep.at(name)) mpfr_add_d(x, x, t[i], MPFR_RNDN);
}
}  // namespace

double deep_rel_diff(const Case& k, const Outputs& a, const Outputs& truth,
                     const std::vector<std::string>& tensors) {
  mpfr_t x, y;
  mpfr_inits2(8192, x, y, (mpfr_ptr) nullptr);
  double worst = 0;
  for (const std::string& name : tensors) {
    const Tensor& ref = truth.tensors.at(name);
    const std::vector<bool> mask = valid_mask(k, name);
    const int64_t width = (name == "out" || name == "latent_out") ? ref.shape.back() : 1;
    for (int64_t row = 0; row < ref.numel() / width; ++row) {
      double dmax = 0, ymax = name == "lse" ? 1.0 : 0.0;
      for (int64_t j = row * width; j < (row + 1) * width; ++j) {
        if ((!mask.empty() && !mask[size_t(j)]) || !std::isfinite(ref[j])) continue;
        value(x, a, name, j);
        value(y, truth, name, j);
        mpfr_sub(x, x, y, MPFR_RNDN);
        dmax = std::max(dmax, std::fabs(mpfr_get_d(x, MPFR_RNDN)));
        ymax = std::max(ymax, std::fabs(ref[j]));
      }
      if (ymax > 0) worst = std::max(worst, dmax / ymax);
    }
  }
  mpfr_clears(x, y, (mpfr_ptr) nullptr);
  return worst;
}

}  // namespace qkmla::ref
