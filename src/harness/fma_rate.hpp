// The machine's fp64 fused multiply-add rate, measured: the physical limit a benchmark states
// beside its time (an exact multiply-add costs at least one fp64 FMA).
#pragma once

namespace qkmla {

// FMAs per second over `threads` threads, each running independent vectorizable FMA chains for
// about `seconds` (the best of three rounds).
double measured_fma_rate(int threads, double seconds = 0.2);

}  // namespace qkmla
