"""JAX/XLA-style absorbed MLA module with QK-norm, in the stored dtype D (module level).

Written the way a Flax/MaxText attention layer is: every `jnp.einsum(...,
preferred_element_type=jnp.float32)` returns fp32 and is cast back to the activation dtype D
(`.astype(self.dtype)`); elementwise ops follow jnp type promotion (D with fp32 -> fp32);
norms and softmax run in fp32 on `.astype(jnp.float32)` inputs.
Rounding points (D = stored dtype; "f32" = fp64 in the fp64 profile):
  - RMSNorm (MaxText RMSNorm): fp32 variance, `lax.rsqrt(var + eps)` (1/sqrt in fp32), output
    cast to D; the rope part normalized -> D, then RoPE in fp32 on the D values -> D (each Flax
    module returns D; rope_then_norm likewise: RoPE -> D, norm -> D)
  - alpha_q: the rsqrt statistic of q_nope, fp32 (kept fp32, a scalar per head)
  - q_latent: einsum(q_nope.astype(f32) * (g_cq * g_ck) [f32], W_K) -> D
  - alpha_k: the key einsum(c, W_K) cast to D (every einsum is cast back), statistic in fp32
  - scores: content einsum(q_latent, c) -> D and rope einsum(q_rope, k_rope) -> D, then
    promoted: (content * alpha_q * alpha_k + rope) * scale in fp32; masked with MaxText's
    DEFAULT_MASK_VALUE = -0.7 * float32 max (not -inf)
  - softmax: jax.nn.softmax(logits.astype(f32)); lse: jax.nn.logsumexp in fp32
  - P cast to D for einsum(P, c) -> latent D; out = einsum(latent, W_V) -> D
  - fp8 cache: codes.astype(f32) * scale stays fp32 (jnp promotion), so c enters the score
    einsum in fp32 and P.c with P in D and c in fp32 (an einsum of mixed operands promotes)
Rows without a visible key: out 0, lse -inf (jnp.where on `mask.any(-1)`).
Delivered: out (D), latent_out (D), lse (fp32).
"""
import ml_dtypes
import numpy as np

from common import load

LEVELS = ("module",)
BUGS = ["one_head", "one_sequence", "row_denominator_bf16", "scale_bias",
        "eps_outside_sqrt", "rope_order_swapped"]
FEATURES = ("topk", "attn_sink")   # conventions §1.5: reads indices and attn_sink when present


def bug_applies(cfg, bug):
    if bug == "eps_outside_sqrt":
        return cfg.get("norm", "blockwise") != "none"
    if bug == "rope_order_swapped":
        return cfg.get("norm", "blockwise") != "none" and int(cfg["d_r"]) > 0
    return bug in BUGS


class _Jnp:
    """The handful of jnp semantics the layer uses, on numpy arrays."""

    def __init__(self, dtype, f32, eps, bug):
        self.dtype, self.f32, self.eps, self.bug = dtype, f32, f32(eps), bug

    def einsum(self, spec, *ops):             # preferred_element_type=f32, then .astype(dtype)
        return np.einsum(spec, *[o.astype(self.f32) for o in ops]).astype(self.dtype)

    def rsqrt_stat(self, x):                  # lax.rsqrt(mean(x^2) + eps), x.astype(f32)
        x = x.astype(self.f32)
        var = np.mean(x * x, axis=-1, keepdims=True)
        if self.bug == "eps_outside_sqrt":
            return 1.0 / (np.sqrt(var) + self.eps)
        return 1.0 / np.sqrt(var + self.eps)

    def rmsnorm(self, x, scale):              # MaxText RMSNorm: normalize in f32 -> dtype, * scale
        y = (x.astype(self.f32) * self.rsqrt_stat(x)).astype(self.dtype)
        return (y.astype(self.f32) * scale.astype(self.f32)).astype(self.dtype)


def _rope(jx, x, cos, sin, style):
    # MaxText-style RoPE: split, rotate in f32, concatenate/interleave, cast to dtype
    x = x.astype(jx.f32)
    if style == "interleaved":
        a, b = x[..., 0::2], x[..., 1::2]
        return np.stack([a * cos - b * sin, b * cos + a * sin], -1).reshape(x.shape).astype(jx.dtype)
    a, b = np.split(x, 2, axis=-1)
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], -1).astype(jx.dtype)


