// gpu/model/mma_model.hpp: the MMA accumulation model, the probe file and the fitter.
#include "gpu/model/mma_model.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <stdexcept>

namespace qkmla::gpu::mma {

std::string MmaParams::str() const {
  return "group " + std::to_string(group) + ", c " + (c_first ? "first" : "last") + ", align " +
         std::to_string(align_bits) + " bits " + (align_round ? "rounded" : "truncated") +
         ", final " + (final_round ? "nearest-even" : "toward zero") +
         (nominal_exponent ? ", nominal exponent" : "");
}

namespace {

// Aligns `n` exact terms to the largest of their exponents `ex`, keeping p.align_bits bits below
// it, sums them exactly and rounds the sum to fp32.
float fused_sum(const MmaParams& p, const double* t, const int* ex, int n) {
  int e = INT32_MIN;
  for (int i = 0; i < n; ++i)
    if (t[i] != 0) e = std::max(e, ex[i]);
  if (e == INT32_MIN) return 0.0f;
  const int shift = p.align_bits - e;  // t * 2^shift: units of the quantum 2^(e - align_bits)
  int64_t sum = 0;
  for (int i = 0; i < n; ++i) {
    const double u = std::ldexp(t[i], shift);  // exact: a power-of-two scaling
    sum += int64_t(p.align_round ? std::nearbyint(u) : std::trunc(u));
  }
  const double s = std::ldexp(double(sum), -shift);  // exact: < 2^(align_bits + 7) units
  float f = float(s);                                // nearest-even
  if (!p.final_round && std::fabs(double(f)) > std::fabs(s)) f = std::nextafter(f, 0.0f);
  return f;
}

}  // namespace

float mma_dot(const MmaParams& p, const float* a, const float* b, int K, float c) {
  double t[kK + 2];  // the group's terms, exact
  int ex[kK + 2];    // their exponents (ilogb of 0 is never read: zeros take no part)
  bool have_acc = p.c_first;
  float acc = p.c_first ? c : 0.0f;
  for (int k0 = 0; k0 < K; k0 += p.group) {
    int n = 0;
    if (have_acc) {
      t[n] = acc;
      ex[n] = std::ilogb(acc);
      ++n;
    }
    for (int k = k0; k < std::min(K, k0 + p.group); ++k) {
      t[n] = double(a[k]) * double(b[k]);
      ex[n] =
          t[n] != 0 && p.nominal_exponent ? std::ilogb(a[k]) + std::ilogb(b[k]) : std::ilogb(t[n]);
      ++n;
    }
    acc = fused_sum(p, t, ex, n);
    have_acc = true;
  }
  if (!p.c_first) {
    t[0] = acc, t[1] = c;
    ex[0] = std::ilogb(acc), ex[1] = std::ilogb(c);
    acc = fused_sum(p, t, ex, 2);
  }
  return acc;
}

std::vector<MmaRecord> records(const Tile& t) {
  const bool h = is_fp16(t.kind);
  std::vector<MmaRecord> r(kM * kN);
  for (int m = 0; m < kM; ++m)
    for (int n = 0; n < kN; ++n) {
      MmaRecord& x = r[m * kN + n];
      for (int k = 0; k < kK; ++k)
        x.a[k] = decode(h, t.a[m * kK + k]), x.b[k] = decode(h, t.b[k * kN + n]);
      x.c = t.c[m * kN + n], x.d = t.d[m * kN + n];
    }
  return r;
}

void mma_tile(const MmaParams& p, Tile& t) {
  const std::vector<MmaRecord> r = records(t);
  for (int i = 0; i < kM * kN; ++i) t.d[i] = mma_dot(p, r[i].a, r[i].b, kK, r[i].c);
}

std::vector<Tile> read_probe(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("mma probe file: cannot open " + path);
  std::vector<Tile> tiles;
  for (;;) {
    unsigned char head[4];
    if (!in.read(reinterpret_cast<char*>(head), 4)) break;
    Tile t;
    if (head[0] > 2 || head[1] > 3) throw std::runtime_error("mma probe file: bad tile header");
    t.kind = MmaKind(head[0]), t.cls = TileClass(head[1]);
    if (!in.read(reinterpret_cast<char*>(t.a), sizeof t.a) ||
        !in.read(reinterpret_cast<char*>(t.b), sizeof t.b) ||
        !in.read(reinterpret_cast<char*>(t.c), sizeof t.c) ||
        !in.read(reinterpret_cast<char*>(t.d), sizeof t.d))
      throw std::runtime_error("mma probe file: truncated tile " + std::to_string(tiles.size()));
    tiles.push_back(t);
  }
  return tiles;
}

void write_probe(const std::string& path, const std::vector<Tile>& tiles) {
  std::ofstream out(path, std::ios::binary);
  for (const Tile& t : tiles) {
    const unsigned char head[4] = {uint8_t(t.kind), uint8_t(t.cls), 0, 0};
    out.write(reinterpret_cast<const char*>(head), 4);
    out.write(reinterpret_cast<const char*>(t.a), sizeof t.a);
    out.write(reinterpret_cast<const char*>(t.b), sizeof t.b);
    out.write(reinterpret_cast<const char*>(t.c), sizeof t.c);
    out.write(reinterpret_cast<const char*>(t.d), sizeof t.d);
  }
  if (!out) throw std::runtime_error("mma probe file: cannot write " + path);
}

std::vector<MmaParams> parameter_grid() {
  std::vector<MmaParams> g;
  for (int group : {1, 2, 4, 8, 16})
    for (bool c_first : {true, false})
      for (int bits = 20; bits <= 40; ++bits)
        for (bool ar : {false, true})
          for (bool fr : {false, true})
            for (bool nominal : {false, true}) g.push_back({group, c_first, bits, ar, fr, nominal});
  return g;
}

FitResult fit(const std::vector<MmaRecord>& recs, const std::vector<MmaParams>& grid) {
  FitResult r;
  r.records = long(recs.size());
  r.mismatches = r.records + 1;
  for (const MmaParams& p : grid) {
    long bad = 0;
    for (const MmaRecord& x : recs) {
      const float d = mma_dot(p, x.a, x.b, kK, x.c);
      if (!(d == x.d || (std::isnan(d) && std::isnan(x.d))) && ++bad > r.mismatches) break;
    }
    if (bad == 0) r.exact.push_back(p);
    if (bad < r.mismatches) r.mismatches = bad, r.best = p;
  }
  return r;
}

}  // namespace qkmla::gpu::mma
