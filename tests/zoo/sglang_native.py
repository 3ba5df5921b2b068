"""SGLang-style absorbed MLA with QK-norm, in the stored dtype D (module and kernel level).

Imitates sglang/srt/models/deepseek_v2.py `DeepseekV2AttentionMLA.forward_absorb` followed by the
torch-native attention backend (`TorchNativeAttnBackend._run_sdpa_forward_decode/extend`: a
Python loop over requests, gathering each request's cached tokens through its token table).
Rounding points, D = the profile's stored dtype, A = its accumulate dtype (fp32; fp64 in fp64):
  - gains: gamma_cq * gamma_ck formed in fp32 (norm weights `.float()`), the gained query
    `(q_nope.float() * g).to(D)` rounded once to D (a torch elementwise op in the model dtype)
  - q_latent: `torch.bmm(q_nope, w_kc)`, D operands, fp32 accumulate, output rounded to D
  - alpha_q, alpha_k: fp32 (sgl_kernel rmsnorm statistics: variance in fp32, rsqrt(var + eps)
    through CUDA's approximate rsqrtf: fastmath.rsqrt_approx);
    alpha_k from the fp32 key `torch.bmm(c.float(), w_kc.float())` at append time
  - rope parts: fused QK-norm + RoPE (sglang `fused_qk_norm_rope`-like) in fp32 with the fp32
    tables (no `cos.to(x.dtype)`), rounded once to D
  - fp8 cache: `kv.to(bf16) * k_scale` -> the dequantized latent rounded to bf16 (attention);
    the append-time alpha_k sees the fp32 latent
  - scores in fp32 (matmul of D operands with fp32 accumulate), softmax in fp32,
    P cast to D before P.c, latent_out rounded to D, then `torch.bmm(attn, w_vc)` -> out in D
  - lse fp32 (natural log); sink factor 1/(1 + exp(s_h - lse)) in fp32 before the latent rounding
Delivered: module level out (D) and lse (fp32); kernel level latent_out (D) and lse (fp32).
"""
import numpy as np

from common import load
from fastmath import rsqrt_approx

LEVELS = ("module", "kernel")
BUGS = ["one_head", "one_sequence", "row_denominator_bf16", "scale_bias",
        "rope_pairs_swapped", "alpha_k_from_latent"]
FEATURES = ("topk", "attn_sink")   # conventions §1.5: reads indices and attn_sink when present


def bug_applies(cfg, bug):
    module = cfg.get("level", "module") == "module"
    if bug == "rope_pairs_swapped":
        return module and int(cfg["d_r"]) > 0
    if bug == "alpha_k_from_latent":
        return module and cfg.get("norm", "blockwise") != "none"
    return bug in BUGS


def _rmsnorm_inv(x, eps):
    # sgl_kernel.rmsnorm: variance = x.float().pow(2).mean(-1); x * torch.rsqrt(variance + eps)
    # on the GPU torch.rsqrt is CUDA's rsqrtf (rsqrt.approx, a few ulp); fp64 stays exact
    ms = np.mean(x * x, axis=-1) + eps
    return rsqrt_approx(ms) if ms.dtype == np.float32 else 1.0 / np.sqrt(ms)


def _apply_rotary_emb(x, cos, sin, is_neox_style):
    # sglang RotaryEmbedding._apply_rotary_emb (forward_native), kept in fp32
    if is_neox_style:
        x1, x2 = np.split(x, 2, axis=-1)
    else:
        x1, x2 = x[..., ::2], x[..., 1::2]
    o1 = x1 * cos - x2 * sin
    o2 = x2 * cos + x1 * sin
    if is_neox_style:
        return np.concatenate((o1, o2), axis=-1)
    return np.stack((o1, o2), axis=-1).reshape(x.shape)


def _dequant(cs, A):
    codes = cs.raw("kv_c").astype(A)
    s = cs.raw("kv_c_scale").astype(A)
    if s.ndim == 2:                                    # one scale per token (fp8 profile)
        return codes * s[..., None]
    return codes * np.repeat(s, 128, axis=-1)[..., :codes.shape[-1]]   # fp8-block128


