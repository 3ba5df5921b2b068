"""vLLM's Triton MLA decode (split-KV, two stages) with a QK-norm added, module and kernel level.

Imitated public code (vllm-project/vllm, read for this file, none of it copied):
  - vllm/v1/attention/ops/triton_decode_attention.py (= vllm/attention/ops/... in older trees):
    `_decode_grouped_att_m_fwd` / `_fwd_grouped_kernel_stage1` (BLOCK_N = 32, BLOCK_H = 16,
    grid (batch, head blocks, NUM_KV_SPLITS)), `_decode_softmax_reducev_fwd` / `_fwd_kernel_stage2`
  - vllm/v1/attention/backends/mla/triton_mla.py `TritonMLAImpl.forward_mqa`: num_kv_splits = 4,
    attn_logits [B, H, splits, r + 1] fp32, `o` and `lse` allocated with dtype = q.dtype,
    V = the latent view of the paged cache, fp8 cache dequantized in the kernel
  - the MLA layer around it (MLACommonImpl): `torch.bmm(q_nope, W_UK_T)` and `_v_up_proj`
    (`torch.bmm(x, W_UV)`), both in the model dtype with fp32 accumulation
The kernel arithmetic, per (request, head, split): tiles of BLOCK_N tokens of the split
[split_start, split_end), split length cdiv(seq_len, 4) tokens; kv_loc = block_table[b, n // P]
* P + n % P (P = 16, block 0 is vLLM's null block, NaN here); qk = tl.dot(q, k) fp32;
sm_scale applied to the fp32 scores; online softmax with tl.exp (natural; lowered to
ex2.approx(x * log2 e) in fp32, modelled by fastmath.ex2_approx); acc += tl.dot(p.to(v.dtype),
v); Mid_O = acc / e_sum and e_max + log(e_sum) stored fp32; stage 2 merges the non-empty
splits by their lse (tl.exp), stores acc / e_sum to `o` and e_max + log(e_sum) to `lse`.

QK-norm, added the way a serving engine would (conventions §1.2 default variant, §3):
  - host: gained query g = gamma_cq * gamma_ck in fp32 (unified: gamma_q[:d_c] * gamma_k[:d_c]),
    `(q_nope.float() * g).to(D)`, then `torch.bmm(., W_UK_T)` -> q_latent in D;
    alpha_q = rsqrt(mean(q_nope.float()^2) + eps) fp32 (CUDA's rsqrtf: fastmath.rsqrt_approx) (unified: over [q_nope; q_pe] with the
    rope part raw (norm_then_rope) or rotated (rope_then_norm));
    rope parts: a fused norm + RoPE in fp32 with the case's fp32 tables, written once in D
    (blockwise: normalized rotated; unified: gained rotated, un-normalized; none: rotated)
  - append path: key c . W_UK_g in fp32 (fp8: from the dequantized fp32 latent), alpha_k =
    rsqrt(mean(key^2) + eps) in fp32 (unified: + |k_pe|^2, over d_c + d_r), cached fp32 in a
    side cache [pages, P, G] next to the latent; the kernel reads alpha_k[kv_loc, h // (H/G)]
  - kernel: the latent and rope dots are separate for every d_r (vLLM splits them only at
    Lk = 576/288); blockwise: qk = dot(q, c) * (alpha_q * alpha_k), then + dot(q_pe, k_pe);
    unified: (dot(q, c) + dot(q_pe, k_pe)) * (alpha_q * alpha_k); then qk *= sm_scale
  - kernel level: q_latent, alpha_q, q_rope, kv_c, k_rope, alpha_k read from the case
Rounding points (D = stored dtype):
  1 gained query -> D; 2 q_latent (bmm output) -> D; 3 rope parts -> D; 4 alpha_q, alpha_k fp32;
  5 scores: fp32 accumulate of D x D products, alpha and sm_scale multiplies in fp32;
  6 P -> D before P.V (`p.to(v.dtype)`); row sum e_sum of the unrounded fp32 p; 7 acc fp32;
  8 split partials acc / e_sum and lse_j fp32 (attn_logits); 9 stage-2 merge in fp32,
  o = acc / e_sum -> D (latent_out); 10 lse -> D (vLLM allocates lse with q.dtype);
  11 out = bmm(latent_out (D), W_UV (D)), fp32 accumulate -> D.
fp8 (per-token scale, fp8-block128: per 128-value block): the kernel loads the token's scale
(vLLM's USE_FP8 path has one per-tensor k_scale); k = (code.to(f32) * scale).to(D) for the
score dot, v = code.to(f32) * scale stays fp32, so tl.dot(p.to(fp32), v) runs in Triton's
default TF32 (p and v rounded to a 10-bit mantissa, round-to-nearest emulated); the rope part
is bf16 (not quantized). fp32 and fp64 (not vLLM Triton MLA dtypes: it supports fp16/bf16)
run the same code with input_precision="ieee" dots in fp32 / fp64, P not rounded.
Multi-token decode (S_q > 1): every query token is one decode row with its own seq_len
(pos(i) + 1 causal, T_b otherwise) over the request's block table. A row with seq_len 0
(T_b = 0) is never launched (vLLM schedules no empty decode; the kernel would give 0/0 = NaN):
its out is 0 and its lse -inf. No sparse top-k, no sinks (FEATURES = ()).
Delivered: module out (D), lse (D), latent_out (D); kernel latent_out (D), lse (D).
"""
import numpy as np

