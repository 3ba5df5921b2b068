"""Hugging Face transformers, DeepseekV3Attention with attn_implementation="eager" (explicit MLA),
plus a Qwen3-style QK-norm, emulated in numpy + ml_dtypes. Module level, explicit form.

Public code imitated (huggingface/transformers: the deepseek_v3 model's modeling file and the
masking utilities; the norm from the qwen3 model's modeling file):
  - DeepseekV3Attention.forward: `kv_b_proj(kv_latent)` -> split into k_pass (per group d_c)
    and value_states (per group d_v); `k_rot` shared by all groups and `.expand`ed; `query_states
    = cat(q_pass, q_rot)`, `key_states = cat(k_pass, k_rot)`.
  - apply_rotary_pos_emb / apply_rotary_pos_emb_interleave (config.rope_interleave): the
    interleaved pairs are de-interleaved (`view(.., d/2, 2).transpose(4, 3)`), then
    `q * cos + rotate_half(q) * sin` with `cos, sin = DeepseekV3RotaryEmbedding(...)`, which
    returns `cos.to(x.dtype), sin.to(x.dtype)`; the angles come from the case's rope_cos /
    rope_sin tables (conventions §1.3), `cos = cat(tab, tab)` as HF's `emb = cat(freqs, freqs)`.
  - Qwen3RMSNorm / DeepseekV3RMSNorm as q_norm / k_norm modules: `h = x.to(float32)`,
    `variance = h.pow(2).mean(-1)`, `h * torch.rsqrt(variance + eps)`, `weight * h.to(dtype)`.
    Placed after the up-projection as conventions §1.1/§1.3 require: blockwise four norms
    (q_norm, k_norm on the content heads, q_rope_norm, k_rope_norm on the rope parts), unified
    one norm over the whole head [content; rope] (the keys per group, since k_pass is per group);
    norm_then_rope (Qwen3's order) or rope_then_norm. Under the de-interleaved layout of
    apply_rotary_pos_emb_interleave the post-rope gain is stored permuted the same way (what a
    checkpoint converter for rope_interleave does), so the math is the conventions' gain.
  - repeat_kv (expand + reshape: head h reads group h // (H/G)) and eager_attention_forward:
    `torch.matmul(query, key.transpose(2, 3)) * scaling`, `+ causal_mask`,
    `softmax(dim=-1, dtype=torch.float32).to(query.dtype)`, `torch.matmul(attn_weights, value)`.
  - masking_utils.eager_mask: additive float mask in the model dtype, 0 where visible and
    `torch.finfo(dtype).min` elsewhere (padding and causality), over a right-padded batch.

Rounding points (D = the model dtype: bf16, fp16 or fp32; every torch op returns D, elementwise
ops compute in fp32 and round once, GEMMs accumulate in fp32 and round the output once):
  1. kv_b_proj: k_nope = c . W_UK_g and v = c . W_UV_g  -> D
  2. RMSNorm: x.to(f32) * rsqrt(mean(x^2) + eps) -> D; weight * that -> D
  3. RoPE tables: cos, sin (fp32 table values) .to(D)
  4. RoPE: q * cos -> D; rotate_half(q) * sin -> D; their sum -> D (likewise for k)
  5. scores: matmul(q, k^T) -> D; * scaling (fp32 scalar) -> D; + mask -> D
  6. softmax in fp32 (max, exp, sum, exp / sum); probabilities .to(D)
  7. out = matmul(P, v) -> D (delivered before o_proj)
Varlen: one right-padded batch; padded cache slots hold zeros (a real batch's pad slots hold
finite keys; the case's NaN rows never enter). A sequence with T_b = 0 has every slot masked, its
rows get uniform weights over zero values: out = 0 exactly. Its queries are rotated at position 0.
Delivered: out only, in D. HF eager returns no lse (attn_weights are the rounded probabilities),
and none is derived: its logits are already rounded twice to D, so an lse "from the fp32 logits"
would be an invention, not this code's output.
Profiles: bf16, fp16, fp32 (model in that dtype). Not fp64: DeepseekV3RMSNorm and eager softmax
force fp32 (`.to(torch.float32)`, `dtype=torch.float32`), so an fp64 model is not fp64 math;
not fp8. Top-k and sinks: DeepseekV3Attention has neither (FEATURES empty).
"""
import numpy as np

