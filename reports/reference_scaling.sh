#!/usr/bin/env bash
# Benchmark: how the reference's cost grows with context (paper-decode, bf16 profile, one run per
# context, all timings from the same build). Writes reports/reference-scaling.md.
set -euo pipefail
cd "$(dirname "$0")/.."
out=reports/reference-scaling.md
{
  echo "# Reference cost vs context (paper-decode, bf16 profile)"
  echo
  echo "Made by \`bash reports/reference_scaling.sh\` at commit $(git describe --always --dirty --abbrev=12), $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, CPU only."
  echo
  echo "| context | exact products s | ref.explicit s (P) | ref.absorbed s (P) | check s (2P) | total report s | agreeing bits |"
  echo "|---|---|---|---|---|---|---|"
  for n in 512 1024 2048 4096 8192; do
    build/src/qkmla report --seqlen "$n" --profiles bf16 --format json |
      python3 -c "import json,sys; j=json.load(sys.stdin); p=j['reference']['profiles'][0]; print(f\"| $n | {p['exact_products_seconds']:.2f} | {p['explicit_seconds']:.2f} | {p['absorbed_seconds']:.2f} | {p['check_seconds']:.2f} | {j['total_seconds']:.1f} | {p['agreeing_bits']:.1f} |\")"
  done
} > "$out"
cat "$out"
