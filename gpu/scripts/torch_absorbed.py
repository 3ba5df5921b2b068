"""A real PyTorch module's absorbed MLA decode on golden cases, in the stored dtype.

Run where PyTorch sees a GPU (or QKMLA_TORCH_DEVICE=cpu for its CPU kernels):
python3 gpu/scripts/torch_absorbed.py CASE_DIR OUT_DIR. Written as DeepSeek-V3's
`inference/model.py` absorb branch is written, with the QK-norm folded in the way a bf16 module
folds it (conventions §2: gains merged into the query, alpha_q and alpha_k as `.type_as(x)`):

    k_nope = einsum(kv, W_UK)                                 # the transient key, for alpha_k
    alpha_q = rsqrt(q_nope.float().pow(2).mean(-1) + eps).type_as(x); alpha_k likewise from k_nope
    q_pe, k_pe: Qwen3 RMSNorm, then DeepSeek's complex-view RoPE       (norm_then_rope)
    q_lat  = einsum("shd,chd->shc", q_nope * (gamma_cq * gamma_ck), W_UK)
    scores = (einsum(q_lat, kv) * alpha_q * alpha_k + einsum(q_pe, k_pe)) * scale
    p = scores.softmax(-1, dtype=float32).type_as(x)
    latent = einsum(p, kv); out = einsum(latent, W_UV)

Every einsum and elementwise op is PyTorch's own kernel (cuBLAS on the GPU). Cases other than
blockwise norm_then_rope, or with sinks or top-k, are refused with the reason. Delivers `out` and
`latent_out` in the stored dtype and `lse` = scores.float().logsumexp(-1) (fp32). Writes
OUT_DIR/<case>__TORCH_ABSORBED.safetensors; judge with torch_sdpa_audit.py ... --form absorbed.
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "zoo"))
from common import load  # noqa: E402

from sdpa_cases import run_all  # noqa: E402  (beside this file)

import torch  # noqa: E402

TORCH_DT = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def rmsnorm(x, w, eps):  # Qwen3RMSNorm
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype)


def rope(x, cos, sin):  # DeepSeek apply_rotary_emb: interleaved pairs as complex numbers
    z = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(z * torch.complex(cos, sin)).flatten(-2).to(x.dtype)


def run_case(path, dev):
    cs = load(path)
    if cs.norm not in ("blockwise", "none") or (cs.norm == "blockwise" and
                                                cs.rope_order != "norm_then_rope"):
        raise ValueError(f"not written for norm {cs.norm}, {cs.rope_order}")
    if cs.rope_style != "interleaved" or cs.features():
        raise ValueError("not written for this rope style, top-k or sinks")
    D = TORCH_DT[np.dtype(cs.stored).name]
    held = {}

    def T_(name):  # the case's tensor on the device in the stored dtype, converted once
        if name not in held:
            held[name] = torch.tensor(np.asarray(cs.get(name, np.float32)), device=dev).to(D)
        return held[name]

    H, G, S, r, dc, dr, dv = cs.H, cs.G, cs.S, cs.r, cs.dc, cs.dr, cs.dv
    gmap = torch.arange(H, device=dev) // (H // G)
    w_uk, w_uv = T_("w_uk").view(r, G, dc), T_("w_uv").view(r, G, dv)
    cos = torch.tensor(cs.get("rope_cos", np.float32), device=dev) if dr else None
    sin = torch.tensor(cs.get("rope_sin", np.float32), device=dev) if dr else None
    out = np.zeros((cs.B, S, H, dv), np.float32)
    lat = np.zeros((cs.B, S, H, r), np.float32)
    lse = np.full((cs.B, S, H), -np.inf, np.float32)
    for b in range(cs.B):
        T = cs.seqlens[b]
        if T == 0:
            continue
        kv = T_("kv_c")[b, :T]                                           # [T, r]
        q_nope = T_("q_nope")[b]                                         # [S, H, dc]
        k_nope = torch.einsum("tc,cgd->tgd", kv, w_uk)                   # [T, G, dc]
        q = q_nope
        if cs.norm == "blockwise":
            q = q_nope * (T_("gamma_cq") * T_("gamma_ck"))
            aq = torch.rsqrt(q_nope.float().pow(2).mean(-1) + cs.eps).to(D)   # [S, H]
            ak = torch.rsqrt(k_nope.float().pow(2).mean(-1) + cs.eps).to(D)   # [T, G]
        q_lat = torch.einsum("shd,chd->shc", q, w_uk[:, gmap, :])        # [S, H, r]
        scores = torch.einsum("shc,tc->sht", q_lat, kv)                  # [S, H, T]
        if cs.norm == "blockwise":
            scores = scores * aq[:, :, None] * ak[:, gmap].T[None]
        if dr:
            qpos, kpos = torch.arange(T - S, T, device=dev), torch.arange(T, device=dev)
            q_pe, k_pe = T_("q_pe")[b], T_("k_pe")[b, :T]
            if cs.norm == "blockwise":
                q_pe = rmsnorm(q_pe, T_("gamma_rq"), cs.eps)
                k_pe = rmsnorm(k_pe, T_("gamma_rk"), cs.eps)
            q_pe = rope(q_pe, cos[qpos][:, None, :], sin[qpos][:, None, :])
            k_pe = rope(k_pe, cos[kpos], sin[kpos])
            scores = scores + torch.einsum("shr,tr->sht", q_pe, k_pe)
        scores = scores * cs.scale
        if cs.causal:
            vis = (torch.arange(T, device=dev)[None, :]
                   <= (T - S + torch.arange(S, device=dev))[:, None])
            scores = scores.masked_fill(~vis[:, None, :], float("-inf"))
        lse[b] = scores.float().logsumexp(-1).cpu().numpy()
        p = scores.softmax(-1, dtype=torch.float32).type_as(scores)
        latent = torch.einsum("sht,tc->shc", p, kv)
        lat[b] = latent.float().cpu().numpy()
        out[b] = torch.einsum("shc,chd->shd", latent, w_uv[:, gmap, :]).float().cpu().numpy()
    return {"out": out.astype(cs.stored), "latent_out": lat.astype(cs.stored), "lse": lse}, {}


def main():
    cases, out_dir = sys.argv[1], sys.argv[2]
    dev = torch.device(os.environ.get("QKMLA_TORCH_DEVICE", "cuda"))
    print(json.dumps({"torch": torch.__version__, "device": str(dev)}), flush=True)
    return run_all(cases, out_dir, ["TORCH_ABSORBED"], lambda path, b: run_case(path, dev))


if __name__ == "__main__":
    sys.exit(main())
