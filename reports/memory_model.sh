#!/usr/bin/env bash
# Validation of the memory model (src/harness/resources.cpp, case_peak_bytes) on shapes it was not
# fitted on: each `qkmla report` runs under GNU time and its peak RSS is set beside the estimate
# `--estimate-memory` prints for the same flags. The estimate must bound the peak (ratio >= 1) and
# should not exceed it by more than 3x (the bound cli.resource_model_bounds_the_measured_peak
# checks on one shape). Writes reports/memory-model.md. About 5 minutes on 2 cores.
# Usage: bash reports/memory_model.sh [build dir]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
bin=$build/src/qkmla
out=reports/memory-model.md
commit=$(git describe --always --dirty --abbrev=12)
cmake --build "$build" --target qkmla -j2 > /dev/null
command -v /usr/bin/time > /dev/null || { echo "needs GNU time: apt-get install -y time" >&2; exit 2; }
shapes=(
  "--preset paper-g8 --profiles bf16 --seqlen 32768"
  "--preset kimi-k2 --profiles bf16 --seqlen 1024"
  "--preset nope-h10 --profiles fp16 --seqlen 65536"
  "--preset paper-decode --profiles fp8 --sq 4 --seqlen 32768"
  "--preset paper-decode --profiles bf16 --batch 3 --seqlen 8192"
  "--preset deepseek-v2-lite --profiles fp32 --seqlen 16384"
  "--preset tiny-g1 --profiles bf16 --batch 100 --seqlen 2048"
  "--preset paper-decode --seqlen 4096"
)
rows=""
worst_low=100 worst_high=0
for s in "${shapes[@]}"; do
  # shellcheck disable=SC2086
  est=$("$bin" report $s --estimate-memory | sed -E 's/.*estimated peak ([0-9]+) bytes.*/\1/')
  # shellcheck disable=SC2086
  /usr/bin/time -f "%e %M" -o /tmp/qkmla-memory-model.time "$bin" report $s --format csv \
    -o /dev/null 2> /dev/null
  read -r secs kib < <(tail -1 /tmp/qkmla-memory-model.time)
  peak=$((kib * 1024))
  ratio=$(awk -v e="$est" -v p="$peak" 'BEGIN { printf "%.2f", e / p }')
  rows+="| \`$s\` | $secs | $(awk -v p="$peak" 'BEGIN { printf "%.0f", p / 1e6 }') | $(awk -v e="$est" 'BEGIN { printf "%.0f", e / 1e6 }') | $ratio |"$'\n'
  worst_low=$(awk -v a="$worst_low" -v r="$ratio" 'BEGIN { print (r < a ? r : a) }')
  worst_high=$(awk -v a="$worst_high" -v r="$ratio" 'BEGIN { print (r > a ? r : a) }')
done
{
  echo "# Memory model: estimate against measured peak on held-out shapes"
  echo
  echo "Made by \`bash reports/memory_model.sh\` at commit $commit, $(date -u '+%Y-%m-%d %H:%M UTC'),"
  echo "$(nproc) cores, CPU only, 2 threads. Peak RSS by GNU time (\`%M\`, KiB x 1024); estimate by"
  echo "\`qkmla report ... --estimate-memory\` (\`report_peak_bytes\`: every profile's"
  echo "\`case_peak_bytes\`, the exact products of one wave of truths only). None of these shapes was used to fit the model (the fit's shapes are listed in"
  echo "\`src/harness/resources.cpp\`)."
  echo
  echo "| flags of \`qkmla report\` | wall s | peak MB | estimate MB | estimate / peak |"
  echo "|---|---|---|---|---|"
  printf "%s" "$rows"
  echo
  echo "Estimate / peak from $worst_low to $worst_high."
} > "$out"
cat "$out"
awk -v l="$worst_low" 'BEGIN { exit (l >= 1 ? 0 : 1) }' || { echo "the estimate is below a measured peak" >&2; exit 1; }