from common import load

LEVELS = ("module",)
PROFILES = ("bf16", "fp16", "fp32")
FEATURES = ()
AUDIT_ARGS = ("--form", "explicit")
F32 = np.float32

BUGS = {
    "one_sequence": "the last sequence's queries rotated at the padded batch's positions "
                    "(T_max - S_q + i, a cache_position shared by a right-padded batch)",
    "group_map_mod": "repeat_kv by .repeat(1, n_rep, 1, 1) (tiling: head h reads group h % G)",
    "eps_outside_sqrt": "hand-written RMSNorm: h / (sqrt(variance) + eps)",
    "rope_order_swapped": "norm and rope applied in the other order than the config's",
    "scale_dc_only": "scaling = qk_nope_head_dim ** -0.5 (the rope dims left out)",
    "no_gamma_k": "k_norm weights not loaded (checkpoint key mismatch): key gains left at ones",
}


def bug_applies(cfg, bug):
    if cfg.get("level", "module") != "module" or cfg.get("profile") not in PROFILES:
        return False
    if cfg.get("topk") or cfg.get("attn_sink"):
        return False
    norm, dr = cfg.get("norm", "blockwise"), int(cfg["d_r"])
    H, G = int(cfg["heads"]), int(cfg["groups"])
    sl = [int(x) for x in cfg["seqlens"]]
    if bug == "one_sequence":
        return dr > 0 and bool(sl) and sl[-1] > 0
    if bug == "group_map_mod":
        return G > 1 and H // G > 1
    if bug in ("eps_outside_sqrt", "no_gamma_k"):
        return norm != "none"
    if bug == "rope_order_swapped":
        return norm != "none" and dr > 0
    if bug == "scale_dc_only":
        return dr > 0 or abs(float(cfg["softmax_scale"]) * np.sqrt(int(cfg["d_c"])) - 1) > 1e-12
    return bug in BUGS


class _Torch:
    """torch semantics for tensors of dtype D (opmath fp32)."""

    def __init__(self, D, eps, bug):
        self.D, self.eps, self.bug = D, F32(eps), bug

    def t(self, x):                    # a D tensor from an fp32 value: one rounding
        return np.asarray(x, F32).astype(self.D)

    def f(self, x):                    # .to(torch.float32) / opmath read: exact
        return np.asarray(x).astype(F32)

    def mul(self, a, b):
        return self.t(self.f(a) * self.f(b))

    def add(self, a, b):
        return self.t(self.f(a) + self.f(b))

    def matmul(self, a, b):            # fp32 accumulate, output rounded to D
        return self.t(np.matmul(self.f(a), self.f(b)))

    def rmsnorm(self, x, w):
        """Qwen3RMSNorm: weight * (x.float() * rsqrt(mean(x^2) + eps)).to(dtype)."""
        h = self.f(x)
        var = np.mean(h * h, axis=-1, keepdims=True, dtype=F32)
        if self.bug == "eps_outside_sqrt":
            h = h / (np.sqrt(var) + self.eps)
        else:
            h = h * (F32(1) / np.sqrt(var + self.eps))
        return self.mul(w, self.t(h))

    def rope(self, x, cos, sin, interleaved):
        """apply_rotary_pos_emb(_interleave): x * cos + rotate_half(x) * sin, all in D.
        cos/sin: [..., d_r] D tensors (cat(tab, tab).to(D)). The result is in HF's layout:
        de-interleaved when interleaved (pair j at (j, j + d_r/2))."""
        d2 = x.shape[-1] // 2
        if interleaved:
            x = np.concatenate([x[..., 0::2], x[..., 1::2]], -1)
        rot = np.concatenate([-x[..., d2:], x[..., :d2]], -1)      # rotate_half (negation exact)
        return self.add(self.mul(x, cos), self.mul(rot, sin))


