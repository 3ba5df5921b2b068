// The truth, computed once for every command (conventions §4): ref.explicit at P bits (ref.kernel
// for a kernel-level case), optionally ref.absorbed at P after it (taking its alpha_k, the same
// values: proofs/reference.md, A.3), and the check run at P + 64 bits on the same exact products;
// the bits on which the two runs agree, and the refusal rule (fewer than stored precision + 20
// bits: the reference is not accurate enough to judge anything).
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "core/case.hpp"
#include "core/outputs.hpp"
#include "reference/reference.hpp"

namespace qkmla {

struct TruthOptions {
  int bits = 113;           // P (MPFR rounds up to a whole number of limbs' worth: 114)
  int check_bits = 0;       // 0: P + 64, so the check's own error is 2^-64 of the P run's
  bool absorbed = false;    // also ref.absorbed at P (the equivalence row; latent_out's truth)
  bool latent_out = false;  // ref.explicit also forms latent_out (its own truth, then)
  int threads = 2;
  // compute_truth only: these products (exact_dots of the same case) instead of forming new ones,
  // e.g. so that a caller can watch their progress (Dots::blocks_read).
  const ref::Dots* dots = nullptr;
  // compute_truths: cases run in waves (products, P runs, check runs), each of at least one case
  // per thread and more while its products stay within wave_bytes (ref::whole_product_bytes), so
  // that only a wave's products are alive at once and the next wave reuses their arrays. 600 MB:
  // the default report's five profiles at 4096 tokens (537 MB each by that bound) form waves of
  // 2, 2 and 1; the gate's thousands of small cases stay one wave, whose phases balance best.
  int64_t wave_bytes = int64_t(600) << 20;
};

struct Truth {
  Outputs explicit_p;  // ref.explicit (or ref.kernel) at P
  Outputs absorbed_p;  // ref.absorbed at P, when asked
  Outputs check;       // ref.explicit (or ref.kernel) at the check precision
  ref::Dots dots;      // the exact products (module level)
  int bits = 0, check_bits = 0;
  double agreeing_bits = 0;  // explicit_p vs check
  double required_bits = 0;  // stored-dtype precision + 20
  bool ok() const { return agreeing_bits >= required_bits; }
  // The truth of one output tensor: ref.explicit's, or ref.absorbed's where the explicit form does
  // not form it (latent_out, q_latent). Null when neither has it.
  const Outputs* of(const std::string& tensor) const;
};

// The truths of many cases, in phases: exact products, everything at P, everything at the check
// precision (Boost keeps one global default precision, so each precision is one phase), then the
// cases with streamed products, whose P and check runs take turns block by block
// (ref_explicit_pair). `extra`: the caller's CPU work (no multiprecision: it may run in any
// phase), run on threads a phase would leave idle, and what is left of it before the streamed
// cases.
std::vector<Truth> compute_truths(const std::vector<const Case*>& cases, const TruthOptions& o,
                                  const std::vector<std::function<void()>>& extra = {});
// The waves compute_truths runs cases in (indices, in order), from each case's product bytes
// (ref::whole_product_bytes at module level, 0 at kernel level): a wave takes the next case while
// it has fewer than `threads` cases or the sum stays within `wave_bytes`.
std::vector<std::vector<size_t>> plan_waves(const std::vector<int64_t>& product_bytes, int threads,
                                            int64_t wave_bytes);
Truth compute_truth(const Case& k, const TruthOptions& o,
                    const std::vector<std::function<void()>>& extra = {});

}  // namespace qkmla
