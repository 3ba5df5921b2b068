"""Apple MLX: mlx-lm's DeepSeek-V3 MLA attention with a QK-norm, emulated in numpy + ml_dtypes.
Module level. Absorbed decode for S_q = 1; mlx-lm's explicit branch for S_q > 1.

Public code imitated:
  - ml-explore/mlx-lm, mlx_lm/models/deepseek_v3.py DeepseekV3Attention.__call__ and
    mlx_lm/models/mla.py MultiLinear (embed_q [H, r, d_c], unembed_out [H, d_v, r], per head):
        pe_scores = (q_pe * self.scale) @ k_pe.swapaxes(-1, -2)       # in the model dtype
        pe_scores = mx.where(mask, pe_scores, mx.finfo(dtype).min)    # when a mask exists (L > 1)
        L == 1:  q = embed_q(q_nope); k = v = kv_latent               # absorbed, latent as value
        L > 1:   k = embed_q(kv_latent, transpose=False); v = unembed_out(kv_latent)   # explicit
        output = mx.fast.scaled_dot_product_attention(q, k, v, scale=self.scale, mask=pe_scores)
        L == 1:  output = unembed_out(output)
    RoPE with mx.fast.rope (traditional=True: interleaved pairs; False: half), rope'd k_pe cached.
  - The QK-norm added the way mlx-lm writes Qwen3 (self.q_norm / self.k_norm = nn.RMSNorm, i.e.
    mx.fast.rms_norm), placed as conventions §1.3 requires. L == 1 (absorbed): the query is
    normalized first (q_norm, conventions §1.2 variant q_normed_first), then k_norm's gain
    folded in (q * gamma_ck) and embed_q; the key's statistic alpha_k[t, g] is computed at
    append from the transient key embed_q(kv_latent, transpose=False) in fp32 and cached fp32;
    since SDPA takes one scale per call, alpha_k is folded into per-group keys
    K_g = (kv_latent * alpha_k_g).astype(dtype) (v = kv_latent broadcast to the G groups,
    gqa = H/G; under norm = none k = v = kv_latent, one head, exactly upstream). Unified: q_norm
    over the whole head [content; rope]; the cached rope key is the gained rotated un-normalized
    one and alpha_k_g scales it per group: (k_rope * alpha_k_g).astype(dtype).
    L > 1 (explicit): q_norm(q_nope), k_norm(embed_q(kv_latent, transpose=False)) per head.
  - ml-explore/mlx, mlx/fast.cpp scaled_dot_product_attention (+ its fallback lambda),
    mlx/backend/metal/scaled_dot_product_attention.cpp (has_fused_kernel / use_fallback /
    eval_gpu routing), mlx/backend/metal/kernels/sdpa_vector.h (sdpa_vector,
    sdpa_vector_2pass_1/_2), kernels/softmax.h, kernels/rms_norm.metal, kernels/rope.metal.
    Routing: the fused vector kernel only for L <= 8, L <= kL, L * gqa <= 32 and head dims
    (D, V) in {64, 96, 128, 256} (D == V) or (192, 128); otherwise the unfused fallback. So an
    MLA decode with r = 512 (paper presets) or r = 32 (tiny) takes the FALLBACK, and sdpa_vector
    runs for r in {64, 96, 128, 256} (e.g. --latent-rank 128) and for the S_q > 1 explicit branch
    with d_c = d_v = 128. 2-pass when gqa > 1 and kL >= 4096 (an M-series base GPU; the Max/Ultra
    rule kL >= 1024 is not modelled), 32/64 blocks. A non-NAX GPU: fp32 GEMMs are plain fp32.

Rounding points (D = model dtype bf16/fp16/fp32; every MLX op returns D unless an operand is
fp32; GEMMs accumulate in fp32 and round once; a Python float scalar becomes a D scalar):
  1. mx.fast.rms_norm: w * D(x * precise::rsqrt(sum(x^2)/n + eps)) -> D (two roundings)
  2. mx.fast.rope (table cos/sin, fp32): x1*c - x2*s, x1*s + x2*c in fp32 -> D
  3. q * gamma_ck -> D; embed_q (q_latent) -> D; transient key embed_q(c) -> D;
     alpha_k = rsqrt(mean(key.astype(f32)^2) + eps) fp32; K_g = (c * alpha_k_g) -> D
     (unified: also (k_rope * alpha_k_g) -> D)
  4. pe_scores: q_pe * D(scale) -> D; @ k_pe^T -> D; mx.where(mask, pe, finfo(D).min)
  5a. sdpa_vector (fused): q scaled in fp32 (scale * q), per-lane fp32 partial dot + simd_sum,
     score + float(mask), online softmax in fp32 with fast::exp (modelled exp2(fp32(x*log2e))),
     32 simdgroups each over keys j, j+32, ... then merged; o / sum -> D. 2-pass: unnormalized
     block partials stored in D, fp32 sums/maxs, merge, / sum -> D.
  5b. fallback: D(scale) * q -> D; q @ k^T -> D; + mask -> D (bool: where(.., finfo.min));
     softmax(precise=True): fp32, fast::exp, p = e * (1/sum) -> D; p @ v -> D.
  6. L == 1: latent_out (SDPA output) in D; out = unembed_out(latent_out) -> D.
Varlen: one call per sequence (batch 1, a KVCache of T_b tokens, offset T_b - S_q); T_b = 0:
no call, out = 0. Delivered: out (D), and latent_out (D) for S_q = 1 only (the explicit branch
never forms it). No lse: mx.fast.scaled_dot_product_attention returns none (its logsumexp
output exists only for the fused VJP while training).
Profiles: bf16, fp16, fp32 (not fp64: Metal has no fp64; not fp8). Top-k and sinks: the
DeepSeek-V3 model passes neither (FEATURES empty).
"""
import numpy as np

