"""Attention computed in chunks whose outputs are stored in the activation dtype D and merged by lse.

Module level: SGLang's DeepSeek-V2/V3 "MHA with chunked prefix cache" (explicit form; audited with
`--form explicit`), as `forward_normal_chunked_kv_prepare` / `forward_normal_chunked_kv_core` and
`_chunked_prefix_attn_mha` (sglang srt/models/deepseek_v2.py, later
deepseek_common/attention_forward_methods/forward_mha.py) run it, plus a QK-norm in module form:
  - keys and values from the latent through `kv_b_proj`: c (D) . [W_UK_g | W_UV_g], fp32
    accumulate, one rounding to D (fp8 cache: code * scale in fp32, cast to D = bf16 as
    `_get_mla_kv_buffer(..., q.dtype)` does; fp8-block128: each value times its 128-block's scale);
  - QK-norm as an RMSNorm module (flashinfer/sgl-kernel rmsnorm: fp32 statistic, x * rrms * w in
    fp32, one rounding to D) and RoPE as the rotary module (fp32 math on the D input with the fp32
    tables, written in D): each module's output is stored in D, so norm -> rope (or rope -> norm)
    rounds twice; unified norm: one RMSNorm over [content; rope] per group;
  - the extend part (the S_q query tokens' own keys, causal among themselves) runs first with
    `mha_return_lse`; the prefix [0, T_b - S_q) is cut by `prepare_chunked_prefix_cache_info` /
    `get_prefix_chunk_seq_lens` into chunks of `prefix_chunk_len` tokens shared by the batch
    (here max(4, ceil(max prefix / 4)): up to 4 chunks for the longest prefix; shorter prefixes
    get empty chunks), each chunk attended without a mask;
  - every attention call is a FlashAttention-2/3-style kernel: fp32 scores, 128-token key blocks
    with an fp32 online softmax, the unnormalized P rounded to D before P.V, fp32 accumulator,
    divided by the fp32 row sum, output stored in D, lse = m + log(l) fp32 (natural), +inf for a
    row without keys (FA2's non-split epilogue);
  - each chunk is merged into the accumulator by sgl-kernel `merge_state_v2`
    (csrc/attention/merge_attn_states.cu, `merge_attn_states_kernel`): +-inf lse read as -inf,
    max shift, expf weights p_se / (p_se + s_se), one fp32 FMA per element, stored in D; merged
    lse = logf(sum) + max. The running output is thus re-rounded to D after every merge.
Kernel level: FlashInfer split-KV / cascade (include/flashinfer/attention/cascade.cuh,
`MergeStateInPlaceKernel`; flashinfer/cascade.py `merge_state_in_place`): the cache [0, T_b) cut
into chunks of one batch-wide size max(4, ceil(max T_b / 4)); each chunk's partial computed in
fp32 with the scale * log2(e) folded (base-2 softmax, exp2, P unrounded), stored in D with its
base-2 lse; merged in place chunk by chunk (exp2 weights, fp32, stored in D); lse converted to
natural log at the end (* ln 2, fp32). exp2/log2 are numpy's (correctly rounded), not ptx approx.
fp64 profile: every step in fp64 (D = A = fp64). No top-k, no sinks (FEATURES empty).
Outputs: module `out` (D), `lse` (fp32); kernel `latent_out` (D), `lse` (fp32).
"""
import numpy as np

from common import BF16, FP8_BLOCK, load

LEVELS = ("module", "kernel")
PROFILES = ("fp64", "fp32", "bf16", "fp16", "fp8", "fp8-block128")
FEATURES = ()
AUDIT_ARGS = ("--form", "explicit")     # the module-level design is the explicit form
FA_BLOCK_N = 128                         # key block of the FlashAttention-style kernel


def audit_args(cfg):
    """The form a module-level run declares; a kernel-level run is absorbed (no --form needed)."""
    return AUDIT_ARGS if cfg.get("level", "module") == "module" else ()


