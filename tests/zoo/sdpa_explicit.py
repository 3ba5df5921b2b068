"""Explicit (full-key) form, written like a module that calls scaled_dot_product_attention.

Per group the keys and values are materialized from the latent cache and stored in D:
    k_nope = c . W_UK_g (fp32 acc) -> QK-norm in fp32 -> D ;  v = c . W_UV_g (fp32 acc) -> D
    k_rope: RMSNorm + RoPE in fp32 -> D (blockwise: once per token; unified: per group, since
            the unified statistic depends on the group's content key)
    q = cat(N(q_nope), Rot(N(q_pe))) in D
then repeat_kv (repeat_interleave of the G groups to H heads), a padded batch with a boolean
attn_mask (key padding + causal; padded key slots zero-filled, as after torch.nan_to_num), and
one SDPA call upcast to fp32 (scores, softmax, P.V in fp32, P unrounded), out rounded to D.
lse = logsumexp of the fp32 scores (what the efficient-attention backend returns), fp32.
Rows with no visible key: SDPA's NaN row replaced by 0 and lse = -inf. Module level only.
fp8-block128: code * scale of each value's 128-block. Top-k: the bool mask is the index set
(-1 pads ignored), replacing key padding and causality. Attention sink: an extra key slot with
value 0 and attn_mask bias s_h (out scaled by exp(lse)/(exp(lse) + exp(s_h)) inside the one
softmax); lse is the logsumexp of the real keys' scores.
fp64 profile: all fp64.
"""
import numpy as np

from common import BF16, FP8_BLOCK, load

LEVELS = ("module",)
AUDIT_ARGS = ("--form", "explicit")   # what its author would declare to the audit


def _rope(x, cos, sin, style):
    d2 = x.shape[-1] // 2
    if style == "interleaved":
        xr = np.stack([-x[..., 1::2], x[..., 0::2]], -1).reshape(x.shape)
        c2, s2 = np.repeat(cos, 2, -1), np.repeat(sin, 2, -1)
    else:
        xr = np.concatenate([-x[..., d2:], x[..., :d2]], -1)       # rotate_half
        c2, s2 = np.concatenate([cos, cos], -1), np.concatenate([sin, sin], -1)
    return x * c2 + xr * s2


def _rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * w


