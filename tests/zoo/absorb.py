"""Host-side absorption of a serving engine (the model code around a decode kernel).

Turns a module-level case into the kernel-level inputs a FlashMLA/FlashInfer-style kernel reads:
    q_latent [B,S,H,r] (stored dtype), alpha_q [B,S,H] fp32, q_rope [B,S,H,d_r] (stored dtype),
    kv_c (as stored), k_rope [B,T,d_r] (stored dtype), alpha_k [B,T,G] fp32
computed the way an engine's projection code does it: fp32 GEMMs (upcast operands, fp32
accumulation), RMS statistics in fp32, RoPE in fp32 with the fp32 tables, one rounding to the
stored dtype on write. The append path forms the key k0c = c*W_UK in fp32 transiently for
alpha_k. In unified mode q_rope/k_rope are the gained rotated *un-normalized* rope parts and the
kernel scales the whole score by alpha_q*alpha_k (conventions §1.3). fp64 profile: fp64 throughout.

Used by the kernel-style files (flashmla_style, flashinfer_fp8, kernel_plain); the torch, spec,
sdpa and triton styles carry their own preludes.
"""
import numpy as np

from common import FP8_BLOCK


def rotate(x, cos, sin, style):
    d2 = x.shape[-1] // 2
    if style == "interleaved":
        x1, x2 = x[..., 0::2], x[..., 1::2]
    else:
        x1, x2 = x[..., :d2], x[..., d2:]
    y1 = x1 * cos - x2 * sin
    y2 = x1 * sin + x2 * cos
    if style == "interleaved":
        return np.stack([y1, y2], -1).reshape(x.shape)
    return np.concatenate([y1, y2], -1)


