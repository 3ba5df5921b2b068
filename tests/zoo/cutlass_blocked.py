"""CUTLASS/FlashMLA-like blocked decode kernel, emulated tile by tile (module and kernel level).

The kernel packs the S_q*H query rows of one sequence into one row tile (FlashMLA's
`q_seq_per_hk`) and walks the cache in K/V tiles of BLOCK_N = 64 tokens. Tensor-core MMAs are
emulated as: operands in the stored dtype D, the inner dimension reduced in k-tiles (KT_QK = 32
for Q.K^T over r (+ d_r), KT_PV = 16 tokens for P.V), each k-tile's partial sum in fp32 and the
partials added one by one into the fp32 accumulator (as the MMA's C fragment accumulates).
Rounding points (D = stored dtype, A = accumulate: fp32, fp64 in fp64):
  - host prelude (a CUTLASS grouped GEMM epilogue): q_latent = (q_nope * g) @ W_K^T in fp32,
    rounded once to D; rope parts in fp32 rounded once to D; alpha_q, alpha_k in fp32
  - scores: fp32 accumulator; norm none/unified: one 576-wide K (latent | rope) as FlashMLA;
    blockwise: separate content / rope accumulators (alpha_q*alpha_k scales the content one)
  - softmax: scale*log2(e) folded into one fp32 constant, exp2 (fast-math: ex2.approx,
    fastmath.ex2_approx), online max/sum per 64-token tile
    with rescaling (FlashAttention-2), row sum l of the unrounded fp32 p
  - P rounded to D before P.V (the bf16 P of the tensor-core MMA)
  - fp8 cache, K side: the e4m3 codes are the MMA operand (exact in bf16) and the fp32 scale
    multiplies the fp32 score partial of its scale block (per token, or per 128 values);
    V side: the tile is dequantized (code * scale in fp32) and rounded to bf16 for P.V, as
    FlashMLA's fp8 kernel converts its V tile (folding the per-token scale into P instead, p*s
    rounded to bf16, was tried first: see tests/zoo/README.md)
  - latent_out = acc / l in fp32, rounded to D; lse = (m + log2 l) * ln 2 in fp32 (natural log)
  - module level: out = latent_out @ W_V (fp32 GEMM, k-tiles of 32) rounded to D
Delivered: latent_out (D), lse (fp32), and out (D) at module level.
"""
import numpy as np

from common import load
from fastmath import ex2_approx

LEVELS = ("module", "kernel")
BUGS = ["one_head", "one_sequence", "row_denominator_bf16", "scale_bias",
        "causal_off_by_one", "missing_rescale"]
BLOCK_N, KT_QK, KT_PV = 64, 32, 16
FEATURES = ("topk", "attn_sink")   # conventions §1.5: reads indices and attn_sink when present


def bug_applies(cfg, bug):
    sl = [int(x) for x in cfg["seqlens"]]
    if bug == "causal_off_by_one":
        return bool(cfg.get("causal", True)) and int(cfg["s_q"]) > 1 and not cfg.get("topk")
    if bug == "missing_rescale":                 # needs a second K/V tile
        return max(sl) > BLOCK_N
    return bug in BUGS


def mma(a, b, kt, A):
    """C[M,N] = a[M,K] . b[N,K]^T: fp32 partial per k-tile, partials accumulated in order."""
    acc = np.zeros((a.shape[0], b.shape[0]), A)
    for k0 in range(0, a.shape[1], kt):
        acc += a[:, k0:k0 + kt] @ b[:, k0:k0 + kt].T
    return acc


def rot_pairs(x, cos, sin, style):
    # rotate as complex pairs: view (a, b) as a + ib, multiply by cos + i sin (fp32 parts)
    h = x.shape[-1] // 2
    re, im = (x[..., 0::2], x[..., 1::2]) if style == "interleaved" else (x[..., :h], x[..., h:])
    nre, nim = re * cos - im * sin, re * sin + im * cos
    y = np.empty_like(x)
    if style == "interleaved":
        y[..., 0::2], y[..., 1::2] = nre, nim
    else:
        y[..., :h], y[..., h:] = nre, nim
    return y


