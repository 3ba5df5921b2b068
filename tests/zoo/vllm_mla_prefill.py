"""vLLM's MLA prefill path with chunked cached context (explicit form), with a QK-norm fork.

What runs is `MLACommonImpl._forward_prefill` (vllm/v1/attention/backends/mla/common.py) for a
batch whose sequences have cached context: the S_q query tokens of each sequence are the "new"
tokens, the T_b - S_q tokens before them the context, read from the cache in chunks.

- Chunking (`MLACommonMetadataBuilder`, chunked context metadata): workspace of WORKSPACE tokens
  shared equally by the sequences with context, rounded down to the page size PAGE:
  `C = round_down(WORKSPACE // n_ctx, PAGE)` (vLLM asserts C > 0; here clamped to PAGE);
  chunk i of every sequence covers context tokens [i*C, min(ctx_b, (i+1)*C)) (possibly empty).
- Gather (`gather_and_maybe_dequant_cache`): the latent rows of the chunk into a D workspace;
  fp8: `D(fp32(code) * scale)` (scaled_convert: fp32 product, one conversion to D).
  The new tokens' latent is taken from the same cache (a case stores only that).
- `kv_b_proj` (a D linear: fp32 accumulate, output D) -> per-head k_nope [n, H, d_c] and v.
- QK-norm fork: RMSNorm modules as vLLM's `RMSNorm` (forward_native / the rms_norm CUDA kernel):
  statistic in fp32, `x * rsqrt(var + eps)` rounded to D, then `* weight` rounded to D.
  Blockwise: q_norm/k_norm over d_c, rope norms over d_r; unified: one RMSNorm over the
  concatenated head [nope; pe] (per head for the keys).
- RoPE as vLLM's `RotaryEmbedding.forward_native` (`_apply_rotary_emb_torch`) and its CUDA kernel
  both do it: cos/sin cache in D, `x1*cos - x2*sin`, `x2*cos + x1*sin`, every op rounded to D
  (D math, not fp32); neox = half style, else interleaved.
- `k = cat(k_nope, k_pe.expand)`, `v` zero-padded to d_c + d_r (`_pad_v`, FA2 needs equal dims).
- Attention: `flash_attn_varlen_func(..., return_softmax_lse=True)` modelled as FA2: fp32 scores
  from D inputs, `scale*log2(e)` folded, exp2 (FMA of score*scale_log2 - max_scaled), online
  softmax over 128-key blocks visited last to first, unnormalized P rounded to D for P.V, row sum
  of the unrounded P, fp32 accumulator, `acc * (1/sum)` -> D, lse = max*scale + log(sum) in
  fp32, +inf for a row without keys (sum == 0). Context chunks: causal=False; new tokens: causal.
- `merge_attn_states` (csrc/attention/merge_attn_states.cu): +-inf lse -> -inf, max_lse,
  `p_out*p_scale + (s_out*s_scale)` (fma) in fp32 on D inputs, output D; both -inf -> the prefix
  output copied (zeros) and lse -inf. Context chunks merged in order (prefix = merged so far,
  suffix = chunk i; output_lse carried), then prefix = context, suffix = new tokens. The last
  merge's lse (fp32) is delivered (vLLM passes output_lse=None there; the formula is the same).
- Output: `out[..., :d_v]` (padded columns dropped) in D, lse fp32 natural log (-inf for an
  empty row). fp64 profile: everything fp64, no rounding. Module level, dense, no sink.
"""
import numpy as np

from common import BF16, FP8_BLOCK, load

LEVELS = ("module",)
FEATURES = ()
PROFILES = ("fp64", "fp32", "bf16", "fp16", "fp8", "fp8-block128")
AUDIT_ARGS = ("--form", "explicit")

WORKSPACE = 16     # context tokens per chunk pass (all sequences with context together)
PAGE = 4           # cache block size: chunk length is rounded down to it
BLOCK_N = 128      # FA2 key block

BUGS = {
    "one_head": "last head's query RMSNorm applied without its gain",
    "one_sequence": "last sequence's context chunk ends one token short (a chunk boundary off by one)",
    "row_denominator_bf16": "FA2 row sum rounded to bf16 before 1/sum and lse",
    "scale_bias": "out scaled by 1.01",
    "lse_not_updated": "context-chunk loop keeps the first chunk's lse instead of the merged one",
    "fa2_inf_lse": "FA2's +inf lse of an empty chunk not mapped to -inf in merge_attn_states",
}


