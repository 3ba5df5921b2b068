"""Triton-style absorbed decode with alpha_q folded into q_latent and the Gram form of alpha_k.

Host (module level):
    alpha_q  = rsqrt(mean(q_nope^2) + eps) (fp32; unified: over [q_nope; q_rope stat])
    q_latent = ((q_nope * gamma_cq * gamma_ck) * alpha_q) . W_UK^T   kept in fp32 (never rounded)
    Gram_g   = W_UK_g W_UK_g^T  [r, r] in fp32, computed once per layer
    alpha_k  = rsqrt(c Gram_g c^T / d_c + eps)  (unified: (c Gram c^T + |k_pe stat|^2)/(d_c+d_r))
               -- the key is never formed
    q_rope, k_rope rounded to the stored dtype (normalized rotated; unified: gained rotated).
Kernel (one program per (b, head), BLOCK_N = 32 tokens, online softmax with exp, fp32 scores):
    s = (q_latent.c) * alpha_k [+ alpha_q * alpha_k * (q_rope.k_rope) for unified,
                                 + q_rope.k_rope for blockwise] ; s *= scale
    acc += tl.dot(p.to(D), c)  -- P rounded to the stored dtype (bf16/fp16), fp32 accumulator
    latent_out = acc / l -> D ; out = latent_out . W_UV (fp32 acc) -> D ; lse natural, fp32.
Kernel level: q_latent * alpha_q folded in fp32 by the wrapper, alpha_k read from the cache.
fp8: codes * scale in fp32 at load (fp8-block128: the scale of each value's 128-block). Sparse
top-k: each query row's program walks its index list (index order, -1 pads skipped, no causal
mask). Attention sink: l += exp(s_h - m) before acc / l; lse = m + log(l) without it.
fp64 profile: fp64 throughout, P unrounded.
"""
import numpy as np

from common import BF16, FP8_BLOCK, load

LEVELS = ("module", "kernel")
BLOCK_N = 32


def _rot(x, cos, sin, style):
    if style == "interleaved":
        xe, xo = x[..., ::2], x[..., 1::2]
        y = np.empty_like(x)
        y[..., ::2] = xe * cos - xo * sin
        y[..., 1::2] = xe * sin + xo * cos
        return y
    h = x.shape[-1] // 2
    return np.concatenate([x[..., :h] * cos - x[..., h:] * sin, x[..., :h] * sin + x[..., h:] * cos], -1)