def host_prelude(cs):
    """The host-side absorption the kernel is launched after (fp32 GEMMs, one rounding)."""
    A, D = cs.accum, cs.stored
    B, S, H, G, r, dc, dr = cs.B, cs.S, cs.H, cs.G, cs.r, cs.dc, cs.dr
    eps = A(cs.eps)
    inv = lambda ss, n: 1.0 / np.sqrt(ss / A(n) + eps)               # noqa: E731
    codes = cs.raw("kv_c").astype(A)
    c = codes * expand_scale(cs, A) if cs.is_fp8() else codes
    wk = cs.get("w_uk", A).reshape(r, G, dc)
    qn = cs.get("q_nope", A)
    key = np.einsum("btr,rgd->btgd", c, wk)                          # transient key
    out = {}
    pos = np.array([[max(L - S + i, 0) for i in range(S)] for L in cs.seqlens])
    if dr:
        cos, sin = cs.get("rope_cos", A), cs.get("rope_sin", A)
        qrot = lambda x: rot_pairs(x, cos[pos][:, :, None], sin[pos][:, :, None], cs.rope_style)  # noqa
        krot = lambda x: rot_pairs(x, cos[None, :x.shape[1]], sin[None, :x.shape[1]], cs.rope_style)  # noqa
        qp, kp = cs.get("q_pe", A), cs.get("k_pe", A)
    if cs.norm == "none":
        g = np.ones(dc, A)
        if dr:
            out["q_rope"], out["k_rope"] = qrot(qp), krot(kp)
    elif cs.norm == "blockwise":
        g = cs.get("gamma_cq", A) * cs.get("gamma_ck", A)
        out["alpha_q"] = inv(np.sum(qn * qn, -1), dc)
        out["alpha_k"] = inv(np.sum(key * key, -1), dc)
        if dr:
            nrm = lambda x, gm: x * inv(np.sum(x * x, -1), dr)[..., None] * gm   # noqa: E731
            grq, grk = cs.get("gamma_rq", A), cs.get("gamma_rk", A)
            if cs.rope_order == "norm_then_rope":
                out["q_rope"], out["k_rope"] = qrot(nrm(qp, grq)), krot(nrm(kp, grk))
            else:
                out["q_rope"], out["k_rope"] = nrm(qrot(qp), grq), nrm(krot(kp), grk)
    else:
        gq, gk = cs.get("gamma_q", A), cs.get("gamma_k", A)
        g = gq[:dc] * gk[:dc]
        ssq, ssk = np.sum(qn * qn, -1), np.sum(key * key, -1)
        if dr:
            if cs.rope_order == "norm_then_rope":
                qs, ks = qp, kp
                out["q_rope"], out["k_rope"] = qrot(qp * gq[dc:]), krot(kp * gk[dc:])
            else:
                qs, ks = qrot(qp), krot(kp)
                out["q_rope"], out["k_rope"] = qs * gq[dc:], ks * gk[dc:]
            ssq, ssk = ssq + np.sum(qs * qs, -1), ssk + np.sum(ks * ks, -1)[..., None]
        out["alpha_q"], out["alpha_k"] = inv(ssq, dc + dr), inv(ssk, dc + dr)
    wk_h = wk[:, np.arange(H) // (H // G), :]                        # [r, H, dc]
    out["q_latent"] = np.einsum("bshd,rhd->bshr", qn * g, wk_h).astype(D)
    for k in ("q_rope", "k_rope"):
        if k in out:
            out[k] = out[k].astype(D)
    return out


def expand_scale(cs, A):
    """The fp8 scale of every latent value: [B, T, r] (per token, or per 128-value block)."""
    s = cs.raw("kv_c_scale").astype(A)
    r = cs.raw("kv_c").shape[-1]
    if s.ndim == 2:
        return np.repeat(s[..., None], r, axis=-1)
    return np.repeat(s, 128, axis=-1)[..., :r]


def run(case, bug=None):
    cs = load(case)
    A, D = cs.accum, cs.stored
    B, S, H, G, r, dr = cs.B, cs.S, cs.H, cs.G, cs.r, cs.dr
    hpg = H // G
    kin = host_prelude(cs) if cs.level == "module" else {k: cs.raw(k) for k in cs.t}
    fp8 = cs.is_fp8()
    codes = cs.raw("kv_c").astype(A)                   # fp8: e4m3 codes, exact in bf16
    scl = expand_scale(cs, A) if fp8 else None
    ql = kin["q_latent"].astype(A)
    aq = kin["alpha_q"].astype(A) if "alpha_q" in kin else None
    ak = kin["alpha_k"].astype(A) if "alpha_k" in kin else None
    qr = kin["q_rope"].astype(A) if dr else None
    kr = kin["k_rope"].astype(A) if dr else None
    scale2 = A(A(cs.scale) * A(np.log2(np.e)))         # softmax_scale * log2(e), one fp32 const
    one_acc = cs.norm != "blockwise" and not fp8         # a single 576-wide K accumulator
    topk = cs.raw("indices") if cs.has("indices") else None
    sinks = cs.get("attn_sink", A) if cs.has("attn_sink") else None
    lat = np.zeros((B, S, H, r), A)
    lse = np.full((B, S, H), -np.inf, A)
    live = [b for b in range(B) if cs.seqlens[b] > 0]
    odd = live[-1] if live else -1
    rows_h = np.tile(np.arange(H), S)                    # row = i*H + h
    rows_i = np.repeat(np.arange(S), H)
    for b in range(B):
        L = cs.seqlens[b]
        if L == 0:
            continue
        Q = ql[b].reshape(S * H, r)
        QR = qr[b].reshape(S * H, dr) if dr else None
        if topk is not None:                             # sparse: per-row index list
            allowed = np.zeros((S * H, L), bool)
            for i in range(S):
                idx = topk[b, i][topk[b, i] >= 0]
                allowed[i * H:(i + 1) * H, idx] = True
        else:
            lastvis = (L - S + rows_i + (1 if bug == "causal_off_by_one" else 0)) if cs.causal \
                else np.full(S * H, L - 1)
        m = np.full(S * H, -np.inf, A)
        l = np.zeros(S * H, A)
        acc = np.zeros((S * H, r), A)
        for t0 in range(0, L, BLOCK_N):
            t = np.arange(t0, min(t0 + BLOCK_N, L))      # predicated load: rows >= L never read
            C = codes[b, t]
            if one_acc and dr:                           # FlashMLA: K = [latent | rope]
                s = mma(np.concatenate([Q, QR], 1), np.concatenate([C, kr[b, t]], 1), KT_QK, A)
            else:
                if fp8:                                  # each k-tile partial times its block scale
                    s = np.zeros((S * H, t.size), A)
                    for k0 in range(0, r, KT_QK):
                        s += (Q[:, k0:k0 + KT_QK] @ C[:, k0:k0 + KT_QK].T) * scl[b, t, k0][None, :]
                else:
                    s = mma(Q, C, KT_QK, A)
                if dr and cs.norm != "blockwise":
                    s = s + mma(QR, kr[b, t], KT_QK, A)
            if cs.norm != "none":                        # unified: alpha_q*alpha_k scales both parts
                s = s * (aq[b].reshape(S * H)[:, None] * ak[b, t][:, rows_h // hpg].T)
            if dr and cs.norm == "blockwise":
                s = s + mma(QR, kr[b, t], KT_QK, A)
            s = s * scale2
            vis = allowed[:, t] if topk is not None else (t[None, :] <= lastvis[:, None])
            s = np.where(vis, s, -np.inf)
            m_new = np.maximum(m, s.max(1))
            m_use = np.where(np.isneginf(m_new), 0, m_new)
            exp2 = ex2_approx if A == np.float32 else np.exp2    # fast-math exp2f: ex2.approx
            p = exp2(s - m_use[:, None])
            corr = exp2(m - m_use)
            l = l * corr + p.sum(1)
            if bug != "missing_rescale":
                acc = acc * corr[:, None]
            if fp8:                                      # V tile dequantized to bf16 (FlashMLA fp8)
                V = (C * scl[b, t]).astype(D).astype(A)
            else:
                V = C
            acc += mma(p.astype(D).astype(A), V.T, KT_PV, A)
            m = m_new
        if bug == "row_denominator_bf16":
            import ml_dtypes
            l = l.astype(ml_dtypes.bfloat16).astype(A)
        live_rows = l > 0
        o = np.where(live_rows[:, None], acc / np.where(live_rows, l, 1)[:, None], 0)
        row_lse = np.where(live_rows, (m + np.log2(np.where(live_rows, l, 1))) * A(np.log(2.0)), -np.inf)
        if sinks is not None:                            # a row without tokens keeps out = 0 (no
            with np.errstate(invalid="ignore"):          # exp(-inf - -inf) = NaN for a -inf sink)
                f = np.where(live_rows, 1.0 / (1.0 + np.exp(sinks[rows_h] - row_lse)), 0)
            o = o * f[:, None]
        if bug == "one_sequence" and b == odd:
            o = o * A(1.004)
        lat[b] = o.reshape(S, H, r)
        lse[b] = row_lse.reshape(S, H)
    if bug == "one_head":
        lat[:, :, H // 2] *= A(1.05)
    if bug == "scale_bias":
        lat *= A(1.01)
    lat_d = lat.astype(D)
    lse_t = np.float64 if A == np.float64 else np.float32
    res = {"latent_out": lat_d, "lse": lse.astype(lse_t)}
    if cs.level == "module":
        wv = cs.get("w_uv", A).reshape(r, G, cs.dv)
        o = np.empty((B, S, H, cs.dv), A)
        for h in range(H):
            o[:, :, h] = mma(lat_d[:, :, h].astype(A).reshape(B * S, r), wv[:, h // hpg].T, 32, A
                             ).reshape(B, S, cs.dv)
        res["out"] = o.astype(D)
    return res
