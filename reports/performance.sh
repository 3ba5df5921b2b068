#!/usr/bin/env bash
# The performance table (reports/performance-latest.md): each row measured in this one run, with
# the commit, the machine and what bounds it. Usage, from the repository root after a build:
#   bash reports/performance.sh [BUILD_DIR] [--long] [--fresh-clone]
# --long adds the 256k bf16 report (minutes); --fresh-clone adds `bash .ci/test` in a fresh clone
# (~10 min). Goals (issue "Speed"): default report <= 10 s, gate <= 20 s, 256k bf16 report
# <= 120 s and <= 2 GB, test command <= 10 min.
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
# One timed command: wall seconds and peak RSS from GNU time.
measure() {
  local what="$1" goal="$2"
  shift 2
  /usr/bin/time -f '%e %M' -o "$work/time" "$@" > "$work/out" 2> "$work/err" || true
  read -r wall kb < "$work/time"
  rows+=("| $what | $wall s | $(awk -v k="$kb" 'BEGIN {printf "%.2f GB", k/1048576}') | $goal |")
  echo "$what: $wall s, $kb kB" >&2
}
rate=$("$q" reference --preset tiny --seqlen 64 2>&1 | grep -o 'fp64 FMA rate [0-9.e+]*/s' | head -1 || true)
measure "default report (\`qkmla report\`)" "≤ 10 s" "$q" report -o "$work/r.html"
measure "default gate (\`qkmla gate\`)" "≤ 20 s" "$q" gate -o "$work/g.xml"
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
  measure "audit of a paper-g8 bf16 case, 4096 tokens" "–" "$q" audit "$work/case.safetensors" "$work/outs.safetensors" --no-diagnose
fi
if [ "$long" = 1 ]; then
  measure "bf16 report at 262144 tokens" "≤ 120 s, ≤ 2 GB" "$q" report --profile bf16 --seqlen 262144 -o "$work/long.html"
fi
if [ "$fresh" = 1 ]; then
  git clone -q . "$work/clone"
  measure "\`bash .ci/test\` in a fresh clone" "≤ 10 min" bash -c "cd '$work/clone' && bash .ci/test"
fi
{
  echo "# Performance, measured by reports/performance.sh"
  echo
  echo "Commit $commit; machine: $machine; ${rate:-fp64 FMA rate not printed}; $(date -u '+%Y-%m-%d %H:%M UTC')."
  echo "Wall time and peak RSS from GNU time, one run each (this machine is shared: compare only"
  echo "rows of one run)."
  echo
  echo "| what | wall | peak RSS | goal |"
  echo "|---|---:|---:|---|"
  printf '%s\n' "${rows[@]}"
} > "$out"
cat "$out"
