#!/usr/bin/env bash
# interop.numpy_safetensors: a Python client with the real PyPI packages reads a golden case,
# computes the absorbed form in float32, and `qkmla audit` passes it; the same client with one
# injected bug (gamma_ck not absorbed) must fail. Usage: run_interop.sh QKMLA_BINARY WORK_DIR
set -euo pipefail
qkmla=$1
work=$2
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$work"
venv="$work/venv"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import safetensors, numpy" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check safetensors numpy
fi
"$venv/bin/python" -c "import safetensors, numpy; print('safetensors', safetensors.__version__, 'numpy', numpy.__version__)"
"$qkmla" golden --preset tiny --profile fp32 --seqlens 0,9,33 --sq 2 --seed 7 -o "$work/case.safetensors"
"$venv/bin/python" "$here/numpy_client.py" "$work/case.safetensors" "$work/good.safetensors"
"$qkmla" audit "$work/case.safetensors" "$work/good.safetensors" --label numpy
"$venv/bin/python" "$here/numpy_client.py" "$work/case.safetensors" "$work/bug.safetensors" no_gamma_k
set +e
"$qkmla" audit "$work/case.safetensors" "$work/bug.safetensors" --label numpy_bug > "$work/bug.txt"
rc=$?
set -e
cat "$work/bug.txt"
if [ "$rc" -ne 1 ]; then
  echo "interop: the injected bug was not caught (exit $rc, expected 1)" >&2
  exit 1
fi
echo "interop: correct client passed, injected bug failed (exit 1) as it should"
