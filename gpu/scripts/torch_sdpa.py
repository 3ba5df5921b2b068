"""Real third-party GPU kernels on golden cases: PyTorch's scaled_dot_product_attention backends.

Run on a machine with a CUDA device and PyTorch (the lent H200's image has torch, numpy, ml_dtypes
and safetensors): python3 gpu/scripts/torch_sdpa.py CASE_DIR OUT_DIR.

For every golden case in CASE_DIR (plain causal cases; top-k and sinks have no SDPA argument), the
explicit keys and values are formed as an explicit-form module forms them
(tests/zoo/sdpa_explicit.py: q, k, v rounded to the stored dtype), then each backend of
torch.nn.attention.SDPBackend (FLASH_ATTENTION, EFFICIENT_ATTENTION, CUDNN_ATTENTION, MATH), and
Hugging Face's eager attention as written and under torch.compile (HF_EAGER, HF_EAGER_COMPILED),
runs the attention on the GPU, one call per sequence (keys cut to its length; a bottom-right
causal mask when S_q > 1), in the stored dtype. v is zero-padded to q's head dim (the flash
kernels need equal head dims; a zero column changes no other column). `out` is delivered in the
stored dtype; `lse` (natural log, fp32) from the backend's own private op where it exposes one,
delivered only when it agrees with an fp32 logsumexp of the same scores to 1e-3 (a different base
or layout would be an interface mismatch, not numerics). Writes
OUT_DIR/<case>__<backend>.safetensors and prints one JSON line per (case, backend); judge them
here with `qkmla audit CASE OUTPUTS --form explicit`.
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "zoo"))
from sdpa_explicit import qkv  # noqa: E402

from sdpa_cases import run_all  # noqa: E402  (beside this file)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

BACKENDS = ["FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH", "HF_EAGER",
            "HF_EAGER_COMPILED"]


def hf_eager(q, k, v, mask, scale):
    """Hugging Face's eager_attention_forward: scores in the stored dtype, an fp32 softmax cast
    back, P.V in the stored dtype (cuBLAS; compiled: what torch.compile's Inductor makes of it)."""
    w = torch.matmul(q, k.transpose(2, 3)) * scale
    if mask is not None:
        w = w.masked_fill(~mask, float("-inf"))
    w = torch.nn.functional.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(w, v)


hf_eager_compiled = torch.compile(hf_eager, dynamic=True)
TORCH_DT = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def private_lse(backend, q, k, v, bias, scale):
    """(out, lse [H, S]) from the backend's own op, or None where it has none for these inputs."""
    ops = torch.ops.aten
    if backend == "FLASH_ATTENTION" and bias is None:
        r = ops._scaled_dot_product_flash_attention(q, k, v, 0.0, False, False, scale=scale)
    elif backend == "EFFICIENT_ATTENTION":
        r = ops._scaled_dot_product_efficient_attention(q, k, v, bias, True, 0.0, False,
                                                        scale=scale)
    elif backend == "CUDNN_ATTENTION":
        r = ops._scaled_dot_product_cudnn_attention(q, k, v, bias, True, 0.0, False, False,
                                                    scale=scale)
    else:
        return None
    S = q.shape[2]
    return r[0], r[1].float().reshape(q.shape[1], -1)[:, :S]


def run_case(path, backend, dev):
    m = qkv(path)
    cs = m.cs
    B, S, H, dv = cs.B, cs.S, cs.H, cs.dv
    d = m.q.shape[-1]
    tdt = TORCH_DT[np.dtype(cs.stored).name]
    out = np.zeros((B, S, H, dv), np.float32)
    lse = np.full((B, S, H), -np.inf, np.float32)
    info = {"lse_from": None, "private_out_equal": True, "lse_max_abs_diff": 0.0}
    lse_ok = True

    def to(x):  # a stored-dtype tensor on the device from values exact in that dtype
        return torch.tensor(np.ascontiguousarray(x, np.float32), device=dev).to(tdt)

    for b in range(B):
        T = int(m.seq[b])
        if T == 0:
            continue
        q = to(m.q[b].transpose(1, 0, 2))[None]                          # [1, H, S, d]
        k = to(m.k[b, :T].transpose(1, 0, 2))[None]                      # [1, H, T, d]
        vp = np.zeros((T, H, d), np.float32)
        vp[..., :dv] = m.v[b, :T]
        v = to(vp.transpose(1, 0, 2))[None]                              # [1, H, T, d]
        mask = bias = None
        if S > 1 and cs.causal:  # query i sees t <= T - S + i
            mask = (torch.arange(T, device=dev)[None, :]
                    <= (T - S + torch.arange(S, device=dev))[:, None])
            bias = torch.zeros(1, H, S, T, device=dev, dtype=tdt).masked_fill(~mask, float("-inf"))
        if backend.startswith("HF_EAGER"):  # no lse: the module never forms one
            fn = hf_eager_compiled if backend == "HF_EAGER_COMPILED" else hf_eager
            o, pr = fn(q, k, v, mask, float(m.scale)), None
        else:
            with sdpa_kernel(getattr(SDPBackend, backend)):
                o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=float(m.scale))
                try:
                    pr = private_lse(backend, q, k, v, bias, float(m.scale))
                except Exception as e:  # out is still delivered; lse is not
                    pr = None
                    info["lse_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        out[b] = o[0, :, :, :dv].float().cpu().numpy().transpose(1, 0, 2)
        if pr is None:
            lse_ok = False
            continue
        sc = (q.float() @ k.float().transpose(-1, -2))[0] * float(m.scale)  # [H, S, T]
        if mask is not None:
            sc = sc.masked_fill(~mask, float("-inf"))
        ref = torch.logsumexp(sc, -1)                                    # [H, S]
        info["private_out_equal"] &= bool(torch.equal(pr[0], o))
        diff = float((pr[1] - ref).abs().max())
        info["lse_max_abs_diff"] = max(info["lse_max_abs_diff"], diff)
        lse_ok &= diff <= 1e-3
        lse[b] = pr[1].cpu().numpy().T
    outs = {"out": out.astype(cs.stored)}
    if lse_ok:
        outs["lse"] = lse
        info["lse_from"] = "private op"
    return outs, info


def main():
    cases, out_dir = sys.argv[1], sys.argv[2]
    dev = torch.device(os.environ.get("QKMLA_TORCH_DEVICE", "cuda"))  # cpu: a dry run of the script
    print(json.dumps({"torch": torch.__version__, "cuda": torch.version.cuda,
                      "cudnn": torch.backends.cudnn.version(),
                      "device": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu"}),
          flush=True)
    return run_all(cases, out_dir, BACKENDS, lambda path, b: run_case(path, b, dev))


if __name__ == "__main__":
    sys.exit(main())
