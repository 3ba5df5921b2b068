#!/usr/bin/env bash
# The zoo's kill / false-alarm matrix (tests/zoo): run_zoo.py over FIRST..LAST in chunks of 20
# seeds (each chunk's JSON kept, so a stopped run keeps what finished), merged by merge_runs.py
# into reports/zoo-FIRST-LAST[-correct].md with the checkout's commit, the binary and the seed
# range. Needs numpy and ml_dtypes (the test command's venv: build/tests/interop/venv).
# Usage: reports/zoo_matrix.sh QKMLA_BINARY FIRST LAST [--correct-only]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
qkmla=$(realpath "$1"); first=$2; last=$3; flag=${4:-}
python=${PYTHON:-$here/build/tests/interop/venv/bin/python}
work=$(mktemp -d)
suffix=${flag:+-correct}
jsons=()
for ((start = first; start <= last; start += 20)); do
  end=$((start + 19 < last ? start + 19 : last))
  "$python" "$here/tests/zoo/run_zoo.py" "$qkmla" "$work/w$start" --seeds "$start-$end" $flag \
      --json "$work/$start.json" >/dev/null || true  # the merged matrix says what failed
  rm -rf "$work/w$start"
  jsons+=("$work/$start.json")
done
"$python" "$here/tests/zoo/merge_runs.py" "$here/reports/zoo-$first-$last$suffix.md" "${jsons[@]}"
