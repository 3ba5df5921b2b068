#include "harness/yardstick.hpp"

#include <algorithm>
#include <cmath>

#include "core/attention_math.hpp"
#include "impl/cpu_impls.hpp"
#include "impl/kernel_level.hpp"
#include "impl/profile_math.hpp"
#include "metrics/compare.hpp"

namespace qkmla {

namespace {

bool wider(DType a, DType b) { return format_of(a).precision > format_of(b).precision; }

// Designs over the listed rounding points, each stored (D) or kept in the accumulate type (A).
// `lattice`: every combination (2^n), for small cases; otherwise the two extremes, every point
// stored (the most rounding a legitimate design does) and none. Over many rows a mix's RMS error
// lies between the extremes', so they cover it; over a few rows one ill-conditioned row (a near
// tie of large logits) can dominate, and a mix may round that tie differently from both.
std::vector<Design> designs_over(const Design& base, const std::vector<DType Design::*>& points,
                                 DType D, DType A, bool lattice) {
  std::vector<Design> out;
  const size_t n = points.size();
  for (size_t mask = 0; mask < (size_t(1) << n); ++mask) {
    if (!lattice && mask != 0 && mask + 1 != (size_t(1) << n)) continue;
    Design d = base;
    for (size_t i = 0; i < n; ++i) d.*points[i] = (mask >> i & 1) ? A : D;
    if (std::find(out.begin(), out.end(), d) == out.end()) out.push_back(d);
  }
  return out;
}

// Few enough row x token logits that one row can dominate a tensor's rel_l2 (and that running
// the whole lattice costs well under a second): every non-empty row's share is >= 1/64.
bool small_case(const MlaConfig& c) {
  int64_t rows = 0;
  for (int t : c.seqlens) rows += t > 0 ? int64_t(c.s_q) * c.heads : 0;
  return rows <= 64;
}

}  // namespace

Design design_of(const ImplId& id, Profile p) {
  const Form f = id.family == Family::Cpu && id.form == Form::Kernel ? Form::Kernel
                 : id.form == Form::Explicit                         ? Form::Explicit
                                                                     : Form::Absorbed;
  Design d = spec_design(p, f);
  if (id.variant == Variant::AlphaKBf16) d.alpha_k = DType::BF16;
  d.gains_merged = id.variant == Variant::GammaMerged && d.form == Form::Absorbed;
  return d;
}

std::vector<Design> candidate_designs(const MlaConfig& c, Form form, const Delivered& delivered) {
  const DType D = stored_dtype(c.profile), A = accumulate_dtype(c.profile);
  auto given = [&](const char* t, DType fallback) {
    return delivered.count(t) ? delivered.at(t) : fallback;
  };
  if (c.level == Level::Kernel) {
    Design base = spec_design(c.profile, Form::Kernel);
    base.latent_out = wider(given("latent_out", D), D) ? A : D;
    return designs_over(base, {&Design::p}, D, A, true);
  }
  const DType out = given("out", D);
  Design base = spec_design(c.profile, form == Form::Explicit ? Form::Explicit : Form::Absorbed);
  base.alpha_k = given("alpha_k", A) == DType::BF16 && A != DType::BF16 ? DType::BF16 : A;
  if (wider(out, D)) {  // fp32 out: an fp32 (fp64) compute
    Design d = accumulate_design(c.profile, form);
    d.alpha_k = base.alpha_k;
    return {d};
  }
  base.out = out;
  const bool lattice = small_case(c);
  if (form == Form::Explicit) {
    std::vector<DType Design::*> points = {&Design::q, &Design::rope, &Design::kv, &Design::p};
    if (c.norm == NormMode::Unified && c.d_r > 0) points.push_back(&Design::rope_key);
    return designs_over(base, points, D, A, lattice);
  }
  return designs_over(base, {&Design::q, &Design::rope, &Design::p, &Design::latent_out}, D, A,
                      lattice);
}

namespace {

// The exact-arithmetic variants a design's correct implementations may take (SPEC §1.2): they
// round at the same points but different values (alpha_q folded in or not, the query normalized
// first or not), so they sample the design's rounding noise, not only its summation order's.
std::vector<Variant> sample_variants(const MlaConfig& c, const Design& d) {
  if (c.level != Level::Module || d.form != Form::Absorbed || c.norm == NormMode::None)
    return {Variant::Default};
  // Merged gains are one more rounding point (the merged weights), which only gamma_merged has.
  if (d.gains_merged) return {Variant::GammaMerged};
  return {Variant::Default, Variant::AlphaQFolded, Variant::QNormedFirst};
}

// Every design's samples in the current summation order: outs[n] holds design n's.
std::vector<std::vector<Outputs>> run_designs(const Case& k, const std::vector<Design>& designs) {
  std::vector<impl::AbsorbedSpec> absorbed;
  for (const Design& d : designs)
    for (Variant v : sample_variants(k.cfg, d))
      if (k.cfg.level == Level::Module && d.form == Form::Absorbed) absorbed.push_back({v, {}, d});
  std::vector<Outputs> batch = impl::cpu_absorbed(k, absorbed);  // one shared cache per rope format
  std::vector<std::vector<Outputs>> outs;
  size_t next = 0;
  for (const Design& d : designs) {
    outs.emplace_back();
    if (k.cfg.level == Level::Kernel)
      outs.back().push_back(impl::cpu_kernel(k, d));
    else if (d.form == Form::Explicit)
      outs.back().push_back(impl::cpu_explicit(k, d));
    else
      for (size_t n = 0; n < sample_variants(k.cfg, d).size(); ++n)
        outs.back().push_back(std::move(batch[next++]));
  }
  return outs;
}

// Restores the forward order when it goes out of scope.
struct OrderScope {
  explicit OrderScope(impl::SumOrder o) { impl::sum_order() = o; }
  ~OrderScope() { impl::sum_order() = {}; }
};

}  // namespace

const std::vector<impl::SumOrder>& yardstick_orders() {
  static const std::vector<impl::SumOrder> o = {{false, 1, 1}, {true, 1, 1},  {false, 2, 1},
                                                {false, 8, 1}, {false, 1, 2}, {false, 1, 4}};
  return o;
}

Yardstick measure_yardstick(const Case& k, const std::vector<Design>& designs, const TruthOf& truth,
                            const std::vector<std::string>& tensors) {
  Yardstick y;
  y.designs = designs;
  // sq[n][tensor]: sum over samples (orders x variants) of rel_l2^2 for design n, count[n] samples.
  std::vector<std::map<std::string, double>> sq(designs.size());
  std::vector<std::map<std::string, double>> count(designs.size());
  for (const impl::SumOrder& order : yardstick_orders()) {
    OrderScope scope(order);
    const std::vector<std::vector<Outputs>> outs = run_designs(k, designs);
    for (size_t n = 0; n < outs.size(); ++n)
      for (const Outputs& o : outs[n])
        for (const std::string& t : tensors) {
          const Tensor* ref = truth(t);
          if (!ref || !o.tensors.count(t)) continue;
          const Tensor& x = o.tensors.at(t);
          const double e = compare(x, *ref, x.dtype, valid_mask(k, t)).rel_l2;
          sq[n][t] += e * e;
          count[n][t] += 1;
        }
  }
  for (size_t n = 0; n < designs.size(); ++n)
    for (const auto& [t, s] : sq[n]) {
      const double rms = std::sqrt(s / count[n].at(t));
      if (!y.rel_l2.count(t) || rms > y.rel_l2[t])
        y.rel_l2[t] = rms, y.design_of[t] = to_string(designs[n]);
    }
  return y;
}

}  // namespace qkmla
