"""Split-KV decode kernel (FlashDecoding) on kernel-level inputs, fp32 everywhere.

Each (sequence, row, head) cache range [0, T_b) is cut into n_split = 2..4 contiguous chunks
(chunk = ceil(T_b / n_split)); every chunk runs an exact local softmax in fp32:
    m_j = max s,  l_j = sum exp(s - m_j),  o_j = (sum exp(s - m_j) c) / l_j,  lse_j = m_j + log l_j
and a combine kernel merges them by lse:  lse = m + log sum_j exp(lse_j - m),
    o = sum_j exp(lse_j - lse) o_j.
Score: plain MLA s = scale*(q_latent.c + q_rope.k_rope); QK-normed: alpha_q*alpha_k scale the
latent part (blockwise) or the whole score (unified). fp8 cache: code*scale in fp32.
latent_out delivered in the stored dtype, lse fp32 (natural). fp64 profile: fp64.
Module level: absorb.py prelude and out = latent_out(stored) . W_UV (fp32 acc) -> stored dtype.
"""
import numpy as np

from absorb import kernel_inputs
from common import BF16, load

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


def split_kv_decode(cs, ki, bug=None):
    A = cs.accum
    B, S, H, G, r = cs.B, cs.S, cs.H, cs.G, cs.r
    gmap = np.arange(H) // (H // G)
    lat = np.zeros((B, S, H, r), A)
    lse = np.full((B, S, H), -np.inf, A)
    q_all = ki["q_latent"].astype(A)
    has_rope = "q_rope" in ki and cs.dr > 0
    has_alpha = "alpha_q" in ki and "alpha_k" in ki
    for b in range(B):
        T = cs.seqlens[b]
        if T == 0:
            continue
        if cs.is_fp8():
            cache = ki["kv_c"][b, :T].astype(np.float32) * \
                ki["kv_c_scale"][b, :T].astype(np.float32)[:, None]
            cache = cache.astype(A)
        else:
            cache = ki["kv_c"][b, :T].astype(A)
        krope = ki["k_rope"][b, :T].astype(A) if has_rope else None
        pos = T - S + np.arange(S)
        parts = []
        for (a, e) in _splits(T, bug == "one_sequence" and b == B - 1):
            if e <= a:
                parts.append((np.zeros((S, H, r), A), np.full((S, H), -np.inf, A), 0))
                continue
            c = cache[a:e]
            s = np.einsum("shr,tr->sht", q_all[b], c)
            if has_alpha:
                al = ki["alpha_q"][b].astype(A)[:, :, None] * ki["alpha_k"][b, a:e].astype(A)[:, gmap].T[None]
            if has_rope:
                sr = np.einsum("shd,td->sht", ki["q_rope"][b].astype(A), krope[a:e])
                if not has_alpha:
                    s = s + sr
                elif cs.norm == "unified":
                    s = (s + sr) * al
                else:
                    s = s * al + sr
            elif has_alpha:
                s = s * al
            s = s * A(cs.scale)
            if cs.causal:
                vis = np.arange(a, e)[None, :] <= pos[:, None]
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
        # combine kernel
        O = np.stack([p_[0] for p_ in parts])                 # [n,S,H,r]
        L = np.stack([p_[1] for p_ in parts])                 # [n,S,H]
        if bug == "one_head":
            L[0, :, -1] = -np.inf                             # head-stride slip: split 0 lost for last head
        if bug == "combine_by_count":
            cnt = np.array([p_[2] for p_ in parts], A)[:, None, None] * np.isfinite(L)
            w = cnt / np.maximum(cnt.sum(0, keepdims=True), 1)
            Lt = np.log(np.exp(L).sum(0))
        elif bug == "combine_unstable":
            with np.errstate(over="ignore", invalid="ignore"):
                ex = np.exp(L)
                w = ex / ex.sum(0, keepdims=True)
                Lt = np.log(ex.sum(0))
        else:
            M = L.max(0)
            M0 = np.where(np.isfinite(M), M, 0)
            ssum = np.exp(L - M0).sum(0)
            with np.errstate(divide="ignore"):
                Lt = np.where(ssum > 0, M0 + np.log(ssum), -np.inf)
            w = np.where(np.isfinite(Lt), np.exp(L - np.where(np.isfinite(Lt), Lt, 0)), 0)
        lat[b] = (w[..., None] * O).sum(0)
        lse[b] = Lt
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
}


def bug_applies(cfg, bug):
    if bug == "one_sequence":
        return cfg["seqlens"][-1] >= 2
    return True
