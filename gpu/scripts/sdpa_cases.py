"""The case loop torch_sdpa.py and jax_sdpa.py share: every golden case of CASE_DIR times every
backend, outputs to OUT_DIR/<case>__<backend>.safetensors, one JSON line per pair (a backend that
refuses a case says why and the rest go on). Returns 1 when as many pairs failed as there are
backends (a backend missing everywhere, or worse), else 0: a refusal of one case is data."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "zoo"))
from common import save_outputs  # noqa: E402


def run_all(cases, out_dir, backends, run_case):
    """run_case(path, backend) -> (outputs dict, info dict)."""
    os.makedirs(out_dir, exist_ok=True)
    failures = 0
    for name in sorted(f for f in os.listdir(cases) if f.endswith(".safetensors")):
        for backend in backends:
            row = {"case": name, "backend": backend}
            try:
                outs, info = run_case(os.path.join(cases, name), backend)
                stem = name[: -len(".safetensors")]
                save_outputs(outs, os.path.join(out_dir, f"{stem}__{backend}.safetensors"))
                row.update(info, ok=True, delivered=sorted(outs))
            except Exception as e:  # a backend that refuses these inputs says why
                row.update(ok=False, error=f"{type(e).__name__}: {str(e)[:300]}")
                failures += 1
            print(json.dumps(row), flush=True)
    return 0 if failures < len(backends) else 1