# ----------------------------------------------------------------------------- chunking
def _chunk_len(longest):
    return max(4, -(-longest // 4)) if longest > 0 else 4


def module_chunks(cfg):
    """(prefix_chunk_len, num_prefix_chunks) as SGLang's batch-wide chunking computes them."""
    S = int(cfg["s_q"])
    pre = [max(int(T) - S, 0) for T in cfg["seqlens"] if int(T) > 0]
    mp = max(pre) if pre else 0
    cl = _chunk_len(mp)
    return cl, (-(-mp // cl) if mp else 0)


def kernel_chunk_len(cfg):
    return _chunk_len(max(int(T) for T in cfg["seqlens"]))


def _ranges(n, cl, count, overlap=False):
    """[start, end) of chunk i: [i*cl, min((i+1)*cl, n)), empty past n; overlap (bug one_sequence):
    every chunk after the first starts one token early."""
    out = []
    for i in range(count):
        a = i * cl
        e = min(a + cl, n)
        if e <= a:
            out.append((a, a))
            continue
        if overlap and i > 0:
            a -= 1
        out.append((a, e))
    return out


# ----------------------------------------------------------------------------- helpers
def _fma32(a, b, c):
    """fp32 fma(a, b, c): the exact product a*b (fp64 holds it) plus c, rounded once to fp32."""
    return (a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(np.float32)


def _rope(x, cos, sin, style):
    d2 = x.shape[-1] // 2
    if style == "interleaved":
        a, b = x[..., 0::2], x[..., 1::2]
    else:
        a, b = x[..., :d2], x[..., d2:]
    y1 = a * cos - b * sin
    y2 = a * sin + b * cos
    if style == "interleaved":
        return np.stack([y1, y2], -1).reshape(x.shape)
    return np.concatenate([y1, y2], -1)


def _dequant(cs, b, T):
    """The sequence's latent cache [T, r] in the accumulate type (fp8: code * scale in fp32)."""
    A = cs.accum
    if not cs.is_fp8():
        return cs.raw("kv_c")[b, :T].astype(A)
    sc = cs.raw("kv_c_scale")[b, :T].astype(np.float32)
    sc = sc[:, np.arange(cs.r) // FP8_BLOCK] if sc.ndim == 2 else sc[:, None]
    return (cs.raw("kv_c")[b, :T].astype(np.float32) * sc).astype(np.float32).astype(A)


# ----------------------------------------------------------------------------- module prelude
class _Module:
    """The module's D tensors, read back in the accumulate type."""

    def __init__(self, cs, bug):
        self.cs, self.bug = cs, bug
        A, D = cs.accum, cs.stored
        self.A, self.D = A, D
        self.rd = lambda x: np.asarray(x, A).astype(D).astype(A)   # noqa: E731
        self.eps = A(cs.eps)
        self.gmap = np.arange(cs.H) // (cs.H // cs.G)

    def rms(self, x, w):
        """RMSNorm module: fp32 statistic, x * rrms * w in fp32, stored in D."""
        with np.errstate(invalid="ignore", divide="ignore"):
            rr = self.A(1) / np.sqrt(np.mean(x * x, -1, keepdims=True) + self.eps)
        return self.rd(x * rr * w)

    def rot(self, x, pos):
        """Rotary module at positions pos (x [..., n, (heads,) d_r], pos [n]), stored in D."""
        cs = self.cs
        cos = cs.get("rope_cos", self.A)[pos]
        sin = cs.get("rope_sin", self.A)[pos]
        shape = (len(pos),) + (1,) * (x.ndim - 2) + (cos.shape[-1],)
        return self.rd(_rope(x, cos.reshape(shape), sin.reshape(shape), cs.rope_style))

    def queries(self, b, T):
        """q [S, H, d_c + d_r] in D (as A) for sequence b at positions T - S + i."""
        cs, A = self.cs, self.A
        S, dc, dr = cs.S, cs.dc, cs.dr
        qn = cs.get("q_nope", A)[b]                       # [S,H,dc] (D values)
        pos = np.arange(T - S, T)
        if dr:
            qp = cs.get("q_pe", A)[b]
        if cs.norm == "none":
            return np.concatenate([qn, self.rot(qp, pos)], -1) if dr else qn
        if cs.norm == "blockwise":
            qc = self.rms(qn, cs.get("gamma_cq", A))
            if not dr:
                return qc
            g = cs.get("gamma_rq", A)
            if cs.rope_order == "norm_then_rope":
                qr = self.rot(self.rms(qp, g), pos)
            else:
                qr = self.rms(self.rot(qp, pos), g)
            return np.concatenate([qc, qr], -1)
        g = cs.get("gamma_q", A)                          # unified
        if not dr:
            return self.rms(qn, g)
        if cs.rope_order == "norm_then_rope":
            qq = self.rms(np.concatenate([qn, qp], -1), g)
            return np.concatenate([qq[..., :dc], self.rot(qq[..., dc:], pos)], -1)
        return self.rms(np.concatenate([qn, self.rot(qp, pos)], -1), g)

    def keys_values(self, b, T):
        """k [T, G, d_c + d_r], v [T, G, d_v] in D (as A) for tokens [0, T) of sequence b."""
        cs, A = self.cs, self.A
        G, r, dc, dr, dv = cs.G, cs.r, cs.dc, cs.dr, cs.dv
        c = self.rd(_dequant(cs, b, T))                  # the kv_b_proj input, in D
        w = np.concatenate([cs.get("w_uk", A).reshape(r, G, dc), cs.get("w_uv", A).reshape(r, G, dv)], -1)
        kv = self.rd(np.einsum("tr,rgd->tgd", c, w))      # kv_b_proj: fp32 acc, out in D
        kn, v = kv[..., :dc], kv[..., dc:]
        pos = np.arange(T)
        if dr:
            kp = cs.get("k_pe", A)[b, :T]                 # [T, dr]
        if cs.norm == "none":
            if not dr:
                return kn, v
            kr = self.rot(kp, pos)
            return np.concatenate([kn, np.repeat(kr[:, None], G, 1)], -1), v
        if cs.norm == "blockwise":
            kc = self.rms(kn, cs.get("gamma_ck", A))
            if not dr:
                return kc, v
            g = cs.get("gamma_rk", A)
            if cs.rope_order == "norm_then_rope":
                kr = self.rot(self.rms(kp, g), pos)
            else:
                kr = self.rms(self.rot(kp, pos), g)
            return np.concatenate([kc, np.repeat(kr[:, None], G, 1)], -1), v
        g = cs.get("gamma_k", A)                          # unified: per group
        if not dr:
            return self.rms(kn, g), v
        if cs.rope_order == "norm_then_rope":
            kk = self.rms(np.concatenate([kn, np.repeat(kp[:, None], G, 1)], -1), g)
            return np.concatenate([kk[..., :dc], self.rot(kk[..., dc:], pos)], -1), v
        kr = self.rot(kp, pos)
        return self.rms(np.concatenate([kn, np.repeat(kr[:, None], G, 1)], -1), g), v


# ----------------------------------------------------------------------------- FA-style kernel
def _flash(q, k, v, scale, A, D, mask=None, bug=None):
    """FlashAttention-2/3-style forward over keys [n] in FA_BLOCK_N blocks.
    q [S,H,d], k [n,H,d], v [n,H,dv] (D values as A); mask [S,n] bool or None.
    fp32 scores * scale, online softmax in fp32, unnormalized P rounded to D for P.V, fp32
    accumulator, O / l stored in D; lse = m + log(l) (A), +inf where a row has no key."""
    S, H = q.shape[0], q.shape[1]
    dv = v.shape[-1]
    n = k.shape[0]
    m = np.full((S, H), -np.inf, A)
    l = np.zeros((S, H), A)
    acc = np.zeros((S, H, dv), A)
    for a in range(0, n, FA_BLOCK_N):
        e = min(a + FA_BLOCK_N, n)
        s = np.einsum("shd,thd->sht", q, k[a:e]).astype(A) * A(scale)
        if mask is not None:
            s = np.where(mask[:, None, a:e], s, A(-np.inf))
        m_new = np.maximum(m, s.max(-1))
        m_use = np.where(np.isfinite(m_new), m_new, A(0))
        corr = np.exp(m - m_use)
        p = np.exp(s - m_use[..., None])
        l = l * corr + p.sum(-1)
        acc = acc * corr[..., None] + np.einsum("sht,thd->shd", p.astype(D).astype(A), v[a:e])
        m = m_new
    has = l > 0
    den = l.astype(BF16).astype(A) if bug == "row_denominator_bf16" else l
    with np.errstate(divide="ignore", invalid="ignore"):
        o = np.where(has[..., None], acc / np.where(has, den, 1)[..., None], A(0))
        lse = np.where(has, m + np.log(np.where(has, l, 1)), A(np.inf))
    return o.astype(D), lse.astype(A)


def _merge_state_v2(v_a, s_a, v_b, s_b, A, D, bug=None, n_a=None, n_b=None):
    """sgl-kernel merge_state_v2 (natural-log lse, fp32 math): returns (v_merged in D, s_merged)."""
    if bug != "empty_chunk_inf":
        s_a = np.where(np.isinf(s_a), A(-np.inf), s_a)
        s_b = np.where(np.isinf(s_b), A(-np.inf), s_b)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        mx = np.maximum(s_a, s_b)
        pa = np.exp(s_a - mx)
        pb = np.exp(s_b - mx)
        tot = pa + pb
        wa, wb = pa / tot, pb / tot
        if bug == "merge_by_count":
            na = np.broadcast_to(A(n_a), wa.shape)
            nb = np.broadcast_to(A(n_b), wb.shape)
            wa, wb = na / (na + nb), nb / (na + nb)
        va, vb = v_a.astype(A), v_b.astype(A)
        if A == np.float32:
            o = _fma32(va, wa[..., None], (vb * wb[..., None]).astype(np.float32))
        else:
            o = va * wa[..., None] + vb * wb[..., None]
        lse = np.log(tot) + mx
    return o.astype(D), lse.astype(A)


def _run_module(cs, bug):
    A, D = cs.accum, cs.stored
    B, S, H, dv = cs.B, cs.S, cs.H, cs.dv
    mod = _Module(cs, bug)
    out = np.zeros((B, S, H, dv), D)
    lse = np.full((B, S, H), -np.inf, A)
    cl, nch = module_chunks(cs.cfg)
    for b in range(B):
        T = cs.seqlens[b]
        if T == 0:
            continue                                     # out = 0, lse = -inf
        P = T - S
        last = bug == "one_sequence" and b == B - 1
        q = mod.queries(b, T)                            # [S,H,dk]
        k, v = mod.keys_values(b, T)
        k, v = k[:, mod.gmap], v[:, mod.gmap]            # per head
        # extend part: the S query tokens' own keys, causal among themselves
        e0 = P - 1 if (last and P > 0) else P
        mask = None
        if cs.causal and bug != "extend_not_causal":
            mask = np.arange(e0, T)[None, :] <= np.arange(T - S, T)[:, None]
        acc_o, acc_s = _flash(q, k[e0:T], v[e0:T], cs.scale, A, D, mask, bug)
        acc_n = T - e0
        prev_s = acc_s
        # chunked prefix: every chunk fully visible to every query row
        for (a, e) in _ranges(P, cl, nch, overlap=last):
            o_c, s_c = _flash(q, k[a:e], v[a:e], cs.scale, A, D, None, bug)
            s_used = s_c
            if bug == "one_head":                        # last head reads the previous chunk's lse
                s_used = s_c.copy()
                s_used[:, -1] = prev_s[:, -1]
            acc_o, acc_s = _merge_state_v2(o_c, s_used, acc_o, acc_s, A, D, bug, e - a, acc_n)
            acc_n += e - a
            prev_s = s_c
        out[b] = acc_o
        lse[b] = acc_s
    if bug == "scale_bias":
        out = (out.astype(A) * A(1.01)).astype(D)
    if bug == "lse_base2":
        lse = (lse / A(np.log(2.0))).astype(A)
    return {"out": out, "lse": lse}


# ----------------------------------------------------------------------------- kernel level
def _partial_base2(q, qr, c, kr, al_q, al_k, cs, A, D, mask, bug):
    """One chunk's partial (FlashInfer style, base 2): fp32 scores, scale*log2e folded, exp2,
    P unrounded, o / d stored in D, lse2 = m + log2(d) (-inf, o = 0 where a row sees nothing)."""
    s = np.einsum("shr,tr->sht", q, c)
    if qr is not None:
        sr = np.einsum("shd,td->sht", qr, kr)
    if al_q is not None:
        al = al_q[:, :, None] * al_k.T[None]              # [S,H,n]
        if qr is None:
            s = s * al
        elif cs.norm == "unified":
            s = (s + sr) * al
        else:
            s = s * al + sr
    elif qr is not None:
        s = s + sr
    s = s * (A(cs.scale) * A(np.log2(np.e)))
    if mask is not None:
        s = np.where(mask[:, None, :], s, A(-np.inf))
    m = s.max(-1)
    has = np.isfinite(m)
    m0 = np.where(has, m, A(0))
    p = np.exp2(s - m0[..., None])
    d = p.sum(-1)
    den = d.astype(BF16).astype(A) if bug == "row_denominator_bf16" else d
    o = np.einsum("sht,tr->shr", p, c)
    with np.errstate(divide="ignore", invalid="ignore"):
        o = np.where(has[..., None], o / np.where(has, den, 1)[..., None], A(0))
        lse2 = np.where(has, m0 + np.log2(np.where(has, d, 1)), A(-np.inf))
    return o.astype(D), lse2.astype(A)


def _merge_in_place(v, s, v_o, s_o, A, D, bug=None, n=None, n_o=None):
    """FlashInfer MergeStateInPlaceKernel: base-2 lse, fp32 math, v updated in D."""
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        mx = np.maximum(s, s_o)
        a = np.exp2(s - mx)
        b = np.exp2(s_o - mx)
        sc, sco = a / (a + b), b / (a + b)
        if bug == "merge_by_count":
            na = np.broadcast_to(A(n), sc.shape)
            nb = np.broadcast_to(A(n_o), sc.shape)
            sc, sco = na / (na + nb), nb / (na + nb)
        va, vb = v.astype(A), v_o.astype(A)
        if A == np.float32:
            o = _fma32(sc[..., None], va, (sco[..., None] * vb).astype(np.float32))
        else:
            o = sc[..., None] * va + sco[..., None] * vb
        s_new = np.log2(a + b) + mx
    return o.astype(D), s_new.astype(A)


def _run_kernel(cs, bug):
    A, D = cs.accum, cs.stored
    B, S, H, r = cs.B, cs.S, cs.H, cs.r
    gmap = np.arange(H) // (H // cs.G)
    lat = np.zeros((B, S, H, r), D)
    lse = np.full((B, S, H), -np.inf, A)
    has_rope = cs.dr > 0 and cs.has("q_rope")
    has_alpha = cs.has("alpha_q") and cs.has("alpha_k")
    cl = kernel_chunk_len(cs.cfg)
    for b in range(B):
        T = cs.seqlens[b]
        if T == 0:
            continue
        last = bug == "one_sequence" and b == B - 1
        c = _dequant(cs, b, T)
        q = cs.get("q_latent", A)[b]
        qr = cs.get("q_rope", A)[b] if has_rope else None
        kr = cs.get("k_rope", A)[b, :T] if has_rope else None
        aq = cs.get("alpha_q", A)[b] if has_alpha else None
        ak = cs.get("alpha_k", A)[b, :T][:, gmap] if has_alpha else None     # [T,H]
        pos = np.arange(T - S, T)
        acc = None
        prev_s = None
        for (a, e) in _ranges(T, cl, -(-T // cl), overlap=last):
            tk = np.arange(a, e)
            mask = (tk[None, :] <= pos[:, None]) if cs.causal else None
            o_c, s_c = _partial_base2(q, qr, c[a:e], kr[a:e] if has_rope else None, aq,
                                      ak[a:e] if has_alpha else None, cs, A, D, mask, bug)
            if acc is None:
                acc, acc_s, acc_n = o_c, s_c, e - a
            else:
                s_used = s_c
                if bug == "one_head":
                    s_used = s_c.copy()
                    s_used[:, -1] = prev_s[:, -1]
                acc, acc_s = _merge_in_place(acc, acc_s, o_c, s_used, A, D, bug, acc_n, e - a)
                acc_n += e - a
            prev_s = s_c
        lat[b] = acc
        lse[b] = acc_s if bug == "lse_base2" else (acc_s * A(np.log(2.0))).astype(A)
    if bug == "scale_bias":
        lat = (lat.astype(A) * A(1.01)).astype(D)
    return {"latent_out": lat, "lse": lse}


def run(case, bug=None):
    cs = load(case)
    if cs.features():
        raise ValueError("chunked_merge runs neither sparse top-k nor attention sinks")
    with np.errstate(invalid="ignore", over="ignore"):
        return _run_kernel(cs, bug) if cs.level == "kernel" else _run_module(cs, bug)


BUGS = {
    "one_head": "the last head's merge reads the previous chunk's lse instead of its own chunk's",
    "one_sequence": "the last sequence's chunk ranges overlap by one token (each later chunk starts one early)",
    "row_denominator_bf16": "each chunk's softmax row sum rounded to bf16 before the division",
    "scale_bias": "out (kernel level: latent_out) scaled by 1.01",
    "merge_by_count": "merge weights by the chunks' token counts instead of their lse",
    "lse_base2": "lse returned in base 2 (module: log2 of the sum; kernel: FlashInfer's lse not converted)",
    "empty_chunk_inf": "module: the merge takes FA's +inf lse of an empty prefix chunk as is (no isinf -> -inf)",
    "extend_not_causal": "module: the extend part (the S_q query tokens) attended without its causal mask",
}


def bug_applies(cfg, bug):
    S = int(cfg["s_q"])
    sl = [int(T) for T in cfg["seqlens"]]
    if cfg.get("topk") or cfg.get("attn_sink"):
        return False
    kernel = cfg.get("level", "module") == "kernel"
    live = [T for T in sl if T > 0]
    if not live:
        return False
    if bug in ("scale_bias", "lse_base2"):
        return True
    if bug == "row_denominator_bf16":
        return max(live) >= 2
    if kernel:
        cl = kernel_chunk_len(cfg)
        if bug in ("one_head", "merge_by_count"):
            return max(live) > cl
        if bug == "one_sequence":
            return sl[-1] > cl
        return False                                     # empty_chunk_inf, extend_not_causal
    cl, nch = module_chunks(cfg)
    if bug in ("one_head", "merge_by_count"):
        return any(T > S for T in live)
    if bug == "one_sequence":
        return sl[-1] > S
    if bug == "empty_chunk_inf":
        return any(-(-(T - S) // cl) < nch for T in live)
    if bug == "extend_not_causal":
        return bool(cfg.get("causal", True)) and S >= 2
    return False
