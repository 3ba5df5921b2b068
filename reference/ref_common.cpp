#include "reference/ref_common.hpp"

#include <cmath>
#include <limits>

#include "core/rope.hpp"
#include "reference/exact_sum.hpp"

namespace qkmla::ref {

MpVec to_mp(const double* p, int n) { return MpVec(p, p + n); }

ExactSum& scratch_sum() {
  thread_local ExactSum acc;
  acc.clear();
  return acc;
}

Mp sum_squares(const MpVec& z, int from, int n) {  // exact, rounded once (X.6)
  if (n < 0) n = int(z.size()) - from;
  ExactSum& acc = scratch_sum();
  const std::span<const Mp> part(z.data() + from, size_t(n));
  acc.add_dot(part, part);
  Mp out;
  acc.round(out.backend().data());
  return out;
}

Mp inv_rms(const Mp& sum_sq, int n, const Mp& eps) { return 1 / sqrt(sum_sq / n + eps); }

void scale_gain(MpVec& z, int from, int n, const Tensor& gamma, int gamma_from, const Mp& inv) {
  for (int j = 0; j < n; ++j) {  // in place: (z_j * gamma_j) * inv, no temporaries
    mpfr_ptr zj = z[size_t(from + j)].backend().data();
    mul_d(zj, zj, gamma[gamma_from + j]);
    mpfr_mul(zj, zj, inv.backend().data(), MPFR_RNDN);
  }
}

void scale_gain(MpVec& z, int from, int n, const MpVec& gamma, int gamma_from, const Mp& inv) {
  for (int j = 0; j < n; ++j) {
    mpfr_ptr zj = z[size_t(from + j)].backend().data();
    mpfr_mul(zj, zj, gamma[size_t(gamma_from + j)].backend().data(), MPFR_RNDN);
    mpfr_mul(zj, zj, inv.backend().data(), MPFR_RNDN);
  }
}

void rotate(MpVec& z, const Case& k, int64_t p) {
  rope_rotate(z.data(), k.cfg.d_r, k.cfg.rope_style, k.get("rope_cos"), k.get("rope_sin"), p);
}

Mp dot(const MpVec& a, const MpVec& b) {  // exact, rounded once (X.6)
  ExactSum& acc = scratch_sum();
  acc.add_dot(a, b);
  Mp out;
  acc.round(out.backend().data());
  return out;
}

namespace {

// E.6's lse over n logits, read by at(i, out).
template <class At>
Mp lse_of(size_t n, const At& at) {
  if (n == 0) return -std::numeric_limits<double>::infinity();
  Mp m, l;
  at(0, m);
  for (size_t i = 0; i < n; ++i) {  // the shift only guards exp's range
    at(i, l);
    m = std::max(m, l);
  }
  ExactSum sum;  // each exp rounded to P, their sum exact (X.6)
  Mp e;
  for (size_t i = 0; i < n; ++i) {
    at(i, l);
    e = exp(l - m);
    sum.add(e.backend().data());
  }
  Mp s;
  sum.round(s.backend().data());
  return m + log(s);
}

}  // namespace

Mp softmax_lse(const MpVec& logits) {
  return lse_of(logits.size(), [&](size_t i, Mp& out) { out = logits[i]; });
}

Mp softmax_lse(const PackedMpVec& logits) {
  return lse_of(logits.size(), [&](size_t i, Mp& out) { logits.get(i, out); });
}

Mp softmax_lse(size_t n, const std::function<void(size_t i, Mp& out)>& at) { return lse_of(n, at); }

void softmax(const MpVec& logits, Mp& lse, MpVec& p) {
  p.clear();
  lse = softmax_lse(logits);
  p.reserve(logits.size());
  for (const Mp& l : logits) p.push_back(exp(l - lse));
}

void init_outputs(Outputs& o, const Case& k, std::initializer_list<const char*> names) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const char* n : names) {
    o.tensors[n] = make_output(k, n, DType::F64, std::string(n) == "alpha_k" ? nan : 0.0);
    o.lo[n] = make_output(k, n, DType::F64, 0.0);
  }
}

namespace {
bool deep_capture_on = false;
}

void set_deep_capture(bool on) { deep_capture_on = on; }
bool deep_capture() { return deep_capture_on; }

void store(Outputs& o, const std::string& name, int64_t flat, const Mp& x) {
  if (!deep_capture_on) {  // at(): no insertion, so concurrent stores to distinct elements are safe
    split_double(x, o.tensors.at(name)[flat], o.lo.at(name)[flat]);
    return;
  }
  const int parts = parts_for(int(mpfr_get_prec(x.backend().data())));
  std::vector<double> p(static_cast<size_t>(parts), 0.0);
  if (mpfr_number_p(x.backend().data()))
    to_parts(x, p.data(), parts);
  else
    p[0] = x.convert_to<double>();
  o.tensors[name][flat] = p[0];
  o.lo[name][flat] = parts > 1 ? p[1] : 0.0;
  std::vector<Tensor>& deep = o.deep[name];
  while (int(deep.size()) < parts - 2)
    deep.push_back(Tensor(DType::F64, o.tensors[name].shape, 0.0));
  for (int i = 2; i < parts; ++i) deep[size_t(i - 2)][flat] = p[size_t(i)];
}

}  // namespace qkmla::ref
