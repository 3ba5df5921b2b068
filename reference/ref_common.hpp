// Small multiprecision stages shared by ref.explicit and ref.absorbed.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "core/case.hpp"
#include "core/outputs.hpp"
#include "reference/mp.hpp"

namespace qkmla::ref {

using MpVec = std::vector<Mp>;
class ExactSum;

// This thread's X.6 accumulator, cleared: for a sum rounded before the next call needs it.
ExactSum& scratch_sum();

MpVec to_mp(const double* p, int n);                       // exact
Mp sum_squares(const MpVec& z, int from = 0, int n = -1);  // sum_j z_j^2
// E.2: 1 / S with S = sqrt(sum_sq / n + eps): eps inside the root.
Mp inv_rms(const Mp& sum_sq, int n, const Mp& eps);
// E.3: z_j * gamma_j * inv over [from, from + n) of z, gamma read from `gamma` at gamma_from.
void scale_gain(MpVec& z, int from, int n, const Tensor& gamma, int gamma_from, const Mp& inv);
// The same with the gains already exact MPFR values (the same roundings, without converting
// every gain on every call).
void scale_gain(MpVec& z, int from, int n, const MpVec& gamma, int gamma_from, const Mp& inv);
// E.4: rotation by the table row of position p.
void rotate(MpVec& z, const Case& k, int64_t p);
Mp dot(const MpVec& a, const MpVec& b);

// Softmax of one query row over its visible logits (E.6): lse and p (same length as logits).
// No visible key: lse = -inf, p empty.
void softmax(const MpVec& logits, Mp& lse, MpVec& p);
Mp softmax_lse(const MpVec& logits);        // softmax's lse alone; its p_t is exp(logit_t - lse)
Mp softmax_lse(const PackedMpVec& logits);  // the same operations on packed logits
// The same operations on n logits, the i-th read by at(i, out) (logits kept in pieces).
Mp softmax_lse(size_t n, const std::function<void(size_t i, Mp& out)>& at);

// Allocates the named outputs (hi and lo) with NaN fill for alpha_k, 0 otherwise.
void init_outputs(Outputs& o, const Case& k, std::initializer_list<const char*> names);
// Writes x's double-double image into output `name` (allocated by init_outputs). Calls on distinct
// elements may run concurrently unless deep capture is on.
void store(Outputs& o, const std::string& name, int64_t flat, const Mp& x);
// While set (one thread: convergence studies), store() keeps every exact remainder in o.deep.
void set_deep_capture(bool on);
bool deep_capture();

}  // namespace qkmla::ref
