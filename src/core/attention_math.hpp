// The two formulas every implementation shares, whatever its arithmetic (MPFR, fp64, fp32, the
// error-bound type, CUDA): which cached tokens a query sees (conventions §1.1, §1.4) and how a
// logit is assembled from its latent (content) and rope dot products (conventions §1.1, §1.2).
// C++17 and dependency-free, so the CUDA kernels include it too (gpu/kernels/stages.hpp).
#pragma once
#include <cstdint>
#ifndef __CUDACC__
#include <cmath>
#include <limits>
#endif

#ifdef __CUDACC__
#define QKMLA_HD __host__ __device__ __forceinline__
#else
#define QKMLA_HD inline
#endif

namespace qkmla {

// a * b rounded on its own: on a CUDA device a product the compiler may not contract with a
// following add into an fma, whatever its --fmad flag (the CPU builds use -ffp-contract=off).
template <class T>
QKMLA_HD T product(const T& a, const T& b) {
  return T(a * b);
}
#ifdef __CUDA_ARCH__
QKMLA_HD float product(const float& a, const float& b) { return __fmul_rn(a, b); }
#endif

// Is cached token t of a sequence of T_b tokens visible to query i of s_q? The query sits at
// pos(i) = T_b - s_q + i. `extra` widens the causal window (only the causal_off_by_one mutant
// sets it). Slots t >= T_b are never visible.
QKMLA_HD bool token_visible(bool causal, int64_t T_b, int s_q, int i, int64_t t, int extra = 0) {
  return t < T_b && (!causal || t <= T_b - s_q + i + extra);
}

// The logit of one (query row, token). `s` is alpha_q * alpha_k (already multiplied, in that
// order, by the caller), `latent` the content score (q_latent . c, or qc^ . kc^ in the explicit
// form) and `rope` the rope score. Blockwise (A.4): sigma (s latent + rope); unified (U.1):
// sigma s (latent + rope). Every implementation uses this order of operations.
template <class T>
QKMLA_HD T latent_logit(bool unified, const T& scale, const T& s, const T& latent, const T& rope) {
  if (unified) return product(scale, product(s, T(latent + rope)));
  return product(scale, T(product(s, latent) + rope));
}

// The logit of a form whose keys and queries are already normalized (the explicit form, plain
// MLA): sigma (content + rope) (E.5).
template <class T>
QKMLA_HD T plain_logit(const T& scale, const T& content, const T& rope) {
  return product(scale, T(content + rope));
}

#ifndef __CUDACC__
// Attention sink (conventions §1.5): a row's out is multiplied by exp(lse) / (exp(lse) + exp(s)) =
// 1 / (1 + exp(s - lse)). An empty row (lse = -inf) has out = 0 and factor 0; a sink of -inf is no
// sink (factor 1). Host only: the CUDA kernels do not take a sink (conventions §10).
template <class T>
T sink_factor(const T& s, const T& lse) {
  using std::exp;
  if (lse == -std::numeric_limits<double>::infinity()) return T(0);
  return T(1) / T(T(1) + exp(T(s - lse)));
}
#endif

}  // namespace qkmla
