#include "harness/logit_noise.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "impl/attention_core.hpp"
#include "metrics/structure.hpp"

namespace qkmla {

namespace {

// Dithered draws per stored-logit design. A near tie's row error is one normal value (one
// degree of freedom): an independent draw exceeds 4x its RMS over 8 draws with probability 0.4 %
// (Student's t, 8 dof), over 4 draws 1.6 %. Each draw costs one more run of the design.
constexpr int kDraws = 8;
// An fp8 (e4m3) query moves every logit by ~2^-5 of its size, so a row whose two largest logits
// lie that close flips its argmax in some draws and not in others: a two-valued row error, not a
// normal one, whose flips 8 draws miss with probability (1 - p)^8 (zoo style fp8_attention, seed
// 108251: a row the draws never flipped, 0.32 off in the style). 32 draws miss a 1-in-5 flip one
// time in 1300; only a declared fp8 design pays for them.
constexpr int kManyDraws = 32;
// A row whose noise level is this many times the median row's is ill-conditioned (a near tie of
// two stored logits: zoo 100326's row was 10 % off, the rest of its rows ~0.1 %).
constexpr double kIllRow = 10;

// e minus its projection on `basis` (orthonormal), twice over (Gram-Schmidt's second pass keeps
// what cancellation in the first leaves), in place.
void project_out(const std::vector<std::vector<double>>& basis, std::vector<double>& e) {
  for (int pass = 0; pass < 2; ++pass)
    for (const std::vector<double>& b : basis) {
      long double dot = 0;
      for (size_t i = 0; i < e.size(); ++i) dot += (long double)e[i] * b[i];
      for (size_t i = 0; i < e.size(); ++i) e[i] -= double(dot) * b[i];
    }
}

double norm(const std::vector<double>& v) {
  long double s = 0;
  for (double x : v) s += (long double)x * x;
  return double(std::sqrt(s));
}

// Row r of a [.., w] tensor, non-finite entries as 0.
std::vector<double> row_of(const Tensor& x, size_t r, int64_t w) {
  std::vector<double> v(static_cast<size_t>(w));
  for (int64_t j = 0; j < w; ++j) {
    const double e = x[int64_t(r) * w + j];
    v[size_t(j)] = std::isfinite(e) ? e : 0.0;
  }
  return v;
}

// The basis of ill-conditioned row r (Yardstick::ill_basis): each draw's change of the row as far
// as it leaves the span so far by more than `floor` (the median row's noise level times |y_r|: a
// direction the draws move the row along as much as they move an ordinary row at all; a lower
// floor only takes noise directions too). Not the reference row itself: a tie moves the row
// towards the tied tokens' values, and a design whose draws do scale the row (a sink near the
// row's lse) puts that direction in through its draws; a free row scale let one head x 1.10 pass
// on an ill row (probe seed 555511).
std::vector<std::vector<double>> tie_basis(const std::vector<const Changes*>& chs,
                                           const std::string& t, const Tensor& ref, size_t r,
                                           double median) {
  const int64_t w = ref.shape[3];
  std::vector<std::vector<double>> basis;
  auto add = [&](std::vector<double> v, double floor) {
    if (int64_t(basis.size()) >= w) return;
    project_out(basis, v);
    const double n = norm(v);
    if (!(n > floor)) return;
    for (double& x : v) x /= n;
    basis.push_back(std::move(v));
  };
  const double floor = std::max(median, 1e-300) * norm(row_of(ref, r, w));
  for (const Changes* ch : chs)
    for (const auto& [n, per_t] : *ch)
      if (per_t.count(t))
        for (const Tensor& d : per_t.at(t)) add(row_of(d, r, w), floor);
  return basis;
}

double residual(const std::vector<std::vector<double>>& basis, std::vector<double> e, double ny) {
  if (!(ny > 0)) return 0.0;
  project_out(basis, e);
  return norm(e) / ny;
}

// A dithered draw on this thread while in scope (impl/attention_core.hpp LogitDither).
struct DitherScope {
  DitherScope(int draw, bool chain, double amplitude) {
    impl::logit_dither().draw = draw;
    impl::logit_dither().chain = chain;
    impl::logit_dither().amplitude = amplitude;
    // a chain draw's (a wide draw's) stream apart from the final-logit draw of the same index
    impl::logit_dither().rng = Rng(uint64_t(draw) + (chain ? 1001 : amplitude != 1 ? 2001 : 1));
  }
  ~DitherScope() {
    impl::logit_dither().draw = -1, impl::logit_dither().chain = false;
    impl::logit_dither().amplitude = 1;
  }
};

// Per tensor and row of out and latent_out, the row's noise level under `ch`'s draws: the RMS
// over draws of |d| / |y| over `masks`, the largest over designs; NaN where the row has no
// reference to measure against.
std::map<std::string, std::vector<double>> row_levels(
    const Changes& ch, const TruthOf& truth, std::map<std::string, std::vector<bool>>& masks) {
  std::map<std::string, std::vector<double>> level;
  for (const auto& [n, per_t] : ch)
    for (const auto& [t, ds] : per_t) {
      const Tensor* ref = truth(t);
      if (!ref || ref->shape.size() != 4 || ref->shape[3] == 0) continue;
      const int64_t w = ref->shape[3], rows = ref->numel() / w;
      std::vector<double> sq(size_t(rows), 0.0), yy(size_t(rows), 0.0);
      for (const Tensor& d : ds)
        for (int64_t i = 0; i < d.numel(); ++i)
          if ((masks[t].empty() || masks[t][size_t(i)]) && std::isfinite(d[i]) &&
              std::isfinite((*ref)[i]))
            sq[size_t(i / w)] += d[i] * d[i], yy[size_t(i / w)] += (*ref)[i] * (*ref)[i];
      std::vector<double>& l = level[t];
      l.resize(size_t(rows), std::nan(""));
      for (int64_t r = 0; r < rows; ++r)
        if (yy[size_t(r)] > 0) {
          const double v = std::sqrt(sq[size_t(r)] / yy[size_t(r)]);
          l[size_t(r)] = std::isnan(l[size_t(r)]) ? v : std::max(l[size_t(r)], v);
        }
    }
  return level;
}

double median_of(const std::vector<double>& l) {
  std::vector<double> live;
  for (double v : l)
    if (!std::isnan(v)) live.push_back(v);  // a row the draws leave unchanged counts: 0
  if (live.empty()) return std::nan("");
  std::nth_element(live.begin(), live.begin() + std::ptrdiff_t(live.size() / 2), live.end());
  return live[live.size() / 2];
}

}  // namespace

Changes dithered_changes(const std::map<size_t, std::vector<Outputs>>& base,
                         const std::function<std::vector<Outputs>(size_t)>& rerun,
                         const std::vector<std::string>& tensors, bool chain,
                         const std::set<size_t>& many, double amplitude) {
  Changes ch;
  for (const auto& [n, outs0] : base)
    for (int draw = 0; draw < (many.count(n) ? kManyDraws : kDraws); ++draw) {
      DitherScope scope(draw, chain, amplitude);
      const std::vector<Outputs> outs = rerun(n);
      for (size_t v = 0; v < outs.size() && v < outs0.size(); ++v)
        for (const std::string& t : tensors) {
          if (!outs[v].tensors.count(t) || !outs0[v].tensors.count(t)) continue;
          Tensor d = outs[v].tensors.at(t);  // [as t]
          const Tensor& x0 = outs0[v].tensors.at(t);
          for (int64_t i = 0; i < d.numel(); ++i) d[i] -= x0[i];
          ch[n][t].push_back(std::move(d));
        }
    }
  return ch;
}

void mark_ill_rows(const Changes& ch, const Changes& widen, const TruthOf& truth,
                   std::map<std::string, std::vector<bool>>& masks, Yardstick& y,
                   const Changes& span) {
  // `widen`'s levels, taken before any row leaves the masks
  const std::map<std::string, std::vector<double>> wider = row_levels(widen, truth, masks);
  for (auto& [t, l] : row_levels(ch, truth, masks)) {
    const double median = median_of(l);
    if (std::isnan(median)) continue;
    const int64_t w = truth(t)->shape[3];
    std::vector<bool> ill(size_t(truth(t)->numel()), false);
    bool any = false;
    for (size_t r = 0; r < l.size(); ++r) {
      if (std::isnan(l[r]) || !(l[r] > kIllRow * median)) {
        l[r] = 0;
        continue;
      }
      any = true;
      if (wider.count(t) && !std::isnan(wider.at(t)[r])) l[r] = std::max(l[r], wider.at(t)[r]);
      for (int64_t i = int64_t(r) * w; i < int64_t(r + 1) * w; ++i) {
        ill[size_t(i)] = true;
        if (!masks[t].empty()) masks[t][size_t(i)] = false;
      }
    }
    if (!any) continue;
    if (masks[t].empty()) {
      masks[t].assign(ill.size(), true);
      for (size_t i = 0; i < ill.size(); ++i) masks[t][i] = !ill[i];
    }
    const Tensor& ref = *truth(t);
    std::vector<double>& res = y.ill_residual[t];
    res.assign(l.size(), 0.0);
    for (size_t r = 0; r < l.size(); ++r) {
      if (!ill[r * size_t(w)]) continue;
      std::vector<std::vector<double>>& basis = y.ill_basis[t][r];
      basis = tie_basis({&ch, &span}, t, ref, r, median);
      const double ny = norm(row_of(ref, r, w));
      for (const auto& [n, per_t] : ch)  // what the draws leave outside the span
        if (per_t.count(t))
          for (const Tensor& d : per_t.at(t))
            res[r] = std::max(res[r], residual(basis, row_of(d, r, w), ny));
    }
    y.ill[t] = std::move(ill);
    y.ill_allowance[t] = std::move(l);
  }
}

bool has_ill_rows(const Changes& ch, const TruthOf& truth,
                  std::map<std::string, std::vector<bool>>& masks) {
  for (const auto& [t, l] : row_levels(ch, truth, masks)) {
    const double median = median_of(l);
    for (double v : l)
      if (!std::isnan(v) && v > kIllRow * median) return true;
  }
  return false;
}

void noise_levels(const Changes& ch, const TruthOf& truth,
                  std::map<std::string, std::vector<bool>>& masks,
                  const std::vector<double>& lse_floor, Yardstick& y) {
  for (const auto& [n, per_t] : ch)
    for (const auto& [t, ds] : per_t) {
      const Tensor* ref = truth(t);
      if (!ref || ds.empty()) continue;
      Yardstick::Noise a;
      a.design = n, a.tensor = t;
      for (const Tensor& d : ds) {
        Tensor z = *ref;  // [as ref]: the truth moved by the draw's change
        long double dd = 0, yy = 0;
        for (int64_t i = 0; i < z.numel(); ++i) {
          if ((!masks[t].empty() && !masks[t][size_t(i)]) || !std::isfinite(d[i]) ||
              !std::isfinite(z[i]))
            continue;
          dd += (long double)d[i] * d[i], yy += (long double)z[i] * z[i];
          z[i] += d[i];
        }
        const Structure z_st =
            structure_of(z, *ref, masks[t], t == "lse" ? lse_floor : std::vector<double>{});
        const std::vector<double> st = structure_values(z_st);
        a.structure.resize(st.size(), 0.0);
        a.seq_mean.resize(z_st.seq_mean.size(), 0.0);
        a.rel_l2 += yy > 0 ? double(dd / yy) : 0.0;
        for (size_t i = 0; i < st.size(); ++i) {
          // a projection at its draw's noise level as well: one draw of a sum over a few rows
          // is a 1-dof value, whose RMS over eight draws is below half its level one time in 50
          const std::string& name = structure_names()[i];
          const double v = name == "bias"       ? std::max(st[i], z_st.bias_noise)
                           : name == "row_bias" ? std::max(st[i], z_st.row_bias_noise)
                                                : st[i];
          a.structure[i] += v * v;
        }
        for (size_t b = 0; b < a.seq_mean.size(); ++b)
          a.seq_mean[b] += z_st.seq_mean[b] * z_st.seq_mean[b];
      }
      const double count = double(ds.size());
      a.rel_l2 = std::sqrt(a.rel_l2 / count);
      for (double& x : a.structure) x = std::sqrt(x / count);
      for (double& x : a.seq_mean) x = std::sqrt(x / count);
      y.noise.push_back(a);
    }
}

void approximate_exp_noise(const Tensor& ref, const std::vector<bool>& mask,
                           const std::vector<double>& lse_floor, DType A,
                           const std::vector<size_t>& designs, Yardstick& y) {
  const double c = 2 * unit_roundoff(A);
  Tensor z = ref;  // [B, S_q, H]: lse moved by c nats
  long double dd = 0, yy = 0;
  for (int64_t i = 0; i < z.numel(); ++i) {
    if ((!mask.empty() && !mask[size_t(i)]) || !std::isfinite(z[i])) continue;
    z[i] -= c;
    dd += (long double)c * c, yy += (long double)ref[i] * ref[i];
  }
  if (!(yy > 0)) return;
  const Structure st = structure_of(z, ref, mask, lse_floor);
  Yardstick::Noise a;
  a.tensor = "lse";
  a.rel_l2 = double(std::sqrt(dd / yy));
  a.structure = structure_values(st);
  a.structure[0] = std::nan("");  // worst_row: structure_names()[0]
  a.seq_mean = st.seq_mean;
  for (size_t n : designs) a.design = n, y.noise.push_back(a);
}

void widen_ill_allowance(const Tensor& x, const Tensor& ref, const std::string& t, Yardstick& y) {
  if (!y.ill.count(t)) return;
  std::vector<double>& a = y.ill_allowance[t];
  const int64_t w = ref.shape[3];
  for (size_t r = 0; r < a.size(); ++r) {
    if (!y.ill[t][r * size_t(w)]) continue;
    long double dd = 0, yy = 0;
    for (int64_t i = int64_t(r) * w; i < int64_t(r + 1) * w; ++i)
      if (std::isfinite(x[i]) && std::isfinite(ref[i]))
        dd += (long double)(x[i] - ref[i]) * (x[i] - ref[i]), yy += (long double)ref[i] * ref[i];
    if (yy > 0) a[r] = std::max(a[r], double(std::sqrt(dd / yy)));
    std::vector<double>& res = y.ill_residual[t];
    res[r] = std::max(res[r], off_span_residual(y.ill_basis[t][r], x, ref, {}, r, true));
  }
}

double off_span_residual(const std::vector<std::vector<double>>& basis, const Tensor& x,
                         const Tensor& y, const std::vector<bool>& valid, size_t r,
                         bool skip_nonfinite) {
  const int64_t w = y.shape[3];
  std::vector<double> e(size_t(w), 0.0);
  long double yy = 0;
  for (int64_t j = 0; j < w; ++j) {
    const int64_t i = int64_t(r) * w + j;
    if ((!valid.empty() && !valid[size_t(i)]) || !std::isfinite(y[i])) continue;
    if (!std::isfinite(x[i])) {
      if (skip_nonfinite) continue;
      return std::numeric_limits<double>::infinity();
    }
    e[size_t(j)] = x[i] - y[i], yy += (long double)y[i] * y[i];
  }
  return residual(basis, std::move(e), double(std::sqrt(yy)));
}

}  // namespace qkmla
