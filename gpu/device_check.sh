#!/usr/bin/env bash
# Every GPU check of the project in one prepared run on a lent GPU: at most 7 minutes, at most 8
# files under $OUT. Uses the bundle made beforehand by gpu/scripts/prepare_device_bundle.sh (built here,
# where the Debian libraries are; its binaries find the bundled libraries through an $ORIGIN
# rpath, so nothing else on the machine sees them), carried as build-device/:
#   device run: command "bash gpu/device_check.sh", carry ["build-device"], timeout_s 480
# then give the device back and commit $OUT under reports/ with the device, driver and date.
# Order: preflight (bundle present, a GPU listed, the driver's CUDA >= the bundle's runtime, the
# bundle's own runtime finds the device; any failure stops the run, exit 2), bits (every kernel vs
# its CPU model), compute-sanitizer memcheck/racecheck/synccheck/initcheck on a small dedicated
# case set (each must show "ran N kernel launches" with N > 0, or it fails as vacuous), the bench
# sweep (JSON lines as rows finish, a copy baseline), one Nsight Compute summary of the decode
# kernel (if ncu exists; --clock-control none: the clocks are left as the machine runs them, as
# the lent machines' notes ask), the MMA probe, the report, and, where the machine has PyTorch, its
# SDPA backends (flash, efficient, cuDNN, math) and Hugging Face's eager attention (plain and
# compiled) on the bundle's golden cases
# (gpu/scripts/torch_sdpa.py; judged here afterwards by gpu/scripts/torch_sdpa_audit.py). Every
# step's output is shown as it runs (stdout, also log.txt), so a time-out keeps the story. Exit 0
# only when every step passed.
# Files: log.txt (everything, with nvidia-smi, the ptxas summary and the ncu summary),
# steps.jsonl (one line per step and check), kernels-vs-model.txt, sanitizers.txt, bench.jsonl,
# mma-probe.bin, report.md, torch-sdpa.tar (the backends' outputs and their JSON lines).
# Overrides (tests): QKMLA_DEVICE_BUILD, QKMLA_NVIDIA_SMI, QKMLA_SANITIZER, QKMLA_NCU, QKMLA_PYTHON,
# QKMLA_LIMIT_<STEP> (seconds; STEP in PREFLIGHT BITS SANITIZER BENCH NCU PROBE REPORT TORCH).
set -u -o pipefail
OUT=${OUT:-$PWD/device-out}
B=${QKMLA_DEVICE_BUILD:-build-device}
mkdir -p "$OUT"
rm -f "$OUT/steps.jsonl"
exec > >(tee -a "$OUT/log.txt") 2>&1
TEE_PID=$!
source "$(dirname "$0")/scripts/device_steps.sh"
# Limits (s): 15 + 110 + 4 x 20 + 80 + 40 + 15 + 45 + 60 = 445, + 10 x 3 s grace = 475 s < 8
# minutes; the H200 run of 2026-12-04 took 61 s for all but the last step (30 s on its own).
L_PREFLIGHT=${QKMLA_LIMIT_PREFLIGHT:-15} L_BITS=${QKMLA_LIMIT_BITS:-110}
L_SAN=${QKMLA_LIMIT_SANITIZER:-20} L_BENCH=${QKMLA_LIMIT_BENCH:-80} L_NCU=${QKMLA_LIMIT_NCU:-40}
L_PROBE=${QKMLA_LIMIT_PROBE:-15} L_REPORT=${QKMLA_LIMIT_REPORT:-45} L_TORCH=${QKMLA_LIMIT_TORCH:-60}
PY=${QKMLA_PYTHON:-python3}
SMI=${QKMLA_NVIDIA_SMI:-nvidia-smi}
SAN=${QKMLA_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
NCU=${QKMLA_NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}
T=$B/tests/gpu_device_tests Q=$B/src/qkmla P=$B/gpu/probe_mma

finish() {  # at most 8 files come back: anything beyond is packed into one archive
  local files n
  mapfile -t files < <(cd "$OUT" && find . -type f ! -name log.txt ! -name steps.jsonl | sort)
  n=$((${#files[@]} + 2))
  if [ "$n" -gt 8 ]; then
    echo "== $n files under \$OUT: packing ${#files[@]} of them into extra.tar"
    (cd "$OUT" && tar -cf extra.tar --remove-files "${files[@]}")
  fi
  echo "== device_check: exit $1 ($FAILED failed steps or checks; files: $(cd "$OUT" && ls | tr '\n' ' '))"
  exec 1>&- 2>&-
  wait "$TEE_PID" 2> /dev/null
  exit "$1"
}

stop() {  # a failed preflight: say why, loudly, and stop before any step
  check preflight FAIL "$1"
  echo "PREFLIGHT FAILED: $1. Nothing else was run."
  finish 2
}

# --- preflight -------------------------------------------------------------------------------
echo "== device_check at $(date -u +%FT%TZ), bundle $B, commit $(cat "$B/COMMIT" 2> /dev/null)"
for f in "$T" "$Q" "$P" "$B/COMMIT" "$B/CUDA_RUNTIME"; do
  [ -e "$f" ] || stop "the bundle lacks $f (run gpu/scripts/prepare_device_bundle.sh here and carry $B)"
done
command -v "$SMI" > /dev/null || stop "$SMI not found: no NVIDIA driver on this machine"
gpus=$(timeout -k 2 10 "$SMI" -L 2>&1)
echo "$gpus"
grep -q '^GPU [0-9]' <<< "$gpus" || stop "no GPU listed by $SMI -L"
timeout -k 2 10 "$SMI" --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
drv=$(timeout -k 2 10 "$SMI" 2>&1 | grep -o 'CUDA Version: *[0-9.]*' | grep -o '[0-9.]*$')
rt=$(cat "$B/CUDA_RUNTIME")
echo "driver supports CUDA ${drv:-?}; the bundle's runtime is CUDA $rt"
[ -n "$drv" ] || stop "$SMI shows no 'CUDA Version'"
[ "$(printf '%s\n%s\n' "$rt" "$drv" | sort -V | head -1)" = "$rt" ] ||
  stop "the driver supports CUDA $drv, older than the bundle's runtime $rt"
step preflight "$L_PREFLIGHT" - "$T" preflight
[ "$STEP_RC" -eq 0 ] || stop "the bundle's own runtime finds no usable device (gpu_device_tests preflight: exit $STEP_RC)"
check preflight OK "device found, driver CUDA $drv >= runtime $rt"
echo "== ptxas summary of the bundle:" && cat "$B/ptxas.txt" 2> /dev/null | head -60

# --- the steps ---------------------------------------------------------------------------------
step bits "$L_BITS" "$OUT/kernels-vs-model.txt" "$T" bits
for tool in memcheck racecheck synccheck initcheck; do
  if [ ! -x "$SAN" ]; then
    check "sanitizer-$tool" FAIL "compute-sanitizer not found ($SAN)"
    continue
  fi
  log=$OUT/sanitizer-$tool.part
  step "sanitizer-$tool" "$L_SAN" "$log" "$SAN" --tool "$tool" --error-exitcode 3 "$T" sanitize
  n=$(grep -o 'ran [0-9]* kernel launches' "$log" | tail -1 | grep -o '[0-9]*')
  # racecheck's summary line is its own: "RACECHECK SUMMARY: 0 hazards displayed (0 errors, ...".
  errors=$(grep -c -E 'ERROR SUMMARY: 0 errors|RACECHECK SUMMARY: 0 hazards displayed \(0 errors' "$log")
  cat "$log" >> "$OUT/sanitizers.txt" && rm -f "$log"
  if [ "$STEP_RC" -eq 0 ] && [ "${n:-0}" -gt 0 ] && [ "$errors" -gt 0 ]; then
    check "sanitizer-$tool" OK "$n kernel launches checked, 0 errors"
  else
    check "sanitizer-$tool" FAIL "vacuous or failed: ${n:-no} kernel launches seen, or errors"
  fi
  echo "---- end of $tool" >> "$OUT/sanitizers.txt"
done
step bench "$L_BENCH" - "$Q" bench --sweep --warmup 3 --reps 15 --format jsonl -o "$OUT/bench.jsonl"
if [ -x "$NCU" ]; then
  step ncu "$L_NCU" - "$NCU" --clock-control none --kernel-name regex:decode_kernel --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section LaunchStats \
    --section Occupancy "$Q" bench --contexts 65536 --batch 4 --warmup 0 --reps 3
else
  echo "== ncu: not found ($NCU); no Nsight Compute summary"
fi
# Seed 2000: tiles the fitted H200 model (gpu/model/mma_model.hpp, fitted on seed 1000) never saw.
step mma-probe "$L_PROBE" - "$P" "$OUT/mma-probe.bin" "${QKMLA_PROBE_SEED:-2000}"
step report "$L_REPORT" - "$Q" report --threads 16 --format md -o "$OUT/report.md"
if [ -d "$B/cases" ] && "$PY" -c "import torch, safetensors, ml_dtypes" 2> /dev/null; then
  tw=$(mktemp -d)
  step torch-sdpa "$L_TORCH" "$tw/torch_sdpa.jsonl" env PYTHONUNBUFFERED=1 "$PY" \
    "$(dirname "$0")/scripts/torch_sdpa.py" "$B/cases" "$tw/out"
  tar -cf "$OUT/torch-sdpa.tar" -C "$tw" . && rm -rf "$tw"
else
  echo "== torch-sdpa: skipped ($PY has no torch, safetensors or ml_dtypes, or $B has no cases)"
fi
echo "== steps:" && cat "$OUT/steps.jsonl"
finish "$([ "$FAILED" -eq 0 ] && echo 0 || echo 1)"