from common import load

LEVELS = ("module",)
PROFILES = ("bf16", "fp16", "fp32")
FEATURES = ()
F32 = np.float32
LOG2E = F32(1.4426950408889634)

BUGS = {
    "alpha_k_from_latent": "alpha_k = rsqrt(mean(kv_latent^2) + eps): the latent's RMS, not the key's",
    "no_gamma_k": "k_norm's gain never folded into the query (absorbed) / not applied (explicit)",
    "scale_dc_only": "self.scale = qk_nope_head_dim ** -0.5",
    "rope_pairs_swapped": "mx.fast.rope's traditional flag inverted (upstream hardcodes True)",
    "no_rescale": "sdpa_vector online softmax: o not multiplied by the factor on a new max",
    "one_sequence": "last sequence's queries rotated at the cache offset read after "
                    "update_and_fetch (T_b + i instead of T_b - S_q + i)",
    "eps_outside_sqrt": "hand-written alpha_k statistic 1 / (sqrt(mean) + eps)",
}


def _fused_ok(Dq, Dv, L, kL, gqa):
    """has_fused_kernel() and not use_fallback() for the vector kernel (L <= 8)."""
    if L > 8 or L > kL or L * gqa > 32:
        return False
    ok = (Dq == Dv and Dq in (64, 96, 128, 192, 256)) or (Dq, Dv) == (192, 128)
    return ok and not (Dq == Dv == 192)


def _uses_fused(cfg):
    """Whether any sequence of the case runs the fused sdpa_vector kernel."""
    H, G, r, dc, dv, S = (int(cfg[k]) for k in ("heads", "groups", "latent_rank", "d_c", "d_v", "s_q"))
    norm = cfg.get("norm", "blockwise")
    for T in (int(x) for x in cfg["seqlens"]):
        if T == 0:
            continue
        if S == 1:
            gqa = H if norm == "none" else H // G
            if _fused_ok(r, r, 1, T, gqa):
                return True
        elif _fused_ok(dc, dv, S, T, 1):
            return True
    return False


