"""Split-KV decode kernel (FlashDecoding) on kernel-level inputs, fp32 everywhere.

Each (sequence, row, head) cache range [0, T_b) is cut into n_split = 2..4 contiguous chunks
(chunk = ceil(T_b / n_split)); every chunk runs an exact local softmax in fp32:
    m_j = max s,  l_j = sum exp(s - m_j),  o_j = (sum exp(s - m_j) c) / l_j,  lse_j = m_j + log l_j
and a combine kernel merges them by lse:  lse = m + log sum_j exp(lse_j - m),
    o = sum_j exp(lse_j - lse) o_j.
Score: plain MLA s = scale*(q_latent.c + q_rope.k_rope); QK-normed: alpha_q*alpha_k scale the
latent part (blockwise) or the whole score (unified). fp8 cache: code*scale in fp32
(fp8-block128: each value times its 128-block's scale). Sparse top-k: each query row's index
list (index order, -1 pads dropped) is split into the chunks instead of [0, T_b). Attention
sink: the combine treats it as one more split with lse s_h and output 0 (weights
exp(lse_j - logaddexp(lse, s_h))); lse returned without it.
latent_out delivered in the stored dtype, lse fp32 (natural). fp64 profile: fp64.
Module level: absorb.py prelude and out = latent_out(stored) . W_UV (fp32 acc) -> stored dtype.
"""
import numpy as np

from absorb import kernel_inputs
from common import BF16, FP8_BLOCK, load

LEVELS = ("module", "kernel")


