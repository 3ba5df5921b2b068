"""PyTorch on CPU: an absorbed-MLA module in the stored dtype D whose attention is ATen's CPU
flash-attention kernel, emulated in numpy + ml_dtypes. Modelled on pytorch/pytorch (read, not copied):
- aten/src/ATen/native/cpu/FlashAttentionKernel.cpp `cpu_flash_attention` (dispatch in
  `flash_attention_kernel_impl`: qSplitSize 32/64/256 by query length, kvSplitSize 512). Per kv block:
  fp32 GEMM q.k^T (`cpublas::gemm`, accum_t = fp32 for bf16/fp16), the scale on that fp32 result
  (`_mul_reduce_max_fusion_kernel`; with a mask `_scale_attn_mask_fusion_kernel`: qk*scale + mask),
  row max, `_exp_reduce_sum_fusion_kernel` (exp(qk - max) by `Vectorized<float>::exp_u20` on the
  16-lane part, std::exp on the tail; fp32 exps summed lane-wise, `vec_reduce_all`, tail one by one;
  the exps stored to `qk_reduced` in bf16/fp16), exp_tmp = std::exp(old max - max) rescaling the row
  sum and the fp32 `dst`, dst += P.V (fp32 GEMM). End: empty rows get sum 1, out = dst * (1 / sum)
  -> D, lse = max + log(sum) fp32 (0 for a fully masked row). exp_u20: the AVX-512 polynomial of
  aten/src/ATen/cpu/vec/vec512/vec512_float.h (FMAs emulated in fp64); doubles use exp.
- transformers/sdp_utils_cpp.cpp `check_head_dim_size_cpp`: flash needs one head size for q, k, v
  (E != Ev falls back to the math backend), so the value (the latent) is zero-padded to E = r + d_r
  and out[..., :r] kept (padded columns are 0 and independent: the emulation skips them); keys are
  expanded per head. transformers/attention.cpp `convert_boolean_attn_mask`: a bool mask becomes an
  additive 0/-inf mask in D. lse is needed, so the module calls
  `torch.ops.aten._scaled_dot_product_flash_attention_for_cpu` (out, lse [B, H, L] fp32) with
  `scale=softmax_scale`. `is_causal` is top-left aligned, so S_q > 1 passes a bottom-right bool mask.
The module (DeepSeek-V3 inference/model.py absorb branch + the conventions' QK-norm), ops in D:
q_nope * gamma_cq * gamma_ck (two roundings), einsum with W_UK -> q_latent; alpha_q = rsqrt(mean(
q_nope.float()^2) + eps) fp32, folded: (q_latent.float() * alpha_q).to(D); append path: k_nope =
einsum(kv_c, W_UK) in D, alpha_k fp32, folded into per-group keys (kv_c.float() * alpha_k).to(D);
rope parts F.rms_norm (fp32 inside) and a fp32 rotation -> D; unified: one statistic over
[content; rope], alpha_q / alpha_k scale the whole q / key. latent_out = SDPA out[..., :r];
out = einsum(latent_out, W_UV) in D. Kernel level: the given absorbed inputs folded the same way
(SDPA has no per-key scale). fp8: (codes.float() * scale).to(bf16). fp64: all fp64. One call per
sequence on kv_c[b, :T_b] (T_b = 0: out 0, lse -inf). Top-k: bool mask from `indices`. Sinks (SDPA
takes none): (latent.float() * sigmoid(lse - s_h)).to(D) with the returned lse. Rows without
tokens: lse set to -inf.
"""
import numpy as np

from common import BF16, FP8_BLOCK, load

LEVELS = ("module", "kernel")
FEATURES = ("topk", "attn_sink")
F32, F64 = np.float32, np.float64
KV_SPLIT = 512                                        # kv_split_size of every dispatch
_U32 = lambda h: np.array([h], np.uint32).view(F32)[0]  # noqa: E731
_LOG2E, _LN2F, _LN_MIN, _LN_MAX = (_U32(0x3fb8aa3b), _U32(0x3f317218), _U32(0xc2aeac50),
                                   _U32(0x42b17218))
_POLY = [F32(c) for c in (0.999999701, 0.499991506, 0.166676521, 0.0418978221, 0.00828929059)]


# ----------------------------------------------------------------- ATen CPU vector arithmetic
def _fma(a, b, c):                                    # _mm512_fmadd_ps: one rounding
    return (np.asarray(a, F64) * np.asarray(b, F64) + np.asarray(c, F64)).astype(F32)


