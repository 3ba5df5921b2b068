#!/usr/bin/env bash
# Regenerates reports/gpu-ptxas.md: recompiles the CUDA sources of build/ and tabulates ptxas -v.
set -euo pipefail
cd "$(dirname "$0")/.."
touch gpu/kernels/device_pipeline.cu gpu/bench/bench.cu
cmake --build build --target qkmla_gpu 2>&1 | grep -A3 "ptxas info    : Compiling entry" | grep -E "Compiling|spill|Used" |
  paste - - - | sed 's/ptxas info    : //g' > /tmp/qkmla-ptxas.txt
python3 - <<'PY'
import re, subprocess, datetime
fmt = {'0': 'F32', '1': 'BF16', '2': 'F16', '3': 'E4M3'}
rows = set()
for line in open('/tmp/qkmla-ptxas.txt'):
    m = re.search(r"function '(\S+)' for '(sm_\w+)'.*?(\d+) bytes spill stores.*?Used (\d+) registers", line)
    if not m:
        continue
    smem = re.search(r"(\d+) bytes smem", line)
    name = subprocess.run(['c++filt', m.group(1)], capture_output=True, text=True).stdout.strip()
    name = name.replace('void ', '').replace('qkmla::gpu::', '').replace('(anonymous namespace)::', '')
    name = re.sub(r'\(Store\)(\d)', lambda x: fmt[x.group(1)], name)
    name = re.sub(r'\(.*\)$', '', name)
    rows.add((m.group(2), name, int(m.group(4)), int(m.group(3)), smem.group(1) if smem else '0'))
commit = subprocess.run(['git', 'describe', '--always', '--dirty', '--abbrev=12'], capture_output=True, text=True).stdout.strip()
with open('reports/gpu-ptxas.md', 'w') as f:
    f.write("# ptxas resource summary of the GPU kernels\n\n")
    f.write(f"Made by `reports/gpu_ptxas.sh` (nvcc 13.0.88, `-Xptxas=-v --fmad=false`, CUDA_ARCHITECTURES 90a;80) at commit {commit} on {datetime.date.today()}; the same summary is printed in every build log. Compile-time numbers only: no GPU was involved. Template arguments: decode_kernel<key/cache format, stored format>, append_kernel<stored, cache>. `fill_kernel` is the benchmark's data generator.\n\n")
    f.write("| arch | kernel | registers | spill stores (bytes) | static smem (bytes) |\n|---|---|---|---|---|\n")
    for r in sorted(rows):
        f.write(f"| {r[0]} | `{r[1]}` | {r[2]} | {r[3]} | {r[4]} |\n")
PY
