#!/usr/bin/env bash
# Builds what gpu/device_check.sh runs, here (where the Debian -dev packages are), and bundles it
# into build-device/: src/qkmla, tests/gpu_device_tests (sm_90a + sm_80 kernels), gpu/probe_mma,
# the shared libraries they need beyond glibc (lib/, found through an $ORIGIN/../lib DT_RPATH of
# each binary, so that no global LD_LIBRARY_PATH puts them ahead of the system's for other tools),
# the commit (COMMIT), the CUDA runtime it was built with (CUDA_RUNTIME: the driver must support
# at least that), the kernels' ptxas register and spill summary (ptxas.txt) and three golden cases
# for PyTorch's SDPA backends (cases/). Both build folders are git-ignored; the device tool carries
# the bundle (about 41 MB).
set -euo pipefail
cd "$(dirname "$0")/../.."  # the repository root
W=build-device-work B=build-device
# DT_RPATH (not RUNPATH): searched for the libraries' own dependencies too.
cmake -S . -B "$W" -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=ON '-DCMAKE_BUILD_RPATH=$ORIGIN/../lib' \
  -DCMAKE_EXE_LINKER_FLAGS=-Wl,--disable-new-dtags > /dev/null
touch gpu/kernels/device_pipeline.cu gpu/bench/bench.cu  # recompile the kernels so that their ptxas summary is captured
rm -rf "$B"  # no stale bundle survives a failed build
# The whole build log is kept: a failed build stops here and shows the compiler's errors.
if ! cmake --build "$W" -j2 --target qkmla gpu_device_tests probe_mma > "$W/build.log" 2>&1; then
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
mkdir -p "$B/src" "$B/tests" "$B/gpu" "$B/lib"
cp "$W/src/qkmla" "$B/src/" && cp "$W/tests/gpu_device_tests" "$B/tests/" && cp "$W/ptxas.txt" "$B/"
cp "$W/gpu/probe_mma" "$B/gpu/"
nvcc=$(grep -m1 '^CMAKE_CUDA_COMPILER:' "$W/CMakeCache.txt" | cut -d= -f2)
"${nvcc:-nvcc}" --version | grep -o 'release [0-9.]*' | cut -d' ' -f2 > "$B/CUDA_RUNTIME"
[ -s "$B/CUDA_RUNTIME" ] || { echo "prepare_device_bundle: no CUDA version from nvcc" >&2; exit 1; }
# Golden cases for gpu/scripts/torch_sdpa.py (PyTorch's SDPA backends on the device; each about
# 6 MB, most of it the up-projection weights).
mkdir -p "$B/cases"
golden() { "$W/src/qkmla" golden --preset paper-decode --batch 2 --sq 1 "$@" > /dev/null; }
golden --profile bf16 --seqlens 600,130 --seed 11 -o "$B/cases/pd-bf16-sq1.safetensors"
golden --profile bf16 --seqlens 500,77 --scenario large_logits --seed 12 \
  -o "$B/cases/pd-bf16-sq1-large.safetensors"
golden --profile fp16 --seqlens 600,130 --seed 13 -o "$B/cases/pd-fp16-sq1.safetensors"
git describe --always --dirty --abbrev=12 > "$B/COMMIT"  # -dirty: the bundle is not a commit's
for bin in "$B/src/qkmla" "$B/tests/gpu_device_tests" "$B/gpu/probe_mma"; do
  readelf -d "$bin" | grep -q 'RPATH.*\$ORIGIN/../lib' ||
    { echo "prepare_device_bundle: $bin has no \$ORIGIN/../lib RPATH" >&2; exit 1; }
  # A later binary's ldd already resolves to the bundle's own copies (the rpath): skip those.
  ldd "$bin" | awk '/=> \// {print $3}' | grep -v -E '/lib(c|m|pthread|dl|rt)\.so|/ld-linux' |
    while read -r lib; do
      [ -e "$B/lib/$(basename "$lib")" ] || cp -L "$lib" "$B/lib/"
    done
done
du -sh "$B"
