// The yardstick of a judged implementation (conventions §5 "Judging"): correct implementations of
// the design it declares, or of every legitimate design consistent with what it delivered, run on
// the same case and measured against the same truth. A verdict then asks whether the judged error,
// and where it sits, is far beyond what a correct implementation of such a design makes on this
// case.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/case.hpp"
#include "core/design.hpp"
#include "core/impl_id.hpp"
#include "core/variant.hpp"
#include "metrics/structure.hpp"

namespace qkmla {

// Per delivered tensor, the formats its rounding point may have been: its container dtype first,
// then every narrower one (the stored dtype, fp32) that holds each of its values exactly (bf16
// values delivered as F32 after `.float()` are consistent with out rounded to bf16).
using Delivered = std::map<std::string, std::vector<DType>>;
// The formats of `x` (valid positions of `mask`) that the case's profile makes candidates.
std::vector<DType> consistent_formats(const Tensor& x, const std::vector<bool>& mask, Profile p);

// The delivered lse's rounding point: the least accurate format its values are consistent with
// that is narrower than the accumulate type A (vLLM's Triton MLA returns lse in q's dtype); F64
// (not rounded) otherwise, or when no lse is delivered. No stage reads it: one last rounding.
DType delivered_lse_point(const Delivered& delivered, DType A);
// The delivered latent_out's file format at module level, where its point feeds out: the
// container's format (an fp32 case's latent_out written as bf16) when it is narrower than A and is
// not D; F64 (none) otherwise. Values that are also D's are still written in the container: an
// fp16 file of an fp8 case's bf16 latent_out rounds what lies below fp16's normal range to its
// subnormal spacing (probes 555618-555619: 6.7 % and 3.7 % on tiny_keys; fitted). Only that
// tensor reads it.
DType delivered_latent_file(const Delivered& delivered, DType D, DType A);

// A legitimate design and the family it belongs to, as a verdict names it ("PyTorch module",
// "FlashMLA-style (bf16 P, exp2)", ...; proofs/budgets.md lists each with the code that does it).
struct Candidate {
  std::string family;
  Design d;
};

// Legitimate designs (conventions §5) of the case's level and `form` consistent with what was
// delivered: for each consistent format of out (latent_out at kernel level), the accumulate-type
// compute, conventions §3's points, the stored/accumulate mixes of those points (every combination
// when the case has at most 64 non-empty rows, where one ill-conditioned row can dominate and a mix
// can round a near tie differently from both extremes; else the two extremes, whose RMS errors
// bracket every mix over many rows), and the designs real code uses: FlashMLA-style bf16 P with
// exp2, a PyTorch module storing every op's output (fp8: also a JAX module's, the cache kept in
// the accumulate type), the scale folded into q, alpha_k folded into stored keys (absorbed, under
// a QK-norm), an approximate rsqrt, and (fp8) the cache dequantized to bf16. alpha_k in the
// accumulate type, or bf16 where delivered in bf16; lse at delivered_lse_point.
std::vector<Candidate> candidate_designs(const MlaConfig& c, Form form, const Delivered& delivered);
// The same over several forms (audit_forms), an explicit family's name prefixed "explicit form: "
// where both forms are candidates.
std::vector<Candidate> candidate_designs(const MlaConfig& c, const std::vector<Form>& forms,
                                         const Delivered& delivered);

// The forms an audit's candidates take. Declared (`--form`, non-empty `declared`): that one. Else
// both forms at module level, since explicit and absorbed code are equally legitimate and a file
// does not say which it came from (zoo sweep seed 101537: mlx-lm's S_q > 1 branch is explicit and
// failed as absorbed at 5.45x), except where latent_out is delivered (only the absorbed form forms
// it) or where one explicit sample costs over 2.5e8 multiply-adds (kExplicitBudget): `note` then
// says the explicit form was not sampled and how to declare it.
std::vector<Form> audit_forms(const MlaConfig& c, const std::string& declared,
                              const Delivered& delivered, std::string* note);

// Which run a sample is: its summation order (an index into the yardstick's orders; 0 is the
// forward order every registered cpu.* implementation runs) and its exact-arithmetic variant.
struct SampleId {
  size_t order = 0;
  Variant variant = Variant::Default;
  bool operator==(const SampleId& o) const { return order == o.order && variant == o.variant; }
};

struct Yardstick {
  std::vector<Candidate> designs;
  // One correct implementation's run: its design (index into designs), which run it is, and per
  // tensor rel_l2 and structure.
  struct Sample {
    size_t design = 0;
    SampleId id;
    std::map<std::string, double> rel_l2;
    std::map<std::string, Structure> structure;
  };
  std::vector<Sample> samples;
  // A design that stores its logits in a narrow format (Design::score: a PyTorch module) rounds
  // each one once for all of its samples, so they hold one draw of that rounding, however small
  // by chance. Its noise level (harness/logit_noise.hpp): per tensor, the RMS over dithered draws
  // of rel_l2, of each structure statistic and of lse's per-sequence means of the change a draw
  // makes, measured as an error against the truth. Every design's lse has one more: lse moved
  // by an approximate exp's normalizer error on every row (logit_noise.hpp
  // approximate_exp_noise). rms(), structure_max() and seq_allowance() take the larger of the
  // samples' value and these levels, as bias_noise does for bias.
  struct Noise {
    size_t design = 0;
    std::string tensor;
    double rel_l2 = 0;
    std::vector<double> structure;  // in structure_names() order; NaN where not measured
    std::vector<double> seq_mean;   // lse: per entry of Structure::seq_mean (seq_allowance)
  };
  std::vector<Noise> noise;
  // Per tensor (out, latent_out), the elements of ill-conditioned rows: rows whose noise level is
  // far above the median row's (a near tie of two stored logits). Every statistic, sample and
  // noise level is measured without them (`mask()`), and each such row is judged on its own
  // against ill_allowance: per row (0 elsewhere), the larger of its noise level and its largest
  // rel_l2 over the samples.
  std::map<std::string, std::vector<bool>> ill;
  std::map<std::string, std::vector<double>> ill_allowance;
  // Per tensor and ill-conditioned row: an orthonormal basis ([m][w]) of the directions the draws
  // move the row along (not the row itself: a free row scale let one head x 1.10 pass, probe
  // seed 555511). A near tie moves the output within
  // the span of its tied tokens' values; a wrong value, scale or head moves it out of that span
  // (zoo seed 102733: fp8-block128's first block scale on the whole row, 153 % on rows whose
  // draws move them 95 %). ill_residual: per row, the largest rel_l2 left after projecting the
  // span out, over the draws and the samples (0 elsewhere).
  std::map<std::string, std::map<size_t, std::vector<std::vector<double>>>> ill_basis;
  std::map<std::string, std::vector<double>> ill_residual;
  // `valid` without tensor t's ill-conditioned rows.
  std::vector<bool> mask(const std::string& t, std::vector<bool> valid) const;
  // Per tensor: the largest over the designs of the RMS of rel_l2 over the design's samples: seven
  // orders (forward, reversed, 2 and 8 lanes, split-KV into 2, 3 and 4 chunks combined by their
  // lse, or three orders of a declared chunk length) x, for the absorbed form, the exact-arithmetic
  // variants that round different values at the same points. Every sample included (the gate leaves
  // out the judged run itself with rms()).
  std::map<std::string, double> rel_l2;
  std::map<std::string, std::string> design_of;  // which design made it

