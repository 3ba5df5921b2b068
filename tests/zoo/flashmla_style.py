"""FlashMLA-like decode kernel (absorbed, latent cache), emulated tile by tile.

Kernel: for every (sequence, query row, head) the cache is streamed in 64-token tiles;
    s      = q_latent . c  (fp32 accumulation)                       [+ row/col alpha scaling]
    s     *= scale_log2 = fp32(softmax_scale * log2(e))               (one folded constant)
    m_new  = max(m, rowmax(s));  corr = exp2(m - m_new);  P = exp2(s - m_new)
             (fp32: --use_fast_math's ex2.approx.ftz, fastmath.ex2_approx)
    l      = l*corr + rowsum(P)      (fp32 P)
    acc    = acc*corr + bf16(P) . c  (P rounded to bf16 for the tensor-core P.V; fp16 in the
                                      fp16 profile; not rounded in fp32/fp64)
    latent_out = acc / l -> stored dtype;  lse = (m + log2(l)) * ln(2)  (natural log, fp32)
Blockwise: s = alpha_q*alpha_k*(q_latent.c) + q_rope.k_rope; unified: alpha_q*alpha_k*(both).
fp8 cache: each tile dequantized in fp32 (code * scale), fed to the fp32 score/P.V products;
fp8-block128: value j of a token takes its 128-block's scale (exact: e4m3 times a power of two).
Sparse top-k (FlashMLA sparse decode): each query row gathers its listed tokens in index order,
64 indices a tile, -1 pads skipped. Attention sink: the epilogue adds exp2(s_h*log2(e) - m) to
the row sum l before acc / l (so out *= 1/(1 + exp(s_h - lse))); lse is from l alone.
Host (module level): absorb.py (engine prelude), then out = latent_out(stored) . W_UV with fp32
accumulation, rounded to the stored dtype. Works on kernel-level cases too (latent_out, lse).
Rows past T_b are never loaded: the last tile is clipped at T_b (a masked load).
"""
import numpy as np

from absorb import kernel_inputs
from common import BF16, FP8_BLOCK, load
from fastmath import ex2_approx

LEVELS = ("module", "kernel")
TILE = 64
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


def _p_dtype(profile):
    return {"bf16": BF16, "fp8": BF16, "fp8-block128": BF16, "fp16": np.float16}.get(profile)