def _splits(T, bug_overlap=False):
    n = min(4, max(2, -(-T // 16)))
    ch = -(-T // n) if T else 0
    out = []
    for j in range(n):
        a, e = j * ch, min((j + 1) * ch, T)
        if bug_overlap and j > 0 and a > 0:
            a -= 1                                  # inclusive-end confusion: boundary token twice
        out.append((a, max(a, e)))
    return out


def _cache(cs, ki, b, T, bug):
    """The sequence's dequantized latent cache [T, r]: fp8 code * scale in fp32; fp8-block128:
    value j takes the scale of its 128-block j // 128 (bug block_scale_first: block 0's)."""
    A = cs.accum
    if not cs.is_fp8():
        return ki["kv_c"][b, :T].astype(A)
    sc = ki["kv_c_scale"][b, :T].astype(np.float32)
    if sc.ndim == 2:
        blk = np.arange(cs.r) // FP8_BLOCK
        sc = sc[:, np.zeros_like(blk) if bug == "block_scale_first" else blk]
    else:
        sc = sc[:, None]
    return (ki["kv_c"][b, :T].astype(np.float32) * sc).astype(A)


def split_kv_decode(cs, ki, bug=None):
    A = cs.accum
    B, S, H, G, r = cs.B, cs.S, cs.H, cs.G, cs.r
    gmap = np.arange(H) // (H // G)
    lat = np.zeros((B, S, H, r), A)
    lse = np.full((B, S, H), -np.inf, A)
    q_all = ki["q_latent"].astype(A)
    has_rope = "q_rope" in ki and cs.dr > 0
    has_alpha = "alpha_q" in ki and "alpha_k" in ki
    topk = cs.raw("indices") if cs.has("indices") else None
    sink = cs.get("attn_sink", A) if cs.has("attn_sink") else None
    for b in range(B):
        T = cs.seqlens[b]
        if T == 0:
            continue
        cache = _cache(cs, ki, b, T, bug)
        krope = ki["k_rope"][b, :T].astype(A) if has_rope else None
        pos = T - S + np.arange(S)
        # work items: dense, all S rows over [0, T) with the causal mask; sparse top-k, one
        # per query row over its own index list (index order, -1 pads dropped), no mask
        if topk is None:
            items = [(np.arange(S), np.arange(T), cs.causal)]
        else:
            items = []
            for i in range(S):
                tok = topk[b, i][topk[b, i] >= 0].astype(np.int64)
                if bug == "topk_off_by_one":
                    tok = tok + 1                           # reads slot t+1 (T_b - 1 + 1: a NaN pad row)
                items.append((np.array([i]), tok, False))
        for rows, tok_all, masked in items:
            ns, n = rows.size, tok_all.size
            if bug == "topk_off_by_one":
                cache_b = _cache(cs, ki, b, T + 1, bug)     # the kernel indexes the pool, not [0, T)
            else:
                cache_b = cache
            parts = []
            for (a, e) in _splits(n, bug == "one_sequence" and b == B - 1):
                if e <= a:
                    parts.append((np.zeros((ns, H, r), A), np.full((ns, H), -np.inf, A), 0))
                    continue
                tk = tok_all[a:e]
                c = cache_b[tk]
                s = np.einsum("shr,tr->sht", q_all[b, rows], c)
                if has_alpha:
                    al = ki["alpha_q"][b, rows].astype(A)[:, :, None] * \
                        ki["alpha_k"][b, tk].astype(A)[:, gmap].T[None]
                if has_rope:
                    kr = ki["k_rope"][b, tk].astype(A) if bug == "topk_off_by_one" else krope[tk]
                    sr = np.einsum("shd,td->sht", ki["q_rope"][b, rows].astype(A), kr)
                    if not has_alpha:
                        s = s + sr
                    elif cs.norm == "unified":
                        s = (s + sr) * al
                    else:
                        s = s * al + sr
                elif has_alpha:
                    s = s * al
                s = s * A(cs.scale)
                if masked:
                    vis = tk[None, :] <= pos[rows][:, None]
                    s = np.where(vis[:, None, :], s, -np.inf)
                m = s.max(-1)
                ok = np.isfinite(m)
                m0 = np.where(ok, m, 0)
                p = np.exp(s - m0[..., None])
                l = p.sum(-1)
                den = l.astype(BF16).astype(A) if bug == "row_denominator_bf16" else l
                with np.errstate(divide="ignore", invalid="ignore"):
                    o = np.where(ok[..., None], np.einsum("sht,tr->shr", p, c) / den[..., None], 0)
                    lj = np.where(ok, m0 + np.log(l), -np.inf)
                parts.append((o, lj, e - a))
            if not parts:                                   # an empty index list: out 0, lse -inf
                continue
            # combine kernel
            O = np.stack([p_[0] for p_ in parts])                 # [n,s,H,r]
            L = np.stack([p_[1] for p_ in parts])                 # [n,s,H]
            if bug == "one_head":
                L[0, :, -1] = -np.inf                             # head-stride slip: split 0 lost for last head
            if bug == "combine_by_count":
                cnt = np.array([p_[2] for p_ in parts], A)[:, None, None] * np.isfinite(L)
                w = cnt / np.maximum(cnt.sum(0, keepdims=True), 1)
                Lt = np.log(np.exp(L).sum(0))
                Lw = Lt
            elif bug == "combine_unstable":
                with np.errstate(over="ignore", invalid="ignore"):
                    ex = np.exp(L)
                    w = ex / ex.sum(0, keepdims=True)
                    Lt = np.log(ex.sum(0))
                Lw = Lt
            else:
                M = L.max(0)
                M0 = np.where(np.isfinite(M), M, 0)
                ssum = np.exp(L - M0).sum(0)
                with np.errstate(divide="ignore"):
                    Lt = np.where(ssum > 0, M0 + np.log(ssum), -np.inf)
                Lw = Lt
                if sink is not None and bug != "sink_ignored":
                    # the sink is one more "split" with lse s_h and output 0: the weights are
                    # exp(lse_j - lse_all), lse_all = logaddexp(lse, s_h); lse returned without it
                    with np.errstate(invalid="ignore"):
                        Lw = np.where(np.isfinite(Lt), np.logaddexp(Lt, sink[None, :]), -np.inf)
                    if bug == "sink_in_lse":
                        Lt = Lw
                w = np.where(np.isfinite(Lw), np.exp(L - np.where(np.isfinite(Lw), Lw, 0)), 0)
            lat[b, rows] = (w[..., None] * O).sum(0)
            lse[b, rows] = Lt
    if bug == "lse_base2":
        lse = lse / A(np.log(2.0))
    return lat, lse


def run(case, bug=None):
    cs = load(case)
    A, D = cs.accum, cs.stored
    ki = kernel_inputs(cs, bug)
    lat, lse = split_kv_decode(cs, ki, bug)
    if bug == "scale_bias":
        lat = lat * A(1.01)
    lat_d = lat.astype(D)
    if cs.level == "kernel":
        return {"latent_out": lat_d, "lse": lse}
    wv = cs.get("w_uv", A).reshape(cs.r, cs.G, cs.dv)[:, np.arange(cs.H) // (cs.H // cs.G), :]
    out = np.einsum("bshr,rhv->bshv", lat_d.astype(A), wv)
    return {"out": out.astype(D), "lse": lse, "latent_out": lat_d}


BUGS = {
    "one_head": "combine drops split 0 of the last head (head-stride slip)",
    "one_sequence": "last sequence's split ranges overlap (boundary token counted twice)",
    "row_denominator_bf16": "each split's row sum rounded to bf16 before the division",
    "scale_bias": "latent_out scaled by 1.01",
    "combine_by_count": "splits merged by token counts instead of lse",
    "combine_unstable": "combine weights exp(lse_j)/sum exp(lse_k) without the max shift",
    "lse_base2": "lse returned in base 2",
    "topk_off_by_one": "sparse: each listed token read as token + 1",
    "sink_in_lse": "the combine returns logaddexp(lse, s_h) as lse",
    "sink_ignored": "the combine forgets the attention sink",
    "block_scale_first": "fp8-block128: the first 128-block's scale used for the whole latent row",
}
FEATURES = ("topk", "attn_sink")


def bug_applies(cfg, bug):
    if bug == "one_sequence":
        return cfg["seqlens"][-1] >= 2
    if bug == "topk_off_by_one":
        return bool(cfg.get("topk"))
    if bug in ("sink_in_lse", "sink_ignored"):
        return bool(cfg.get("attn_sink"))
    if bug == "block_scale_first":               # needs a second scale block
        return cfg["profile"] == "fp8-block128" and int(cfg["latent_rank"]) > FP8_BLOCK
    return True