  // RMS of rel_l2 of tensor t over design n's samples, leaving out the run `self` (null: none;
  // the gate's cpu.* row is the forward-order run of its own design and variant), at least design
  // n's noise levels; NaN when no sample remains. A sample whose bits merely equal the
  // judged tensor's is a correct run and stays: a correctly rounded output is bit-identical to
  // several samples.
  double rms(size_t n, const std::string& t, const SampleId* self = nullptr) const;
  // max over designs of rms(n, t); `which` receives the design (NaN, npos: none).
  double least_accurate(const std::string& t, size_t* which = nullptr) const;
  // max over every sample of structure statistic `stat` (an index into structure_names()), and
  // over every noise level; NaN when none.
  double structure_max(const std::string& t, size_t stat) const;
  // lse's seq_shift allowance per sequence: max over every sample of max(seq_mean, seq_noise)
  // (metrics/structure.hpp) and over the noise levels; empty when no sample has them.
  std::vector<double> seq_allowance(const std::string& t) const;
  // max over every sample of a noise level (Structure::bias_noise or row_bias_noise); 0 when none.
  double noise_max(const std::string& t, double Structure::*noise) const;
};

// The design a registered implementation implements: conventions §3's rounding points for its form
// (explicit or absorbed; the GPU kernels and their model round where the CPU profiles do), alpha_k
// in bf16 for the alpha_k_bf16 variant.
Design design_of(const ImplId& id, Profile p);

// Runs every design on the case (CPU, the case's profile arithmetic) and measures each tensor
// against `truth(tensor)` (null: not measured). Tensors absent from a design's outputs are skipped.
using TruthOf = std::function<const Tensor*(const std::string&)>;
// kv_chunk > 0: the judged implementation attends over KV chunks of that many tokens merged by
// their lse (a declared --kv-chunk), sampled instead of split-KV into 2, 3 and 4 chunks.
Yardstick measure_yardstick(const Case& k, const std::vector<Candidate>& designs,
                            const TruthOf& truth, const std::vector<std::string>& tensors,
                            int kv_chunk = 0);
Yardstick measure_yardstick(const Case& k, const std::vector<Design>& designs, const TruthOf& truth,
                            const std::vector<std::string>& tensors);

}  // namespace qkmla