def exp_u20(x):
    """Vectorized<float>::exp_u20 (AVX-512): 2^n * poly5(r), r = x - n ln2, n = floor(x log2e + .5)."""
    x = np.asarray(x, F32)
    under = x < _LN_MIN
    src = np.maximum(np.minimum(x, _LN_MAX), _LN_MIN)
    fx = np.floor(_fma(src, _LOG2E, F32(0.5)))
    r = _fma(-fx, _LN2F, src)
    y = _fma(r, _POLY[4], _POLY[3])
    for c in (_POLY[2], _POLY[1], _POLY[0], F32(1)):
        y = _fma(r, y, c)
    e = fx.astype(np.int64) - 1                        # 2^(n-1) built from its bits: 0 at e = -127
    p2 = np.where(e > -127, np.ldexp(1.0, np.clip(e, -126, 127)), 0.0).astype(F32)
    p2[under] = 0
    return ((y * p2).astype(F32) * F32(2)).astype(F32)


def _exp_scalar(x, C):                                # std::exp on accum_t
    with np.errstate(invalid="ignore"):
        return np.exp(np.asarray(x, F64)).astype(C)


def _exp_reduce_sum(a, C):
    """_exp_reduce_sum_fusion_kernel on rows a = qk - max [R, n]: (exps in C, row sums in C)."""
    lanes = 16 if C == F32 else 8                     # Vectorized<accum_t>::size() on AVX-512
    n = a.shape[1]
    nv = n - n % lanes
    e = np.empty_like(a)
    e[:, :nv] = exp_u20(a[:, :nv]) if C == F32 else np.exp(a[:, :nv])
    e[:, nv:] = _exp_scalar(a[:, nv:], C)
    acc = np.zeros((a.shape[0], lanes), C)            # vec_tmp_sum += tmp2
    for j in range(0, nv, lanes):
        acc = (acc + e[:, j:j + lanes]).astype(C)
    while acc.shape[1] > 1:                           # vec_reduce_all: halving tree
        h = acc.shape[1] // 2
        acc = (acc[:, :h] + acc[:, h:]).astype(C)
    s = acc[:, 0]
    for j in range(nv, n):                            # scalar tail
        s = (s + e[:, j]).astype(C)
    return e, s


def cpu_flash_attention(q, k, v, scale, mask, is_causal, D, C, bug=None):
    """q [H, L, E], k [H, S, E], v [H, S, Ev] in D; mask [L, S] additive (0/-inf, D) or None.
    Returns out [H, L, Ev] in D and lse [H, L] in C."""
    H, L, E = q.shape
    S = k.shape[1]
    q_split = min(256 if L >= 768 else 64 if L >= 192 else 32, L)
    kv_split = min(KV_SPLIT, S)
    reduced = D not in (F32, F64)
    qf, kf, vf, sc = q.astype(C), k.astype(C), v.astype(C), C(scale)
    out = np.empty((H, L, v.shape[2]), D)
    lse = np.empty((H, L), C)
    for m in range(0, L, q_split):
        qb = min(q_split, L - m)
        mx = np.full((H, qb), -np.inf, C)              # qk_max_data
        sm = np.zeros((H, qb), C)                      # qk_sum_data
        dst = np.zeros((H, qb, v.shape[2]), C)         # fp32 output accumulator
        num_keys = min(m + qb, S) if is_causal else S
        for n in range(0, num_keys, kv_split):
            kb = min(kv_split, S - n)
            qk = np.matmul(qf[:, m:m + qb], kf[:, n:n + kb].transpose(0, 2, 1)).astype(C)  # [H, qb, kb]
            if is_causal and num_keys - n <= kv_split:     # top-left: row sees keys <= m + row
                for row in range(qb):
                    qk[:, row, max(m + row - n + 1, 0):] = -np.inf
            qk = (qk * sc).astype(C)
            if mask is not None:
                qk = (qk + mask[m:m + qb, n:n + kb].astype(C)).astype(C)
            new_max = np.maximum(mx, qk.max(-1))           # [H, qb]
            live = new_max != -np.inf
            with np.errstate(invalid="ignore"):
                a = (qk - np.where(live, new_max, 0)[..., None]).astype(C)
                e, s = _exp_reduce_sum(a.reshape(-1, kb), C)
                e_tmp = _exp_scalar(np.where(live, mx - new_max, 0), C)
            e, s = e.reshape(H, qb, kb), s.reshape(H, qb)
            sm = np.where(live, (s + (e_tmp * sm).astype(C)).astype(C), sm)
            if n > 0:
                dst = np.where(live[..., None], (dst * e_tmp[..., None]).astype(C), dst)
            mx = np.where(live, new_max, mx)
            p = np.where(live[..., None], e, 0).astype(C)
            if reduced:                                     # qk_reduced_data: P in bf16/fp16
                p = p.astype(D).astype(C)
            pv = np.matmul(p, vf[:, n:n + kb]).astype(C)
            dst = pv if n == 0 else (dst + pv).astype(C)
        mx = np.where(mx == -np.inf, 0, mx).astype(C)
        sm = np.where(sm == 0, 1, sm).astype(C)
        den = sm.astype(BF16).astype(C) if bug == "row_denominator_bf16" else sm
        rec = (C(1) / den).astype(C)
        out[:, m:m + qb] = (dst * rec[..., None]).astype(C).astype(D)
        lse[:, m:m + qb] = (mx + np.log(sm.astype(F64)).astype(C)).astype(C)
    return out, lse


