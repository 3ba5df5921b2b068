"""A real client: reads a qkmla golden case with the PyPI `safetensors` and `numpy` packages,
computes the absorbed form (SPEC §1.2, blockwise) in float32 with NumPy, and writes `out`/`lse`
with safetensors.numpy.save_file. An optional bug name injects one plausible mistake."""
import json
import sys

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file


def rms_inv(z, eps):
    return np.float32(1) / np.sqrt(np.mean(z * z, dtype=np.float32) + np.float32(eps))


def rotate(z, pos, cfg, cos, sin):
    half = cfg["d_r"] // 2
    if cfg["rope_style"] == "interleaved":
        a_idx, b_idx = np.arange(half) * 2, np.arange(half) * 2 + 1
    else:
        a_idx, b_idx = np.arange(half), np.arange(half) + half
    a, b = z[a_idx].copy(), z[b_idx].copy()
    c, s = cos[pos], sin[pos]
    out = z.copy()
    out[a_idx] = a * c - b * s
    out[b_idx] = a * s + b * c
    return out


def rope_norm(z, gamma, pos, cfg, cos, sin, eps):
    if cfg["rope_order"] == "rope_then_norm":
        z = rotate(z, pos, cfg, cos, sin)
        return z * gamma * rms_inv(z, eps)
    return rotate(z * gamma * rms_inv(z, eps), pos, cfg, cos, sin)


def main(case, out_path, bug=""):
    with safe_open(case, "numpy") as f:
        cfg = json.loads(f.metadata()["qkmla.config"])
        t = {k: f.get_tensor(k).astype(np.float32) for k in f.keys() if not k.startswith("ref.")}
    assert cfg["norm"] == "blockwise" and cfg["level"] == "module", "this client implements blockwise, module level"
    B, S, H, G = cfg["batch"], cfg["s_q"], cfg["heads"], cfg["groups"]
    dc, dv, eps, sigma = cfg["d_c"], cfg["d_v"], cfg["eps"], np.float32(cfg["softmax_scale"])
    out = np.zeros((B, S, H, dv), np.float32)
    lse = np.full((B, S, H), -np.inf, np.float32)
    cos, sin = t["rope_cos"], t["rope_sin"]
    gk = t["gamma_ck"] if bug != "no_gamma_k" else np.ones_like(t["gamma_ck"])
    for b in range(B):
        T = int(t["seqlens"][b])
        for h in range(H):
            g = h // (H // G)
            wk = t["w_uk"][:, g * dc:(g + 1) * dc]
            wv = t["w_uv"][:, g * dv:(g + 1) * dv]
            c = t["kv_c"][b, :T]
            keys = c @ wk
            alpha_k = np.float32(1) / np.sqrt(np.mean(keys * keys, axis=1, dtype=np.float32) + np.float32(eps))
            kr = np.stack([rope_norm(t["k_pe"][b, s], t["gamma_rk"], s, cfg, cos, sin, eps) for s in range(T)]) if T else None
            for i in range(S):
                pos = T - S + i
                if T == 0:
                    continue
                q = t["q_nope"][b, i, h]
                q_latent = wk @ (q * t["gamma_cq"] * gk)
                qr = rope_norm(t["q_pe"][b, i, h], t["gamma_rq"], pos, cfg, cos, sin, eps)
                visible = np.arange(T) <= pos if cfg["causal"] else np.ones(T, bool)
                logits = sigma * (rms_inv(q, eps) * alpha_k * (c @ q_latent) + kr @ qr)
                logits = logits[visible]
                m = logits.max()
                e = np.exp(logits - m)
                lse[b, i, h] = m + np.log(e.sum())
                p = e / e.sum()
                out[b, i, h] = (p @ c[visible]) @ wv
    save_file({"out": out, "lse": lse}, out_path)


if __name__ == "__main__":
    main(*sys.argv[1:])
