// Arithmetic shared by the CPU profile implementations. Acc is the accumulate type (float or
// double); every loop runs in one fixed order, so results do not depend on vector width.
#pragma once
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "bounds/eb_simd.hpp"
#include "core/case.hpp"
#include "core/design.hpp"
#include "core/rope.hpp"
#include "gemm/ordered_gemm.hpp"

namespace qkmla::impl {

// A decimal constant of the config (eps, the softmax scale) in Acc: one rounding, which the
// error-bound type accounts for (EB::converted).
template <class Acc>
Acc constant(double x) {
  if constexpr (std::is_floating_point_v<Acc>)
    return Acc(x);
  else
    return Acc::converted(x);
}

template <class Acc>
std::vector<Acc> to_acc(const Tensor& t) {
  return std::vector<Acc>(t.data.begin(), t.data.end());  // exact: stored dtype is within Acc
}

// Sequence b's latent cache as an implementation reads it: rows [t0, t0 + n) into out [n, r], the
// stored values, or in the fp8 profile code x scale computed in Acc (fp32: one rounding of the
// exact product; the error-bound type accounts for it; fp64: exact). Each row is its own: rows
// read a block at a time are the rows read all at once.
struct LatentSource {
  const Tensor* kv = nullptr;     // [B, T_max, r]
  const Tensor* scale = nullptr;  // fp8: [B, T_max] or (fp8-block128) [B, T_max, ceil(r / 128)]
  int b = 0;
  LatentSource() = default;
  LatentSource(const Case& k, int seq)
      : kv(&k.get("kv_c")), scale(k.has("kv_c_scale") ? &k.get("kv_c_scale") : nullptr), b(seq) {}
  int64_t width() const { return kv->shape[2]; }
  template <class Acc>
  void read(int64_t t0, int64_t n, Acc* out) const {
    const int64_t r = width();
    if (!scale) {
      kv->read(kv->index({b, t0, 0}), n * r, out);  // either storage (a compact long cache)
      return;
    }
    const double* src = kv->ptr({b, t0, 0});                             // fp8 codes: never compact
    const int64_t per = scale->shape.size() == 3 ? scale->shape[2] : 1;  // scale j: 128 j ...
    const int64_t block = per > 1 ? 128 : r;
    for (int64_t t = 0; t < n; ++t)
      for (int64_t l = 0; l < r; ++l)
        out[t * r + l] =
            Acc(src[t * r + l]) * Acc((*scale)[(b * scale->shape[1] + t0 + t) * per + l / block]);
  }
};

template <class Acc>
std::vector<Acc> latent_rows(const Case& k, int b, int64_t t0, int64_t n) {
  const LatentSource src(k, b);
  std::vector<Acc> out(static_cast<size_t>(n * src.width()));
  src.read(t0, n, out.data());
  return out;
}

// All T rows of sequence b: [T, r].
template <class Acc>
std::vector<Acc> latent_rows(const Case& k, int b, int64_t T) {
  return latent_rows<Acc>(k, b, 0, T);
}

// Round an accumulated value to the stored dtype (RNE, once, from the Acc value). A float's bf16
// and fp32 stores inline (round_to's bits: test dtype.store_inline_matches_round_to).
template <class Acc>
Acc store(DType d, Acc x) {
  if constexpr (std::is_same_v<Acc, float>) {
    if (d == DType::F32) return x;
    if (d == DType::BF16 && !std::isnan(x)) return round_bf16(x);
  }
  return Acc(round_to(d, double(x)));
}

// A rounding point of a design (core/design.hpp): x stored in format d, or kept as it is when d is
// the accumulate type A (nothing is rounded there, and the error-bound type adds nothing).
template <class Acc>
Acc round_point(DType d, DType A, Acc x) {
  return d == A ? x : store(d, x);
}

// Summation orders. Every sum of a profile implementation takes its terms in one order: forward by
// default (the proofs and the error bounds assume it). A yardstick (harness/yardstick.hpp) also
// runs a design in other correct orders, reversed and split over 2 or 8 lanes whose partial sums
// are added at the end, as a vectorized or split-KV kernel does, to sample how much correct
// implementations of one design differ on a case. Per thread.
struct SumOrder {
  bool reverse = false;
  int lanes = 1;
  int splits = 1;  // attention rows split into this many KV chunks combined by their lse
  // > 0: attention rows split into KV chunks of this many tokens instead (an audit's declared
  // --kv-chunk: a chunked prefill merging as many chunks as its row has)
  int chunk = 0;
  bool splitting() const { return splits > 1 || chunk > 0; }
  // The tokens per chunk of a row of n tokens; 0: the row is not split.
  size_t chunk_tokens(size_t n) const {
    if (chunk > 0) return n > size_t(chunk) ? size_t(chunk) : 0;
    return splits > 1 && n >= size_t(splits) ? (n + size_t(splits) - 1) / size_t(splits) : 0;
  }
};
inline SumOrder& sum_order() {
  thread_local SumOrder o;
  return o;
}
inline bool forward_order() {
  return !sum_order().reverse && sum_order().lanes == 1 && !sum_order().splitting();
}

// sum_{j < n} term(j) in the current order.
template <class Acc, class Term>
Acc ordered_sum(int n, const Term& term) {
  if (forward_order()) {
    Acc s = 0;
    for (int j = 0; j < n; ++j) s += term(j);
    return s;
  }
  const SumOrder o = sum_order();
  Acc total = 0;
  for (int lane = 0; lane < o.lanes; ++lane) {
    Acc s = 0;
    for (int k = lane; k < n; k += o.lanes) s += term(o.reverse ? n - 1 - k : k);
    total += s;
  }
  return total;
}

// y[j] += sum_{l < n} coef(l) * row(l)[j] for j < cols, each output's terms in the current order
// (y holds zeros on entry). The inner loop runs across outputs and vectorizes.
template <class Acc, class Coef, class Row>
void ordered_accumulate(int64_t n, int cols, const Coef& coef, const Row& row, Acc* y) {
  if (forward_order()) {
    if constexpr (std::is_same_v<Acc, bounds::EB>) {  // the same values, vectorized
      for (int64_t l = 0; l < n; ++l) bounds::eb_axpy(coef(l), row(l), y, cols);
      return;
    }
    for (int64_t l = 0; l < n; ++l) {
      const Acc c = coef(l);
      const Acc* r = row(l);
      for (int j = 0; j < cols; ++j) y[j] += c * r[j];
    }
    return;
  }
  const SumOrder o = sum_order();
  std::vector<Acc> part(static_cast<size_t>(cols));
  for (int lane = 0; lane < o.lanes; ++lane) {
    std::fill(part.begin(), part.end(), Acc(0));
    for (int64_t k = lane; k < n; k += o.lanes) {
      const int64_t l = o.reverse ? n - 1 - k : k;
      const Acc c = coef(l);
      const Acc* r = row(l);
      for (int j = 0; j < cols; ++j) part[size_t(j)] += c * r[j];
    }
    for (int j = 0; j < cols; ++j) y[j] += part[size_t(j)];
  }
}

template <class Acc>
Acc sum_sq(const Acc* z, int n) {
  return ordered_sum<Acc>(n, [&](int j) { return z[j] * z[j]; });
}

template <class Acc>
Acc dot(const Acc* a, const Acc* b, int n) {
  return ordered_sum<Acc>(n, [&](int j) { return a[j] * b[j]; });
}

// out[u] = dot(a, rows[u], n) for u < m, each in the current order: the same terms added in the
// same order, bit for bit (a sum of one lane in order is that sum, as in the forward order; only
// the sign of an exact zero can differ from ordered_sum's `0 + s`). Eight rows at a time, so that
// their sums, each sequential, run side by side: one dot alone waits on its adds' latency.
template <class Acc>
void ordered_dots(const Acc* a, const Acc* const* rows, int64_t m, int n, Acc* out) {
  if constexpr (std::is_same_v<Acc, bounds::EB>) {
    // Rows evenly spaced (a weight matrix's rows, a cache's tokens): a vector lane per row.
    const int64_t stride = m > 1 ? rows[1] - rows[0] : 0;
    bool even = forward_order() && m > 1;
    for (int64_t u = 2; even && u < m; ++u) even = rows[u] - rows[0] == u * stride;
    if (even) return bounds::eb_dots(a, rows[0], stride, m, n, out);
  }
  constexpr int U = 8;
  int64_t u0 = 0;
  {  // the error-bound type too (rows not evenly spaced): its chains wait on latency as well
    const SumOrder o = forward_order() ? SumOrder{} : sum_order();
    for (; u0 + U <= m; u0 += U) {
      const Acc* p[U];
      for (int u = 0; u < U; ++u) p[u] = rows[u0 + u];
      Acc total[U] = {};
      for (int lane = 0; lane < o.lanes; ++lane) {
        Acc s[U] = {};
        for (int k = lane; k < n; k += o.lanes) {
          const int j = o.reverse ? n - 1 - k : k;
          const Acc x = a[j];
          for (int u = 0; u < U; ++u) s[u] += x * p[u][j];
        }
        for (int u = 0; u < U; ++u) total[u] = o.lanes == 1 ? s[u] : total[u] + s[u];
      }
      for (int u = 0; u < U; ++u) out[u0 + u] = total[u];
    }
  }
  for (; u0 < m; ++u0) out[u0] = dot(a, rows[u0], n);
}

// dot(a, b) with every partial sum rounded to bf16 when `lowp` (the *_lowp mutants' accumulation).
template <class Acc>
Acc dot_maybe_lowp(const Acc* a, const Acc* b, int n, bool lowp) {
  if (!lowp) return dot(a, b, n);
  Acc s = 0;
  for (int j = 0; j < n; ++j) s = store(DType::BF16, s + a[j] * b[j]);
  return s;
}

// An approximate reciprocal square root's result (rsqrt.approx is within 2 ulp): y moved by -2..2
// ulp of Acc, picked by y's own bits, so that every run of a design moves a value alike.
template <class Acc>
Acc approx_rsqrt_of(Acc y) {
  if constexpr (!std::is_floating_point_v<Acc>) {
    return y;
  } else {
    int e = 0;
    const uint64_t bits = uint64_t(std::llround(std::fabs(std::frexp(double(y), &e)) * 0x1p40));
    const int k = int((bits * 0x9E3779B97F4A7C15ull) >> 61) % 5 - 2;
    return y * (Acc(1) + Acc(k) * std::numeric_limits<Acc>::epsilon() / Acc(2));
  }
}

// The softmax scale as the design holds it: sigma, stored first where the design stores it.
inline double design_sigma(const Design& d, double sigma) {
  return d.sigma == DType::F64 ? sigma : round_to(d.sigma, sigma);
}

// The softmax scale a design multiplies its scores by: sigma (design_sigma), or 1 when sigma is
// folded into the query; times log2(e) (one rounding of the product) when the design exponentiates
// in base 2.
template <class Acc>
Acc design_scale(const Design& d, double sigma) {
  const double s = d.scale_in_q ? 1.0 : design_sigma(d, sigma);
  return constant<Acc>(d.exp2 ? s * 1.4426950408889634 : s);
}

// 1 / sqrt(sum_sq / n + eps), all in Acc (E.2).
template <class Acc>
Acc inv_rms_from(Acc sum_sq, int n, Acc eps) {
  using std::sqrt;  // unqualified: the error-bound type brings its own (bounds/error_bound.hpp)
  return Acc(1) / sqrt(sum_sq / Acc(n) + eps);
}

// y_j = (z_j * gamma_j) * inv (E.3), in Acc.
template <class Acc>
void scale_gain(Acc* z, int n, const Acc* gamma, Acc inv) {
  for (int j = 0; j < n; ++j) z[j] = (z[j] * gamma[j]) * inv;
}

template <class Acc>
void rotate(Acc* z, const Case& k, int64_t pos) {
  rope_rotate(z, k.cfg.d_r, k.cfg.rope_style, k.get("rope_cos"), k.get("rope_sin"), pos);
}

// y[cols] = x[rows] . W[rows, ld] restricted to columns [col0, col0 + cols): for each output,
// one sequential sum over rows (the inner loop runs across outputs and vectorizes).
template <class Acc>
void vec_mat(const Acc* x, int rows, const Acc* W, int ld, int col0, int cols, Acc* y) {
  for (int j = 0; j < cols; ++j) y[j] = 0;
  ordered_accumulate<Acc>(
      rows, cols, [&](int64_t l) { return x[l]; }, [&](int64_t l) { return W + l * ld + col0; }, y);
}

// Tokens whose keys and values the CPU implementations project at a time (rows_mat over a block of
// the latent rows): each row's sums are its own, so blocks give the values of the whole product,
// and the projected cache stays a block long at any context.
constexpr int64_t kProjectTokens = 256;

// rows_mat in a yardstick's order o by ordered_gemm: each lane's terms (l = lane, lane + lanes,
// ..., counted from the end when reversed) gathered in that order into X and W copies, so that the
// GEMM's one sequential sum from +0 is ordered_accumulate's `part`; the parts added to +0 in turn.
template <class T>
void lanes_gemm(const T* X, int64_t rows, int n, const T* W, int ld, int cols, T* Y,
                const SumOrder& o) {
  std::fill(Y, Y + rows * cols, T(0));
  std::vector<T> xl, wl, part(static_cast<size_t>(rows * cols));
  std::vector<int> at;  // the lane's inner indices, in its order
  for (int lane = 0; lane < o.lanes; ++lane) {
    at.clear();
    for (int k = lane; k < n; k += o.lanes) at.push_back(o.reverse ? n - 1 - k : k);
    const int c = int(at.size());
    xl.resize(static_cast<size_t>(rows * c));
    wl.resize(static_cast<size_t>(c) * size_t(cols));
    for (int64_t i = 0; i < rows; ++i)
      for (int t = 0; t < c; ++t) xl[size_t(i * c + t)] = X[i * n + at[size_t(t)]];
    for (int t = 0; t < c; ++t)
      std::copy_n(W + int64_t(at[size_t(t)]) * ld, cols, wl.begin() + int64_t(t) * cols);
    gemm::ordered_gemm(xl.data(), rows, c, wl.data(), cols, cols, part.data(), gemm::Fused::No);
    for (size_t i = 0; i < part.size(); ++i) Y[i] += part[i];
  }
}

// Y[rows, cols] = X[rows, n] . W[n, ld] (columns [0, cols)), each output one sequential sum over
// n exactly as vec_mat: by ordered_gemm (SIMD across outputs, register tiles) for float and double
// (in a yardstick's order by lanes_gemm), row by row through ordered_accumulate otherwise.
template <class Acc>
void rows_mat(const Acc* X, int64_t rows, int n, const Acc* W, int ld, int cols, Acc* Y) {
  if constexpr (std::is_same_v<Acc, float> || std::is_same_v<Acc, double>) {
    if (forward_order()) return gemm::ordered_gemm(X, rows, n, W, ld, cols, Y, gemm::Fused::No);
    return lanes_gemm(X, rows, n, W, ld, cols, Y, sum_order());
  }
  for (int64_t i = 0; i < rows * cols; ++i) Y[i] = 0;
  for (int64_t i = 0; i < rows; ++i)
    ordered_accumulate<Acc>(
        n, cols, [&](int64_t l) { return X[i * n + l]; }, [&](int64_t l) { return W + l * ld; },
        Y + i * cols);
}

// Softmax over one row's visible logits: lse = m + log(sum exp(l - m)), p = exp(l - m) / sum.
// With `unnormalized`, p is left as exp(l - m) and *unnormalized receives the sum, as a kernel's
// tile keeps it: the largest weight exactly 1, the division after p.v.
template <class Acc>
Acc softmax(std::vector<Acc>& logits_to_p, Acc* unnormalized = nullptr) {
  if (logits_to_p.empty()) return -std::numeric_limits<Acc>::infinity();
  Acc m = logits_to_p[0];
  for (Acc l : logits_to_p) m = std::max(m, l);
  for (Acc& l : logits_to_p) l = std::exp(l - m);
  const Acc sum =
      ordered_sum<Acc>(int(logits_to_p.size()), [&](int t) { return logits_to_p[size_t(t)]; });
  if (unnormalized)
    *unnormalized = sum;
  else
    for (Acc& l : logits_to_p) l /= sum;
  return m + std::log(sum);
}

// The same over base-2 logits (the scale carried log2 e): p = exp2(l - m) / sum, and the natural
// lse (m + log2 sum) ln 2, as exp2 kernels return it.
template <class Acc>
Acc softmax_base2(std::vector<Acc>& logits_to_p, Acc* unnormalized = nullptr) {
  if (logits_to_p.empty()) return -std::numeric_limits<Acc>::infinity();
  Acc m = logits_to_p[0];
  for (Acc l : logits_to_p) m = std::max(m, l);
  for (Acc& l : logits_to_p) l = std::exp2(l - m);
  const Acc sum =
      ordered_sum<Acc>(int(logits_to_p.size()), [&](int t) { return logits_to_p[size_t(t)]; });
  if (unnormalized)
    *unnormalized = sum;
  else
    for (Acc& l : logits_to_p) l /= sum;
  return (m + std::log2(sum)) * Acc(0.6931471805599453);
}

}  // namespace qkmla::impl