# ----------------------------------------------------------------- torch ops in the stored dtype
class _Ops:
    def __init__(self, D):
        self.D, self.C = D, (F64 if D == F64 else F32)

    def mul(self, a, b):                               # elementwise: opmath, one rounding to D
        return (np.asarray(a).astype(self.C) * np.asarray(b).astype(self.C)).astype(self.D)

    def einsum(self, spec, a, b):                      # bmm: fp32 accumulate, output in D
        return np.einsum(spec, a.astype(self.C), b.astype(self.C)).astype(self.D)

    def inv_rms(self, x, eps):                         # rsqrt(x.float().pow(2).mean(-1) + eps)
        h = np.asarray(x).astype(self.C)
        return (self.C(1) / np.sqrt(np.mean(h * h, -1) + self.C(eps))).astype(self.C)

    def rms_norm(self, x, w, eps):                     # F.rms_norm: fp32 inside, .type_as(x)
        h = np.asarray(x).astype(self.C)
        return ((h * self.inv_rms(x, eps)[..., None]) * w.astype(self.C)).astype(self.D)

    def rope(self, x, cos, sin, style):                # (a c - b s, a s + b c) in fp32 -> D
        xf = np.asarray(x).astype(self.C)
        d2 = xf.shape[-1] // 2
        a, b = (xf[..., 0::2], xf[..., 1::2]) if style == "interleaved" else (xf[..., :d2], xf[..., d2:])
        y1, y2 = a * cos - b * sin, a * sin + b * cos
        y = np.stack([y1, y2], -1).reshape(xf.shape) if style == "interleaved" else np.concatenate([y1, y2], -1)
        return y.astype(self.D)


