#!/usr/bin/env bash
# Every GPU check of the project in one run on a lent GPU (budget: under 5 minutes on an H200),
# results under $OUT. Uses a build made beforehand by gpu/prepare_device_bundle.sh (the device
# machine has nvcc but not the project's Debian libraries), carried as build-device/:
#   device run: command "bash gpu/device_check.sh", carry ["build-device"], timeout_s 360
# (the steps are capped at 120 + 3 x 20 + 40 + 70 s, so the whole run stays under 5 minutes), then
# give the device back and commit $OUT under reports/ with the device, driver, date and commit.
# Files written: device.txt (nvidia-smi, driver, date), kernels-vs-model.txt (bit-exactness of
# every kernel against its CPU model), report.md (qkmla report with gpu.absorbed/gpu.explicit
# rows and the kernel-vs-model notes), bench.md (the paper's decode table), ptxas.txt,
# sanitizer-{memcheck,racecheck,synccheck}.txt (compute-sanitizer on tiny shapes; skipped with a
# line saying so where the tool is absent). Every step's output is line-buffered, so a step killed
# by its limit keeps what it printed.
set -u
OUT=${OUT:-$PWD/device-out}
B=${QKMLA_DEVICE_BUILD:-build-device}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/$B/lib:${LD_LIBRARY_PATH:-}"
QKMLA_COMMIT=$(cat "$B/COMMIT" 2>/dev/null || echo unknown)
export QKMLA_COMMIT
source "$(dirname "$0")/device_steps.sh"  # step NAME SECONDS COMMAND...
{ date -u; echo "commit $QKMLA_COMMIT"; nvidia-smi || true; } > "$OUT/device.txt" 2>&1
cp "$B/ptxas.txt" "$OUT/ptxas.txt" 2>/dev/null
step kernels-vs-model 120 "$B/tests/gpu_device_tests" bits > "$OUT/kernels-vs-model.txt" 2>&1
san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck racecheck synccheck; do
  if [ -x "$san" ]; then
    step "sanitizer-$tool" 20 "$san" --tool "$tool" --error-exitcode 3 \
      "$B/tests/gpu_device_tests" bits-small > "$OUT/sanitizer-$tool.txt" 2>&1
  else
    echo "sanitizer-$tool: skipped, compute-sanitizer not found" >> "$OUT/steps.txt"
  fi
done
step bench 40 "$B/src/qkmla" bench --format md -o "$OUT/bench.md" 2>> "$OUT/steps.txt"
step report 70 "$B/src/qkmla" report --threads 16 --format md -o "$OUT/report.md" 2>> "$OUT/steps.txt"
cat "$OUT/steps.txt"
