#!/usr/bin/env bash
# Builds what gpu/device_check.sh runs, here (where the Debian -dev packages are), and bundles it
# into build-device/: src/qkmla, tests/gpu_device_tests (sm_90a + sm_80 kernels), the shared
# libraries they need beyond glibc (lib/), the commit (COMMIT) and the kernels' ptxas register and
# spill summary (ptxas.txt). Both build folders are git-ignored; the device tool carries the bundle.
set -euo pipefail
cd "$(dirname "$0")/.."
W=build-device-work B=build-device
cmake -S . -B "$W" -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=ON > /dev/null
touch gpu/device_pipeline.cu gpu/bench.cu  # recompile the kernels so that their ptxas summary is captured
rm -rf "$B"  # no stale bundle survives a failed build
# The whole build log is kept: a failed build stops here and shows the compiler's errors.
if ! cmake --build "$W" -j2 --target qkmla gpu_device_tests > "$W/build.log" 2>&1; then
  # The compiler's errors first: in a parallel build the log's tail is often another job's output
  # (ptxas summaries), not the error that stopped the build.
  grep -E -B2 -A6 '(error|fatal)( |:)|#error' "$W/build.log" | head -80 >&2
  echo "... (last lines of the log:)" >&2
  tail -5 "$W/build.log" >&2
  echo "prepare_device_bundle: build failed (log: $W/build.log); no bundle made" >&2
  exit 1
fi
grep -A3 "ptxas info    : Compiling" "$W/build.log" > "$W/ptxas.txt" ||
  { echo "prepare_device_bundle: no ptxas summary in the build log" >&2; exit 1; }
mkdir -p "$B/src" "$B/tests" "$B/lib"
cp "$W/src/qkmla" "$B/src/" && cp "$W/tests/gpu_device_tests" "$B/tests/" && cp "$W/ptxas.txt" "$B/"
git describe --always --dirty --abbrev=12 > "$B/COMMIT"  # -dirty: the bundle is not a commit's
for bin in "$B/src/qkmla" "$B/tests/gpu_device_tests"; do
  ldd "$bin" | awk '/=> \// {print $3}' | grep -v -E '/lib(c|m|pthread|dl|rt)\.so|/ld-linux' |
    xargs -r -I{} cp -L {} "$B/lib/"
done
du -sh "$B"