def _cache(cs):
    """The latent cache as the kernel's tl.load sees it: fp8 codes times their scale in fp32, the
    scale loaded per token, or (fp8-block128) per 128-value block of the row: offs_r // 128."""
    if not cs.is_fp8():
        return cs.get("kv_c", cs.accum)
    sc = cs.raw("kv_c_scale").astype(np.float32)
    sc = sc[..., np.arange(cs.r) // FP8_BLOCK] if sc.ndim == 3 else sc[..., None]
    return (cs.raw("kv_c").astype(np.float32) * sc).astype(cs.accum)


def _host(cs, bug):
    A, D = cs.accum, cs.stored
    B, S, H, G, r, dc, dr = cs.B, cs.S, cs.H, cs.G, cs.r, cs.dc, cs.dr
    gmap = np.arange(H) // (H // G)
    eps = A(cs.eps)
    T_max = cs.raw("kv_c").shape[1]
    c = _cache(cs)
    wk = cs.get("w_uk", A).reshape(r, G, dc)
    qn = cs.get("q_nope", A)
    if dr:
        pq = np.array([[max(T - S + i, 0) for i in range(S)] for T in cs.seqlens])
        cos, sin = cs.get("rope_cos", A), cs.get("rope_sin", A)
        qcs, kcs = (cos[pq][:, :, None], sin[pq][:, :, None]), (cos[:T_max][None], sin[:T_max][None])
        qp, kp = cs.get("q_pe", A), cs.get("k_pe", A)
    with np.errstate(invalid="ignore", over="ignore"):
        gram = np.einsum("rgd,sgd->grs", wk, wk)                  # [G,r,r]
        quad = np.einsum("btr,grs,bts->btg", c, gram, c)          # c Gram c^T  [B,T,G]
        kdiv = A(1) if bug == "gram_no_dc" else A(dc)             # bug: the 1/d_c forgotten
        if cs.norm == "none":
            q_in, aq, ak = qn, np.ones((B, S, H), A), np.ones((B, T_max, G), A)
            qr = _rot(qp, *qcs, cs.rope_style) if dr else None
            kr = _rot(kp, *kcs, cs.rope_style) if dr else None
        elif cs.norm == "blockwise":
            q_in = qn * (cs.get("gamma_cq", A) * cs.get("gamma_ck", A))
            aq = 1 / np.sqrt(np.mean(qn * qn, -1) + eps)
            ak = 1 / np.sqrt(quad / kdiv + eps)
            if dr:
                grq, grk = cs.get("gamma_rq", A), cs.get("gamma_rk", A)
                nrm = lambda x, g: x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * g  # noqa
                if cs.rope_order == "norm_then_rope":
                    qr, kr = _rot(nrm(qp, grq), *qcs, cs.rope_style), _rot(nrm(kp, grk), *kcs, cs.rope_style)
                else:
                    qr, kr = nrm(_rot(qp, *qcs, cs.rope_style), grq), nrm(_rot(kp, *kcs, cs.rope_style), grk)
            else:
                qr = kr = None
        else:
            gq, gk = cs.get("gamma_q", A), cs.get("gamma_k", A)
            q_in = qn * (gq[:dc] * gk[:dc])
            sq, sk = np.sum(qn * qn, -1), quad
            qr = kr = None
            if dr:
                if cs.rope_order == "norm_then_rope":
                    qs_, ks_ = qp, kp
                    qr, kr = _rot(qp * gq[dc:], *qcs, cs.rope_style), _rot(kp * gk[dc:], *kcs, cs.rope_style)
                else:
                    qs_, ks_ = _rot(qp, *qcs, cs.rope_style), _rot(kp, *kcs, cs.rope_style)
                    qr, kr = qs_ * gq[dc:], ks_ * gk[dc:]
                sq = sq + np.sum(qs_ * qs_, -1)
                sk = sk + np.sum(ks_ * ks_, -1)[..., None]
            aq = 1 / np.sqrt(sq / A(dc + dr) + eps)
            ak = 1 / np.sqrt(sk / A(dc + dr) + eps)
        q_lat = np.einsum("bshd,rhd->bshr", q_in * aq[..., None], wk[:, gmap, :])   # folded, fp32
    ki = {"q_lat_folded": q_lat, "alpha_q": aq.astype(A), "alpha_k": ak.astype(A), "c": c}
    if dr:
        ki["q_rope"], ki["k_rope"] = qr.astype(D).astype(A), kr.astype(D).astype(A)
    return ki


def _wrapper_kernel_inputs(cs):
    A = cs.accum
    c = _cache(cs)
    aq = cs.get("alpha_q", A) if cs.has("alpha_q") else np.ones((cs.B, cs.S, cs.H), A)
    ki = {"q_lat_folded": cs.get("q_latent", A) * aq[..., None], "alpha_q": aq, "c": c,
          "alpha_k": cs.get("alpha_k", A) if cs.has("alpha_k") else np.ones((cs.B, c.shape[1], cs.G), A)}
    if cs.dr:
        ki["q_rope"], ki["k_rope"] = cs.get("q_rope", A), cs.get("k_rope", A)
    return ki


def run(case, bug=None):
    cs = load(case)
    A, D = cs.accum, cs.stored
    B, S, H, G, r = cs.B, cs.S, cs.H, cs.G, cs.r
    gmap = np.arange(H) // (H // G)
    pdt = {"bf16": BF16, "fp8": BF16, "fp8-block128": BF16, "fp16": np.float16}.get(cs.profile)
    topk = cs.raw("indices") if cs.has("indices") else None
    sink = cs.get("attn_sink", A) if cs.has("attn_sink") else None
    ki = _wrapper_kernel_inputs(cs) if cs.level == "kernel" else _host(cs, bug)
    lat = np.zeros((B, S, H, r), A)
    lse = np.full((B, S, H), -np.inf, A)
    for b in range(B):
        T = cs.seqlens[b]
        pos = T - S + np.arange(S)
        if bug == "one_sequence" and b == B - 1:
            pos = pos + 1                                          # causal limit off by one
        for h in range(H):                                         # one program per (b, h)
            g = gmap[h]
            if bug == "one_head" and h == H - 1 and G > 1:
                g = 0                                              # pid -> group slip on the last head
            # dense: the S rows walk [0, T) under the causal mask; sparse top-k: each row walks
            # its own index list (offs_n -> tl.load(indices), -1 pads skipped), no mask
            if topk is None:
                work = [(np.arange(S), np.arange(T), cs.causal)]
            else:
                work = [(np.array([i]), topk[b, i][topk[b, i] >= 0].astype(np.int64), False)
                        for i in range(S)]
            for rows, toks, masked in work:
                q = ki["q_lat_folded"][b, rows, h]                 # [s,r]
                aq = ki["alpha_q"][b, rows, h]
                ns = rows.size
                m = np.full(ns, -np.inf, A)
                l = np.zeros(ns, A)
                acc = np.zeros((ns, r), A)
                for n0 in range(0, toks.size, BLOCK_N):
                    tk = toks[n0:n0 + BLOCK_N]
                    c = ki["c"][b, tk]
                    ak = ki["alpha_k"][b, tk, g]
                    s = (q @ c.T) * ak[None]
                    if bug == "alpha_q_twice":
                        s = s * aq[:, None]
                    if "q_rope" in ki:
                        sr = ki["q_rope"][b, rows, h] @ ki["k_rope"][b, tk].T
                        s = s + (sr * aq[:, None] * ak[None] if cs.norm == "unified" else sr)
                    s = s * A(cs.scale)
                    if masked:
                        s = np.where(tk[None] <= pos[rows][:, None], s, -np.inf)
                    m_new = np.maximum(m, s.max(-1))
                    m0 = np.where(np.isfinite(m_new), m_new, 0)
                    alpha = np.exp(m - m0)
                    p = np.exp(s - m0[:, None])
                    l = l * alpha + p.sum(-1)
                    pv = p.astype(pdt).astype(A) if pdt is not None else p
                    acc = acc * alpha[:, None] + pv @ c
                    m = m_new
                den = l.astype(BF16).astype(A) if bug == "row_denominator_bf16" else l
                live = l > 0
                if sink is not None:                               # l += exp(sink - m) before acc / l
                    den = den + np.exp(sink[h] - np.where(live, m, 0))
                with np.errstate(divide="ignore", invalid="ignore"):
                    lat[b, rows, h] = np.where(live[:, None], acc / den[:, None], 0)
                    lse[b, rows, h] = np.where(live, m + np.log(l), -np.inf)
    if bug == "scale_bias":
        lat = lat * A(1.01)
    lat_d = lat.astype(D)
    if cs.level == "kernel":
        return {"latent_out": lat_d, "lse": lse}
    wv = cs.get("w_uv", A).reshape(r, G, cs.dv)[:, gmap, :]
    out = np.einsum("bshr,rhv->bshv", lat_d.astype(A), wv)
    return {"out": out.astype(D), "lse": lse, "latent_out": lat_d}


BUGS = {
    "one_head": "last head's program reads alpha_k of group 0",
    "one_sequence": "last sequence's causal limit off by one (sees pos(i)+1)",
    "row_denominator_bf16": "row sum l rounded to bf16 before acc / l",
    "scale_bias": "latent_out scaled by 1.01",
    "gram_no_dc": "Gram-form statistic without the 1/d_c (S^2 = c Gram c^T + eps)",
    "alpha_q_twice": "alpha_q folded into q_latent and applied again as a row scale",
}


FEATURES = ("topk", "attn_sink")


def bug_applies(cfg, bug):
    norm, G = cfg.get("norm"), int(cfg["groups"])
    kernel = cfg.get("level") == "kernel"
    if bug == "one_head":
        return G > 1 and norm != "none"
    if bug == "one_sequence":
        return (bool(cfg.get("causal", True)) and int(cfg["s_q"]) > 1 and cfg["seqlens"][-1] > 0
                and not cfg.get("topk"))             # top-k rows have no causal limit
    if bug == "gram_no_dc":
        return norm == "blockwise" and not kernel
    if bug == "alpha_q_twice":
        return norm != "none"
    return True
