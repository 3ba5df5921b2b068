#!/usr/bin/env bash
# The performance table (reports/performance-latest.md): each row measured in this one run, with
# the commit, the machine and what bounds it. Usage, from the repository root after a build:
#   bash reports/performance.sh [BUILD_DIR] [--long] [--fresh-clone]
# --long adds the 256k bf16 report (minutes); --fresh-clone adds `bash .ci/test` in a fresh clone
# (~10 min). Goals (issue "Speed"): default report <= 10 s, gate <= 20 s, 256k bf16 report
# <= 120 s and <= 2 GB, test command <= 10 min.
# The limit column: the machine's floor for the row's arithmetic, where one applies. The exact
# key product is the reference's only work that scales as a GEMM: tokens x G x d_c x r
# multiply-adds per profile (the count `qkmla reference` prints; no value product since X.8,
# proofs/reference.md), at the fp64 FMA rate measured
# here on the same threads; wall / limit says how far above that floor a row runs. The gate's
# thousands of small cases are bounded by their long-double error-bound runs, and an audit by its
# yardstick designs' runs in several summation orders, not by one GEMM: no limit is given there.
set -euo pipefail
build=build long=0 fresh=0
for a in "$@"; do
  case "$a" in
    --long) long=1 ;;
    --fresh-clone) fresh=1 ;;
    *) build="$a" ;;
  esac
done
q="$build/src/qkmla"
[ -x "$q" ] || { echo "performance.sh: no $q (build first)" >&2; exit 2; }
out=reports/performance-latest.md
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
commit=$(git describe --always --dirty --abbrev=12)
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
machine="$(nproc) cores, $cpu, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo)"
rows=()
rate=$("$q" reference --preset tiny --seqlen 64 2>&1 | grep -o 'fp64 FMA rate [0-9.e+]*/s' | head -1 || true)
fma=$(echo "$rate" | grep -o '[0-9.]*e+[0-9]*' || true)
# Multiply-adds of the exact key products: profiles x tokens x G x d_c x r.
macs() { awk -v p="$1" -v t="$2" -v g="$3" -v d="$4" -v r="$5" 'BEGIN {printf "%.4g", p * t * g * d * r}'; }
# One timed command: wall seconds and peak RSS from GNU time; MACS (or "") for the limit column.
measure() {
  local what="$1" goal="$2" m="$3"
  shift 3
  local rc=0
  /usr/bin/time -f '%e %M' -o "$work/time" "$@" > "$work/out" 2> "$work/err" || rc=$?
  read -r wall kb < <(tail -1 "$work/time")
  [ "$rc" = 0 ] || wall="$wall (exit $rc)"
  local limit="–"
  if [ -n "$m" ] && [ -n "$fma" ]; then
    limit=$(awk -v m="$m" -v f="$fma" -v w="$wall" \
      'BEGIN {printf "%.2f s: %.3g exact MACs at the fp64 FMA rate (wall %.0fx the limit)", m / f, m, w / (m / f)}')
  fi
  rows+=("| $what | $wall s | $(awk -v k="$kb" 'BEGIN {printf "%.2f GiB", k/1048576}') | $limit | $goal |")
  echo "$what: $wall s, $kb kB" >&2
}
# paper-decode: G 16, d_c 128, r 512; paper-g8: G 8 (qkmla presets).
measure "default report (\`qkmla report\`)" "≤ 10 s" "$(macs 5 4096 16 128 512)" "$q" report -o "$work/r.html"
measure "default gate (\`qkmla gate\`)" "≤ 20 s" "" "$q" gate -o "$work/g.xml"
"$q" golden --preset paper-g8 --seqlen 4096 --profile bf16 -o "$work/case.safetensors" > /dev/null
# The outputs audited: the reference's own out (rounded to bf16) and lse, written with numpy.
py="$build/tests/interop/venv/bin/python"
if [ -x "$py" ]; then
  "$py" - "$work/case.safetensors" "$work/outs.safetensors" <<'PY'
import sys
import ml_dtypes
from safetensors.numpy import load_file, save_file
c = load_file(sys.argv[1])
save_file({"out": c["ref.out"].astype("float32").astype(ml_dtypes.bfloat16),
           "lse": c["ref.lse"].astype("float32")}, sys.argv[2])
PY
  measure "audit of a paper-g8 bf16 case, 4096 tokens" "–" "" "$q" audit "$work/case.safetensors" "$work/outs.safetensors" --no-diagnose
fi
if [ "$long" = 1 ]; then
  measure "bf16 report at 262144 tokens" "≤ 120 s, ≤ 2 GB" "$(macs 1 262144 16 128 512)" "$q" report --profile bf16 --seqlen 262144 -o "$work/long.html"
fi
if [ "$fresh" = 1 ]; then
  git clone -q . "$work/clone"
  # The clone's log stays in /tmp/qkmla-fresh-clone-test.log (what passed, what failed).
  measure "\`bash .ci/test\` in a fresh clone" "≤ 10 min" "" \
    bash -c "cd '$work/clone' && bash .ci/test > /tmp/qkmla-fresh-clone-test.log 2>&1"
fi
{
  echo "# Performance, measured by reports/performance.sh"
  echo
  echo "Commit $commit; machine: $machine; ${rate:-fp64 FMA rate not printed}; $(date -u '+%Y-%m-%d %H:%M UTC')."
  echo "Wall time and peak RSS from GNU time, one run each (this machine is shared: compare only"
  echo "rows of one run)."
  echo
  echo "| what | wall | peak RSS | limit | goal |"
  echo "|---|---:|---:|---|---|"
  printf '%s\n' "${rows[@]}"
} > "$out"
cat "$out"