def bug_applies(cfg, bug):
    if cfg.get("level", "module") != "module" or cfg.get("profile") not in PROFILES:
        return False
    if cfg.get("topk") or cfg.get("attn_sink"):
        return False
    norm, dr, S = cfg.get("norm", "blockwise"), int(cfg["d_r"]), int(cfg["s_q"])
    sl = [int(x) for x in cfg["seqlens"]]
    if bug in ("alpha_k_from_latent", "eps_outside_sqrt"):
        return norm != "none" and S == 1
    if bug == "no_gamma_k":
        return norm != "none"
    if bug == "scale_dc_only":
        return dr > 0 or abs(float(cfg["softmax_scale"]) * np.sqrt(int(cfg["d_c"])) - 1) > 1e-12
    if bug == "rope_pairs_swapped":
        return dr > 0
    if bug == "no_rescale":
        return _uses_fused(cfg) and max(sl + [0]) > 32
    if bug == "one_sequence":
        return dr > 0 and bool(sl) and sl[-1] > 0
    return bug in BUGS


class _Mx:
    """MLX op semantics for arrays of the model dtype D (Metal computes in fp32 and rounds)."""

    def __init__(self, D, eps, bug):
        self.D, self.eps, self.bug = D, F32(eps), bug

    def t(self, x):
        return np.asarray(x, F32).astype(self.D)

    def f(self, x):
        return np.asarray(x).astype(F32)

    def scalar(self, v):               # a Python float meeting a D array: array(float(v), D)
        return F32(v).astype(self.D)

    def mul(self, a, b):
        return self.t(self.f(a) * self.f(b))

    def add(self, a, b):
        return self.t(self.f(a) + self.f(b))

    def matmul(self, a, b):
        return self.t(np.matmul(self.f(a), self.f(b)))

    def rms_norm(self, x, w):
        """mx.fast.rms_norm (rms_single_row): w * T(x * precise::rsqrt(acc / n + eps))."""
        h = self.f(x)
        acc = np.sum(h * h, axis=-1, keepdims=True, dtype=F32)
        inv = (1.0 / np.sqrt(acc.astype(np.float64) / h.shape[-1] + float(self.eps))).astype(F32)
        return self.mul(w, self.t(h * inv))

    def rope(self, x, cos, sin, traditional):
        """mx.fast.rope kernel with the case's fp32 cos/sin: fp32 rotation, one rounding."""
        h = self.f(x)
        if traditional:
            x1, x2 = h[..., 0::2], h[..., 1::2]
        else:
            x1, x2 = np.split(h, 2, axis=-1)
        r1 = x1 * cos - x2 * sin
        r2 = x1 * sin + x2 * cos
        if traditional:
            return self.t(np.stack([r1, r2], -1).reshape(h.shape))
        return self.t(np.concatenate([r1, r2], -1))

    def rsqrt_stat(self, ssq, n):      # alpha_k as an MLX user writes it, fp32
        ms = (ssq / F32(n)).astype(F32)
        if self.bug == "eps_outside_sqrt":
            return (F32(1) / (np.sqrt(ms) + self.eps)).astype(F32)
        return (1.0 / np.sqrt(ms.astype(np.float64) + float(self.eps))).astype(F32)


def _fexp(x):
    """Metal fast::exp, modelled as exp2 of the fp32 product x * log2(e)."""
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        return np.exp2((np.asarray(x, F32) * LOG2E).astype(F32)).astype(F32)


def _simd_sum(x, axis=-1):
    """simd_sum over 32 lanes (butterfly: lane i + lane i^16, ^8, ... ^1), fp32."""
    x = np.moveaxis(np.asarray(x, F32), axis, -1)
    n = x.shape[-1]
    while n > 1:
        n //= 2
        x = (x[..., :n] + x[..., n:2 * n]).astype(F32)
    return x[..., 0]


def _dot_lanes(q, k):
    """score = simd_sum over lanes of a lane's sequential fp32 sum over its D/32 elements.
    q [..., D], k [..., D] (broadcastable), fp32."""
    prod = (q * k).astype(F32)
    D = prod.shape[-1]
    per = D // 32
    prod = prod.reshape(prod.shape[:-1] + (32, per))
    acc = np.zeros(prod.shape[:-1], F32)
    for j in range(per):
        acc = (acc + prod[..., j]).astype(F32)
    return _simd_sum(acc)