def _chunking(seqlens, sq):
    ctx = [max(t - sq, 0) for t in seqlens]
    n_ctx = sum(1 for c in ctx if c > 0)
    if n_ctx == 0:
        return ctx, 0, 0
    C = max(PAGE, (WORKSPACE // n_ctx) // PAGE * PAGE)
    return ctx, C, -(-max(ctx) // C)


def audit_args(cfg):
    """The explicit form, and the chunk length its merges use: a user of a workspace this small
    declares it (`--kv-chunk`), since the error of stored partials grows with their number."""
    seqlens, sq = [int(x) for x in cfg["seqlens"]], int(cfg["s_q"])
    _, C, nch = _chunking(seqlens, sq)
    return AUDIT_ARGS + (("--kv-chunk", str(C)) if nch >= 2 else ())


def bug_applies(cfg, bug):
    if cfg.get("level", "module") != "module":
        return False
    seqlens, sq = [int(x) for x in cfg["seqlens"]], int(cfg["s_q"])
    ctx, C, nch = _chunking(seqlens, sq)
    if bug == "one_head":
        return cfg.get("norm", "blockwise") != "none"
    if bug == "one_sequence":
        return ctx[-1] > 0
    if bug == "lse_not_updated":
        return nch >= 2
    if bug == "fa2_inf_lse":
        # some sequence meets an empty chunk (or has no keys at all) while merging happens
        return nch >= 1 and any(c <= (nch - 1) * C for c in ctx)
    return any(t > 0 for t in seqlens)


class _Num:
    """The profile's arithmetic: A accumulate, D storage, rd = round to D and read back."""

    def __init__(self, cs):
        self.A, self.D = cs.accum, cs.stored
        self.f64 = self.A == np.float64

    def rd(self, x):
        return np.asarray(x).astype(self.D).astype(self.A)

    def fma(self, a, b, c):
        """fp32 fma(a, b, c): exact product in fp64, one rounding (fp64 then fp32)."""
        if self.f64:
            return a * b + c
        return (a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(np.float32)


def _rmsnorm(nm, x, w, eps):
    """vLLM RMSNorm on a D tensor: fp32 statistic, normalized -> D, * weight -> D."""
    A = nm.A
    var = np.mean(x * x, -1, keepdims=True, dtype=A).astype(A)
    inv = A(1) / np.sqrt(var + A(eps))
    return nm.rd(nm.rd(x * inv) * w)


def _rope(nm, x, cos, sin, style):
    """_apply_rotary_emb_torch on D tensors (cos/sin already D), every op rounded to D."""
    rd = nm.rd
    if style == "half":
        h = x.shape[-1] // 2
        x1, x2 = x[..., :h], x[..., h:]
    else:
        x1, x2 = x[..., 0::2], x[..., 1::2]
    o1 = rd(rd(x1 * cos) - rd(x2 * sin))
    o2 = rd(rd(x2 * cos) + rd(x1 * sin))
    if style == "half":
        return np.concatenate([o1, o2], -1)
    return np.stack([o1, o2], -1).reshape(x.shape)


def _fa2(nm, q, k, v, scale, causal, bug=None):
    """flash_attn_varlen_func for one sequence: q [S,H,d], k [n,H,d], v [n,H,dv] (D values).
    Returns out [S,H,dv] (D values) and lse [S,H] (A), +inf where a row has no key."""
    A = nm.A
    S, H = q.shape[:2]
    n = k.shape[0]
    if n == 0:                                   # varlen early exit: 0 and lse = +inf
        return np.zeros((S, H, v.shape[-1]), A), np.full((S, H), np.inf, A)
    sl2 = A(scale * np.log2(np.e)) if not nm.f64 else scale * np.log2(np.e)
    s_all = np.einsum("shd,nhd->hsn", q, k).astype(A)                 # [H,S,n]
    if causal:                                                        # bottom-right aligned
        qi = np.arange(S)[:, None] + (n - S)
        vis = np.arange(n)[None, :] <= qi
        s_all = np.where(vis[None], s_all, -np.inf)
    m = np.full((H, S, 1), -np.inf, A)
    l = np.zeros((H, S, 1), A)
    acc = np.zeros((H, S, v.shape[-1]), A)
    nblk = -(-n // BLOCK_N)
    for blk in range(nblk - 1, -1, -1):                               # FA2: last block first
        sl = slice(blk * BLOCK_N, min(n, (blk + 1) * BLOCK_N))
        s = s_all[..., sl]
        m_new = np.maximum(m, s.max(-1, keepdims=True))
        m_scaled = np.where(np.isinf(m_new) & (m_new < 0), A(0), m_new * sl2).astype(A)
        with np.errstate(invalid="ignore"):
            p = np.exp2(nm.fma(s, np.broadcast_to(sl2, s.shape).astype(A), -m_scaled)).astype(A)
            corr = np.exp2(nm.fma(m, np.broadcast_to(sl2, m.shape).astype(A), -m_scaled)).astype(A)
        corr = np.where(np.isinf(m) & (m < 0), A(0), corr)
        p = np.where(np.isinf(s) & (s < 0), A(0), p)
        l = l * corr + p.sum(-1, keepdims=True, dtype=A)
        acc = acc * corr + np.einsum("hsn,nhd->hsd", nm.rd(p), v[sl]).astype(A)
        m = m_new
    if bug == "row_denominator_bf16":
        l = l.astype(BF16).astype(A)
    empty = (l == 0) | np.isnan(l)
    inv = np.where(empty, A(1), A(1) / np.where(empty, A(1), l))
    out = nm.rd(acc * inv)
    with np.errstate(divide="ignore"):
        lse = np.where(empty, A(np.inf), (m * A(scale) + np.log(np.where(empty, A(1), l))).astype(A))
    return np.transpose(out, (1, 0, 2)), np.transpose(lse[..., 0], (1, 0))


def _merge(nm, po, plse, so, slse, bug=None):
    """merge_attn_states: fp32 math on D outputs, output D, lse fp32."""
    A = nm.A
    if bug != "fa2_inf_lse":
        plse = np.where(np.isinf(plse), A(-np.inf), plse)
        slse = np.where(np.isinf(slse), A(-np.inf), slse)
    mx = np.maximum(plse, slse)
    both = np.isinf(mx) & (mx < 0)
    mxs = np.where(both, A(0), mx)
    with np.errstate(invalid="ignore", over="ignore"):
        pse = np.exp(plse - mxs).astype(A)
        sse = np.exp(slse - mxs).astype(A)
        ose = (pse + sse).astype(A)
        ps = (pse / ose).astype(A)[..., None]
        ss = (sse / ose).astype(A)[..., None]
        o = nm.fma(po, np.broadcast_to(ps, po.shape), (so * ss).astype(A))
    o = np.where(both[..., None], po, nm.rd(o))
    with np.errstate(divide="ignore", invalid="ignore"):
        lse = np.where(both, mx, (np.log(ose) + mxs).astype(A))
    return o, lse


def run(case, bug=None):
    cs = load(case)
    nm = _Num(cs)
    A, D, rd = nm.A, nm.D, nm.rd
    B, S, H, G, r, dc, dr, dv = cs.B, cs.S, cs.H, cs.G, cs.r, cs.dc, cs.dr, cs.dv
    eps = cs.eps
    hmap = np.arange(H) // (H // G)
    dqk = dc + dr
    dvp = max(dv, dqk)
    w_uk = cs.get("w_uk", A).reshape(r, G, dc)
    w_uv = cs.get("w_uv", A).reshape(r, G, dv)
    seqlens = cs.seqlens
    ctx, C, nch = _chunking(seqlens, S)

    if dr:
        cos_t, sin_t = rd(cs.get("rope_cos", A)), rd(cs.get("rope_sin", A))   # cos_sin_cache in D

    def gather(b, lo, hi):
        """latent rows [lo, hi) of sequence b from the cache, into the D workspace."""
        if cs.is_fp8():
            code = cs.raw("kv_c")[b, lo:hi].astype(np.float32)
            sc = cs.raw("kv_c_scale")[b, lo:hi].astype(np.float32)
            sc = sc[:, np.arange(r) // FP8_BLOCK] if sc.ndim == 2 else sc[:, None]
            return rd((code * sc).astype(np.float32))
        return cs.get("kv_c", A)[b, lo:hi]

    def gains(name):
        return cs.get(name, A)

    def qk_norm_q(q_nope, q_pe, pos):
        """q [S,H,dqk] in D: QK-norm modules + rotary on the new tokens' queries."""
        if dr:
            cq, sq_ = cos_t[pos][:, None, :], sin_t[pos][:, None, :]
        if cs.norm == "none":
            qc = q_nope
            qr = _rope(nm, q_pe, cq, sq_, cs.rope_style) if dr else None
        elif cs.norm == "blockwise":
            g = np.broadcast_to(gains("gamma_cq"), (H, dc)).copy()
            if bug == "one_head":
                g[-1] = 1
            qc = _rmsnorm(nm, q_nope, g, eps)
            if dr:
                grq = gains("gamma_rq")
                if cs.rope_order == "norm_then_rope":
                    qr = _rope(nm, _rmsnorm(nm, q_pe, grq, eps), cq, sq_, cs.rope_style)
                else:
                    qr = _rmsnorm(nm, _rope(nm, q_pe, cq, sq_, cs.rope_style), grq, eps)
        else:
            g = np.broadcast_to(gains("gamma_q"), (H, dqk)).copy()
            if bug == "one_head":
                g[-1] = 1
            if not dr:
                qc = _rmsnorm(nm, q_nope, g, eps)
            elif cs.rope_order == "norm_then_rope":
                qn = _rmsnorm(nm, np.concatenate([q_nope, q_pe], -1), g, eps)
                qc, qr = qn[..., :dc], _rope(nm, qn[..., dc:], cq, sq_, cs.rope_style)
            else:
                qn = _rmsnorm(nm, np.concatenate([q_nope, _rope(nm, q_pe, cq, sq_, cs.rope_style)], -1),
                              g, eps)
                qc, qr = qn[..., :dc], qn[..., dc:]
        return np.concatenate([qc, qr], -1) if dr else qc

    def keys(b, lo, hi):
        """k [n,H,dqk], v padded [n,H,dvp] (D values) for cached tokens [lo, hi) of sequence b."""
        n = hi - lo
        c = gather(b, lo, hi)                                             # [n, r] D
        kv_nope = rd(np.einsum("nr,rgd->ngd", c, w_uk).astype(A))        # kv_b_proj -> D
        v = rd(np.einsum("nr,rgd->ngd", c, w_uv).astype(A))
        k_nope, v = kv_nope[:, hmap], v[:, hmap]                          # per head
        if dr:
            k_pe = cs.get("k_pe", A)[b, lo:hi]                            # [n, dr]
            pos = np.arange(lo, hi)
            ck, sk = cos_t[pos], sin_t[pos]
        if cs.norm == "none":
            kc = k_nope
            if dr:
                kr = np.broadcast_to(_rope(nm, k_pe, ck, sk, cs.rope_style)[:, None], (n, H, dr))
        elif cs.norm == "blockwise":
            kc = _rmsnorm(nm, k_nope, gains("gamma_ck"), eps)
            if dr:
                grk = gains("gamma_rk")
                if cs.rope_order == "norm_then_rope":
                    kr = _rope(nm, _rmsnorm(nm, k_pe, grk, eps), ck, sk, cs.rope_style)
                else:
                    kr = _rmsnorm(nm, _rope(nm, k_pe, ck, sk, cs.rope_style), grk, eps)
                kr = np.broadcast_to(kr[:, None], (n, H, dr))
        else:
            gk = gains("gamma_k")
            if not dr:
                kc = _rmsnorm(nm, k_nope, gk, eps)
            elif cs.rope_order == "norm_then_rope":
                kpe = np.broadcast_to(k_pe[:, None], (n, H, dr))
                kn = _rmsnorm(nm, np.concatenate([k_nope, kpe], -1), gk, eps)
                kc = kn[..., :dc]
                kr = _rope(nm, kn[..., dc:], ck[:, None], sk[:, None], cs.rope_style)
            else:
                kpe = np.broadcast_to(_rope(nm, k_pe, ck, sk, cs.rope_style)[:, None], (n, H, dr))
                kn = _rmsnorm(nm, np.concatenate([k_nope, kpe], -1), gk, eps)
                kc, kr = kn[..., :dc], kn[..., dc:]
        k = np.concatenate([kc, kr], -1) if dr else kc
        if dvp > dv:
            v = np.concatenate([v, np.zeros((n, H, dvp - dv), A)], -1)   # _pad_v
        return k, v

    out = np.zeros((B, S, H, dv), A)
    lse_all = np.full((B, S, H), -np.inf, A)
    q_nope_all, q_pe_all = cs.get("q_nope", A), (cs.get("q_pe", A) if dr else None)
    for b in range(B):
        T = seqlens[b]
        pos = np.maximum(T - S + np.arange(S), 0)
        q = qk_norm_q(q_nope_all[b], q_pe_all[b] if dr else None, pos)
        # context: chunked, merged in order (_compute_prefill_context)
        o_ctx = lse_ctx = None
        for i in range(nch):
            lo, hi = i * C, min(ctx[b], (i + 1) * C)
            if bug == "one_sequence" and b == B - 1 and hi > lo:
                hi -= 1
            hi = max(hi, lo)
            k, v = keys(b, lo, hi)
            o_i, l_i = _fa2(nm, q, k, v, cs.scale, causal=False, bug=bug)
            if o_ctx is None:
                o_ctx, lse_ctx = o_i, l_i
            else:
                o_new, l_new = _merge(nm, o_ctx, lse_ctx, o_i, l_i, bug)
                o_ctx = o_new
                if bug != "lse_not_updated":
                    lse_ctx = l_new
        # new tokens: causal (keys ctx .. T-1)
        k, v = keys(b, ctx[b], T) if T > 0 else keys(b, 0, 0)
        o_s, l_s = _fa2(nm, q, k, v, cs.scale, causal=cs.causal, bug=bug)
        if nch > 0:                                  # has_context (batch-wide)
            o, l = _merge(nm, o_ctx, lse_ctx, o_s, l_s, bug)
        else:
            o, l = o_s, np.where(np.isinf(l_s), A(-np.inf), l_s)    # FA2's +inf -> conventions' -inf
        o = o[..., :dv]
        if bug == "scale_bias":
            o = o * A(1.01)
        out[b], lse_all[b] = o, l
    return {"out": out.astype(D), "lse": lse_all.astype(A)}
