// Where an error sits, not only how large it is (conventions §5 "Judging"): the worst unit (a row,
// a head, a sequence) and the error's systematic part (its projection on the reference), so that
// one wrong head, one wrong sequence, a 1 % scale or a per-row scale error is seen even when the
// whole tensor's rel_l2 hides it among rounding noise. An audit compares each statistic with the
// same statistic of correct implementations on the same case (harness/yardstick.hpp).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.hpp"

namespace qkmla {

struct Structure {
  // max over units of the unit's rel_l2 (units whose reference is all zero skipped); NaN where the
  // tensor has no such unit. A row of lse ([B, S_q, H]) is one number: its worst_row is the largest
  // |x - y| / max(|y|, 1) (an absolute error where lse is small) over the elements whose
  // `lse_floor` is 1 (all where empty), and the rel_l2 of those whose floor is 0 taken as one
  // unit (one-token rows, whose lse is a logit: relative errors, but measured against the unit's
  // norm, since a logit that nearly cancels has a large relative error in any correct order);
  // it has no row_bias.
  double worst_row = 0, worst_head = 0, worst_seq = 0;
  // lse only (0 otherwise): worst_row's two parts, the rows that see more than one token and the
  // one-token unit's rel_l2, and the RMS of that unit's reference. A normalizer l through an
  // approximate exp is ~2 ulp off, an absolute error of lse (log l) in nats whatever the logit's
  // size: on a one-token row's tiny logit (zoo seed 105029, FlashMLA's sparse decode, exp2 of a
  // nonzero FMA residual: l = 1 - 2^-24 on a logit of 2.3e-5) it is a large relative one, so an
  // audit allows that unit u_common / one_token_rms.
  double many_token_worst = 0, one_token_rel = 0, one_token_rms = 0;
  // rank-4 tensors (out, latent_out) only, NaN otherwise:
  double bias = 0;      // |<x - y, y>| / <y, y>: a common scale error of the whole tensor
  double row_bias = 0;  // RMS over rows of the per-row <x - y, y> / <y, y>: per-row scale errors
  // What bias reaches when the rows' <x - y, y> are independent draws of their size:
  // sqrt(sum over rows of <x - y, y>_row^2) / <y, y>. A correct sample's bias is one draw (its
  // roundings shared with the other samples of its design), and another correct implementation's
  // was 5.3x it (zoo seed 79367: fp8, 5 tokens, so the rows' errors are few P errors times whole
  // cache rows); the yardstick takes the larger of the two (not a statistic: NaN-free, 0 for lse).
  double bias_noise = 0;
  // What row_bias reaches when each row's elements' errors are independent draws of their size:
  // RMS over rows of sqrt(sum_j e_j^2 y_j^2) / <y, y>_row. A correct sample's per-row projections
  // are one draw too: its output roundings are the other samples' (the same values rounded the
  // same way), and another correct implementation's row_bias was 4.7x theirs (zoo seed 82124:
  // fp16 kernel level, large logits make every row one-hot but one, whose projection was the
  // whole statistic). The yardstick takes the larger of the two, as for bias.
  double row_bias_noise = 0;
  // lse (rank 3) only, NaN otherwise: max over sequences of |mean over the sequence's rows of
  // (x - y)|, in nats (lse's error is the relative error of the softmax's sum), and of the
  // projection of its one-token rows (below). A logit scale or offset in one sequence moves all
  // its rows one way. Not a projection on y: lse's values share an offset (log T) that would
  // dilute it; rounding noise alone moves it (Jensen: noise in the logits raises log-sum-exp by
  // ~var/2), which the yardstick's samples carry too.
  double seq_shift = 0;
  // lse only, two entries per sequence (empty otherwise; 0 where there is nothing to measure):
  // over the rows that see more than one token, |mean of (x - y)| and the RMS of (x - y) over
  // sqrt(n), what the mean of n independent roundings of that size reaches; over the one-token
  // rows (lse_floor 0: lse is a logit, whose errors are relative and have no log T offset), the
  // projection |<x - y, y>| / <y, y> and its noise level sqrt(sum (x - y)^2 y^2) / <y, y> (a
  // logit scale in a one-token sequence cancels in a mean of logits of both signs: zoo 78551).
  // seq_shift is the largest first value. The noise level makes a yardstick of a correct
  // sample's noise level rather than of its one realization of the mean: samples of one design
  // share their roundings, and another correct implementation's mean, an independent draw, was
  // 3.6x theirs (zoo seed 78503, fp8, a one-token sequence of 16 heads).
  std::vector<double> seq_mean, seq_noise;
  // Per entry, the size of the reference it measures, against which a relative floor is
  // absolute: a kernel's rounded constants (log2 e, the scale times log2 e, ln 2 back from base 2)
  // move every logit, and so lse, by a relative ulp or two one way (zoo seed 79014, FlashMLA-style
  // kernel, fp32 lse near 200: a mean of 2.2e-5, 1.7 ulp), and a normalizer through an
  // approximate exp moves lse by an ulp or two in nats whatever its size (one_token_rel). So
  // max(RMS of y, 1) over a mean's rows; max(1, 1 / RMS of y) for a projection (already relative,
  // and an absolute error c moves it by up to c / RMS).
  std::vector<double> seq_scale;
};

// The statistics' names, in the order `structure_values` returns them.
const std::vector<std::string>& structure_names();
std::vector<double> structure_values(const Structure& s);

// x against y over the positions of `mask` (empty: all) where both are finite. Layout: dim 0 is
// the sequence, dim 2 the head; a row is the last dimension of a rank-4 tensor (out, latent_out:
// [B, S_q, H, w]). `lse_floor`: per element of a rank-3 tensor (core/case.hpp lse_abs_floor).
Structure structure_of(const Tensor& x, const Tensor& y, const std::vector<bool>& mask,
                       const std::vector<double>& lse_floor = {});

}  // namespace qkmla