def run(case, bug=None):
    cs = load(case)
    D = cs.stored
    F = np.float64 if cs.profile == "fp64" else np.float32
    jx = _Jnp(D, F, cs.eps, bug)
    B, S, H, G, r, dc, dr, dv = cs.B, cs.S, cs.H, cs.G, cs.r, cs.dc, cs.dr, cs.dv
    hpg = H // G
    T = cs.raw("kv_c").shape[1]
    lens = np.array(cs.seqlens)
    if cs.is_fp8():
        sc = cs.raw("kv_c_scale").astype(F)                              # [B,T] or [B,T,r/128]
        sc = sc[..., None] if sc.ndim == 2 else np.repeat(sc, 128, -1)[..., :r]
        c = cs.raw("kv_c").astype(F) * sc
    else:
        c = cs.raw("kv_c")
    valid = np.arange(T)[None, :] < lens[:, None]                       # [B, T]
    c = np.where(valid[..., None], c.astype(F), 0).astype(c.dtype)       # paged gather: pad = 0
    w_uk = cs.raw("w_uk").reshape(r, G, dc)
    w_uv = cs.raw("w_uv").reshape(r, G, dv)
    head_g = np.arange(H) // hpg
    q_nope = cs.raw("q_nope")
    order = cs.rope_order
    if bug == "rope_order_swapped":
        order = "rope_then_norm" if order == "norm_then_rope" else "norm_then_rope"
    qpos = np.clip(lens[:, None] - S + np.arange(S)[None, :], 0, None)   # [B, S]
    if dr:
        cos, sin = cs.raw("rope_cos").astype(F), cs.raw("rope_sin").astype(F)
        qr = lambda x: _rope(jx, x, cos[qpos][:, :, None], sin[qpos][:, :, None], cs.rope_style)  # noqa
        kr = lambda x: _rope(jx, x, cos[None, :T], sin[None, :T], cs.rope_style)                  # noqa
        q_pe = cs.raw("q_pe")
        k_pe = np.where(valid[..., None], cs.raw("k_pe").astype(F), 0).astype(D)
    key = jx.einsum("btr,rgd->btgd", c, w_uk)                            # -> D (cast back)
    if cs.norm == "none":
        g, aq, ak = np.ones(dc, F), np.ones((B, S, H), F), np.ones((B, T, G), F)
        if dr:
            q_rope, k_rope = qr(q_pe), kr(k_pe)
    elif cs.norm == "blockwise":
        g = cs.raw("gamma_cq").astype(F) * cs.raw("gamma_ck").astype(F)
        aq, ak = jx.rsqrt_stat(q_nope)[..., 0], jx.rsqrt_stat(key)[..., 0]
        if dr:
            grq, grk = cs.raw("gamma_rq"), cs.raw("gamma_rk")
            if order == "norm_then_rope":
                q_rope, k_rope = qr(jx.rmsnorm(q_pe, grq)), kr(jx.rmsnorm(k_pe, grk))
            else:
                q_rope, k_rope = jx.rmsnorm(qr(q_pe), grq), jx.rmsnorm(kr(k_pe), grk)
    else:                                                                # unified statistic
        gq, gk = cs.raw("gamma_q").astype(F), cs.raw("gamma_k").astype(F)
        g = gq[:dc] * gk[:dc]
        qcat, kcat = q_nope.astype(F), key.astype(F)
        if dr:
            if order == "norm_then_rope":
                qs, ks = q_pe, k_pe
                q_rope = qr((q_pe.astype(F) * gq[dc:]).astype(D))
                k_rope = kr((k_pe.astype(F) * gk[dc:]).astype(D))
            else:
                qs, ks = qr(q_pe), kr(k_pe)
                q_rope = (qs.astype(F) * gq[dc:]).astype(D)
                k_rope = (ks.astype(F) * gk[dc:]).astype(D)
            qcat = np.concatenate([qcat, qs.astype(F)], -1)
            kcat = np.concatenate([kcat, np.broadcast_to(ks.astype(F)[:, :, None], (B, T, G, dr))], -1)
        aq, ak = jx.rsqrt_stat(qcat)[..., 0], jx.rsqrt_stat(kcat)[..., 0]
    q_latent = jx.einsum("bshd,rhd->bshr", q_nope.astype(F) * g, w_uk[:, head_g])
    # scores: [B, S, H, T]
    content = jx.einsum("bshr,btr->bsht", q_latent, c)
    ak_h = np.transpose(ak[:, :, head_g], (0, 2, 1))[:, None]           # [B, 1, H, T]
    logits = content.astype(F) * aq[..., None] * ak_h if cs.norm != "none" else content.astype(F)
    if dr:
        rope = jx.einsum("bshd,btd->bsht", q_rope, k_rope).astype(F)
        logits = logits + (rope * aq[..., None] * ak_h if cs.norm == "unified" else rope)
    logits = logits * F(cs.scale)
    if bug == "one_sequence":
        live = np.nonzero(lens > 0)[0]
        if live.size:
            logits[live[-1]] *= F(1.015)
    # mask: [B, S, 1, T]
    if cs.has("indices"):
        idx = cs.raw("indices")
        mask = np.zeros((B, S, T), bool)
        for b in range(B):
            for i in range(S):
                mask[b, i, idx[b, i][idx[b, i] >= 0]] = True
    else:
        mask = np.broadcast_to(valid[:, None, :], (B, S, T)).copy()
        if cs.causal:
            mask &= np.arange(T)[None, None, :] <= (lens[:, None] - S + np.arange(S))[:, :, None]
    mask = mask[:, :, None, :]
    big_neg = F(-0.7 * float(np.finfo(np.float32).max))
    logits = np.where(mask, logits, big_neg)
    mx = np.max(logits, axis=-1, keepdims=True)                          # jax.nn.softmax
    ex = np.exp(logits - mx)
    den = np.sum(ex, axis=-1, keepdims=True)
    if bug == "row_denominator_bf16":
        den = den.astype(ml_dtypes.bfloat16).astype(F)
    probs = ex / den
    lse = (mx + np.log(den))[..., 0]                                     # jax.nn.logsumexp
    any_vis = mask.any(-1)                                               # [B, S, 1]
    lse = np.where(any_vis, lse, -np.inf).astype(F)
    p_d = np.where(mask, probs, 0).astype(D)                             # probs.astype(dtype)
    latent32 = np.einsum("bsht,btr->bshr", p_d.astype(F), c.astype(F))
    if cs.has("attn_sink"):
        sink = cs.raw("attn_sink").astype(F)
        latent32 = latent32 / (1.0 + np.exp(sink[None, None, :] - lse))[..., None]
    latent32 = np.where(any_vis[..., None], latent32, 0)
    if bug == "one_head":
        latent32[:, :, H // 2] *= F(1.05)
    if bug == "scale_bias":
        latent32 *= F(1.01)
    latent = latent32.astype(D)
    out = jx.einsum("bshr,rhv->bshv", latent, w_uv[:, head_g])
    return {"out": out, "latent_out": latent, "lse": lse.astype(F)}
