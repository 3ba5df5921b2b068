"""PyTorch-module style in the stored dtype, emulated in numpy + ml_dtypes.

Every op's output is a tensor of the stored dtype D (bf16/fp16; fp32/fp64 in those profiles), as
torch gives for bf16 tensors: einsum/matmul accumulate in fp32 and round the output to D;
elementwise ops compute in fp32 and round to D; `x.float()` is exact; RMSNorm is the Qwen3 idiom
(`h = x.float(); h * rsqrt(h.pow(2).mean(-1) + eps)` then `.to(D)` and `weight * h`), RoPE is the
DeepSeek complex idiom (`view_as_complex(x.float()) * freqs_cis`, `.to(D)`), softmax is
`softmax(dim=-1, dtype=float32).type_as(x)`.

The absorbed path follows DeepSeek-V3 `inference/model.py` (absorb branch):
    q_lat  = einsum("shd,hdc->shc", q_nope * (gamma_cq*gamma_ck), W_UK per head)
    scores = (einsum(q_lat, kv) * alpha_q * alpha_k + einsum(q_pe, pe)) * scale     (blockwise)
    scores = (einsum(q_lat, kv) + einsum(q_pe, pe)) * alpha_q * alpha_k * scale     (unified)
    p      = scores.softmax(-1, dtype=float32).type_as(x)
    latent = einsum(p, kv); out = einsum(latent, W_UV)
alpha_q, alpha_k are computed in fp32 from the D-typed tensors and `.type_as(x)` (the bf16-alpha
variant), so scores, P, latent and out are all D. fp8 profile: the cache is dequantized as
`(code.float() * scale).to(bf16)` once. lse is `scores.float().logsumexp(-1)` (fp32).
Varlen: one forward per sequence over kv_cache[:T_b] (rows past T_b are never read).
fp8-block128: `(code.float() * scale.repeat_interleave(128)[:r]).to(bf16)` (exact). Top-k:
DeepSeek-V3.2's index_mask (-inf except the listed tokens) added to the scores instead of the
causal mask. Sinks: gpt-oss / HF eager's cat([scores, sinks]) -> fp32 softmax -> drop the sink
column -> `.type_as(x)`; lse = logsumexp of the scores alone.
Module level only.
"""
import numpy as np

from common import FP8_BLOCK, load

LEVELS = ("module",)


class _Torch:
    """Tiny emulation of torch semantics for tensors of dtype D."""

    def __init__(self, D):
        self.D = D
        self.C = np.float64 if D == np.float64 else np.float32   # opmath type

    def t(self, x):            # a D tensor from a computed value (one rounding)
        return np.asarray(x, self.C).astype(self.D)

    def float(self, x):        # .float() (exact; fp64 stays fp64)
        return np.asarray(x).astype(self.C)

    def mul(self, a, b):
        return self.t(self.float(a) * self.float(b))

    def add(self, a, b):
        return self.t(self.float(a) + self.float(b))

    def einsum(self, spec, a, b):
        return self.t(np.einsum(spec, self.float(a), self.float(b)))

    def rsqrt_ms(self, h, eps, outside=False):  # fp32 statistic, as h.pow(2).mean(-1)
        ms = np.mean(h * h, axis=-1)
        return (1.0 / (np.sqrt(ms) + self.C(eps))) if outside else (1.0 / np.sqrt(ms + self.C(eps)))

    def rmsnorm(self, x, w, eps, outside=False):  # Qwen3RMSNorm
        h = self.float(x)
        h = h * self.rsqrt_ms(h, eps, outside)[..., None]
        return self.mul(w, self.t(h))

    def rope(self, x, cos, sin, style):
        """DeepSeek apply_rotary_emb (interleaved, complex view) or the NeoX half layout."""
        xf = self.float(x)
        h = xf.shape[-1] // 2
        if style == "interleaved":
            z = xf[..., 0::2] + 1j * xf[..., 1::2]
        else:
            z = xf[..., :h] + 1j * xf[..., h:]
        ctype = np.complex128 if self.C == np.float64 else np.complex64
        z = z.astype(ctype) * (cos + 1j * sin).astype(ctype)
        y = np.empty_like(xf)
        if style == "interleaved":
            y[..., 0::2], y[..., 1::2] = z.real, z.imag
        else:
            y[..., :h], y[..., h:] = z.real, z.imag
        return self.t(y)