def _lanes_online(q, k, v, scale, fmask, bmask, D, bug, width):
    """The kernels' shared loop: `width` lanes (simdgroups or blocks), lane j taking keys j,
    j + width, ..., each with its own running max m, sum s and fp32 accumulator o. q [Hq,L,Dq],
    k [Hk,T,Dq], v [Hk,T,V] in D; returns m, s [Hq,L,width] and o [Hq,L,width,V]."""
    Hq, L, _ = q.shape
    Hk, T, V = v.shape
    kv = np.arange(Hq) // (Hq // Hk)
    qs = (F32(scale) * q.astype(F32)).astype(F32)                     # q[i] = scale * queries[i]
    kf, vf = k.astype(F32), v.astype(F32)
    m = np.full((Hq, L, width), np.finfo(F32).min, F32)                # Limits<U>::finite_min
    s = np.zeros((Hq, L, width), F32)
    o = np.zeros((Hq, L, width, V), F32)
    for it in range(0, T, width):
        idx = np.arange(it, min(it + width, T))                        # key of lane j = it + j
        nj = len(idx)
        sc = _dot_lanes(qs[:, :, None, :], kf[kv][:, None, idx, :])    # [Hq,L,nj]
        use = np.ones((Hq, L, nj), bool)
        if bmask is not None:
            use &= bmask[None, :, idx]
        if fmask is not None:
            fm = fmask[:, :, idx]
            use &= fm.astype(F32) >= F32(np.finfo(D).min)
            sc = (sc + fm.astype(F32)).astype(F32)
        mo = m[:, :, :nj]
        new_m = np.maximum(mo, sc)
        fac = _fexp(mo - new_m)
        e = _fexp(sc - new_m)
        s_new = (s[:, :, :nj] * fac + e).astype(F32)
        if bug == "no_rescale":
            o_new = (o[:, :, :nj] + e[..., None] * vf[kv][:, None, idx, :]).astype(F32)
        else:
            o_new = (o[:, :, :nj] * fac[..., None] + e[..., None] * vf[kv][:, None, idx, :]).astype(F32)
        m[:, :, :nj] = np.where(use, new_m, mo)
        s[:, :, :nj] = np.where(use, s_new, s[:, :, :nj])
        o[:, :, :nj] = np.where(use[..., None], o_new, o[:, :, :nj])
    return m, s, o


def _sdpa_vector(q, k, v, scale, fmask, bmask, D, bug):
    """1-pass sdpa_vector. q [Hq,L,Dq] D, k [Hk,T,Dq] D, v [Hk,T,V] D, fmask [Hq,L,T] D or None,
    bmask [L,T] bool or None. Returns [Hq,L,V] D."""
    m, s, o = _lanes_online(q, k, v, scale, fmask, bmask, D, bug, 32)    # 32 simdgroups
    M = m.max(-1, keepdims=True)                                       # simd_max
    fac = _fexp(m - M)
    tot = _simd_sum(s * fac)                                           # [Hq,L]
    acc = _simd_sum(o * fac[..., None], axis=2)                        # [Hq,L,V]
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(tot[..., None] == 0, acc, acc / tot[..., None]).astype(F32)
    return out.astype(D)


def _sdpa_vector_2pass(q, k, v, scale, fmask, bmask, D, bug):
    """sdpa_vector_2pass_1 + _2 (a base M-series GPU: 32 or 64 blocks)."""
    Hq, L, _ = q.shape
    Hk, T, V = v.shape
    gqa = Hq // Hk
    blocks = 64 if gqa * L >= 4 else 32
    m, s, o = _lanes_online(q, k, v, scale, fmask, bmask, D, bug, blocks)
    part = o.astype(D).astype(F32)                                     # out[i] = T(o[i]) unnormalized
    # pass 2: lanes hold blocks lane + 32 b; simdgroups walk blocks gid + 32 b
    nb = blocks // 32
    mb = m.reshape(Hq, L, nb, 32)
    M = mb.max(axis=(2, 3), keepdims=True)
    fac = _fexp(mb - M)
    lane = np.zeros((Hq, L, 32), F32)
    for b in range(nb):
        lane = (lane + fac[:, :, b] * s.reshape(Hq, L, nb, 32)[:, :, b]).astype(F32)
    tot = _simd_sum(lane)
    pb = part.reshape(Hq, L, nb, 32, V)
    grp = np.zeros((Hq, L, 32, V), F32)
    for b in range(nb):
        grp = (grp + fac[:, :, b, :, None] * pb[:, :, b]).astype(F32)
    acc = _simd_sum(grp, axis=2)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(tot[..., None] == 0, acc, acc / tot[..., None]).astype(F32)
    return out.astype(D)


