#!/usr/bin/env bash
# Benchmark: the reference's slice GEMM (X.5) on every Highway target of this CPU against Eigen's
# GEMM, and one 256-token block's whole sliced product, in one run of one build. Writes
# reports/slice-gemm.md. About 10 s. Usage: bash reports/slice_gemm.sh [build dir] [repetitions]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=reports/slice-gemm.md
commit=$(git describe --always --dirty --abbrev=12)  # before the report file below is rewritten
cmake --build "$build" --target qkmla_bench_slice_gemm -j2 > /dev/null
flags=$(grep -E '^CMAKE_CXX_FLAGS(_RELEASE)?:' "$build/CMakeCache.txt" | cut -d= -f2- | tr '\n' ' ')
{
  echo "# Slice GEMM: Highway targets against Eigen"
  echo
  echo "Made by \`bash reports/slice_gemm.sh\` at commit $commit, $(date -u '+%Y-%m-%d %H:%M UTC'),"
  echo "$(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), CPU only, one thread,"
  echo "compiler flags \`$flags\` plus the project's \`-mavx2\` and \`-mfma\` (Eigen's GEMM, as the reference once used it)."
  echo
  echo '```'
  "$build/reference/qkmla_bench_slice_gemm" "${2:-9}"
  echo '```'
} > "$out"
cat "$out"