class Qkv:
    """What a module hands to SDPA: q [B,S,H,d], k [B,T,H,d], v [B,T,H,dv] in D (read back as A),
    the key-padding mask valid [B,T], the sequence lengths and the softmax scale."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


def qkv(case, bug=None):
    """The module's explicit keys and values (every step before the SDPA call)."""
    cs = load(case)
    A, D = cs.accum, cs.stored
    B, S, H, G, r, dc, dr, dv = cs.B, cs.S, cs.H, cs.G, cs.r, cs.dc, cs.dr, cs.dv
    T_max = cs.raw("kv_c").shape[1]
    eps = A(cs.eps)
    rd = lambda x: x.astype(D).astype(A)   # noqa: E731  (a D tensor, read back by the kernel)
    seq = np.array(cs.seqlens)
    valid = np.arange(T_max)[None, :] < seq[:, None]                 # [B,T]
    if cs.is_fp8():
        sc = cs.raw("kv_c_scale").astype(A)                          # per token, or per 128 values
        c = cs.raw("kv_c").astype(A) * (sc[..., np.arange(r) // FP8_BLOCK] if sc.ndim == 3 else sc[..., None])
    else:
        c = cs.get("kv_c", A)
    c = np.where(valid[..., None], c, 0)                              # nan_to_num on the padding
    k_nope = np.einsum("btr,rgd->btgd", c, cs.get("w_uk", A).reshape(r, G, dc))
    v = rd(np.einsum("btr,rgd->btgd", c, cs.get("w_uv", A).reshape(r, G, dv)))
    q_nope = cs.get("q_nope", A)
    order = cs.rope_order
    if bug == "rope_order_swapped":
        order = "rope_then_norm" if order == "norm_then_rope" else "norm_then_rope"
    if dr:
        qpos = np.maximum(seq[:, None] - S + np.arange(S)[None, :], 0)   # [B,S]
        cos, sin = cs.get("rope_cos", A), cs.get("rope_sin", A)
        qcs = (cos[qpos][:, :, None, :], sin[qpos][:, :, None, :])
        kcs = (cos[:T_max][None], sin[:T_max][None])
        q_pe = cs.get("q_pe", A)
        k_pe = np.where(valid[..., None], cs.get("k_pe", A), 0)
        rot = lambda x, cs_: _rope(x, *cs_, cs.rope_style)   # noqa: E731
    if cs.norm == "none":
        qc, kc = q_nope, k_nope
        if dr:
            qr, kr = rot(q_pe, qcs), rot(k_pe, kcs)[:, :, None, :].repeat(G, 2)
    elif cs.norm == "blockwise":
        gcq = cs.get("gamma_cq", A)
        qc = _rms(q_nope, gcq, eps)
        if bug == "one_head":
            qc[:, :, -1] = _rms(q_nope[:, :, -1], np.ones_like(gcq), eps)   # last head: gain lost
        kc = _rms(k_nope, cs.get("gamma_ck", A), eps)
        if dr:
            grq, grk = cs.get("gamma_rq", A), cs.get("gamma_rk", A)
            if order == "norm_then_rope":
                qr, kr = rot(_rms(q_pe, grq, eps), qcs), rot(_rms(k_pe, grk, eps), kcs)
            else:
                qr, kr = _rms(rot(q_pe, qcs), grq, eps), _rms(rot(k_pe, kcs), grk, eps)
            kr = kr[:, :, None, :].repeat(G, 2)
    else:  # unified: one RMSNorm over the concatenated head, per group for the keys
        gq, gk = cs.get("gamma_q", A), cs.get("gamma_k", A)
        if dr:
            kpg = k_pe[:, :, None, :].repeat(G, 2)
            if order == "norm_then_rope":
                qn = _rms(np.concatenate([q_nope, q_pe], -1), gq, eps)
                kn = _rms(np.concatenate([k_nope, kpg], -1), gk, eps)
                qc, qr = qn[..., :dc], rot(qn[..., dc:], qcs)
                kc, kr = kn[..., :dc], rot(kn[..., dc:], (kcs[0][:, :, None], kcs[1][:, :, None]))
            else:
                qn = _rms(np.concatenate([q_nope, rot(q_pe, qcs)], -1), gq, eps)
                kn = _rms(np.concatenate([k_nope, rot(kpg, (kcs[0][:, :, None], kcs[1][:, :, None]))], -1),
                          gk, eps)
                qc, qr, kc, kr = qn[..., :dc], qn[..., dc:], kn[..., :dc], kn[..., dc:]
        else:
            qc, kc = _rms(q_nope, gq, eps), _rms(k_nope, gk, eps)
        if bug == "one_head":
            qc[:, :, -1] = qc[:, :, -1] / gq[:dc]
    # stored-dtype q, k, v
    q = rd(np.concatenate([qc, qr], -1) if dr else qc)                # [B,S,H,d]
    k = rd(np.concatenate([kc, kr], -1) if dr else kc)                # [B,T,G,d]
    # repeat_kv
    if bug == "group_map_mod":
        hmap = np.arange(H) % G                                       # .repeat instead of repeat_interleave
    else:
        hmap = np.arange(H) // (H // G)
    scale = A(1.0 / np.sqrt(dc)) if bug == "scale_dc_only" else A(cs.scale)
    return Qkv(cs=cs, q=q, k=k[:, :, hmap], v=v[:, :, hmap], valid=valid, seq=seq, scale=scale)


def run(case, bug=None):
    m = qkv(case, bug)
    cs, q, k, vv, valid, seq, scale = m.cs, m.q, m.k, m.v, m.valid, m.seq, m.scale
    A, D = cs.accum, cs.stored
    B, S = cs.B, cs.S
    T_max = cs.raw("kv_c").shape[1]
    # SDPA (fp32 math)
    sc = np.einsum("bshd,bthd->bhst", q, k) * scale                   # [B,H,S,T]
    mask = valid[:, None, None, :].repeat(S, 2)                       # [B,1,S,T]
    qpos_full = seq[:, None] - S + np.arange(S)[None, :]
    if bug == "one_sequence":
        # last sequence gets the padded-batch mask: tril at the padded length, no key padding
        mask[-1] = True
        qpos_full[-1] = T_max - S + np.arange(S)
    if cs.has("indices"):                                              # top-k: the index mask
        idx = cs.raw("indices")                                        # replaces key padding + causal
        sel = np.zeros((B, S, T_max), bool)
        for b in range(B):
            for i in range(S):
                sel[b, i, idx[b, i][idx[b, i] >= 0]] = True
        mask = sel[:, None]
    elif cs.causal:
        mask = mask & (np.arange(T_max)[None, None, :] <= qpos_full[:, :, None])[:, None]
    sc = np.where(mask, sc, -np.inf)
    mx = sc.max(-1, keepdims=True)
    any_vis = np.isfinite(mx)
    with np.errstate(divide="ignore", invalid="ignore"):               # logsumexp of the real keys
        lse = np.where(any_vis[..., 0], mx[..., 0] + np.log(np.exp(sc - np.where(any_vis, mx, 0)).sum(-1)),
                       -np.inf)                                        # [B,H,S]
    if cs.has("attn_sink"):
        # SDPA has no sink argument: one extra key slot per row, value 0, whose float attn_mask
        # bias is s_h (k = 0), so the softmax's denominator holds exp(s_h); P.V is unchanged
        sink = cs.get("attn_sink", A)[None, :, None, None] + np.zeros_like(sc[..., :1])
        sc = np.concatenate([sc, sink], -1)
        mx = np.maximum(mx, sink)
    mx = np.where(any_vis, mx, 0)
    e = np.exp(sc - mx)
    den = e.sum(-1, keepdims=True)
    if bug == "row_denominator_bf16":
        den = den.astype(BF16).astype(A)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = (e / den)[..., :T_max]                                     # the sink slot's value is 0
        o = np.einsum("bhst,bthd->bshd", np.where(any_vis, p, 0), vv)
    if bug == "scale_bias":
        o = o * A(1.01)
    return {"out": o.astype(D), "lse": np.transpose(lse, (0, 2, 1)).astype(A)}


BUGS = {
    "one_head": "last head's query normalized without its gain",
    "one_sequence": "last sequence masked as if it had the padded length T_max (causal tril at\n"
                    "T_max - S_q, no key padding): zero-filled slots attended",
    "row_denominator_bf16": "softmax row sum rounded to bf16",
    "scale_bias": "out scaled by 1.01",
    "group_map_mod": "repeat_kv with .repeat (h % G) instead of repeat_interleave",
    "scale_dc_only": "softmax scale 1/sqrt(d_c) (nope head dim) instead of the config's",
    "rope_order_swapped": "rope/norm order swapped",
}


FEATURES = ("topk", "attn_sink")


def bug_applies(cfg, bug):
    if cfg.get("level") == "kernel":
        return False
    if bug == "one_sequence" and cfg.get("topk"):
        return False                             # the index mask replaces the padded-batch mask
    norm, dr, G, H = cfg.get("norm"), int(cfg["d_r"]), int(cfg["groups"]), int(cfg["heads"])
    if bug == "one_head":
        return norm != "none"
    if bug == "one_sequence":
        return cfg["seqlens"][-1] > 0            # visible when the last sequence is padded
    if bug == "group_map_mod":
        return G > 1 and H // G > 1
    if bug == "rope_order_swapped":
        return norm != "none" and dr > 0
    if bug == "scale_dc_only":
        return dr > 0 or abs(float(cfg["softmax_scale"]) * np.sqrt(int(cfg["d_c"])) - 1) > 1e-12
    return True