def absorb(cs, bug=None):
    A, D = cs.accum, cs.stored
    B, S, H, G, r, dc, dr = cs.B, cs.S, cs.H, cs.G, cs.r, cs.dc, cs.dr
    hpg = H // G
    eps = A(cs.eps)

    def inv_rms(ms):
        if bug == "eps_outside_sqrt":
            return 1.0 / (np.sqrt(ms) + eps)
        return 1.0 / np.sqrt(ms + eps)

    style = cs.rope_style
    if bug == "rope_pairs_swapped":
        style = "half" if style == "interleaved" else "interleaved"
    T_max = cs.raw("kv_c").shape[1]
    q_nope = cs.get("q_nope", A)                                  # [B,S,H,dc]
    w_uk = cs.get("w_uk", A)                                       # [r, G*dc]
    if cs.is_fp8():
        code = cs.raw("kv_c").astype(A)
        sc = cs.raw("kv_c_scale").astype(A)
        if sc.ndim == 3:                                           # fp8-block128: scale of value j
            sc = sc[..., np.arange(r) // FP8_BLOCK]                # is block j // 128's
        else:
            sc = sc[..., None]
        c_full = code * sc                                         # dequant for the append GEMM
    else:
        c_full = cs.get("kv_c", A)
    # append path: transient key per group, alpha_k cached fp32 (rows >= T_b: garbage, never read)
    with np.errstate(invalid="ignore", over="ignore"):
        k0c = (c_full.reshape(B * T_max, r) @ w_uk).reshape(B, T_max, G, dc)
    pos_q = np.array([[max(T - S + i, 0) for i in range(S)] for T in cs.seqlens])   # [B,S]
    if dr:
        cos, sin = cs.get("rope_cos", A), cs.get("rope_sin", A)
        q_pe, k_pe = cs.get("q_pe", A), cs.get("k_pe", A)
        qc, qs = cos[pos_q][:, :, None, :], sin[pos_q][:, :, None, :]
        kc, ks = cos[:T_max][None], sin[:T_max][None]
    wk_heads = w_uk.reshape(r, G, dc)[:, np.arange(H) // hpg, :]   # [r,H,dc]
    with np.errstate(invalid="ignore", over="ignore"):
        if cs.norm == "none":
            q_in = q_nope
            alpha_q = np.ones((B, S, H), A)
            alpha_k = np.ones((B, T_max, G), A)
            if dr:
                q_rope = rotate(q_pe, qc, qs, style)
                k_rope = rotate(k_pe, kc, ks, style)
        elif cs.norm == "blockwise":
            gck = cs.get("gamma_ck", A)
            if bug == "no_gamma_k":
                gck = np.ones_like(gck)
            q_in = q_nope * (cs.get("gamma_cq", A) * gck)
            alpha_q = inv_rms(np.mean(q_nope ** 2, -1))
            if bug == "alpha_k_from_latent":
                alpha_k = np.repeat(inv_rms(np.mean(c_full ** 2, -1))[..., None], G, -1)
            else:
                alpha_k = inv_rms(np.mean(k0c ** 2, -1))
            if dr:
                grq, grk = cs.get("gamma_rq", A), cs.get("gamma_rk", A)
                if cs.rope_order == "norm_then_rope":
                    q_rope = rotate(q_pe * inv_rms(np.mean(q_pe ** 2, -1))[..., None] * grq, qc, qs, style)
                    k_rope = rotate(k_pe * inv_rms(np.mean(k_pe ** 2, -1))[..., None] * grk, kc, ks, style)
                else:
                    qq, kk = rotate(q_pe, qc, qs, style), rotate(k_pe, kc, ks, style)
                    q_rope = qq * inv_rms(np.mean(qq ** 2, -1))[..., None] * grq
                    k_rope = kk * inv_rms(np.mean(kk ** 2, -1))[..., None] * grk
        else:
            gq, gk = cs.get("gamma_q", A), cs.get("gamma_k", A)
            gkc = np.ones(dc, A) if bug == "no_gamma_k" else gk[:dc]
            q_in = q_nope * (gq[:dc] * gkc)
            ssq_q = np.sum(q_nope ** 2, -1)
            ssq_k = np.sum(k0c ** 2, -1)
            if dr:
                if cs.rope_order == "norm_then_rope":
                    ssq_q = ssq_q + np.sum(q_pe ** 2, -1)
                    ssq_k = ssq_k + np.sum(k_pe ** 2, -1)[..., None]
                    q_rope = rotate(q_pe * gq[dc:], qc, qs, style)
                    k_rope = rotate(k_pe * gk[dc:], kc, ks, style)
                else:
                    qq, kk = rotate(q_pe, qc, qs, style), rotate(k_pe, kc, ks, style)
                    ssq_q = ssq_q + np.sum(qq ** 2, -1)
                    ssq_k = ssq_k + np.sum(kk ** 2, -1)[..., None]
                    q_rope, k_rope = qq * gq[dc:], kk * gk[dc:]
            alpha_q = inv_rms(ssq_q / (dc + dr))
            if bug == "alpha_k_from_latent":
                alpha_k = np.repeat(inv_rms(np.mean(c_full ** 2, -1))[..., None], G, -1)
            else:
                alpha_k = inv_rms(ssq_k / (dc + dr))
        q_latent = np.einsum("bshd,rhd->bshr", q_in, wk_heads)
    res = {"q_latent": q_latent.astype(D), "kv_c": cs.raw("kv_c")}
    if cs.norm != "none":                      # plain MLA kernels get no alpha tensors
        res["alpha_q"] = alpha_q.astype(A)
        res["alpha_k"] = alpha_k.astype(A)
    if cs.is_fp8():
        res["kv_c_scale"] = cs.raw("kv_c_scale")
    if dr:
        res["q_rope"] = q_rope.astype(D)
        res["k_rope"] = k_rope.astype(D)
    return res


def kernel_inputs(cs, bug=None):
    """Kernel-level inputs: from the case itself (level kernel) or from the host absorption."""
    if cs.level == "kernel":
        names = ("q_latent", "alpha_q", "kv_c", "kv_c_scale", "alpha_k", "q_rope", "k_rope")
        return {k: cs.raw(k) for k in names if cs.has(k)}
    return absorb(cs, bug)