def run(case, bug=None):
    cs = load(case)
    D = cs.stored
    tt = _Torch(D)
    H, G, S, r, dc, dr, dv = cs.H, cs.G, cs.S, cs.r, cs.dc, cs.dr, cs.dv
    hpg = H // G
    eps = cs.eps
    outside = bug == "eps_outside_sqrt"
    style = cs.rope_style
    if bug == "rope_pairs_swapped":
        style = "half" if style == "interleaved" else "interleaved"
    gmap = np.arange(H) // hpg
    # weights, as module parameters of dtype D
    w_uk = cs.raw("w_uk").astype(D).reshape(r, G, dc)
    w_uv = cs.raw("w_uv").astype(D).reshape(r, G, dv)
    wk_h = w_uk[:, gmap, :]                               # [r,H,dc] (per-head view, repeat of groups)
    gain_head_missing = False
    if bug == "one_head":
        if G > 1:                                          # last head reads the previous group's slice
            wk_h = wk_h.copy()
            wk_h[:, -1, :] = w_uk[:, (gmap[-1] - 1) % G, :]
        else:
            gain_head_missing = True
    cos_t = cs.get("rope_cos", tt.C) if dr else None
    sin_t = cs.get("rope_sin", tt.C) if dr else None

    out = np.zeros((cs.B, S, H, dv), D)
    lat_all = np.zeros((cs.B, S, H, r), D)
    lse = np.full((cs.B, S, H), -np.inf, np.float32 if D != np.float64 else np.float64)
    topk = cs.raw("indices") if cs.has("indices") else None
    sinks = cs.get("attn_sink", tt.C) if cs.has("attn_sink") else None
    for b in range(cs.B):
        T = cs.seqlens[b]
        if T == 0:
            continue
        # ---- cache (what append wrote): kv [T,r], pe [T,dr], alpha_k [T,G]
        if cs.is_fp8():                                     # fp8-block128: scale.repeat_interleave(128)
            sc = cs.raw("kv_c_scale")[b, :T].astype(np.float32)
            sc = sc[:, np.arange(r) // FP8_BLOCK] if sc.ndim == 2 else sc[:, None]
            kv = tt.t(cs.raw("kv_c")[b, :T].astype(np.float32) * sc)
        else:
            kv = cs.raw("kv_c")[b, :T].astype(D)
        q_nope = cs.raw("q_nope")[b].astype(D)              # [S,H,dc]
        qpos = T - S + np.arange(S)
        if bug == "one_sequence" and b == cs.B - 1:
            qpos = qpos + 1                                  # freqs_cis sliced at start_pos + 1
        kpos = np.arange(T)
        if dr:
            q_pe = cs.raw("q_pe")[b].astype(D)
            k_pe = cs.raw("k_pe")[b, :T].astype(D)
            qf = (cos_t[qpos][:, None, :], sin_t[qpos][:, None, :])
            kf = (cos_t[kpos], sin_t[kpos])
        k_nope = tt.einsum("tc,cgd->tgd", kv, w_uk)          # transient key, D
        if cs.norm == "none":
            q = q_nope
            ak = aq = None
            if dr:
                q_pe_r = tt.rope(q_pe, *qf, style)
                pe = tt.rope(k_pe, *kf, style)
        elif cs.norm == "blockwise":
            gain = tt.mul(cs.raw("gamma_cq").astype(D), cs.raw("gamma_ck").astype(D))
            q = tt.mul(q_nope, gain)
            if gain_head_missing:
                q[:, -1, :] = tt.mul(q_nope[:, -1, :], cs.raw("gamma_cq").astype(D))
            aq = tt.t(tt.rsqrt_ms(tt.float(q_nope), eps, outside))          # [S,H]
            if bug == "alpha_k_from_latent":
                ak = tt.t(np.repeat(tt.rsqrt_ms(tt.float(kv), eps, outside)[:, None], G, 1))
            else:
                ak = tt.t(tt.rsqrt_ms(tt.float(k_nope), eps, outside))      # [T,G]
            if dr:
                grq, grk = cs.raw("gamma_rq").astype(D), cs.raw("gamma_rk").astype(D)
                if cs.rope_order == "norm_then_rope":
                    q_pe_r = tt.rope(tt.rmsnorm(q_pe, grq, eps, outside), *qf, style)
                    pe = tt.rope(tt.rmsnorm(k_pe, grk, eps, outside), *kf, style)
                else:
                    q_pe_r = tt.rmsnorm(tt.rope(q_pe, *qf, style), grq, eps, outside)
                    pe = tt.rmsnorm(tt.rope(k_pe, *kf, style), grk, eps, outside)
        else:  # unified: one statistic over [content; rope]
            gq, gk = cs.raw("gamma_q").astype(D), cs.raw("gamma_k").astype(D)
            gain = tt.mul(gq[:dc], gk[:dc])
            q = tt.mul(q_nope, gain)
            if gain_head_missing:
                q[:, -1, :] = tt.mul(q_nope[:, -1, :], gq[:dc])
            if dr:
                if cs.rope_order == "norm_then_rope":
                    q_stat, k_stat = q_pe, k_pe
                    q_pe_r = tt.rope(tt.mul(q_pe, gq[dc:]), *qf, style)
                    pe = tt.rope(tt.mul(k_pe, gk[dc:]), *kf, style)
                else:
                    q_stat, k_stat = tt.rope(q_pe, *qf, style), tt.rope(k_pe, *kf, style)
                    q_pe_r, pe = tt.mul(q_stat, gq[dc:]), tt.mul(k_stat, gk[dc:])
                qcat = np.concatenate([tt.float(q_nope), tt.float(q_stat)], -1)
                kcat = np.concatenate([tt.float(k_nope),
                                       np.broadcast_to(tt.float(k_stat)[:, None, :], (T, G, dr))], -1)
            else:
                qcat, kcat = tt.float(q_nope), tt.float(k_nope)
            aq = tt.t(tt.rsqrt_ms(qcat, eps, outside))
            if bug == "alpha_k_from_latent":
                ak = tt.t(np.repeat(tt.rsqrt_ms(tt.float(kv), eps, outside)[:, None], G, 1))
            else:
                ak = tt.t(tt.rsqrt_ms(kcat, eps, outside))
        # ---- absorbed attention
        q_lat = tt.einsum("shd,chd->shc", q, wk_h)            # [S,H,r]
        s_lat = tt.einsum("shc,tc->sht", q_lat, kv)           # [S,H,T]
        s_pe = tt.einsum("shr,tr->sht", q_pe_r, pe) if dr else None
        if cs.norm == "none":
            scores = tt.add(s_lat, s_pe) if dr else s_lat
        elif cs.norm == "blockwise":
            s_lat = tt.mul(tt.mul(s_lat, aq[:, :, None]), ak[:, gmap].T[None])
            scores = tt.add(s_lat, s_pe) if dr else s_lat
        else:
            scores = tt.add(s_lat, s_pe) if dr else s_lat
            scores = tt.mul(tt.mul(scores, aq[:, :, None]), ak[:, gmap].T[None])
        scores = tt.t(tt.float(scores) * tt.C(cs.scale))
        if topk is not None:
            # DeepSeek-V3.2: index_mask = full(-inf).scatter_(-1, topk_indices, 0); the index set
            # replaces the causal mask (the -1 pads scatter nowhere)
            mask = np.full((S, T), -np.inf)
            for i in range(S):
                idx = topk[b, i][topk[b, i] >= 0]
                if bug == "topk_off_by_one":
                    idx = idx + 1
                    idx = idx[idx < T]                        # a mask built one column wide, sliced to T
                mask[i, idx] = 0.0
            scores = tt.add(scores, mask[:, None, :])
        elif cs.causal:
            mask = np.where(kpos[None, :] <= (T - S + np.arange(S))[:, None], 0.0, -np.inf)
            scores = tt.add(scores, mask[:, None, :])
        sf = tt.float(scores)
        live = np.isfinite(sf.max(-1, keepdims=True))         # a row without tokens: out 0, lse -inf
        lse_real = np.full((S, H), -np.inf)
        with np.errstate(invalid="ignore", divide="ignore"):  # scores.float().logsumexp(-1), real keys
            m0 = np.where(live, sf.max(-1, keepdims=True), 0)
            lse_real = np.where(live[..., 0], m0[..., 0] + np.log(np.exp(sf - m0).sum(-1)), -np.inf)
        if sinks is not None and bug != "sink_ignored":
            # gpt-oss / HF eager: cat([scores, sinks], -1) (bf16 with the fp32 sink parameter
            # promotes to fp32), softmax, drop the sink column: P = p * exp(lse)/(exp(lse)+exp(s_h))
            sf = np.concatenate([sf, np.broadcast_to(sinks[None, :, None], (S, H, 1))], -1)
        m = sf.max(-1, keepdims=True)
        m = np.where(np.isfinite(m), m, 0)
        e = np.exp(sf - m)
        den = e.sum(-1, keepdims=True)
        if bug == "row_denominator_bf16":
            den = den.astype(np.float32).astype(np.dtype("bfloat16")).astype(tt.C)
        p = tt.t(np.where(live, e / den, 0)[..., :T])         # softmax(dtype=float32).type_as(x)
        lse_row = lse_real
        if bug == "sink_in_lse":                              # logsumexp of the concatenated row
            lse_row = np.where(live[..., 0], m[..., 0] + np.log(den[..., 0]), -np.inf)
        lse[b] = lse_row.astype(lse.dtype)
        latent = tt.einsum("sht,tc->shc", p, kv)
        o = tt.einsum("shc,chd->shd", latent, w_uv[:, gmap, :])
        if bug == "scale_bias":
            o = tt.t(tt.float(o) * tt.C(1.01))
        out[b] = o
        lat_all[b] = latent
    return {"out": out, "lse": lse, "latent_out": lat_all}


BUGS = {
    "one_head": "last head absorbs with the previous group's W_UK slice (G=1: gamma_ck missing)",
    "one_sequence": "last sequence's queries rotated at start_pos+1",
    "row_denominator_bf16": "manual softmax whose row sum is rounded to bf16",
    "scale_bias": "out scaled by 1.01",
    "eps_outside_sqrt": "RMSNorm/alpha as 1/(sqrt(ms) + eps)",
    "rope_pairs_swapped": "NeoX half pairs where the config says interleaved (and vice versa)",
    "alpha_k_from_latent": "alpha_k = 1/rms(c[t])",
    "topk_off_by_one": "index_mask scattered at token + 1",
    "sink_in_lse": "lse = logsumexp of cat([scores, sinks]) (the sink column kept)",
    "sink_ignored": "the sinks never concatenated to the scores",
}
FEATURES = ("topk", "attn_sink")


def bug_applies(cfg, bug):
    if cfg.get("level") == "kernel":
        return False
    if bug == "topk_off_by_one":
        return bool(cfg.get("topk"))
    if bug in ("sink_in_lse", "sink_ignored"):
        return bool(cfg.get("attn_sink"))
    if bug in ("eps_outside_sqrt", "alpha_k_from_latent"):
        return cfg.get("norm") != "none"
    if bug in ("rope_pairs_swapped", "one_sequence"):
        return int(cfg["d_r"]) > 0
    return True
