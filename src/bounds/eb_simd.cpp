// eb_axpy for each Highway target; foreach_target.h compiles this file once per target.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "bounds/eb_simd.cpp"
#include "bounds/eb_simd.hpp"

#include <hwy/foreach_target.h>  // must come before highway.h
#include <hwy/highway.h>

#include <cmath>

HWY_BEFORE_NAMESPACE();
namespace qkmla::bounds::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using D = hn::ScalableTag<double>;
using V = hn::Vec<D>;

// times0: x * y, or 0 where either is 0 (error_bound.hpp).
HWY_INLINE V Times0(D d, V x, V y) {
  const V zero = hn::Zero(d);
  return hn::IfThenZeroElse(hn::Or(hn::Eq(x, zero), hn::Eq(y, zero)), hn::Mul(x, y));
}

// up(): x (1 + 2^-48) + 2^-1068, a multiply then an add, as the scalar code rounds them.
HWY_INLINE V Up(D d, V x) {
  return hn::Add(hn::Mul(x, hn::Set(d, 1.0 + 0x1p-48)), hn::Set(d, 0x1p-1068));
}

void EbAxpy(const EB& c, const EB* x, EB* y, int64_t n) {
  static_assert(sizeof(EB) == 3 * sizeof(double), "EB is (v, e, f), three doubles");
  const D d;
  const int64_t N = int64_t(hn::Lanes(d));
  const V u = hn::Set(d, units().u), eta = hn::Set(d, units().eta), k = hn::Set(d, units().k);
  const double ka = k_of(c);
  const V av = hn::Set(d, c.v), ae = hn::Set(d, c.e), ax = hn::Abs(av), cf = hn::Set(d, c.f);
  const V kae = hn::Set(d, ka * c.e), one_ka = hn::Set(d, 1 + ka);
  const V two = hn::Set(d, 2.0), grow = hn::Set(d, 1 + 2 * kU0);
  const bool a_exact = c.e == 0;
  int64_t j = 0;
  for (; j + N <= n; j += N) {
    V bv, be, bf, yv, ye, yf;
    hn::LoadInterleaved3(d, reinterpret_cast<const double*>(x + j), bv, be, bf);
    hn::LoadInterleaved3(d, reinterpret_cast<const double*>(y + j), yv, ye, yf);
    // B.2: the product c * x[j]
    const V kb = hn::Max(k, bf);
    const V pv = hn::Mul(av, bv), bx = hn::Abs(bv);
    const V t_bx_ae = Times0(d, bx, ae), t_ax_be = Times0(d, ax, be);
    const V other = a_exact ? t_ax_be
                            : hn::Add(hn::Add(t_ax_be, t_bx_ae),
                                      hn::Mul(hn::Add(one_ka, kb), Times0(d, ae, be)));
    const V dd = hn::IfThenElse(hn::Eq(be, hn::Zero(d)), t_bx_ae, other);
    const V m = hn::Add(Times0(d, hn::Add(ax, kae), hn::Add(bx, hn::Mul(kb, be))), dd);
    const V pe = Up(d, hn::Add(hn::Add(dd, hn::Mul(u, m)), eta));
    // B.1: y[j] + that product
    const V v = hn::Add(yv, pv), s = hn::Add(ye, pe);
    const V e = Up(d, hn::Add(s, hn::Mul(u, hn::Add(hn::Mul(hn::Abs(v), grow), hn::Mul(two, s)))));
    hn::StoreInterleaved3(v, e, hn::Max(yf, hn::Max(cf, bf)), d, reinterpret_cast<double*>(y + j));
  }
  for (; j < n; ++j) y[j] += c * x[j];
}

}  // namespace qkmla::bounds::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace qkmla::bounds {

HWY_EXPORT(EbAxpy);

void eb_axpy(const EB& c, const EB* x, EB* y, int64_t n) {
  HWY_DYNAMIC_DISPATCH(EbAxpy)(c, x, y, n);
}

}  // namespace qkmla::bounds
#endif
