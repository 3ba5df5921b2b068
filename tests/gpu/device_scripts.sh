#!/usr/bin/env bash
# gpu.scripts.*: the device scripts fail loudly and keep what they printed (issue 13), on any
# machine (no GPU needed).
#   killed:       a step killed by its time limit keeps every line the binary printed before, and
#                 steps.jsonl records the limit's exit code (gpu_device_tests `stall` hangs after 3 lines).
#   broken_build: a build that fails makes prepare_device_bundle.sh exit non-zero, shows the
#                 compiler's error, and leaves no bundle (not even a stale one from before).
# Usage: device_scripts.sh killed|broken_build SOURCE_DIR GPU_DEVICE_TESTS WORK_DIR
set -uo pipefail
what=$1 root=$2 bin=$3 work=$4
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*" >&2; exit 1; }
case "$what" in
  killed)
    OUT=$work
    source "$root/gpu/scripts/device_steps.sh"
    step stall 2 "$work/stall.txt" "$bin" stall > "$work/shown.txt"
    cat "$work/steps.jsonl" "$work/stall.txt"
    grep -q '^{"step":"stall","rc":124,"seconds":[23],"limit":2}$' "$work/steps.jsonl" ||
      fail "steps.jsonl lacks the timeout"
    [ "$(grep -c '^stall:' "$work/stall.txt")" = 3 ] || fail "the killed run lost printed lines"
    [ "$(grep -c '^stall:' "$work/shown.txt")" = 3 ] || fail "the lines were not shown as they came"
    grep -q '^== stall: exit 124 after' "$work/shown.txt" || fail "no step line on stdout"
    ;;
  broken_build)
    src=$work/src
    mkdir -p "$src"
    (cd "$root" && git ls-files -z --cached --others --exclude-standard |
      tar --null -T - -cf - 2>/dev/null) | tar -xf - -C "$src" || fail "could not copy the tree"
    echo '#error deliberately broken by tests/gpu/device_scripts.sh' >> "$src/src/core/dtype.cpp"
    mkdir -p "$src/build-device" && echo stale > "$src/build-device/COMMIT"
    rc=0
    bash "$src/gpu/scripts/prepare_device_bundle.sh" > "$work/log.txt" 2>&1 || rc=$?
    tail -5 "$work/log.txt"
    [ "$rc" -ne 0 ] || fail "prepare_device_bundle.sh exited 0 on a broken build"
    grep -q "deliberately broken" "$work/log.txt" || fail "the compiler's error is not shown"
    grep -q "build failed" "$work/log.txt" || fail "no 'build failed' message"
    [ ! -e "$src/build-device" ] || fail "a (stale) bundle survived the failed build"
    rm -rf "$src"
    ;;
  *) fail "unknown check '$what'" ;;
esac
echo "PASS: gpu.scripts.$what"