from common import BF16, FP8_BLOCK, load
from fastmath import ex2_approx, rsqrt_approx

LEVELS = ("module", "kernel")
FEATURES = ()                       # TritonMLAImpl: no sparse indices, no sink logits
PAGE_SIZE = 16
NUM_KV_SPLITS = 4
BLOCK_N = 32
LOG2E = np.float32(1.4426950408889634)
LN2 = np.float32(0.6931471805599453)

BUGS = {
    "one_head": "the last head reads alpha_k of group (g + 1) % G (group index slip)",
    "one_sequence": "stale seq_lens for the last request: T_b - 1 (the newest token not counted)",
    "row_denominator_bf16": "stage 1 divides acc by e_sum rounded to bf16",
    "scale_bias": "stage-2 output (latent_out) scaled by 1.01",
    "lse_base2": "lse returned in base 2 (times log2 e)",
    "no_rescale": "stage 1 forgets acc *= re_scale when the running max grows",
    "eps_outside_sqrt": "host RMS statistics as 1 / (sqrt(mean) + eps)",
}


def bug_applies(cfg, bug):
    norm, G = cfg.get("norm", "blockwise"), int(cfg["groups"])
    module = cfg.get("level", "module") == "module"
    sl = [int(x) for x in cfg["seqlens"]]
    if bug == "one_head":
        return norm != "none" and G > 1
    if bug == "one_sequence":
        return bool(sl) and sl[-1] >= int(cfg["s_q"]) + 1
    if bug == "no_rescale":                     # needs a split with a second BLOCK_N tile
        return -(-max(sl + [0]) // NUM_KV_SPLITS) > BLOCK_N
    if bug == "eps_outside_sqrt":
        return module and norm != "none"
    return bug in BUGS


# ----------------------------------------------------------------------------- numerics helpers
def _tl_exp(x, A):
    if A == np.float64:
        return np.exp(x)
    with np.errstate(invalid="ignore", over="ignore"):
        return ex2_approx((x * LOG2E).astype(np.float32))


def _tl_log(x, A):
    with np.errstate(divide="ignore", invalid="ignore"):
        if A == np.float64:
            return np.log(x)
        return (np.log2(x).astype(np.float32) * LN2).astype(np.float32)


def _tf32(x):
    """fp32 -> TF32 (10-bit mantissa), round to nearest (ties away), as an fp32 array."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32)
    fin = np.isfinite(x)
    r = ((u + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)
    return np.where(fin, r, x).astype(np.float32)


def _rope(x, cos, sin, style):
    h = x.shape[-1] // 2
    if style == "interleaved":
        a, b = x[..., 0::2], x[..., 1::2]
    else:
        a, b = x[..., :h], x[..., h:]
    ya, yb = a * cos - b * sin, a * sin + b * cos
    if style == "interleaved":
        return np.stack([ya, yb], -1).reshape(x.shape)
    return np.concatenate([ya, yb], -1)


def _dequant32(cs):
    """fp8 cache as the append path / kernel sees it in fp32: code * scale (per token or block)."""
    code = cs.raw("kv_c").astype(np.float32)
    sc = cs.raw("kv_c_scale").astype(np.float32)
    sc = sc[..., np.arange(cs.r) // FP8_BLOCK] if sc.ndim == 3 else sc[..., None]
    return code * sc


# ----------------------------------------------------------------------------- MLA layer (host)
def _mla_prelude(cs, bug):
    """forward (decode path) of the MLA layer up to the kernel call, plus the append path."""
    A, D = cs.accum, cs.stored
    B, S, H, G, r, dc, dr = cs.B, cs.S, cs.H, cs.G, cs.r, cs.dc, cs.dr
    hpg = H // G
    eps = A(cs.eps)

    def rsqrt_stat(ms):                        # torch.rsqrt(var + eps) in fp32: CUDA's rsqrtf
        if bug == "eps_outside_sqrt":
            return A(1) / (np.sqrt(ms) + eps)
        return rsqrt_approx(ms + eps) if A == np.float32 else A(1) / np.sqrt(ms + eps)

    T_max = cs.raw("kv_c").shape[1]
    q_nope = cs.get("q_nope", A)
    # W_UK_T per head [H, dc, r] in D (process_weights_after_loading: a view of kv_b_proj)
    w_uk = cs.raw("w_uk").reshape(r, G, dc)
    w_uk_t = np.transpose(w_uk, (1, 2, 0))[np.arange(H) // hpg]          # [H, dc, r], D
    c32 = _dequant32(cs).astype(A) if cs.is_fp8() else cs.get("kv_c", A)
    pos = np.array([[max(T - S + i, 0) for i in range(S)] for T in cs.seqlens])
    if dr:
        cos, sin = cs.get("rope_cos", A), cs.get("rope_sin", A)
        qcs = (cos[pos][:, :, None, :], sin[pos][:, :, None, :])
        kcs = (cos[:T_max][None], sin[:T_max][None])
        q_pe, k_pe = cs.get("q_pe", A), cs.get("k_pe", A)
        rq = lambda x: _rope(x, *qcs, cs.rope_style)            # noqa: E731
        rk = lambda x: _rope(x, *kcs, cs.rope_style)            # noqa: E731
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        # append path: transient fp32 content key per group
        key = np.einsum("btr,rgd->btgd", c32, w_uk.astype(A))             # [B,T,G,dc]
        alpha_q = alpha_k = None
        q_rope = k_rope = None
        if cs.norm == "none":
            q_in = cs.raw("q_nope")
            if dr:
                q_rope, k_rope = rq(q_pe), rk(k_pe)
        elif cs.norm == "blockwise":
            g = cs.get("gamma_cq", A) * cs.get("gamma_ck", A)
            q_in = (q_nope * g).astype(D)
            alpha_q = rsqrt_stat(np.mean(q_nope * q_nope, -1))
            alpha_k = rsqrt_stat(np.mean(key * key, -1))
            if dr:
                grq, grk = cs.get("gamma_rq", A), cs.get("gamma_rk", A)
                nrm = lambda x, w: x * rsqrt_stat(np.mean(x * x, -1))[..., None] * w  # noqa: E731
                if cs.rope_order == "norm_then_rope":
                    q_rope, k_rope = rq(nrm(q_pe, grq)), rk(nrm(k_pe, grk))
                else:
                    q_rope, k_rope = nrm(rq(q_pe), grq), nrm(rk(k_pe), grk)
        else:
            gq, gk = cs.get("gamma_q", A), cs.get("gamma_k", A)
            q_in = (q_nope * (gq[:dc] * gk[:dc])).astype(D)
            ssq_q = np.sum(q_nope * q_nope, -1)
            ssq_k = np.sum(key * key, -1)
            if dr:
                if cs.rope_order == "norm_then_rope":
                    qs, ks = q_pe, k_pe
                    q_rope, k_rope = rq(q_pe * gq[dc:]), rk(k_pe * gk[dc:])
                else:
                    qs, ks = rq(q_pe), rk(k_pe)
                    q_rope, k_rope = qs * gq[dc:], ks * gk[dc:]
                ssq_q = ssq_q + np.sum(qs * qs, -1)
                ssq_k = ssq_k + np.sum(ks * ks, -1)[..., None]
            alpha_q = rsqrt_stat(ssq_q / A(dc + dr))
            alpha_k = rsqrt_stat(ssq_k / A(dc + dr))
        # decode_ql_nope = torch.bmm(q_nope (N,B,P), W_UK_T (N,P,L)): D in, fp32 acc, D out
        q_lat = np.einsum("bshd,hdr->bshr", q_in.astype(A), w_uk_t.astype(A)).astype(D)
    ki = {"q_latent": q_lat, "kv_c": cs.raw("kv_c")}
    if cs.is_fp8():
        ki["kv_c_scale"] = cs.raw("kv_c_scale")
    if alpha_q is not None:
        ki["alpha_q"], ki["alpha_k"] = alpha_q.astype(A), alpha_k.astype(A)
    if dr:
        ki["q_rope"], ki["k_rope"] = q_rope.astype(D), k_rope.astype(D)
    return ki


def _case_kernel_inputs(cs):
    names = ("q_latent", "alpha_q", "q_rope", "kv_c", "kv_c_scale", "k_rope", "alpha_k")
    return {k: cs.raw(k) for k in names if cs.has(k)}


# ----------------------------------------------------------------------------- paged cache
def _paged_cache(cs, ki):
    """Copy the dense cache into a page pool: block 0 is the null block, the sequences' pages are
    handed out shuffled, every unfilled slot is NaN, block_table padded with 0."""
    B, G = cs.B, cs.G
    P = PAGE_SIZE
    npg = [-(-T // P) for T in cs.seqlens]
    total = 1 + sum(npg)
    ids = 1 + np.random.default_rng(4321).permutation(total - 1)
    bt = np.zeros((B, max(npg + [1])), np.int64)
    k = 0
    for b in range(B):
        bt[b, :npg[b]] = ids[k:k + npg[b]]
        k += npg[b]
    nslot = total * P

    def pool(x, fill):
        out = np.full((nslot,) + x.shape[2:], fill, x.dtype)
        for b in range(B):
            for t in range(cs.seqlens[b]):
                out[bt[b, t // P] * P + t % P] = x[b, t]
        return out

    nan_c = np.nan
    pc = {"kv_c": pool(ki["kv_c"], nan_c)}
    if "kv_c_scale" in ki:
        pc["kv_c_scale"] = pool(ki["kv_c_scale"].astype(np.float32), np.nan)
    if "k_rope" in ki:
        pc["k_rope"] = pool(ki["k_rope"], np.nan)
    if "alpha_k" in ki:
        pc["alpha_k"] = pool(ki["alpha_k"], np.nan)
    return pc, bt


# ----------------------------------------------------------------------------- the kernel
def _load_latent(cs, pc, loc, A, D):
    """(k for the score dot, v for P.V) of the slots `loc`, as the kernel holds them."""
    if "kv_c_scale" not in pc:
        c = pc["kv_c"][loc]
        return c.astype(A), c
    sc = pc["kv_c_scale"][loc]
    sc = sc[:, np.arange(cs.r) // FP8_BLOCK] if sc.ndim == 2 else sc[:, None]
    v32 = pc["kv_c"][loc].astype(np.float32) * sc                 # k.to(f32) * k_scale
    return v32.astype(D).astype(A), v32                            # k.to(q.dtype); v stays fp32


def _stage1(cs, ki, pc, bt, b, q, qpe, aq, seq_len, bug):
    """_fwd_grouped_kernel_stage1 for one request row b (all heads): [splits] of (Mid_O, lse)."""
    A, D = cs.accum, cs.stored
    H, G = cs.H, cs.G
    gmap = np.arange(H) // (H // G)
    if bug == "one_head":
        gmap = gmap.copy()
        gmap[-1] = (gmap[-1] + 1) % G
    fp8 = "kv_c_scale" in pc
    low = A == np.float32 and D != np.float32                      # P rounded to D (bf16/fp16)
    sm_scale = A(cs.scale)
    kps = -(-seq_len // NUM_KV_SPLITS)
    parts = []
    for sid in range(NUM_KV_SPLITS):
        s0 = kps * sid
        s1 = min(s0 + kps, seq_len)
        if s1 <= s0:
            parts.append(None)
            continue
        e_max = np.full(H, -np.inf, A)
        e_sum = np.zeros(H, A)
        acc = np.zeros((H, cs.r), A)
        for n0 in range(s0, s1, BLOCK_N):
            offs = np.arange(n0, min(n0 + BLOCK_N, s1))
            loc = bt[b, offs // PAGE_SIZE] * PAGE_SIZE + offs % PAGE_SIZE
            k, v = _load_latent(cs, pc, loc, A, D)
            with np.errstate(invalid="ignore", over="ignore"):
                qk = q @ k.T                                       # tl.dot(q, k), fp32 acc
                if aq is not None:
                    al = aq[:, None] * pc["alpha_k"][loc][:, gmap].T.astype(A)
                    if cs.norm != "unified":
                        qk = qk * al
                if qpe is not None:
                    qk = qk + qpe @ pc["k_rope"][loc].astype(A).T
                if aq is not None and cs.norm == "unified":
                    qk = qk * al
                qk = qk * sm_scale
                n_e_max = np.maximum(qk.max(1), e_max)
                re_scale = _tl_exp(e_max - n_e_max, A)
                p = _tl_exp(qk - n_e_max[:, None], A)
                if bug != "no_rescale":
                    acc = acc * re_scale[:, None]
                if fp8 and A == np.float32:
                    acc = acc + _tf32(p) @ _tf32(v)                # tl.dot(p fp32, v fp32): TF32
                elif low:
                    acc = acc + p.astype(D).astype(A) @ v.astype(A)   # tl.dot(p.to(D), v)
                else:
                    acc = acc + p @ v.astype(A)
                e_sum = e_sum * re_scale + p.sum(1)
                e_max = n_e_max
        den = e_sum.astype(BF16).astype(A) if bug == "row_denominator_bf16" else e_sum
        with np.errstate(invalid="ignore", divide="ignore"):
            parts.append(((acc / den[:, None]).astype(A), (e_max + _tl_log(e_sum, A)).astype(A)))
    return parts


def _stage2(parts, H, r, A):
    e_sum = np.zeros(H, A)
    e_max = np.full(H, -np.inf, A)
    acc = np.zeros((H, r), A)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        for pr in parts:
            if pr is None:                                         # split_kv_end <= split_kv_start
                continue
            tv, tlogic = pr
            n_e_max = np.maximum(tlogic, e_max)
            old_scale = _tl_exp(e_max - n_e_max, A)
            acc = acc * old_scale[:, None]
            exp_logic = _tl_exp(tlogic - n_e_max, A)
            acc = acc + exp_logic[:, None] * tv
            e_sum = e_sum * old_scale + exp_logic
            e_max = n_e_max
        return acc / e_sum[:, None], e_max + _tl_log(e_sum, A)


def run(case, bug=None):
    cs = load(case)
    A, D = cs.accum, cs.stored
    B, S, H, G, r = cs.B, cs.S, cs.H, cs.G, cs.r
    ki = _mla_prelude(cs, bug) if cs.level == "module" else _case_kernel_inputs(cs)
    pc, bt = _paged_cache(cs, ki)
    o = np.zeros((B, S, H, r), D)                                  # torch.zeros(..., q.dtype)
    lse = np.full((B, S, H), -np.inf, D)
    q_all = ki["q_latent"].astype(A)
    qpe_all = ki["q_rope"].astype(A) if "q_rope" in ki and cs.dr else None
    aq_all = ki["alpha_q"].astype(A) if "alpha_q" in ki else None
    for b in range(B):
        T = cs.seqlens[b]
        if T == 0:
            continue                                               # no decode row launched
        for i in range(S):
            seq_len = T - S + i + 1 if cs.causal else T
            if bug == "one_sequence" and b == B - 1:
                seq_len -= 1                                       # stale seq_lens
            parts = _stage1(cs, ki, pc, bt, b, q_all[b, i],
                            None if qpe_all is None else qpe_all[b, i],
                            None if aq_all is None else aq_all[b, i], seq_len, bug)
            ob, lb = _stage2(parts, H, r, A)
            if bug == "scale_bias":
                ob = ob * A(1.01)
            o[b, i] = ob.astype(D)
            lse[b, i] = lb.astype(D)
    if bug == "lse_base2":
        lse = (lse.astype(A) * A(1.4426950408889634)).astype(D)
    if cs.level == "kernel":
        return {"latent_out": o, "lse": lse}
    # _v_up_proj: torch.bmm(o (N,B,L), W_UV (N,L,V)) in D, fp32 accumulate
    w_uv = cs.raw("w_uv").reshape(r, G, cs.dv)[:, np.arange(H) // (H // G), :]   # [r,H,dv]
    out = np.einsum("bshr,rhv->bshv", o.astype(A), w_uv.astype(A)).astype(D)
    return {"out": out, "lse": lse, "latent_out": o}
