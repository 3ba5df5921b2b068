#!/usr/bin/env bash
# Benchmark (issue 12): the streamed reference's truth (ref.explicit at P and its check at P + 64,
# paper-decode, batch 1, S_q 1, bf16) at 32k, 128k and 256k tokens, each with its wall time, peak
# RSS, agreeing bits and the fraction of the machine's fp64 FMA limit it reaches, and the default
# report's time, all in one run of one build. Writes reports/long-context.md. About 4 minutes on
# 2 cores. Usage: bash reports/long_context.sh [build dir] (CONTEXTS="32768 131072 262144")
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=reports/long-context.md
tmp=$(mktemp -d)
commit=$(git describe --always --dirty --abbrev=12)  # before the report file below is rewritten
{
  echo "# Long context: the streamed reference (paper-decode, bf16, batch 1, S_q 1)"
  echo
  echo "Made by \`bash reports/long_context.sh\` at commit $commit, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, CPU only, nothing else running."
  echo
  for n in ${CONTEXTS:-32768 131072 262144}; do
    /usr/bin/time -f "%e s wall, %M KB peak RSS (GNU time)" "$build/src/qkmla" reference --seqlen "$n" \
      > "$tmp/ref-$n.txt" 2> "$tmp/time-$n.txt" || true
    echo "## $n tokens"
    echo
    echo '```'
    sed 's/^Made by .*/(provenance as above)/' "$tmp/ref-$n.txt"
    tail -1 "$tmp/time-$n.txt"
    echo '```'
    echo
  done
  echo "## The default report (\`qkmla report\`: paper-decode, 4096 tokens, five profiles)"
  echo
  echo '```'
  /usr/bin/time -f "%e s wall, %M KB peak RSS (GNU time)" "$build/src/qkmla" report -o "$tmp/report.txt" 2>&1 | tail -1
  echo '```'
} > "$out"
cat "$out"
