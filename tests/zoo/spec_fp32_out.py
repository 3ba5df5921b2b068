"""conventions §3 `cpu.absorbed` rounding points, but outputs returned unrounded in fp32 (`.float()`).

Design: q_latent, the rotated normalized rope query/key (or, in unified mode, the gained rotated
un-normalized rope parts) rounded to the stored dtype; c as stored (fp8: dequantized exactly as
code*scale in fp64 then fp32); alpha_q, alpha_k in fp32; scores, softmax and p*c in fp32; p not
rounded; latent_out kept fp32 and out = latent_out*WV in fp32; out, lse, latent_out delivered F32.
fp64 profile: everything fp64, outputs F64.

fp8-block128: code * (its 128-block's scale), exact. Sparse top-k: the row's listed tokens are
the visible set (mask; -1 pads ignored). Sink: latent_out (and so out) times
1/(1 + exp(s_h - lse)) in fp32, lse without it (conventions §1.5).

Written as plain host numpy, one sequence at a time (varlen loop), like a reference CPU path.
"""
import numpy as np

from common import BF16, FP8_BLOCK, load

LEVELS = ("module", "kernel")


def _rot(z, cos, sin, style):
    # z [..., d_r]; cos/sin broadcastable to [..., d_r/2]
    h = z.shape[-1] // 2
    if style == "interleaved":
        a, b = z[..., 0::2], z[..., 1::2]
    else:
        a, b = z[..., :h], z[..., h:]
    ra = a * cos - b * sin
    rb = a * sin + b * cos
    out = np.empty_like(z)
    if style == "interleaved":
        out[..., 0::2], out[..., 1::2] = ra, rb
    else:
        out[..., :h], out[..., h:] = ra, rb
    return out


