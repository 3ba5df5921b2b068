"""FlashMLA-like decode kernel (absorbed, latent cache), emulated tile by tile.

Kernel: for every (sequence, query row, head) the cache is streamed in 64-token tiles;
    s      = q_latent . c  (fp32 accumulation)                       [+ row/col alpha scaling]
    s     *= scale_log2 = fp32(softmax_scale * log2(e))               (one folded constant)
    m_new  = max(m, rowmax(s));  corr = exp2(m - m_new);  P = exp2(s - m_new)
    l      = l*corr + rowsum(P)      (fp32 P)
    acc    = acc*corr + bf16(P) . c  (P rounded to bf16 for the tensor-core P.V; fp16 in the
                                      fp16 profile; not rounded in fp32/fp64)
    latent_out = acc / l -> stored dtype;  lse = (m + log2(l)) * ln(2)  (natural log, fp32)
Blockwise: s = alpha_q*alpha_k*(q_latent.c) + q_rope.k_rope; unified: alpha_q*alpha_k*(both).
fp8 cache: each tile dequantized in fp32 (code * scale), fed to the fp32 score/P.V products.
Host (module level): absorb.py (engine prelude), then out = latent_out(stored) . W_UV with fp32
accumulation, rounded to the stored dtype. Works on kernel-level cases too (latent_out, lse).
Rows past T_b are never loaded: the last tile is clipped at T_b (a masked load).
"""
import numpy as np

from absorb import kernel_inputs
from common import BF16, load

LEVELS = ("module", "kernel")
TILE = 64
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


def _p_dtype(profile):
    return {"bf16": BF16, "fp8": BF16, "fp16": np.float16}.get(profile)


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
    q_lat_all = ki["q_latent"].astype(A)
    aq_all = ki["alpha_q"].astype(A) if "alpha_q" in ki else np.ones((B, S, H), A)
    has_rope = "q_rope" in ki and cs.dr > 0
    latent = np.zeros((B, S, H, r), A)
    lse = np.full((B, S, H), -np.inf, A)
    for b in range(B):
        T = cs.seqlens[b]
        end = T
        if bug == "one_sequence" and b == B - 1:
            end = (T // TILE) * TILE            # scheduler: last entry's tiles = floor(T/64)
        q = q_lat_all[b]                        # [S,H,r]
        aq = aq_all[b]
        qr = ki["q_rope"][b].astype(A) if has_rope else None
        pos = T - S + np.arange(S)
        m = np.full((S, H), -np.inf, A)
        l = np.zeros((S, H), A)
        acc = np.zeros((S, H, r), A)
        for t0 in range(0, end, TILE):
            t1 = min(t0 + TILE, end)
            if cs.is_fp8():
                c = ki["kv_c"][b, t0:t1].astype(np.float32) * \
                    ki["kv_c_scale"][b, t0:t1].astype(np.float32)[:, None]
            else:
                c = ki["kv_c"][b, t0:t1].astype(A)
            s = np.einsum("shr,tr->sht", q, c)
            if "alpha_k" in ki:
                ak = ki["alpha_k"][b, t0:t1].astype(A)[:, gmap].T[None]     # [1,H,t]
                rc = aq[:, :, None] * ak
            else:
                rc = None
            if has_rope:
                sr = np.einsum("shd,td->sht", qr, ki["k_rope"][b, t0:t1].astype(A))
                if rc is None:
                    s = s + sr
                elif unified:
                    s = (s + sr) * rc
                else:
                    s = s * rc + sr
            elif rc is not None:
                s = s * rc
            s = s * scale_log2
            if cs.causal:
                vis = np.arange(t0, t1)[None, :] <= pos[:, None]             # [S,t]
                s = np.where(vis[:, None, :], s, -np.inf)
            m_new = np.maximum(m, s.max(-1))
            m_use = np.where(m_new == -np.inf, A(0), m_new)
            corr = np.exp2(m - m_use)
            p = np.exp2(s - m_use[..., None])
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
        with np.errstate(divide="ignore", invalid="ignore"):
            latent[b] = np.where(l[..., None] > 0, acc / den[..., None], A(0))
            lg = np.log2(l)
        lse[b] = np.where(l > 0, m + lg if bug == "lse_base2" else (m + lg) * A(LN2), -np.inf)
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
}


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
    return True