def _sdpa_fallback(mx, q, k, v, scale, fmask, bmask):
    """The unfused lambda of mlx/fast.cpp: all ops in D, softmax(precise=True)."""
    Hq, L, _ = q.shape
    Hk = k.shape[0]
    kv = np.arange(Hq) // (Hq // Hk)
    qs = mx.mul(mx.scalar(scale), q)                                  # array(scale, D) * q
    sc = mx.matmul(qs, np.swapaxes(k[kv], -1, -2))                    # [Hq,L,T] D
    if bmask is not None:
        sc = np.where(bmask[None], sc, np.finfo(mx.D).min).astype(mx.D)
    if fmask is not None:
        with np.errstate(over="ignore"):
            sc = mx.add(sc, fmask)
    x = mx.f(sc)
    with np.errstate(invalid="ignore"):
        mxv = x.max(-1, keepdims=True)
        e = _fexp(x - mxv)
        nrm = (F32(1) / e.sum(-1, keepdims=True, dtype=F32)).astype(F32)
    p = mx.t(e * nrm)                                                  # T(ld[i] * normalizer)
    return mx.matmul(p, v[kv])


def _sdpa(mx, q, k, v, scale, fmask=None, bmask=None, bug=None):
    Hq, L, Dq = q.shape
    Hk, T, V = v.shape
    gqa = Hq // Hk
    if _fused_ok(Dq, V, L, T, gqa):
        if gqa > 1 and T >= 4096:
            return _sdpa_vector_2pass(q, k, v, scale, fmask, bmask, mx.D, bug)
        return _sdpa_vector(q, k, v, scale, fmask, bmask, mx.D, bug)
    return _sdpa_fallback(mx, q, k, v, scale, fmask, bmask)


