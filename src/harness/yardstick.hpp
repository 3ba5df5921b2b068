// The yardstick of a judged implementation (SPEC §5 "Judging"): correct implementations of the
// design it declares, or of every legitimate design consistent with its form and the dtypes it
// delivers, run on the same case and measured against the same truth. A verdict then asks whether
// the judged error is far beyond what a correct implementation of that design makes on this case.
#pragma once
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/case.hpp"
#include "core/design.hpp"
#include "harness/impl_id.hpp"

namespace qkmla {

// The dtype each given output tensor was delivered in (from its file).
using Delivered = std::map<std::string, DType>;

// Legitimate designs (SPEC §5): for the case's level and `form`, those consistent with the
// delivered dtypes. Module level, out delivered wider than the stored dtype: the design that
// computes and delivers everything in the accumulate type (an fp32 kernel). Otherwise out in the
// delivered dtype and q_latent, rope parts, P and latent_out (explicit form: q, rope, keys/values,
// P) each stored or in the accumulate type: every combination when the case has at most 64
// non-empty rows (one ill-conditioned row can dominate there, and a mix can round a near tie
// differently from both extremes), else the two extremes, all stored and none, whose RMS errors
// bracket every mix over many rows. alpha_k in the accumulate type, or bf16 where it is delivered
// in bf16. Kernel level: P likewise.
std::vector<Design> candidate_designs(const MlaConfig& c, Form form, const Delivered& delivered);

struct Yardstick {
  std::vector<Design> designs;
  // Per tensor: the largest over the designs of the RMS of rel_l2 over correct implementations of
  // the design: six orders (forward, reversed, 2 and 8 lanes, and split-KV into 2 and 4 chunks
  // combined by their lse, as FlashDecoding kernels do) x, for the absorbed form, the
  // exact-arithmetic variants that round different values at the same points: the typical error
  // of a correct implementation of the design on this case.
  std::map<std::string, double> rel_l2;
  std::map<std::string, std::string> design_of;  // which design made it
};

// The design a registered implementation implements: SPEC §3's rounding points for its form
// (explicit or absorbed; the GPU kernels and their model round where the CPU profiles do), alpha_k
// in bf16 for the alpha_k_bf16 variant.
Design design_of(const ImplId& id, Profile p);

// Runs every design on the case (CPU, the case's profile arithmetic) and measures each tensor
// against `truth(tensor)` (null: not measured). Tensors absent from a design's outputs are skipped.
using TruthOf = std::function<const Tensor*(const std::string&)>;
Yardstick measure_yardstick(const Case& k, const std::vector<Design>& designs, const TruthOf& truth,
                            const std::vector<std::string>& tensors);

}  // namespace qkmla
