#!/usr/bin/env bash
# interop.numpy_safetensors: real clients with the PyPI packages (safetensors, numpy, ml_dtypes)
# read golden cases written by qkmla and compute the outputs with an independent implementation
# (tests/thirdparty/mla_numpy.py, written from conventions §1 alone). For every shape class (the paper's,
# NoPE, G = 1, G < H, plain MLA) `qkmla audit` passes the correct client and fails the same client
# with an injected bug. Usage: run_interop.sh QKMLA_BINARY WORK_DIR
set -euo pipefail
qkmla=$1
work=$2
here=$(cd "$(dirname "$0")" && pwd)
client="$here/../thirdparty/mla_numpy.py"
mkdir -p "$work"
venv="$work/venv"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import safetensors, numpy, ml_dtypes" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check safetensors numpy ml_dtypes
fi
"$venv/bin/python" -c "import safetensors, numpy, ml_dtypes; print('safetensors', safetensors.__version__, 'numpy', numpy.__version__, 'ml_dtypes', ml_dtypes.__version__)"

# shape class | case flags | design of the correct client | an injected bug that must fail
classes=(
  "paper|--preset tiny --profile fp32 --seqlens 0,9,33 --sq 2 --seed 7|fp32|no_gamma_q"
  "nope|--preset tiny-nope --profile bf16 --seqlens 0,12,30 --sq 2 --seed 8|stored_out|no_gamma_q"
  "g1|--preset tiny-g1 --profile bf16 --seqlens 5,30 --sq 2 --seed 9|bf16_p|no_gamma_rk"
  "g_lt_h|--preset paper-g8 --profile bf16 --seqlens 0,20 --sq 2 --seed 10|stored_out|rope_style_swapped"
  "norm_none|--preset tiny --norm none --profile bf16 --seqlens 3,25 --sq 2 --seed 11|fp32|rope_pos_plus1"
  "nope_none|--preset tiny-nope --norm none --profile fp16 --seqlens 0,21 --sq 2 --seed 12|stored_out|noncausal"
)
for entry in "${classes[@]}"; do
  IFS='|' read -r name flags design bug <<< "$entry"
  case_file="$work/$name.safetensors"
  # shellcheck disable=SC2086
  "$qkmla" golden $flags -o "$case_file"
  "$venv/bin/python" "$client" "$case_file" "$work/$name-good.safetensors" "$design"
  "$qkmla" audit "$case_file" "$work/$name-good.safetensors" --label "numpy_$name" > "$work/$name-good.txt" || {
    cat "$work/$name-good.txt"
    echo "interop: $name: the correct client ($design) failed the audit" >&2
    exit 1
  }
  "$venv/bin/python" "$client" "$case_file" "$work/$name-bug.safetensors" "$design" "$bug"
  set +e
  "$qkmla" audit "$case_file" "$work/$name-bug.safetensors" --label "numpy_${name}_$bug" > "$work/$name-bug.txt"
  rc=$?
  set -e
  if [ "$rc" -ne 1 ]; then
    cat "$work/$name-bug.txt"
    echo "interop: $name: the injected bug $bug was not caught (exit $rc, expected 1)" >&2
    exit 1
  fi
  echo "interop: $name: correct client ($design) passed, bug $bug failed: $(grep -m1 '^diagnosis' "$work/$name-bug.txt" || echo 'no diagnosis')"
done

# golden --inputs on a file numpy wrote (no metadata: the config is inferred from shapes and
# dtypes) reproduces the reference of the generated case bit for bit.
"$qkmla" golden --preset tiny-g1 --norm unified --profile bf16 --seqlens 0,9,21 --sq 2 --seed 13 -o "$work/gen.safetensors"
"$venv/bin/python" - "$client" "$work/gen.safetensors" "$work/inputs.safetensors" <<'PY'
import importlib.util, sys
import numpy as np
from safetensors.numpy import save_file
spec = importlib.util.spec_from_file_location("mla_numpy", sys.argv[1])
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
_, t = m.load(sys.argv[2])
save_file({k: np.ascontiguousarray(v) for k, v in t.items() if not k.startswith("ref.")}, sys.argv[3])
PY
"$qkmla" golden --inputs "$work/inputs.safetensors" -o "$work/from_inputs.safetensors"
"$venv/bin/python" - "$client" "$work/gen.safetensors" "$work/from_inputs.safetensors" <<'PY'
import importlib.util, sys
import numpy as np
spec = importlib.util.spec_from_file_location("mla_numpy", sys.argv[1])
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
_, a = m.load(sys.argv[2]); _, b = m.load(sys.argv[3])
refs = [k for k in a if k.startswith("ref.")]
bad = [k for k in refs if not np.array_equal(a[k].view(np.uint8), b[k].view(np.uint8))]
print(f"interop: golden --inputs (numpy-written inputs): {len(refs) - len(bad)} of {len(refs)} reference tensors bit-identical")
sys.exit(1 if bad or not refs else 0)
PY