def run(case, bug=None):
    cs = load(case)
    if cs.profile not in PROFILES or cs.level not in LEVELS:
        raise ValueError(f"mlx_sdpa runs profiles {PROFILES} at module level, not {cs.profile}/{cs.level}")
    D = cs.stored
    mx = _Mx(D, cs.eps, bug)
    B, S, H, G, r, dc, dr, dv = cs.B, cs.S, cs.H, cs.G, cs.r, cs.dc, cs.dr, cs.dv
    hpg = H // G
    gmap = np.arange(H) // hpg
    scale = (dc ** -0.5) if bug == "scale_dc_only" else cs.scale
    trad = cs.rope_style == "interleaved"
    if bug == "rope_pairs_swapped":
        trad = not trad
    # weights as sanitize() lays them out: embed_q [H, r, d_c], unembed_out [H, d_v, r]
    wk_g = cs.raw("w_uk").astype(D).reshape(r, G, dc).transpose(1, 0, 2)      # [G, r, dc]
    wv_g = cs.raw("w_uv").astype(D).reshape(r, G, dv).transpose(1, 0, 2)      # [G, r, dv]
    embed_q = wk_g[gmap]                                                      # [H, r, dc]
    unembed_t = wv_g[gmap]                                                    # [H, r, dv] (= weight^T)

    def gain(name):
        g = cs.raw(name).astype(D)
        if bug == "no_gamma_k" and name in ("gamma_ck", "gamma_k"):
            g = np.ones_like(g)
        return g

    out = np.zeros((B, S, H, dv), D)
    lat_all = np.zeros((B, S, H, r), D) if S == 1 else None
    if dr:
        tab_c, tab_s = cs.raw("rope_cos").astype(F32), cs.raw("rope_sin").astype(F32)
    for b in range(B):
        T = cs.seqlens[b]
        if T == 0:
            continue
        c = cs.raw("kv_c")[b, :T].astype(D)                                   # kv_latent [T, r]
        q_nope = cs.raw("q_nope")[b].astype(D).transpose(1, 0, 2)             # [H, S, dc]
        offset = T - S
        qpos = offset + np.arange(S)
        if bug == "one_sequence" and b == B - 1:
            qpos = qpos + S                                                   # offset after update
        if dr:
            q_pe = cs.raw("q_pe")[b].astype(D).transpose(1, 0, 2)             # [H, S, dr]
            k_pe = cs.raw("k_pe")[b, :T].astype(D)                            # [T, dr]
            qrope = lambda x: mx.rope(x, tab_c[qpos], tab_s[qpos], trad)      # noqa: E731
            krope = lambda x: mx.rope(x, tab_c[:T], tab_s[:T], trad)          # noqa: E731
        # mask: create_causal_mask(N=S, offset) for L > 1 (return_array=True); None for L == 1
        bmask = None
        if S > 1:
            mpos = offset + np.arange(S)
            bmask = (np.arange(T)[None, :] <= mpos[:, None]) if cs.causal else np.ones((S, T), bool)
        if S == 1:
            # ------------------------------------------------ absorbed decode (L == 1)
            k0 = mx.matmul(c[None], wk_g)                                     # [G, T, dc] transient
            alpha_k = None
            if cs.norm == "none":
                q_abs = q_nope
                if dr:
                    q_rope, k_rope = qrope(q_pe), krope(k_pe)[None]           # k_rope [1, T, dr]
            elif cs.norm == "blockwise":
                q_abs = mx.mul(mx.rms_norm(q_nope, gain("gamma_cq")), gain("gamma_ck"))
                ssq = np.sum(mx.f(k0) ** 2, -1, dtype=F32)
                alpha_k = mx.rsqrt_stat(ssq, dc)                              # [G, T] fp32
                if bug == "alpha_k_from_latent":
                    alpha_k = np.broadcast_to(mx.rsqrt_stat(np.sum(mx.f(c) ** 2, -1, dtype=F32), r), (G, T))
                if dr:
                    grq, grk = gain("gamma_rq"), gain("gamma_rk")
                    if cs.rope_order == "norm_then_rope":
                        q_rope = qrope(mx.rms_norm(q_pe, grq))
                        k_rope = krope(mx.rms_norm(k_pe, grk))[None]
                    else:
                        q_rope = mx.rms_norm(qrope(q_pe), grq)
                        k_rope = mx.rms_norm(krope(k_pe), grk)[None]
            else:                                                             # unified
                gq, gk = gain("gamma_q"), gain("gamma_k")
                ssq = np.sum(mx.f(k0) ** 2, -1, dtype=F32)
                if not dr:
                    qn = mx.rms_norm(q_nope, gq)
                elif cs.rope_order == "norm_then_rope":
                    qn = mx.rms_norm(np.concatenate([q_nope, q_pe], -1), gq)
                    q_rope = qrope(qn[..., dc:])
                    ssq = (ssq + np.sum(mx.f(k_pe) ** 2, -1, dtype=F32)).astype(F32)
                    k_rope = krope(mx.mul(k_pe, gk[dc:]))
                else:
                    qn = mx.rms_norm(np.concatenate([q_nope, qrope(q_pe)], -1), gq)
                    q_rope = qn[..., dc:]
                    kr = krope(k_pe)
                    ssq = (ssq + np.sum(mx.f(kr) ** 2, -1, dtype=F32)).astype(F32)
                    k_rope = mx.mul(kr, gk[dc:])
                q_abs = mx.mul(qn[..., :dc], gk[:dc])
                alpha_k = mx.rsqrt_stat(ssq, dc + dr)
                if bug == "alpha_k_from_latent":
                    alpha_k = np.broadcast_to(mx.rsqrt_stat(np.sum(mx.f(c) ** 2, -1, dtype=F32), r), (G, T))
                if dr:
                    k_rope = mx.t(mx.f(k_rope)[None] * alpha_k[..., None])    # [G, T, dr]
            q_lat = mx.matmul(q_abs, np.swapaxes(embed_q, -1, -2))            # [H, 1, r]
            if alpha_k is None:
                K = V_ = c[None]                                              # one head, gqa = H
            else:
                K = mx.t(mx.f(c)[None] * alpha_k[..., None])                  # [G, T, r]
                V_ = np.broadcast_to(c[None], (G, T, r))
            fmask = None
            if dr:
                qs = mx.mul(q_rope, mx.scalar(scale))                         # q_pe * self.scale
                kr_h = k_rope[gmap] if k_rope.shape[0] == G else k_rope[np.zeros(H, int)]
                fmask = mx.matmul(qs, np.swapaxes(kr_h, -1, -2))              # pe_scores [H, 1, T]
            latent = _sdpa(mx, q_lat, K, V_, scale, fmask=fmask, bug=bug)      # [H, 1, r] D
            o = mx.matmul(latent, unembed_t)                                  # [H, 1, dv]
            lat_all[b] = latent.transpose(1, 0, 2)
            out[b] = o.transpose(1, 0, 2)
        else:
            # ------------------------------------------------ explicit branch (L > 1)
            k_h = mx.matmul(c[None], embed_q)                                 # [H, T, dc]
            v_h = mx.matmul(c[None], unembed_t)                               # [H, T, dv]
            if cs.norm == "none":
                q_c, k_c = q_nope, k_h
                if dr:
                    q_rope, k_rope = qrope(q_pe), krope(k_pe)[None][np.zeros(H, int)]
            elif cs.norm == "blockwise":
                q_c = mx.rms_norm(q_nope, gain("gamma_cq"))
                k_c = mx.rms_norm(k_h, gain("gamma_ck"))
                if dr:
                    grq, grk = gain("gamma_rq"), gain("gamma_rk")
                    if cs.rope_order == "norm_then_rope":
                        q_rope, k_rope = qrope(mx.rms_norm(q_pe, grq)), krope(mx.rms_norm(k_pe, grk))
                    else:
                        q_rope, k_rope = mx.rms_norm(qrope(q_pe), grq), mx.rms_norm(krope(k_pe), grk)
                    k_rope = k_rope[None][np.zeros(H, int)]
            else:
                gq, gk = gain("gamma_q"), gain("gamma_k")
                if not dr:
                    q_c, k_c = mx.rms_norm(q_nope, gq), mx.rms_norm(k_h, gk)
                elif cs.rope_order == "norm_then_rope":
                    kpe_h = np.broadcast_to(k_pe[None], (H, T, dr))
                    qn = mx.rms_norm(np.concatenate([q_nope, q_pe], -1), gq)
                    kn = mx.rms_norm(np.concatenate([k_h, kpe_h], -1), gk)
                    q_c, q_rope = qn[..., :dc], qrope(qn[..., dc:])
                    k_c, k_rope = kn[..., :dc], krope(kn[..., dc:])
                else:
                    kpe_h = np.broadcast_to(krope(k_pe)[None], (H, T, dr))
                    qn = mx.rms_norm(np.concatenate([q_nope, qrope(q_pe)], -1), gq)
                    kn = mx.rms_norm(np.concatenate([k_h, kpe_h], -1), gk)
                    q_c, q_rope, k_c, k_rope = qn[..., :dc], qn[..., dc:], kn[..., :dc], kn[..., dc:]
            fmask = None
            if dr:
                qs = mx.mul(q_rope, mx.scalar(scale))
                pe = mx.matmul(qs, np.swapaxes(k_rope, -1, -2))               # [H, S, T]
                fmask = np.where(bmask[None], pe, np.finfo(D).min).astype(D)  # mx.where(mask, ...)
                bm = None
            else:
                bm = bmask
            o = _sdpa(mx, q_c, k_c, v_h, scale, fmask=fmask, bmask=bm, bug=bug)   # [H, S, dv]
            out[b] = o.transpose(1, 0, 2)
    res = {"out": out}
    if lat_all is not None:
        res["latent_out"] = lat_all
    return res
