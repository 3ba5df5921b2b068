#!/usr/bin/env bash
# gpu.kernels.no_contraction: the kernels' floating-point contract does not hang on one nvcc flag.
# Each device source is compiled to PTX twice, with --fmad=true and --fmad=false (the build's own
# flag). It fails unless (1) the --fmad=true PTX holds no plain `mul.f32` (every product is
# `mul.rn.f32`, which neither nvcc nor ptxas may fuse into an fma: gpu/kernels/math.hpp mul_rn)
# and (2) both PTX hold the same number of `fma.rn.f32` (the kernels' explicit fmaf only).
# Usage: no_contraction.sh NVCC SOURCE_DIR WORK_DIR
set -euo pipefail
nvcc="$1" root="$2" work="$3"
mkdir -p "$work"
status=0
for src in gpu/kernels/device_pipeline.cu gpu/bench/bench.cu; do
  name=$(basename "$src" .cu)
  for fm in true false; do
    "$nvcc" -std=c++17 -arch=sm_90a -ptx --fmad=$fm --ftz=false --prec-div=true --prec-sqrt=true \
      -I"$root" -I"$root/src" -DQKMLA_HAS_CUDA=1 "$root/$src" -o "$work/$name.$fm.ptx"
  done
  plain=$(grep -cE '\bmul\.f32' "$work/$name.true.ptx" || true)
  fma_t=$(grep -c 'fma\.rn\.f32' "$work/$name.true.ptx" || true)
  fma_f=$(grep -c 'fma\.rn\.f32' "$work/$name.false.ptx" || true)
  echo "$src: --fmad=true: $plain plain mul.f32, $fma_t fma.rn.f32; --fmad=false: $fma_f fma.rn.f32"
  if [ "$plain" -ne 0 ] || [ "$fma_t" -ne "$fma_f" ]; then
    echo "FAIL: $src has products a compiler may contract (first plain products below)"
    grep -nE '\bmul\.f32' "$work/$name.true.ptx" | head -5
    status=1
  fi
  [ "$fma_t" -gt 0 ] || { echo "FAIL: no fma.rn.f32 at all in $src (wrong source?)"; status=1; }
done
exit $status