def _dequant(cs, b, T, A):
    """code * scale exactly (fp64), then the profile's type; fp8-block128: latent value j takes the
    scale of block j // 128 of its token (conventions §3)."""
    sc = cs.raw("kv_c_scale")[b, :T].astype(np.float64)
    sc = sc[:, np.arange(cs.r) // FP8_BLOCK] if sc.ndim == 2 else sc[:, None]
    return (cs.raw("kv_c")[b, :T].astype(np.float64) * sc).astype(A)


def _ms(z):
    return np.mean(z * z, axis=-1)


def _prelude(cs, bug):
    """Absorbed inputs per sequence: q_lat [S,H,r], aq [S,H], qr [S,H,dr], c [T,r], kr [T,dr] or
    per-group [T,G,dr] (unified), ak [T,G]. Returns a list over b."""
    A, D = cs.accum, cs.stored
    H, G, dc, dr, S = cs.H, cs.G, cs.dc, cs.dr, cs.S
    hpg = H // G
    gmap = np.arange(H) // hpg
    eps = cs.eps
    if bug == "eps_outside_sqrt":
        inv_rms = lambda ms: 1.0 / (np.sqrt(ms) + eps)  # noqa: E731
    else:
        inv_rms = lambda ms: 1.0 / np.sqrt(ms + eps)  # noqa: E731
    wk = cs.get("w_uk", A).reshape(cs.r, G, dc)          # [r, G, dc]
    cos_t = cs.get("rope_cos", A) if dr else None
    sin_t = cs.get("rope_sin", A) if dr else None
    style = cs.rope_style
    if bug == "rope_pairs_swapped":
        style = "half" if style == "interleaved" else "interleaved"
    seqs = []
    for b in range(cs.B):
        T = cs.seqlens[b]
        qn = cs.get("q_nope", A)[b]                         # [S,H,dc]
        if cs.is_fp8():
            c = _dequant(cs, b, T, A)
        else:
            c = cs.get("kv_c", A)[b, :T]                    # [T,r]
        k0c = np.einsum("tr,rgd->tgd", c, wk)                # [T,G,dc] transient key
        qpos = T - S + np.arange(S)
        kpos = np.arange(T)
        if dr:
            qp = cs.get("q_pe", A)[b]                       # [S,H,dr]
            kp = cs.get("k_pe", A)[b, :T]                   # [T,dr]
            qcos, qsin = cos_t[np.maximum(qpos, 0)][:, None, :], sin_t[np.maximum(qpos, 0)][:, None, :]
            kcos, ksin = cos_t[kpos], sin_t[kpos]
        if cs.norm == "none":
            q_lat = np.einsum("shd,rhd->shr", qn, wk[:, gmap, :])
            aq = np.ones((S, H), A)
            ak = np.ones((T, G), A)
            qr = _rot(qp, qcos, qsin, style) if dr else None
            kr = _rot(kp, kcos, ksin, style) if dr else None
        elif cs.norm == "blockwise":
            gcq, gck = cs.get("gamma_cq", A), cs.get("gamma_ck", A)
            gk = gck * gck if bug == "gamma_k_twice" else gck
            if bug == "no_gamma_k":
                gk = np.ones_like(gck)
            q_lat = np.einsum("shd,rhd->shr", qn * gcq * gk, wk[:, gmap, :])
            if bug == "joint_norm_in_blockwise" and dr:
                aq = inv_rms((np.sum(qn * qn, -1) + np.sum(qp * qp, -1)) / (dc + dr))
                ak = inv_rms((np.sum(k0c * k0c, -1) + np.sum(kp * kp, -1)[:, None]) / (dc + dr))
            else:
                aq = inv_rms(_ms(qn))
                ak = inv_rms(_ms(c))[:, None].repeat(G, 1) if bug == "alpha_k_from_latent" \
                    else inv_rms(_ms(k0c))
            if dr:
                grq, grk = cs.get("gamma_rq", A), cs.get("gamma_rk", A)
                if cs.rope_order == "norm_then_rope":
                    qr = _rot(qp * inv_rms(_ms(qp))[..., None] * grq, qcos, qsin, style)
                    kr = _rot(kp * inv_rms(_ms(kp))[..., None] * grk, kcos, ksin, style)
                else:
                    qq = _rot(qp, qcos, qsin, style)
                    kk = _rot(kp, kcos, ksin, style)
                    qr = qq * inv_rms(_ms(qq))[..., None] * grq
                    kr = kk * inv_rms(_ms(kk))[..., None] * grk
            else:
                qr = kr = None
        else:  # unified
            gq, gk = cs.get("gamma_q", A), cs.get("gamma_k", A)
            gkc = gk[:dc] if bug != "no_gamma_k" else np.ones(dc, A)
            q_lat = np.einsum("shd,rhd->shr", qn * gq[:dc] * gkc, wk[:, gmap, :])
            if dr:
                if cs.rope_order == "norm_then_rope":
                    qstat, kstat = qp, kp
                    qr = _rot(qp * gq[dc:], qcos, qsin, style)
                    kr = _rot(kp * gk[dc:], kcos, ksin, style)
                else:
                    qstat = _rot(qp, qcos, qsin, style)
                    kstat = _rot(kp, kcos, ksin, style)
                    qr, kr = qstat * gq[dc:], kstat * gk[dc:]
                sq = np.sum(qn * qn, -1) + np.sum(qstat * qstat, -1)
                sk = np.sum(k0c * k0c, -1) + np.sum(kstat * kstat, -1)[:, None]
            else:
                qr = kr = None
                sq, sk = np.sum(qn * qn, -1), np.sum(k0c * k0c, -1)
            aq = inv_rms(sq / (dc + dr))
            ak = inv_rms(sk / (dc + dr))
        # rounding points: q_latent, rope parts to the stored dtype; alphas fp32 (fp64 in fp64)
        q_lat = q_lat.astype(D).astype(A)
        if dr:
            qr = qr.astype(D).astype(A)
            kr = kr.astype(D).astype(A)
        seqs.append(dict(q_lat=q_lat, aq=aq.astype(A), qr=qr, c=c, kr=kr, ak=ak.astype(A), T=T))
    return seqs


def _kernel_inputs(cs):
    A = cs.accum
    seqs = []
    for b in range(cs.B):
        T = cs.seqlens[b]
        if cs.is_fp8():
            c = _dequant(cs, b, T, A)
        else:
            c = cs.get("kv_c", A)[b, :T]
        d = dict(q_lat=cs.get("q_latent", A)[b], c=c, T=T,
                 aq=cs.get("alpha_q", A)[b] if cs.has("alpha_q") else np.ones((cs.S, cs.H), A),
                 ak=cs.get("alpha_k", A)[b, :T] if cs.has("alpha_k") else np.ones((T, cs.G), A),
                 qr=cs.get("q_rope", A)[b] if cs.dr else None,
                 kr=cs.get("k_rope", A)[b, :T] if cs.dr else None)
        seqs.append(d)
    return seqs


def run(case, bug=None):
    cs = load(case)
    A = cs.accum
    H, G, S, r = cs.H, cs.G, cs.S, cs.r
    gmap = np.arange(H) // (H // G)
    if bug == "group_map_mod":
        gmap = np.arange(H) % G
    seqs = _kernel_inputs(cs) if cs.level == "kernel" else _prelude(cs, bug)
    lat = np.zeros((cs.B, S, H, r), A)
    lse = np.full((cs.B, S, H), -np.inf, A)
    topk = cs.raw("indices") if cs.has("indices") else None
    sink = cs.get("attn_sink", A) if cs.has("attn_sink") else None
    for b, d in enumerate(seqs):
        T = d["T"]
        if T == 0:
            continue
        c = d["c"]
        if bug == "one_sequence" and b == cs.B - 1:
            # attention run before the current token was appended: last sequence misses t = T-1
            keep = T - 1
            d = dict(d, c=c[:keep], ak=d["ak"][:keep], kr=None if d["kr"] is None else d["kr"][:keep])
            c = d["c"]
            if keep == 0:
                continue                                              # no key left: out 0, lse -inf
        sc = np.einsum("shr,tr->sht", d["q_lat"], c)                  # [S,H,T]
        al = d["aq"][:, :, None] * d["ak"][:, gmap].T[None, :, :]     # [S,H,T]
        if bug == "no_alpha_q":
            al = np.broadcast_to(d["ak"][:, gmap].T[None], al.shape)
        if d["qr"] is not None:
            sr = np.einsum("shd,td->sht", d["qr"], d["kr"])
            logit = (al * (sc + sr)) if cs.norm == "unified" else (al * sc + sr)
        else:
            logit = al * sc
        logit = logit * A(cs.scale)
        if topk is not None:                                          # §1.5: exactly the listed tokens
            mask = np.zeros((S, c.shape[0]), bool)
            for i in range(S):
                idx = topk[b, i][topk[b, i] >= 0]
                mask[i, idx[idx < c.shape[0]]] = True                 # (one_sequence: t < T_b - 1)
            logit = np.where(mask[:, None, :], logit, -np.inf)
        elif cs.causal:
            pos = T - S + np.arange(S)
            lim = pos + (1 if bug == "causal_off_by_one" else 0)
            mask = np.arange(c.shape[0])[None, :] <= lim[:, None]     # [S,T]
            logit = np.where(mask[:, None, :], logit, -np.inf)
        m = logit.max(-1, keepdims=True)
        live = np.isfinite(m)                                         # a row without tokens: 0, -inf
        m = np.where(live, m, 0)
        e = np.exp(logit - m)
        den = e.sum(-1, keepdims=True)
        if bug == "row_denominator_bf16":
            den = den.astype(np.float32).astype(BF16).astype(A)
        with np.errstate(divide="ignore", invalid="ignore"):
            p = np.where(live, e / den, 0)
            lse[b] = np.where(live[..., 0], m[..., 0] + np.log(den[..., 0]), -np.inf)
        if bug == "lse_base2":
            lse[b] = lse[b] / np.log(2.0)
        lat[b] = np.einsum("sht,tr->shr", p, c)
        if sink is not None:                                          # 1/(1 + exp(s_h - lse)), fp32
            with np.errstate(over="ignore", invalid="ignore"):
                f = 1 / (1 + np.exp(sink[None, :] - lse[b]))
            lat[b] = lat[b] * np.where(live[..., 0], f, 0)[..., None]
    if cs.level == "kernel":
        outs = {"latent_out": lat, "lse": lse}
    else:
        wv = cs.get("w_uv", A).reshape(r, G, cs.dv)
        gm = gmap.copy()
        if bug == "one_head":
            gm[-1] = (gm[-1] + 1) % G if G > 1 else gm[-1]
        out = np.einsum("bshr,rhv->bshv", lat, wv[:, gm, :])
        if bug == "one_head" and G == 1:
            out[:, :, -1] *= 0.9
        outs = {"out": out, "lse": lse, "latent_out": lat}
    if bug == "scale_bias":
        for k in ("out", "latent_out"):
            if k in outs:
                outs[k] = outs[k] * A(1.01)
    od = np.float64 if cs.profile == "fp64" else np.float32
    return {k: v.astype(od) for k, v in outs.items()}


BUGS = {
    "one_head": "last head multiplies latent_out by the next group's W_UV slice (head-block offset)",
    "one_sequence": "last sequence attends before its newest token is appended (misses t = T_b-1)",
    "row_denominator_bf16": "softmax row sum rounded to bf16 before the division",
    "scale_bias": "out and latent_out scaled by 1.01",
    "eps_outside_sqrt": "1/(sqrt(mean z^2) + eps)",
    "no_gamma_k": "gamma_ck not absorbed into q_latent",
    "alpha_k_from_latent": "alpha_k = 1/rms(c[t]) instead of the key's",
    "joint_norm_in_blockwise": "unified statistic in a blockwise config",
    "causal_off_by_one": "query i also sees pos(i)+1",
    "lse_base2": "lse returned in base 2",
}


FEATURES = ("topk", "attn_sink")


def bug_applies(cfg, bug):
    norm, dr = cfg.get("norm"), int(cfg["d_r"])
    if bug == "causal_off_by_one" and cfg.get("topk"):
        return False                                  # top-k rows have no causal limit
    if cfg.get("level") == "kernel":
        return bug in ("one_sequence", "row_denominator_bf16", "scale_bias", "lse_base2",
                       "causal_off_by_one")
    if bug in ("eps_outside_sqrt", "no_gamma_k", "alpha_k_from_latent"):
        return norm != "none"
    if bug == "joint_norm_in_blockwise":
        return norm == "blockwise" and dr > 0
    if bug == "causal_off_by_one":
        return bool(cfg.get("causal", True))
    return True
