// eb_axpy and eb_dots for each Highway target; foreach_target.h compiles this file once per target.
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

// The scalar operand c of y + c * b, with what every lane needs of it.
struct Coef {
  V av, ae, ax, cf, kae, one_ka;
  bool exact;
  Coef(D d, const EB& c)
      : av(hn::Set(d, c.v)),
        ae(hn::Set(d, c.e)),
        ax(hn::Abs(av)),
        cf(hn::Set(d, c.f)),
        kae(hn::Set(d, k_of(c) * c.e)),
        one_ka(hn::Set(d, 1 + k_of(c))),
        exact(c.e == 0) {}
};

// (yv, ye, yf) = y + c * b in every lane, by B.2 then B.1: the scalar operators' operations in
// their order (error_bound.hpp), no fused multiply-add.
HWY_INLINE void AddProduct(D d, const Coef& c, V bv, V be, V bf, V& yv, V& ye, V& yf) {
  const V u = hn::Set(d, units().u), eta = hn::Set(d, units().eta);
  const V kb = hn::Max(hn::Set(d, units().k), bf);
  const V pv = hn::Mul(c.av, bv), bx = hn::Abs(bv);
  const V t_bx_ae = Times0(d, bx, c.ae), t_ax_be = Times0(d, c.ax, be);
  const V other = c.exact ? t_ax_be
                          : hn::Add(hn::Add(t_ax_be, t_bx_ae),
                                    hn::Mul(hn::Add(c.one_ka, kb), Times0(d, c.ae, be)));
  const V dd = hn::IfThenElse(hn::Eq(be, hn::Zero(d)), t_bx_ae, other);
  const V m = hn::Add(Times0(d, hn::Add(c.ax, c.kae), hn::Add(bx, hn::Mul(kb, be))), dd);
  const V pe = Up(d, hn::Add(hn::Add(dd, hn::Mul(u, m)), eta));
  const V v = hn::Add(yv, pv), s = hn::Add(ye, pe);
  const V grow = hn::Set(d, 1 + 2 * kU0), two = hn::Set(d, 2.0);
  ye = Up(d, hn::Add(s, hn::Mul(u, hn::Add(hn::Mul(hn::Abs(v), grow), hn::Mul(two, s)))));
  yv = v;
  yf = hn::Max(yf, hn::Max(c.cf, bf));
}

void EbAxpy(const EB& c, const EB* x, EB* y, int64_t n) {
  static_assert(sizeof(EB) == 3 * sizeof(double), "EB is (v, e, f), three doubles");
  const D d;
  const int64_t N = int64_t(hn::Lanes(d));
  const Coef cc(d, c);
  int64_t j = 0;
  for (; j + N <= n; j += N) {
    V bv, be, bf, yv, ye, yf;
    hn::LoadInterleaved3(d, reinterpret_cast<const double*>(x + j), bv, be, bf);
    hn::LoadInterleaved3(d, reinterpret_cast<const double*>(y + j), yv, ye, yf);
    AddProduct(d, cc, bv, be, bf, yv, ye, yf);
    hn::StoreInterleaved3(yv, ye, yf, d, reinterpret_cast<double*>(y + j));
  }
  for (; j < n; ++j) y[j] += c * x[j];
}

// out[u] = sum over j of a[j] * rows[u][j], row u at rows + u * stride, each sum from +0 in
// increasing j: a lane per row, the rows' terms gathered.
void EbDots(const EB* a, const EB* rows, int64_t stride, int64_t m, int n, EB* out) {
  const D d;
  const hn::RebindToSigned<D> di;
  const int64_t N = int64_t(hn::Lanes(d));
  const double* base = reinterpret_cast<const double*>(rows);
  int64_t u0 = 0;
  for (; u0 + N <= m; u0 += N) {
    const auto at = hn::Mul(hn::Add(hn::Iota(di, 0), hn::Set(di, u0)), hn::Set(di, 3 * stride));
    V yv = hn::Zero(d), ye = hn::Zero(d), yf = hn::Zero(d);
    for (int j = 0; j < n; ++j) {
      const auto idx = hn::Add(at, hn::Set(di, 3 * int64_t(j)));
      const V bv = hn::GatherIndex(d, base, idx), be = hn::GatherIndex(d, base + 1, idx);
      const V bf = hn::GatherIndex(d, base + 2, idx);
      AddProduct(d, Coef(d, a[j]), bv, be, bf, yv, ye, yf);
    }
    hn::StoreInterleaved3(yv, ye, yf, d, reinterpret_cast<double*>(out + u0));
  }
  for (; u0 < m; ++u0) {
    EB s = 0;
    for (int j = 0; j < n; ++j) s += a[j] * rows[u0 * stride + j];
    out[u0] = s;
  }
}

}  // namespace qkmla::bounds::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace qkmla::bounds {

HWY_EXPORT(EbAxpy);
HWY_EXPORT(EbDots);

void eb_axpy(const EB& c, const EB* x, EB* y, int64_t n) {
  HWY_DYNAMIC_DISPATCH(EbAxpy)(c, x, y, n);
}

void eb_dots(const EB* a, const EB* rows, int64_t stride, int64_t m, int n, EB* out) {
  HWY_DYNAMIC_DISPATCH(EbDots)(a, rows, stride, m, n, out);
}

}  // namespace qkmla::bounds
#endif