def _row_groups(cs, b, end, topk):
    """(rows, tokens, vis) groups the kernel walks for sequence b. Dense: all S rows share the
    cache order [0, end) and the causal mask. Sparse top-k (FlashMLA's sparse decode): each query
    row gathers its own listed tokens in index order, the -1 pads skipped (the index set
    replaces the causal window, conventions §1.5), so every listed token is visible."""
    S, T = cs.S, cs.seqlens[b]
    if topk is None:
        tok = np.arange(end)
        vis = (tok[None, :] <= (T - S + np.arange(S))[:, None]) if cs.causal else None
        return [(np.arange(S), tok, vis)]
    groups = []
    for i in range(S):
        idx = topk[b, i]
        tok = idx[idx >= 0].astype(np.int64)
        if end < T:                               # one_sequence: the list's tail tile dropped
            tok = tok[:(tok.size // TILE) * TILE]
        groups.append((np.array([i]), tok, None))
    return groups


def _dequant_tile(cs, ki, b, tok, bug):
    """fp8: the tile's e4m3 codes times their scale in fp32 (exact: e4m3 * power of two, or the
    per-token fp32 scale). fp8-block128: latent value j takes the scale of its 128-block j // 128
    (FlashMLA's fp8 cache, conventions §1.5); bug block_scale_first takes block 0's for all."""
    code = ki["kv_c"][b, tok].astype(np.float32)
    sc = ki["kv_c_scale"][b, tok].astype(np.float32)
    if sc.ndim == 1:
        return code * sc[:, None]
    cols = np.arange(code.shape[-1]) // FP8_BLOCK
    if bug == "block_scale_first":
        cols = np.zeros_like(cols)
    return code * sc[:, cols]


def decode_kernel(cs, ki, bug=None):
    A = cs.accum
    B, S, H, G, r = cs.B, cs.S, cs.H, cs.G, cs.r
    gmap = np.arange(H) // (H // G)
    if bug == "one_head" and G > 1:
        gmap = gmap.copy()
        gmap[-1] = (gmap[-1] - 1) % G       # last head-block reads the previous group's alpha_k
    unified = cs.norm == "unified"
    pdt = _p_dtype(cs.profile)
    scale_log2 = A(cs.scale * LOG2E)
    exp2 = ex2_approx if A == np.float32 else np.exp2    # --use_fast_math: ex2.approx.ftz.f32
    q_lat_all = ki["q_latent"].astype(A)
    aq_all = ki["alpha_q"].astype(A) if "alpha_q" in ki else np.ones((B, S, H), A)
    has_rope = "q_rope" in ki and cs.dr > 0
    topk = cs.raw("indices") if cs.has("indices") else None
    # sink logits in the kernel's log2 domain (FlashMLA: the epilogue adds exp2(sink*log2e - m) to l)
    sink2 = cs.get("attn_sink", A) * A(LOG2E) if cs.has("attn_sink") and bug != "sink_ignored" else None
    latent = np.zeros((B, S, H, r), A)
    lse = np.full((B, S, H), -np.inf, A)
    for b in range(B):
        T = cs.seqlens[b]
        end = T
        if bug == "one_sequence" and b == B - 1:
            end = (T // TILE) * TILE            # scheduler: last entry's tiles = floor(T/64)
        for rows, tok_all, vis_all in _row_groups(cs, b, end, topk):
            if bug == "topk_off_by_one" and topk is not None:
                tok_all = tok_all + 1           # index read one slot late (T_b - 1 + 1: a NaN pad row)
            q = q_lat_all[b, rows]              # [s,H,r]
            aq = aq_all[b, rows]
            qr = ki["q_rope"][b, rows].astype(A) if has_rope else None
            ns = rows.size
            m = np.full((ns, H), -np.inf, A)
            l = np.zeros((ns, H), A)
            acc = np.zeros((ns, H, r), A)
            for t0 in range(0, tok_all.size, TILE):
                tok = tok_all[t0:t0 + TILE]
                if cs.is_fp8():
                    c = _dequant_tile(cs, ki, b, tok, bug)
                else:
                    c = ki["kv_c"][b, tok].astype(A)
                s = np.einsum("shr,tr->sht", q, c)
                if "alpha_k" in ki:
                    ak = ki["alpha_k"][b, tok].astype(A)[:, gmap].T[None]     # [1,H,t]
                    rc = aq[:, :, None] * ak
                else:
                    rc = None
                if has_rope:
                    sr = np.einsum("shd,td->sht", qr, ki["k_rope"][b, tok].astype(A))
                    if rc is None:
                        s = s + sr
                    elif unified:
                        s = (s + sr) * rc
                    else:
                        s = s * rc + sr
                elif rc is not None:
                    s = s * rc
                s = s * scale_log2
                if vis_all is not None:
                    s = np.where(vis_all[:, None, t0:t0 + TILE], s, -np.inf)
                m_new = np.maximum(m, s.max(-1))
                m_use = np.where(m_new == -np.inf, A(0), m_new)
                corr = exp2(m - m_use)
                p = exp2(s - m_use[..., None])
                l = l * corr + p.sum(-1)
                pv = p.astype(pdt).astype(A) if pdt is not None else p
                if bug == "no_rescale":
                    acc = acc + np.einsum("sht,tr->shr", pv, c)
                else:
                    acc = acc * corr[..., None] + np.einsum("sht,tr->shr", pv, c)
                m = m_new
            den = l
            if bug == "row_denominator_bf16":
                den = l.astype(BF16).astype(A)
            live = l > 0                          # a row without tokens: out 0, lse -inf (sink or not)
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                lg = np.log2(l)
                if sink2 is not None:             # l + exp(s_h - max): out *= 1/(1 + exp(s_h - lse))
                    den = den + exp2(sink2[None, :] - np.where(live, m, 0))
                latent[b, rows] = np.where(live[..., None], acc / den[..., None], A(0))
                lsum = np.log2(den) if bug == "sink_in_lse" and sink2 is not None else lg
            lse[b, rows] = np.where(live, m + lsum if bug == "lse_base2" else (m + lsum) * A(LN2), -np.inf)
    return latent, lse


def run(case, bug=None):
    cs = load(case)
    A, D = cs.accum, cs.stored
    ki = kernel_inputs(cs, bug)
    latent, lse = decode_kernel(cs, ki, bug)
    if bug == "scale_bias":
        latent = latent * A(1.01)
    lat_d = latent.astype(D)
    if cs.level == "kernel":
        return {"latent_out": lat_d, "lse": lse.astype(A)}
    G, r, dv = cs.G, cs.r, cs.dv
    gmap = np.arange(cs.H) // (cs.H // G)
    if bug == "one_head" and G == 1:
        gmap = None
    wv = cs.get("w_uv", A).reshape(r, G, dv)
    out = np.einsum("bshr,rhv->bshv", lat_d.astype(A), wv[:, gmap if gmap is not None else np.zeros(cs.H, int), :])
    if gmap is None:                         # G = 1: last head's W_UV read with a dv offset
        out[:, :, -1] = np.roll(out[:, :, -1], 1, axis=-1)
    return {"out": out.astype(D), "lse": lse.astype(A), "latent_out": lat_d}


BUGS = {
    "one_head": "last head-block reads alpha_k of the previous group (G=1: W_UV column offset)",
    "one_sequence": "scheduler gives the last sequence floor(T/64) tiles (its tail tile dropped)",
    "row_denominator_bf16": "row sum l rounded to bf16 before acc / l",
    "scale_bias": "latent_out (and so out) scaled by 1.01",
    "lse_base2": "lse returned as m + log2(l) (base 2)",
    "no_rescale": "online softmax forgets acc *= exp2(m_old - m_new)",
    "eps_outside_sqrt": "host RMS as 1/(sqrt(ms) + eps)",
    "rope_pairs_swapped": "host RoPE with the other pair layout",
    "topk_off_by_one": "sparse: each listed token read as token + 1",
    "sink_in_lse": "the sink term of the denominator also folded into the returned lse",
    "sink_ignored": "the epilogue forgets the attention sink",
    "block_scale_first": "fp8-block128: the first 128-block's scale used for the whole latent row",
}
FEATURES = ("topk", "attn_sink")


def bug_applies(cfg, bug):
    kernel = cfg.get("level") == "kernel"
    norm, dr, G = cfg.get("norm"), int(cfg["d_r"]), int(cfg["groups"])
    if bug == "one_head":
        return (G > 1 and norm != "none") or (G == 1 and not kernel)
    if bug == "one_sequence":
        return max(cfg["seqlens"][-1:] or [0]) % TILE != 0
    if bug == "no_rescale":
        return max(cfg["seqlens"]) > TILE
    if bug == "eps_outside_sqrt":
        return not kernel and norm != "none"
    if bug == "rope_pairs_swapped":
        return not kernel and dr > 0
    if bug == "topk_off_by_one":
        return bool(cfg.get("topk"))
    if bug in ("sink_in_lse", "sink_ignored"):
        return bool(cfg.get("attn_sink"))
    if bug == "block_scale_first":               # needs a second scale block
        return cfg["profile"] == "fp8-block128" and int(cfg["latent_rank"]) > FP8_BLOCK
    return True
