#!/usr/bin/env bash
# Regenerates reports/gpu-emulated.md: the device test's whole bit-for-bit matrix with the kernels
# run by the CPU emulator (gpu/emulator/emulator.hpp) in three thread orders, against the CPU model.
# Usage: bash reports/gpu_emulated.sh [build-dir]   (about 5 CPU-minutes per order)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
bin=$build/tests/gpu_device_tests
[ -x "$bin" ] || { echo "gpu_emulated.sh: build $bin first (cmake --build $build --target gpu_device_tests)" >&2; exit 2; }
out=reports/gpu-emulated.md
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for order in forward reverse shuffled; do  # concurrently: the times below share the cores
  /usr/bin/time -f "%e s, %M KB" -o "$tmp/$order.time" "$bin" bits-emulated "$order" > "$tmp/$order.log" &
done
wait || true
commit=$(git describe --always --dirty --abbrev=12)
cxx=$(grep -m1 '^CMAKE_CXX_COMPILER:' "$build/CMakeCache.txt" | cut -d= -f2)
flags=$(grep '^CXX_FLAGS' "$build/gpu/CMakeFiles/qkmla_gpu.dir/flags.make" | cut -d= -f2- | sed 's/^ //')
{
  echo "# The CUDA kernels on the CPU emulator, against their CPU model"
  echo
  echo "Made by \`reports/gpu_emulated.sh\` on $(date -u +%Y-%m-%d) at commit $commit, $($cxx --version | head -1),"
  echo "flags \`$flags\` (the kernels compiled as host C++ through \`gpu/kernels/host_cuda.hpp\`), on $(nproc)"
  echo "cores of $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')."
  echo "No GPU: every CUDA thread is a fiber of \`gpu/emulator/emulator.hpp\`; the buffers, launch shapes and"
  echo "arguments are \`gpu/kernels/pipeline.hpp\`'s, the same the device runs. Each run compares \`out\`, \`lse\`,"
  echo "\`latent_out\`, \`alpha_q\` and \`alpha_k\` bit for bit (NaN = NaN) with \`gpu.model\`. The matrix is"
  echo "\`gpu_device_tests bits\`'s (fp32, bf16, fp16, fp8; S_q 1/2/4; both norms; both forms; forced split"
  echo "lengths 1 and 3 and the default plan at 132 SMs; T_b = 0 rows; tiny, paper-decode and paper-g8)"
  echo "with the real shapes' sequences shortened (paper-decode 200,0,130 instead of 4096,0,130;"
  echo "paper-g8 150 instead of 1000)."
  echo
  echo "| thread order | runs | runs that differ | wall time (three orders at once), peak RSS |"
  echo "|---|---:|---:|---|"
  for order in forward reverse shuffled; do
    line=$(grep 'gpu.kernels_match_model' "$tmp/$order.log" || echo "gpu.kernels_match_model: ? of ? runs differ (no summary: $(tail -1 "$tmp/$order.log"))")
    differ=$(sed -E 's/.*: ([0-9?]+) of ([0-9?]+) runs differ.*/\1/' <<< "$line")
    runs=$(sed -E 's/.*: ([0-9?]+) of ([0-9?]+) runs differ.*/\2/' <<< "$line")
    echo "| $order | $runs | $differ | $(cat "$tmp/$order.time" | tail -1) |"
  done
  echo
  echo "Per-run lines of the forward order (the other orders print the same lines):"
  echo
  echo '```'
  grep -v '^device:' "$tmp/forward.log"
  echo '```'
} > "$out"
echo "wrote $out"
