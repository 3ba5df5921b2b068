#include "metrics/structure.hpp"

#include <cmath>
#include <limits>

namespace qkmla {

const std::vector<std::string>& structure_names() {
  static const std::vector<std::string> n = {"worst_row", "worst_head", "worst_seq",
                                             "bias",      "row_bias",   "seq_shift"};
  return n;
}

std::vector<double> structure_values(const Structure& s) {
  return {s.worst_row, s.worst_head, s.worst_seq, s.bias, s.row_bias, s.seq_shift};
}

namespace {

// Per unit: sum of squared errors, of squared references, and of error x reference, in double
// (their relative rounding, ~n 2^-53, is far below any ratio the judge draws from them).
struct Sums {
  std::vector<double> ee, yy, ey;
  explicit Sums(int64_t n) : ee(size_t(n), 0), yy(size_t(n), 0), ey(size_t(n), 0) {}
  // The three products of one element, formed once for every unit it belongs to.
  struct Terms {
    double ee, yy, ey;
  };
  static Terms terms(double e, double y) { return {e * e, y * y, e * y}; }
  void add(int64_t u, const Terms& t) {
    ee[size_t(u)] += t.ee;
    yy[size_t(u)] += t.yy;
    ey[size_t(u)] += t.ey;
  }
  double worst() const {
    double w = 0;
    for (size_t u = 0; u < ee.size(); ++u)
      if (yy[u] > 0) w = std::max(w, double(std::sqrt(ee[u] / yy[u])));
    return w;
  }
};

// Per sequence (per_seq elements each), two entries: over its rows that see more than one token
// (lse_floor 1, or no floor given) |mean of (x - y)| and RMS(x - y) / sqrt(n); over its one-token
// rows (floor 0: lse is that token's logit, its error relative) the projection
// |<x - y, y>| / <y, y> and sqrt(sum (x - y)^2 y^2) / <y, y>, the same noise level weighted as the
// projection weighs. seq_shift is the largest first value of any entry.
void seq_means(const Tensor& x, const Tensor& y, const std::vector<bool>& mask,
               const std::vector<double>& lse_floor, int64_t per_seq, Structure& s) {
  const int64_t B = per_seq > 0 ? y.shape[0] : 0;
  s.seq_mean.assign(size_t(2 * B), 0.0), s.seq_noise.assign(size_t(2 * B), 0.0);
  s.seq_scale.assign(size_t(2 * B), 1.0);
  for (int64_t b = 0; b < B; ++b) {
    long double sum = 0, sq = 0, ysq = 0, ey = 0, yy = 0, eeyy = 0, n1 = 0;
    int64_t n = 0;
    for (int64_t i = b * per_seq; i < (b + 1) * per_seq; ++i) {
      if ((!mask.empty() && !mask[size_t(i)]) || !std::isfinite(x[i]) || !std::isfinite(y[i]))
        continue;
      const long double e = (long double)x[i] - y[i], v = y[i];
      if (lse_floor.empty() || lse_floor[size_t(i)] > 0)
        sum += e, sq += e * e, ysq += v * v, ++n;
      else
        ey += e * v, yy += v * v, eeyy += e * e * v * v, n1 += 1;
    }
    if (n) {
      s.seq_mean[size_t(2 * b)] = double(std::fabs(sum / n));
      s.seq_noise[size_t(2 * b)] = double(std::sqrt(sq / n) / std::sqrt((long double)n));
      s.seq_scale[size_t(2 * b)] = std::max(1.0, double(std::sqrt(ysq / n)));
    }
    if (yy > 0) {
      s.seq_mean[size_t(2 * b + 1)] = double(std::fabs(ey / yy));
      s.seq_noise[size_t(2 * b + 1)] = double(std::sqrt(eeyy) / yy);
      s.seq_scale[size_t(2 * b + 1)] = std::max(1.0, double(std::sqrt(n1 / yy)));
    }
  }
  s.seq_shift = 0;
  for (double m : s.seq_mean) s.seq_shift = std::max(s.seq_shift, m);
}

}  // namespace

Structure structure_of(const Tensor& x, const Tensor& y, const std::vector<bool>& mask,
                       const std::vector<double>& lse_floor) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const size_t rank = y.shape.size();
  const int64_t width = rank == 4 ? y.shape[3] : 1;
  const int64_t n = y.numel(), rows = width > 0 ? n / width : 0;
  const int64_t heads = rank >= 3 ? y.shape[2] : 0;
  const int64_t per_seq = rank >= 1 ? n / std::max<int64_t>(y.shape[0], 1) : 0;
  Sums row(rank == 4 ? rows : 0), head(heads), seq(rank >= 1 ? y.shape[0] : 0);
  Sums all(1);
  std::vector<double> row_eeyy(size_t(rank == 4 ? rows : 0), 0);  // sum e^2 y^2 per row
  // Row by row, so that a row's head and sequence are found once (per_seq is a multiple of
  // width); each unit still takes its elements in increasing order.
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t h = heads > 0 ? r % heads : 0, b = per_seq > 0 ? r * width / per_seq : 0;
    for (int64_t i = r * width; i < (r + 1) * width; ++i) {
      if ((!mask.empty() && !mask[size_t(i)]) || !std::isfinite(x[i]) || !std::isfinite(y[i]))
        continue;
      const Sums::Terms t = Sums::terms(x[i] - y[i], y[i]);
      all.add(0, t);
      if (rank == 4) row.add(r, t), row_eeyy[size_t(r)] += t.ee * t.yy;
      if (rank >= 3) head.add(h, t);
      if (rank >= 1) seq.add(b, t);
    }
  }
  Structure s;
  s.worst_row = rank == 4 ? row.worst() : nan;
  if (rank == 3) {  // lse: a row is one number, its error measured against max(|y|, floor)
    s.worst_row = 0;
    long double ee = 0, yy = 0;  // one-token rows (floor 0), together one unit: its rel_l2
    int64_t ones = 0;
    for (int64_t i = 0; i < n; ++i) {
      if ((!mask.empty() && !mask[size_t(i)]) || !std::isfinite(x[i]) || !std::isfinite(y[i]))
        continue;
      const double floor = lse_floor.empty() ? 1.0 : lse_floor[size_t(i)];
      const double scale = std::max(std::fabs(y[i]), floor);
      if (floor > 0)
        s.worst_row = std::max(s.worst_row, std::fabs(x[i] - y[i]) / scale);
      else
        ee += (long double)(x[i] - y[i]) * (x[i] - y[i]), yy += (long double)y[i] * y[i], ++ones;
    }
    s.many_token_worst = s.worst_row;
    if (yy > 0) {
      s.one_token_rel = double(std::sqrt(ee / yy));
      s.one_token_rms = double(std::sqrt(yy / ones));
      s.worst_row = std::max(s.worst_row, s.one_token_rel);
    }
  }
  s.worst_head = rank >= 3 ? head.worst() : nan;
  s.worst_seq = seq.worst();
  // A projection on the reference: for out and latent_out. lse's values share an offset (log T):
  // its systematic errors are measured by seq_shift instead.
  s.bias = rank != 4 ? nan : all.yy[0] > 0 ? double(std::fabs(all.ey[0] / all.yy[0])) : 0.0;
  if (rank == 4) {
    long double sq = 0, noise = 0;
    int64_t n = 0;
    for (size_t u = 0; u < row.yy.size(); ++u)
      if (row.yy[u] > 0) {
        sq += (row.ey[u] / row.yy[u]) * (row.ey[u] / row.yy[u]), ++n;
        noise += row_eeyy[u] / (row.yy[u] * row.yy[u]);
      }
    s.row_bias = n ? double(std::sqrt(sq / n)) : 0.0;
    s.row_bias_noise = n ? double(std::sqrt(noise / n)) : 0.0;
    long double rows_sq = 0;  // the rows' <e, y> as independent draws
    for (size_t u = 0; u < row.ey.size(); ++u) rows_sq += row.ey[u] * row.ey[u];
    s.bias_noise = all.yy[0] > 0 ? double(std::sqrt(rows_sq) / all.yy[0]) : 0.0;
  } else {
    s.row_bias = nan;
  }
  s.seq_shift = nan;
  if (rank == 3) seq_means(x, y, mask, lse_floor, per_seq, s);
  return s;
}

}  // namespace qkmla