def _cache(cs, b, T, D):
    """kv_c[b, :T] as the module holds it: D, or fp8 codes.float() * scale -> bf16."""
    if not cs.is_fp8():
        return cs.raw("kv_c")[b, :T].astype(D)
    sc = cs.raw("kv_c_scale")[b, :T].astype(F32)
    sc = sc[:, np.arange(cs.r) // FP8_BLOCK] if sc.ndim == 2 else sc[:, None]
    return (cs.raw("kv_c")[b, :T].astype(F32) * sc).astype(BF16)


def _module_qk(cs, o, b, T, kv):
    """Query [S, H, E] and per-group keys [T, G, E] in D from the module's raw inputs."""
    D, S, H, G, r, dc, dr = cs.stored, cs.S, cs.H, cs.G, cs.r, cs.dc, cs.dr
    gmap = np.arange(H) // (H // G)
    wk = cs.raw("w_uk").astype(D).reshape(r, G, dc)
    qn = cs.raw("q_nope")[b].astype(D)                               # [S, H, dc]
    qpe = cs.raw("q_pe")[b].astype(D) if dr else np.zeros((S, cs.H, 0), D)      # [S, H, dr]
    kpe = cs.raw("k_pe")[b, :T].astype(D) if dr else np.zeros((T, 0), D)          # [T, dr]
    if dr:
        tc, ts = cs.get("rope_cos", o.C), cs.get("rope_sin", o.C)
        qpos = T - S + np.arange(S)
        rq = lambda x: o.rope(x, tc[qpos][:, None], ts[qpos][:, None], cs.rope_style)  # noqa: E731
        rk = lambda x: o.rope(x, tc[:T], ts[:T], cs.rope_style)                         # noqa: E731
    else:
        rq = rk = lambda x: x                                                           # noqa: E731
    kvg = np.broadcast_to(kv[:, None, :], (T, G, r))
    if cs.norm == "none":
        q_lat = o.einsum("shd,rhd->shr", qn, wk[:, gmap])
        q = np.concatenate([q_lat, rq(qpe)], -1)
        return q, np.concatenate([kvg, np.broadcast_to(rk(kpe)[:, None], (T, G, dr))], -1)
    k_nope = o.einsum("tr,rgd->tgd", kv, wk)                         # [T, G, dc] transient key
    if cs.norm == "blockwise":
        gq, gk = cs.raw("gamma_cq").astype(D), cs.raw("gamma_ck").astype(D)
        q_lat = o.einsum("shd,rhd->shr", o.mul(o.mul(qn, gq), gk), wk[:, gmap])
        aq, ak = o.inv_rms(qn, cs.eps), o.inv_rms(k_nope, cs.eps)    # [S, H], [T, G]
        if dr:
            grq, grk = cs.raw("gamma_rq").astype(D), cs.raw("gamma_rk").astype(D)
            if cs.rope_order == "norm_then_rope":
                q_r, k_r = rq(o.rms_norm(qpe, grq, cs.eps)), rk(o.rms_norm(kpe, grk, cs.eps))
            else:
                q_r, k_r = o.rms_norm(rq(qpe), grq, cs.eps), o.rms_norm(rk(kpe), grk, cs.eps)
        else:
            q_r, k_r = qpe, kpe
        q = np.concatenate([o.mul(q_lat, aq[..., None]), q_r], -1)
        k = np.concatenate([o.mul(kvg, ak[..., None]), np.broadcast_to(k_r[:, None], (T, G, dr))], -1)
        return q, k
    gq, gk = cs.raw("gamma_q").astype(D), cs.raw("gamma_k").astype(D)     # unified
    q_lat = o.einsum("shd,rhd->shr", o.mul(o.mul(qn, gq[:dc]), gk[:dc]), wk[:, gmap])
    if cs.rope_order == "norm_then_rope":
        q_st, k_st = qpe, kpe
        q_r, k_r = rq(o.mul(qpe, gq[dc:])), rk(o.mul(kpe, gk[dc:]))
    else:
        q_st, k_st = rq(qpe), rk(kpe)
        q_r, k_r = o.mul(q_st, gq[dc:]), o.mul(k_st, gk[dc:])
    aq = o.inv_rms(np.concatenate([qn, q_st], -1), cs.eps)
    ak = o.inv_rms(np.concatenate([k_nope, np.broadcast_to(k_st[:, None], (T, G, dr))], -1), cs.eps)
    q = o.mul(np.concatenate([q_lat, q_r], -1), aq[..., None])
    k = o.mul(np.concatenate([kvg, np.broadcast_to(k_r[:, None], (T, G, dr))], -1), ak[..., None])
    return q, k


def _kernel_qk(cs, o, b, T, kv):
    """Query [S, H, E] and per-group keys [T, G, E] from a kernel-level case's absorbed inputs."""
    G, r, dr = cs.G, cs.r, cs.dr
    ql = cs.raw("q_latent")[b]                                         # [S, H, r] D
    qr = cs.raw("q_rope")[b] if dr else np.zeros(ql.shape[:2] + (0,), ql.dtype)
    kr = cs.raw("k_rope")[b, :T] if dr else np.zeros((T, 0), kv.dtype)
    kvg = np.broadcast_to(kv[:, None, :], (T, G, r))
    krg = np.broadcast_to(kr[:, None], (T, G, dr))
    if cs.norm == "none":
        return np.concatenate([ql, qr], -1), np.concatenate([kvg, krg], -1)
    aq, ak = cs.raw("alpha_q")[b][..., None], cs.raw("alpha_k")[b, :T][..., None]
    if cs.norm == "blockwise":
        return (np.concatenate([o.mul(ql, aq), qr], -1),
                np.concatenate([o.mul(kvg, ak), krg], -1))
    return o.mul(np.concatenate([ql, qr], -1), aq), o.mul(np.concatenate([kvg, krg], -1), ak)


def _visible(cs, b, T, bug):
    """Bool mask [S, T] the module passes (None: no mask), and is_causal."""
    S = cs.S
    if cs.has("indices"):                              # sparse top-k: exactly the listed tokens
        m = np.zeros((S, T), bool)
        for i in range(S):
            idx = cs.raw("indices")[b, i]
            m[i, idx[idx >= 0]] = True
        return m, False
    if not cs.causal or S == 1:
        return None, False
    if bug == "causal_top_left":                       # is_causal=True: top-left aligned in SDPA
        return None, True
    return np.arange(T)[None, :] <= (T - S + np.arange(S))[:, None], False


def run(case, bug=None):
    cs = load(case)
    D = cs.stored
    o = _Ops(D)
    B, S, H, G, r = cs.B, cs.S, cs.H, cs.G, cs.r
    gmap = np.arange(H) // (H // G)
    latent = np.zeros((B, S, H, r), D)
    lse = np.full((B, S, H), -np.inf, o.C)
    live_b = [b for b in range(B) if cs.seqlens[b] > 0]
    for b in live_b:
        T = cs.seqlens[b]
        kv = _cache(cs, b, T, D)                                       # [T, r]
        q, k = (_kernel_qk if cs.level == "kernel" else _module_qk)(cs, o, b, T, kv)
        allowed, is_causal = _visible(cs, b, T, bug)
        mask = None if allowed is None else np.where(allowed, 0.0, -np.inf).astype(D)
        scale = 1.0 / np.sqrt(q.shape[-1]) if bug == "default_scale" else cs.scale   # scale=None
        qh = np.ascontiguousarray(q.transpose(1, 0, 2))                # [H, S, E]
        kh = np.ascontiguousarray(k[:, gmap].transpose(1, 0, 2))       # [H, T, E]
        vh = np.broadcast_to(kv[None], (H, T, r))                      # [H, T, r] (pad to E dropped)
        out_h, lse_h = cpu_flash_attention(qh, kh, vh, scale, mask, is_causal, D, o.C, bug)
        lat, l_b = out_h.transpose(1, 0, 2), lse_h.T                   # [S, H, r], [S, H]
        if cs.has("attn_sink"):                                        # out * sigmoid(lse - s_h)
            with np.errstate(over="ignore"):
                f = (o.C(1) / (o.C(1) + _exp_scalar(-(l_b - cs.get("attn_sink", o.C)), o.C))).astype(o.C)
            lat = o.mul(lat, f[..., None])
        if allowed is not None:
            l_b = np.where(allowed.any(-1)[:, None], l_b, -np.inf)
        if bug == "one_head":
            lat = lat.copy()
            lat[:, -1] = o.mul(lat[:, -1], 1.05)
        if bug == "scale_bias" or (bug == "one_sequence" and b == live_b[-1]):
            lat = o.mul(lat, 1.01 if bug == "scale_bias" else 1.004)
        latent[b], lse[b] = lat, l_b
    res = {"latent_out": latent, "lse": lse}
    if cs.level == "module":
        wv = cs.raw("w_uv").astype(D).reshape(r, G, cs.dv)
        res["out"] = o.einsum("bshr,rhd->bshd", latent, wv[:, gmap])     # [B, S, H, d_v]
    return res


BUGS = {
    "one_head": "last head's attention output scaled by 1.05",
    "one_sequence": "last non-empty sequence's attention output scaled by 1.004",
    "row_denominator_bf16": "the kernel's final row sum rounded to bf16 before 1/sum",
    "scale_bias": "attention output scaled by 1.01",
    "causal_top_left": "is_causal=True for S_q > 1: SDPA aligns it top-left, not bottom-right",
    "default_scale": "scale= not passed: SDPA's 1/sqrt(r + d_r) instead of the softmax scale",
}


def bug_applies(cfg, bug):
    sl = [int(x) for x in cfg["seqlens"]]
    if not any(sl):
        return False
    if bug == "causal_top_left":
        sq = int(cfg["s_q"])
        return (bool(cfg.get("causal", True)) and sq > 1 and not cfg.get("topk")
                and any(t > sq for t in sl))
    if bug == "default_scale":
        e = int(cfg["latent_rank"]) + int(cfg["d_r"])
        return abs(float(cfg["softmax_scale"]) * np.sqrt(e) - 1) > 1e-3
    return True
