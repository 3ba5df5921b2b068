"""Real third-party GPU kernels on golden cases: jax.nn.dot_product_attention (XLA and cuDNN).

Run where JAX sees a GPU (the lent H200's image has jax with its CUDA 13 plugin):
python3 gpu/scripts/jax_sdpa.py CASE_DIR OUT_DIR. The same protocol as torch_sdpa.py beside it:
the explicit q, k, v of tests/zoo/sdpa_explicit.py in the stored dtype, one call per sequence
(keys cut to its length; S_q > 1 gets a bottom-right causal mask), v zero-padded to q's head dim,
`out` delivered in the stored dtype. JAX's function returns no lse, so only `out` is delivered.
Writes OUT_DIR/<case>__JAX_<IMPL>.safetensors and one JSON line per (case, implementation);
judge them here with gpu/scripts/torch_sdpa_audit.py (it reads any <case>__<name> file).
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "zoo"))
from sdpa_explicit import qkv  # noqa: E402

from sdpa_cases import run_all  # noqa: E402  (beside this file)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

IMPLEMENTATIONS = ["xla", "cudnn"]


def run_case(path, impl):
    m = qkv(path)
    cs = m.cs
    B, S, H, dv = cs.B, cs.S, cs.H, cs.dv
    d = m.q.shape[-1]
    out = np.zeros((B, S, H, dv), np.float32)
    for b in range(B):
        T = int(m.seq[b])
        if T == 0:
            continue
        q = jnp.asarray(m.q[b][None].astype(cs.stored))                  # [1, S, H, d]
        k = jnp.asarray(m.k[b, :T][None].astype(cs.stored))              # [1, T, H, d]
        vp = np.zeros((1, T, H, d), cs.stored)
        vp[0, ..., :dv] = m.v[b, :T].astype(cs.stored)
        mask = None
        if S > 1 and cs.causal:  # query i sees t <= T - S + i
            vis = np.arange(T)[None, :] <= (T - S + np.arange(S))[:, None]
            mask = jnp.asarray(vis)[None, None]
        o = jax.nn.dot_product_attention(q, k, jnp.asarray(vp), mask=mask, scale=float(m.scale),
                                         implementation=impl)
        out[b] = np.asarray(o[0, :, :, :dv].astype(jnp.float32))
    return {"out": out.astype(cs.stored)}


def main():
    cases, out_dir = sys.argv[1], sys.argv[2]
    print(json.dumps({"jax": jax.__version__, "devices": [str(x) for x in jax.devices()]}),
          flush=True)
    names = {"JAX_" + i.upper(): i for i in IMPLEMENTATIONS}
    return run_all(cases, out_dir, list(names), lambda path, b: (run_case(path, names[b]), {}))


if __name__ == "__main__":
    sys.exit(main())
