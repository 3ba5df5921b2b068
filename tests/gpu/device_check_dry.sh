#!/usr/bin/env bash
# gpu.scripts.{no_device,old_driver,no_device_runtime,hung_step}: gpu/device_check.sh run here,
# without a GPU, against stub tools (tests/gpu/stubs/).
#   no_device:         nvidia-smi lists no GPU: the preflight stops, exit 2, a clear message, <= 8 files.
#   old_driver:        the driver's CUDA is older than the bundle's runtime: stops the same way.
#   no_device_runtime: nvidia-smi lists a GPU but the bundle's own gpu_device_tests (the real one,
#                      built here, where there is none) finds no device: stops the same way.
#   hung_step:         a stub device whose `bits` step hangs: it is killed at its limit, keeps its
#                      line, the later steps still run, a sanitizer step whose binary launched no
#                      kernel fails as vacuous, the run exits 1 with <= 8 files, within seconds.
# Usage: device_check_dry.sh CASE SOURCE_DIR GPU_DEVICE_TESTS WORK_DIR
set -uo pipefail
what=$1 root=$2 real_tests=$3 work=$4
stubs=$root/tests/gpu/stubs
rm -rf "$work" && mkdir -p "$work/out" "$work/bundle/src" "$work/bundle/tests" "$work/bundle/gpu"
fail() { echo "FAIL: $*" >&2; exit 1; }
B=$work/bundle
echo stub-commit > "$B/COMMIT" && echo 13.0 > "$B/CUDA_RUNTIME"
cp "$stubs/qkmla" "$B/src/qkmla" && cp "$stubs/probe_mma" "$B/gpu/probe_mma"
if [ "$what" = no_device_runtime ]; then ln -s "$real_tests" "$B/tests/gpu_device_tests"
else cp "$stubs/gpu_device_tests" "$B/tests/gpu_device_tests"; fi
chmod +x "$B"/*/*
export STUB_SMI_MODE=ok
case "$what" in
  no_device) STUB_SMI_MODE=none ;;
  old_driver) STUB_SMI_MODE=old ;;
esac
t0=$SECONDS rc=0
OUT=$work/out QKMLA_DEVICE_BUILD=$B QKMLA_NVIDIA_SMI=$stubs/nvidia-smi \
  QKMLA_SANITIZER=$stubs/compute-sanitizer QKMLA_NCU=$work/no-ncu QKMLA_LIMIT_BITS=2 \
  QKMLA_KILL_GRACE=1 bash "$root/gpu/device_check.sh" > "$work/stdout.txt" 2>&1 || rc=$?
took=$((SECONDS - t0))
cat "$work/stdout.txt"
files=$(find "$work/out" -type f | wc -l)
echo "-- exit $rc after $took s, $files files: $(ls "$work/out" | tr '\n' ' ')"
[ "$files" -le 8 ] || fail "$files files under \$OUT (at most 8 come back)"
cmp -s "$work/stdout.txt" "$work/out/log.txt" || fail "log.txt is not what stdout showed"
case "$what" in
  no_device | old_driver | no_device_runtime)
    [ "$rc" = 2 ] || fail "exit $rc, not 2, when the preflight fails"
    grep -q '^PREFLIGHT FAILED: ' "$work/stdout.txt" || fail "no PREFLIGHT FAILED message"
    want=$([ "$what" = no_device ] && echo "no GPU listed" ||
      ([ "$what" = old_driver ] && echo "older than the bundle's runtime" || echo "finds no usable device"))
    grep -q "PREFLIGHT FAILED: .*$want" "$work/stdout.txt" || fail "the message does not say '$want'"
    grep -q '"check":"preflight","ok":false' "$work/out/steps.jsonl" || fail "steps.jsonl lacks it"
    ! grep -q '"step":"bits"' "$work/out/steps.jsonl" || fail "a step ran after a failed preflight"
    ;;
  hung_step)
    [ "$rc" = 1 ] || fail "exit $rc, not 1, with a hung step"
    [ "$took" -lt 30 ] || fail "took $took s"
    grep -Eq '^\{"step":"bits","rc":(124|137),' "$work/out/steps.jsonl" || fail "bits not killed"
    grep -q 'bits: started' "$work/out/kernels-vs-model.txt" || fail "the hung step lost its line"
    for tool in memcheck racecheck synccheck; do
      grep -q "\"check\":\"sanitizer-$tool\",\"ok\":true" "$work/out/steps.jsonl" ||
        fail "$tool (kernels launched, 0 errors in its own summary line) did not pass"
    done
    grep -q '"check":"sanitizer-initcheck","ok":false' "$work/out/steps.jsonl" ||
      fail "initcheck with no kernel launched was not failed as vacuous"
    for s in bench mma-probe report; do
      grep -q "^{\"step\":\"$s\",\"rc\":0," "$work/out/steps.jsonl" || fail "step $s did not run after the hang"
    done
    [ "$(grep -c '"context"' "$work/out/bench.jsonl")" = 2 ] || fail "bench.jsonl rows lost"
    [ -s "$work/out/mma-probe.bin" ] || fail "no probe file"
    ;;
  *) fail "unknown case '$what'" ;;
esac
rm -rf "$work"
echo "PASS: gpu.scripts.$what"