def _prelude(cs, bug):
    """forward_absorb's projections + the append path: the kernel-level tensors."""
    A, D = cs.accum, cs.stored
    B, S, H, G, r, dc, dr = cs.B, cs.S, cs.H, cs.G, cs.r, cs.dc, cs.dr
    eps = A(cs.eps)
    neox = cs.rope_style == "half"
    if bug == "rope_pairs_swapped":
        neox = not neox
    c32 = _dequant(cs, A) if cs.is_fp8() else cs.get("kv_c", A)
    T = c32.shape[1]
    w_kc = cs.get("w_uk", A).reshape(r, G, dc).transpose(1, 2, 0)       # [G, dc, r]
    w_kc_h = w_kc[np.arange(H) // (H // G)]                               # [H, dc, r]
    q_nope = cs.get("q_nope", A)
    k0c = np.einsum("btr,gdr->btgd", c32, w_kc)                           # append: fp32 key
    if dr:
        cos_t, sin_t = cs.get("rope_cos", A), cs.get("rope_sin", A)
        pos = np.array([[max(L - S + i, 0) for i in range(S)] for L in cs.seqlens])
        qcos, qsin = cos_t[pos][:, :, None, :], sin_t[pos][:, :, None, :]
        kcos, ksin = cos_t[:T][None], sin_t[:T][None]
        q_pe, k_pe = cs.get("q_pe", A), cs.get("k_pe", A)
        q_rot = lambda x: _apply_rotary_emb(x, qcos, qsin, neox)   # noqa: E731
        k_rot = lambda x: _apply_rotary_emb(x, kcos, ksin, neox)   # noqa: E731
    res = {"kv_c": c32}
    if cs.norm == "none":
        g = np.ones(dc, A)
        if dr:
            res["q_rope"], res["k_rope"] = q_rot(q_pe), k_rot(k_pe)
    elif cs.norm == "blockwise":
        g = cs.get("gamma_cq", A) * cs.get("gamma_ck", A)
        res["alpha_q"] = _rmsnorm_inv(q_nope, eps)
        kstat = np.repeat(c32[:, :, None, :], G, 2) if bug == "alpha_k_from_latent" else k0c
        res["alpha_k"] = _rmsnorm_inv(kstat, eps)
        if dr:
            grq, grk = cs.get("gamma_rq", A), cs.get("gamma_rk", A)
            if cs.rope_order == "norm_then_rope":
                res["q_rope"] = q_rot(q_pe * _rmsnorm_inv(q_pe, eps)[..., None] * grq)
                res["k_rope"] = k_rot(k_pe * _rmsnorm_inv(k_pe, eps)[..., None] * grk)
            else:
                qr, kr = q_rot(q_pe), k_rot(k_pe)
                res["q_rope"] = qr * _rmsnorm_inv(qr, eps)[..., None] * grq
                res["k_rope"] = kr * _rmsnorm_inv(kr, eps)[..., None] * grk
    else:                                                  # unified: one statistic per head
        gq, gk = cs.get("gamma_q", A), cs.get("gamma_k", A)
        g = gq[:dc] * gk[:dc]
        qcat, kcat = q_nope, k0c
        if dr:
            if cs.rope_order == "norm_then_rope":
                qp, kp = q_pe, k_pe
                res["q_rope"], res["k_rope"] = q_rot(q_pe * gq[dc:]), k_rot(k_pe * gk[dc:])
            else:
                qp, kp = q_rot(q_pe), k_rot(k_pe)
                res["q_rope"], res["k_rope"] = qp * gq[dc:], kp * gk[dc:]
            qcat = np.concatenate([q_nope, qp], -1)
            kcat = np.concatenate([k0c, np.broadcast_to(kp[:, :, None, :], k0c.shape[:3] + (dr,))], -1)
        res["alpha_q"] = _rmsnorm_inv(qcat, eps)
        res["alpha_k"] = _rmsnorm_inv(c32[:, :, None, :].repeat(G, 2) if bug == "alpha_k_from_latent"
                                      else kcat, eps)
    q_in = (q_nope * g).astype(D).astype(A)                              # elementwise op in D
    res["q_latent"] = np.einsum("bshd,hdr->bshr", q_in, w_kc_h).astype(D)  # torch.bmm -> D
    for k in ("q_rope", "k_rope"):
        if k in res:
            res[k] = res[k].astype(D)                                    # fused norm+rope -> D
    if cs.is_fp8():
        res["kv_c"] = c32.astype(D)                                      # kv.to(bf16) * scale
    else:
        res["kv_c"] = cs.raw("kv_c")
    return res


def _kernel_inputs(cs):
    A = cs.accum
    res = {k: cs.raw(k) for k in ("q_latent", "alpha_q", "alpha_k", "q_rope", "k_rope") if cs.has(k)}
    res["kv_c"] = _dequant(cs, A).astype(cs.stored) if cs.is_fp8() else cs.raw("kv_c")
    return res


def run(case, bug=None):
    cs = load(case)
    A, D = cs.accum, cs.stored
    B, S, H, G, r, dr = cs.B, cs.S, cs.H, cs.G, cs.r, cs.dr
    hpg = H // G
    kin = _prelude(cs, bug) if cs.level == "module" else _kernel_inputs(cs)
    q_lat = kin["q_latent"].astype(A)
    aq = kin["alpha_q"].astype(A) if "alpha_q" in kin else np.ones((B, S, H), A)
    ak = kin["alpha_k"].astype(A) if "alpha_k" in kin else None
    has_rope = "q_rope" in kin
    sm_scale = A(cs.scale)
    sinks = cs.get("attn_sink", A) if cs.has("attn_sink") else None
    topk = cs.raw("indices") if cs.has("indices") else None
    latent = np.zeros((B, S, H, r), A)
    lse = np.full((B, S, H), -np.inf, np.float32 if A != np.float64 else A)
    live = [b for b in range(B) if cs.seqlens[b] > 0]
    odd_seq = live[-1] if live else -1
    for b in range(B):                                  # torch-native backend: loop over requests
        L = cs.seqlens[b]
        if L == 0:
            continue
        for i in range(S):                              # extend: one query token at a time
            if topk is not None:
                idx = topk[b, i]
                tok = idx[idx >= 0].astype(np.int64)
            else:
                last = L - S + i if cs.causal else L - 1
                tok = np.arange(last + 1)
            if tok.size == 0:
                continue
            ck = kin["kv_c"][b, tok].astype(A)                          # [n, r] gathered
            s = q_lat[b, i] @ ck.T                                      # [H, n] fp32 acc
            if ak is not None:
                s = s * (aq[b, i][:, None] * ak[b, tok][:, np.arange(H) // hpg].T)
            if has_rope:
                rope = kin["q_rope"][b, i].astype(A) @ kin["k_rope"][b, tok].astype(A).T
                if cs.norm == "unified":
                    rope = rope * (aq[b, i][:, None] * ak[b, tok][:, np.arange(H) // hpg].T)
                s = s + rope
            scale = sm_scale * A(1.02) if (bug == "one_sequence" and b == odd_seq) else sm_scale
            s = s * scale
            m = s.max(-1, keepdims=True)                                 # softmax in fp32
            e = np.exp(s - m)
            den = e.sum(-1, keepdims=True)
            if bug == "row_denominator_bf16":
                import ml_dtypes
                den = den.astype(ml_dtypes.bfloat16).astype(A)
            p = (e / den).astype(D).astype(A)                            # P.to(v.dtype)
            o = p @ ck                                                   # fp32 acc
            row_lse = (m[:, 0] + np.log(den[:, 0])).astype(A)
            if sinks is not None:
                o = o * (1.0 / (1.0 + np.exp(sinks - row_lse)))[:, None]
            latent[b, i] = o
            lse[b, i] = row_lse
    if bug == "one_head":
        latent[:, :, H // 2] *= A(1.05)
    if bug == "scale_bias":
        latent *= A(1.01)
    latent_d = latent.astype(D)                                          # attn_output in D
    if cs.level == "kernel":
        return {"latent_out": latent_d, "lse": lse.astype(np.float32 if A != np.float64 else A)}
    w_vc = cs.get("w_uv", A).reshape(r, G, cs.dv).transpose(1, 0, 2)     # [G, r, dv]
    out = np.einsum("bshr,hrv->bshv", latent_d.astype(A), w_vc[np.arange(H) // hpg])
    return {"out": out.astype(D), "lse": lse.astype(np.float32 if A != np.float64 else A)}
