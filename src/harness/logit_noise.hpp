// A stored-logit design's noise level (conventions §5 "Judging", item 5): a design that stores its
// logits in a narrow format (a PyTorch module's fp16 or bf16 scores) rounds each logit once for
// all of its samples, however small that draw happened to be, and a near tie of two large logits
// moves a row's output by percent with it (zoo seeds 100326, 100402). The design is run again with
// its stored logits dithered (impl/attention_core.hpp LogitDither); what the draws change gives
// its noise level (Yardstick::noise) and the rows it makes ill-conditioned (Yardstick::ill).
#pragma once
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/outputs.hpp"
#include "core/tensor.hpp"
#include "harness/yardstick.hpp"

namespace qkmla {

// Per design and tensor, what each dithered draw changes: x_draw - x_base, draw by draw and
// variant by variant.
using Changes = std::map<size_t, std::map<std::string, std::vector<Tensor>>>;

// `base[n]`: design n's forward-order outputs, one per variant; `rerun(n)` runs design n again
// (every variant, forward order) while a dithered draw is on; `chain`: each stored factor of an
// eager design's logit dithered too (impl/attention_core.hpp LogitDither); `many`: designs that
// take kManyDraws draws instead of kDraws (an fp8 query: logit_noise.cpp); `amplitude`: an fp8
// query's dither in units of its ulps (1: a rounding's own size).
Changes dithered_changes(const std::map<size_t, std::vector<Outputs>>& base,
                         const std::function<std::vector<Outputs>(size_t)>& rerun,
                         const std::vector<std::string>& tensors, bool chain = false,
                         const std::set<size_t>& many = {}, double amplitude = 1);

// Rows of out and latent_out ([B, S_q, H, w]) whose noise level under `ch`'s draws (RMS over a
// design's draws of the row's |d| / |y|, the largest over designs) exceeds ten times the median
// row's (a row the draws leave unchanged counts, as 0): they leave `masks` (every statistic and
// sample is then measured without them) and go to y.ill, the directions `ch`'s draws move them
// along to y.ill_basis and what those draws leave outside that span to y.ill_residual. Their
// noise level, the larger of `ch`'s and `widen`'s (an eager design's chain draws), goes to
// y.ill_allowance: `widen` finds no row and adds no direction, since its draws move a row in
// every direction (zoo seed 105185: with them in the span, a bug's 47 % on an ill row left
// nothing outside it, and one_sequence passed where ill_residual had failed it at 566x).
// `span`'s draws add their directions to the ill rows' bases (an fp8 query's wide draws: where
// its rounding moves a near tie's argmax to a token the ordinary draws never reach).
void mark_ill_rows(const Changes& ch, const Changes& widen, const TruthOf& truth,
                   std::map<std::string, std::vector<bool>>& masks, Yardstick& y,
                   const Changes& span = {});

// Whether mark_ill_rows would find an ill-conditioned row in `ch` alone.
bool has_ill_rows(const Changes& ch, const TruthOf& truth,
                  std::map<std::string, std::vector<bool>>& masks);

// Yardstick::Noise from the draws' changes: each change d measured as the error ref + d against
// ref over `masks`, statistic by statistic, and the RMS over draws and variants.
void noise_levels(const Changes& ch, const TruthOf& truth,
                  std::map<std::string, std::vector<bool>>& masks,
                  const std::vector<double>& lse_floor, Yardstick& y);

// lse's noise level from a normalizer through an approximate exp (one per design in `designs`):
// l = sum_t exp(s_t - m) 2 ulp of the accumulate type A off is an error of lse = m + log l in
// nats whatever lse's size, and so a large relative one on a row that sees one token with a logit
// near 0, and on a head or sequence of such rows (zoo seeds 105029, 105104, 105119:
// FlashMLA's sparse decode takes ex2.approx of a nonzero FMA residual, l = 1 - 2^-24). Measured
// as lse moved by that much on every row; its worst_row is not measured here (NaN): an audit
// allows the one-token unit its own floor (metrics/structure.hpp one_token_rel), so that the
// rows that see more tokens keep theirs.
void approximate_exp_noise(const Tensor& ref, const std::vector<bool>& mask,
                           const std::vector<double>& lse_floor, DType A,
                           const std::vector<size_t>& designs, Yardstick& y);

// y.ill_allowance of tensor t widened to sample x's rel_l2 on each ill-conditioned row, and
// y.ill_residual to its residual there.
void widen_ill_allowance(const Tensor& x, const Tensor& ref, const std::string& t, Yardstick& y);

// The residual of row r of x against the reference y: |e - P e| / |y_r| for e = x_r - y_r and P
// the projection on `basis` (orthonormal rows of length w); positions not in `valid` (when
// non-empty) count as no error, a non-finite x as an infinite one (as no error where
// `skip_nonfinite`: a sample's, as widen_ill_allowance measures rel_l2). 0 when y_r is all zero.
double off_span_residual(const std::vector<std::vector<double>>& basis, const Tensor& x,
                         const Tensor& y, const std::vector<bool>& valid, size_t r,
                         bool skip_nonfinite = false);

}  // namespace qkmla