def _perm(g, interleaved):
    """A gain applied after rope_interleave's de-interleave: stored in the same layout."""
    return np.concatenate([g[0::2], g[1::2]]) if interleaved else g


def run(case, bug=None):
    cs = load(case)
    if cs.profile not in PROFILES or cs.level not in LEVELS:
        raise ValueError(f"hf_eager_explicit runs profiles {PROFILES} at module level, "
                         f"not {cs.profile}/{cs.level}")
    D = cs.stored
    tt = _Torch(D, cs.eps, bug)
    B, S, H, G, r, dc, dr, dv = cs.B, cs.S, cs.H, cs.G, cs.r, cs.dc, cs.dr, cs.dv
    T_max = cs.raw("kv_c").shape[1]
    seq = np.array(cs.seqlens)
    valid = np.arange(T_max)[None, :] < seq[:, None]                     # [B,T] padding mask
    order = cs.rope_order
    if bug == "rope_order_swapped":
        order = "rope_then_norm" if order == "norm_then_rope" else "norm_then_rope"
    il = cs.rope_style == "interleaved"                                   # config.rope_interleave

    # ---- the cache of a right-padded batch: pad slots hold finite (zero) latents
    c = np.where(valid[..., None], cs.raw("kv_c").astype(F32), 0).astype(D)   # [B,T,r]
    # ---- kv_b_proj (one nn.Linear in D): k_pass [B,G,T,dc], value_states [B,G,T,dv]
    w_uk = cs.raw("w_uk").astype(D)
    w_uv = cs.raw("w_uv").astype(D)
    k_pass = tt.matmul(c, w_uk).reshape(B, T_max, G, dc).transpose(0, 2, 1, 3)
    value = tt.matmul(c, w_uv).reshape(B, T_max, G, dv).transpose(0, 2, 1, 3)
    q_pass = cs.raw("q_nope").astype(D).transpose(0, 2, 1, 3)            # [B,H,S,dc]

    # ---- rotary embedding: cos/sin of each position, .to(D)
    if dr:
        qpos = np.maximum(seq[:, None] - S + np.arange(S)[None, :], 0)   # [B,S]
        if bug == "one_sequence":
            qpos[-1] = T_max - S + np.arange(S)
        tab_c, tab_s = cs.raw("rope_cos").astype(F32), cs.raw("rope_sin").astype(F32)
        cos_full = tt.t(np.concatenate([tab_c, tab_c], -1))              # emb = cat(freqs, freqs)
        sin_full = tt.t(np.concatenate([tab_s, tab_s], -1))
        q_cos, q_sin = cos_full[qpos][:, None], sin_full[qpos][:, None]  # [B,1,S,dr]
        k_cos, k_sin = cos_full[:T_max][None, None], sin_full[:T_max][None, None]
        q_rot = cs.raw("q_pe").astype(D).transpose(0, 2, 1, 3)          # [B,H,S,dr]
        k_rot = np.where(valid[..., None], cs.raw("k_pe").astype(F32), 0).astype(D)[:, None]  # [B,1,T,dr]
        rope = lambda x, cc, ss: tt.rope(x, cc, ss, il)                 # noqa: E731

    def gain(name):
        g = cs.raw(name).astype(D)
        if bug == "no_gamma_k" and name in ("gamma_ck", "gamma_rk", "gamma_k"):
            g = np.ones_like(g)
        return g

    # ---- QK-norm (q_norm / k_norm modules), then query_states / key_states
    if cs.norm == "none":
        q_c, k_c = q_pass, k_pass
        if dr:
            q_r = rope(q_rot, q_cos, q_sin)
            k_r = np.broadcast_to(rope(k_rot, k_cos, k_sin), (B, G, T_max, dr))   # k_rot.expand
    elif cs.norm == "blockwise":
        q_c = tt.rmsnorm(q_pass, gain("gamma_cq"))
        k_c = tt.rmsnorm(k_pass, gain("gamma_ck"))
        if dr:
            grq, grk = gain("gamma_rq"), gain("gamma_rk")
            if order == "norm_then_rope":
                q_r = rope(tt.rmsnorm(q_rot, grq), q_cos, q_sin)
                k_r = rope(tt.rmsnorm(k_rot, grk), k_cos, k_sin)
            else:
                q_r = tt.rmsnorm(rope(q_rot, q_cos, q_sin), _perm(grq, il))
                k_r = tt.rmsnorm(rope(k_rot, k_cos, k_sin), _perm(grk, il))
            k_r = np.broadcast_to(k_r, (B, G, T_max, dr))
    else:                                                                 # unified: whole head
        gq, gk = gain("gamma_q"), gain("gamma_k")
        if not dr:
            q_c, k_c = tt.rmsnorm(q_pass, gq), tt.rmsnorm(k_pass, gk)
        elif order == "norm_then_rope":
            kr_g = np.broadcast_to(k_rot, (B, G, T_max, dr))
            qn = tt.rmsnorm(np.concatenate([q_pass, q_rot], -1), gq)
            kn = tt.rmsnorm(np.concatenate([k_pass, kr_g], -1), gk)
            q_c, q_r = qn[..., :dc], rope(qn[..., dc:], q_cos, q_sin)
            k_c, k_r = kn[..., :dc], rope(kn[..., dc:], k_cos, k_sin)
        else:
            gq = np.concatenate([gq[:dc], _perm(gq[dc:], il)])
            gk = np.concatenate([gk[:dc], _perm(gk[dc:], il)])
            kr_g = np.broadcast_to(rope(k_rot, k_cos, k_sin), (B, G, T_max, dr))
            qn = tt.rmsnorm(np.concatenate([q_pass, rope(q_rot, q_cos, q_sin)], -1), gq)
            kn = tt.rmsnorm(np.concatenate([k_pass, kr_g], -1), gk)
            q_c, q_r, k_c, k_r = qn[..., :dc], qn[..., dc:], kn[..., :dc], kn[..., dc:]
    query = np.concatenate([q_c, q_r], -1) if dr else q_c                # [B,H,S,d]
    key = np.concatenate([k_c, k_r], -1) if dr else k_c                  # [B,G,T,d]

    # ---- eager_attention_forward
    if bug == "group_map_mod":
        hmap = np.arange(H) % G                                           # tiled, not interleaved
    else:
        hmap = np.arange(H) // (H // G)                                   # repeat_kv
    key_states, value_states = key[:, hmap], value[:, hmap]              # [B,H,T,*]
    scaling = F32((dc ** -0.5) if bug == "scale_dc_only" else cs.scale)
    attn = tt.matmul(query, key_states.transpose(0, 1, 3, 2))             # [B,H,S,T] D
    attn = tt.t(tt.f(attn) * scaling)
    qpos_m = seq[:, None] - S + np.arange(S)[None, :]                     # mask positions
    vis = np.broadcast_to(valid[:, None, :], (B, S, T_max))
    if cs.causal:
        vis = vis & (np.arange(T_max)[None, None, :] <= qpos_m[:, :, None])
    mask = np.where(vis, 0.0, float(np.finfo(D).min)).astype(D)[:, None]  # [B,1,S,T]
    with np.errstate(over="ignore"):                                     # fp16: min + s may be -inf
        attn = tt.add(attn, mask)
    a = tt.f(attn)
    with np.errstate(over="ignore"):
        m = a.max(-1, keepdims=True)
        e = np.exp(a - m)
        p = tt.t(e / e.sum(-1, keepdims=True, dtype=F32))                # softmax(fp32).to(D)
    o = tt.matmul(p, value_states)                                        # [B,H,S,dv] D
    return {"out": np.ascontiguousarray(o.transpose(0, 2, 1, 3))}
