"""FlashInfer-like batch MLA decode over a paged cache, with its fp8 KV handling.

The engine builds a paged layout (page_size 16, pages in a shuffled pool addressed by
kv_indptr / kv_indices / kv_last_page_len, unused slots NaN as in a real pool) and calls a
two-pass kernel per request:
  - K/V load: each page gathered through kv_indices with a predicated load (slots past the
    request's length read as 0). fp8 profile: the e4m3 codes are dequantized (code * per-token
    scale, fp32) and rounded to bf16 before the dot products, as FlashInfer's fp8 MLA path
    feeds bf16 tensor cores;
  - scores in fp32 in base 2 (sm_scale * log2(e) applied to the fp32 logits), softmax in fp32
    (row max, exp2 through ex2.approx: fastmath.ex2_approx; row sum), P kept fp32 for P.V, fp32 accumulation;
  - FlashInfer's lse is base 2: the adapter converts it to the natural log (* ln 2);
  - latent_out written in the stored dtype (bf16 in fp8).
fp8-block128: the scale page holds ceil(r/128) scales per slot, value j takes scale j // 128
(then bf16, exact). Not applicable to top-k and sink cases (FEATURES = ()).
In the other profiles it is a plain fp32-accumulate kernel with stored-dtype output (fp64 in fp64).
Host: absorb.py prelude; out = latent_out(stored) . W_UV, fp32 accumulation, stored dtype.
"""
import numpy as np

from absorb import kernel_inputs
from common import BF16, FP8_BLOCK, load
from fastmath import ex2_approx

LEVELS = ("module", "kernel")
PAGE = 16
LOG2E = 1.4426950408889634


def build_pages(cs, ki, bug=None):
    """Copy the contiguous cache into a shuffled page pool; returns pool tensors + metadata."""
    B, T_max = cs.B, ki["kv_c"].shape[1]
    npages = [-(-T // PAGE) for T in cs.seqlens]
    total = sum(npages) + 1
    perm = np.random.default_rng(1234).permutation(total)      # page ids handed out by the pool
    kv_indptr = np.concatenate([[0], np.cumsum(npages)]).astype(np.int32)
    kv_indices = perm[:sum(npages)].astype(np.int32)
    r = ki["kv_c"].shape[2]
    dr = ki["k_rope"].shape[2] if "k_rope" in ki else 0
    ckv = np.full((total, PAGE, r), np.nan, np.float32 if cs.accum == np.float32 else np.float64)
    kpe = np.full((total, PAGE, dr), np.nan, ckv.dtype)
    sc_in = ki["kv_c_scale"] if cs.is_fp8() else None
    # ckv_scale_cache [pages, PAGE] (one scale per token), or [pages, PAGE, ceil(r/128)] (block128)
    scl = np.full((total, PAGE) + (sc_in.shape[2:] if sc_in is not None else ()), np.nan, np.float32)
    aks = np.full((total, PAGE, cs.G), np.nan, ckv.dtype)
    fp8 = cs.is_fp8()
    codes = np.zeros((total, PAGE, r), np.float32) if fp8 else None
    for b, T in enumerate(cs.seqlens):
        for j in range(npages[b]):
            pid = kv_indices[kv_indptr[b] + j]
            t0, t1 = j * PAGE, min((j + 1) * PAGE, T)
            n = t1 - t0
            if fp8:
                codes[pid, :n] = ki["kv_c"][b, t0:t1].astype(np.float32)
                scl[pid, :n] = ki["kv_c_scale"][b, t0:t1]
            else:
                ckv[pid, :n] = ki["kv_c"][b, t0:t1].astype(ckv.dtype)
            if dr:
                kpe[pid, :n] = ki["k_rope"][b, t0:t1].astype(ckv.dtype)
            if "alpha_k" in ki:
                aks[pid, :n] = ki["alpha_k"][b, t0:t1].astype(ckv.dtype)
    kv_len = np.array(cs.seqlens, np.int32)
    if bug == "one_sequence" and B > 0:
        kv_len[-1] = max(kv_len[-1] - 1, 0)      # stale length for the last request
    return dict(ckv=ckv, kpe=kpe, scale=scl, codes=codes, alpha_k=aks, kv_indptr=kv_indptr,
                kv_indices=kv_indices, kv_len=kv_len, seqlens=np.array(cs.seqlens))


def _load_pages(cs, pool, b, bug):
    A = cs.accum
    idx = pool["kv_indices"][pool["kv_indptr"][b]:pool["kv_indptr"][b + 1]]
    L = int(pool["kv_len"][b])
    slot_ok = (np.arange(len(idx) * PAGE) < L)
    if cs.is_fp8():
        r = pool["codes"].shape[-1]
        sc = pool["scale"][idx].reshape((len(idx) * PAGE,) + pool["scale"].shape[2:])
        if bug == "scale_first_token":
            sc = np.full_like(sc, pool["scale"][idx[0], 0]) if len(idx) else sc
        if sc.ndim == 2:                          # fp8-block128: value j times scale[j // 128]
            blk = np.arange(r) // FP8_BLOCK
            sc = sc[:, np.zeros_like(blk) if bug == "block_scale_first" else blk]
        else:
            sc = sc[:, None]
        kv = pool["codes"][idx].reshape(len(idx) * PAGE, r) * sc
        kv = kv.astype(BF16).astype(np.float32)                 # dequant -> bf16 operands
    else:
        kv = pool["ckv"][idx].reshape(len(idx) * PAGE, pool["ckv"].shape[-1])
    kpe = pool["kpe"][idx].reshape(len(idx) * PAGE, pool["kpe"].shape[-1])
    ak = pool["alpha_k"][idx].reshape(len(idx) * PAGE, cs.G)
    z = A(0)
    kv = np.where(slot_ok[:, None], kv, z)[:L]
    kpe = np.where(slot_ok[:, None], kpe, z)[:L]
    ak = np.where(slot_ok[:, None], ak, z)[:L]
    return kv.astype(A), kpe.astype(A), ak.astype(A), L


def mla_decode(cs, ki, bug=None):
    A = cs.accum
    B, S, H, G, r = cs.B, cs.S, cs.H, cs.G, cs.r
    pool = build_pages(cs, ki, bug)
    gmap = np.arange(H) // (H // G)
    sm_scale_log2 = A(cs.scale) * A(LOG2E)
    q_all = ki["q_latent"].astype(A)
    qpe_all = ki["q_rope"].astype(A) if ("q_rope" in ki and cs.dr) else None
    aq_all = ki["alpha_q"].astype(A) if "alpha_q" in ki else None
    o = np.zeros((B, S, H, r), A)
    lse2 = np.full((B, S, H), -np.inf, A)
    for b in range(B):
        kv, kpe, ak, L = _load_pages(cs, pool, b, bug)
        if L == 0:
            continue
        T = int(pool["seqlens"][b])
        logits = np.einsum("shr,tr->sht", q_all[b], kv)
        if aq_all is not None and "alpha_k" in ki:
            akh = ak[:, gmap].T[None]                          # [1,H,L]
            aqb = aq_all[b][..., None]
            if bug == "one_head":
                aqb = aqb.copy()
                aqb[:, -1] = 1.0                                 # last head: alpha_q not applied
            if qpe_all is not None:
                lr = np.einsum("shd,td->sht", qpe_all[b], kpe)
                logits = (logits + lr) * (aqb * akh) if cs.norm == "unified" \
                    else logits * (aqb * akh) + lr
            else:
                logits = logits * (aqb * akh)
        elif qpe_all is not None:
            lr = np.einsum("shd,td->sht", qpe_all[b], kpe)
            if bug == "one_head":
                lr[:, -1] = 0                                    # last head: rope part dropped
            logits = logits + lr
        elif bug == "one_head":
            logits[:, -1] *= A(0.5)
        s2 = logits * sm_scale_log2
        if cs.causal:
            qpos = T - S + np.arange(S)
            vis = np.arange(L)[None, :] <= qpos[:, None]
            s2 = np.where(vis[:, None, :], s2, -np.inf)
        mx = s2.max(-1, keepdims=True)
        ok = np.isfinite(mx)
        mx = np.where(ok, mx, 0)
        p = (ex2_approx if A == np.float32 else np.exp2)(s2 - mx)   # math::ptx_exp2: ex2.approx
        den = p.sum(-1, keepdims=True)
        if bug == "row_denominator_bf16":
            den = den.astype(BF16).astype(A)
        with np.errstate(divide="ignore", invalid="ignore"):
            o[b] = np.where(den > 0, np.einsum("sht,tr->shr", p, kv) / den, 0)
            lse2[b] = np.where(den[..., 0] > 0, mx[..., 0] + np.log2(den[..., 0]), -np.inf)
    return o, lse2


def run(case, bug=None):
    cs = load(case)
    A, D = cs.accum, cs.stored
    ki = kernel_inputs(cs, bug)
    o, lse2 = mla_decode(cs, ki, bug)
    lse = lse2 if bug == "lse_base2" else lse2 * A(np.log(2.0))
    if bug == "scale_bias":
        o = o * A(1.01)
    lat = o.astype(D)
    if cs.level == "kernel":
        return {"latent_out": lat, "lse": lse}
    wv = cs.get("w_uv", A).reshape(cs.r, cs.G, cs.dv)[:, np.arange(cs.H) // (cs.H // cs.G), :]
    out = np.einsum("bshr,rhv->bshv", lat.astype(A), wv)
    return {"out": out.astype(D), "lse": lse, "latent_out": lat}


BUGS = {
    "one_head": "last head: alpha_q not applied (norm none: its rope logits dropped)",
    "one_sequence": "stale kv_len (T_b - 1) for the last request",
    "row_denominator_bf16": "softmax row sum rounded to bf16",
    "scale_bias": "latent_out scaled by 1.01",
    "lse_base2": "FlashInfer's base-2 lse returned without the ln 2 conversion",
    "scale_first_token": "fp8: per-token scales treated as one per-tensor scale (token 0's)",
    "rope_pairs_swapped": "host RoPE with the other pair layout",
    "alpha_k_from_latent": "host alpha_k = 1/rms(c[t])",
    "block_scale_first": "fp8-block128: the first 128-block's scale used for the whole latent row",
}
# FlashInfer's batch MLA decode (BatchMLAPagedAttentionWrapper) takes neither a sparse index
# list per query row nor sink logits: sparse top-k and attention-sink cases are not applicable
FEATURES = ()


def bug_applies(cfg, bug):
    kernel = cfg.get("level") == "kernel"
    if bug == "scale_first_token":
        return cfg["profile"] == "fp8"
    if bug == "block_scale_first":               # needs a second scale block
        return cfg["profile"] == "fp8-block128" and int(cfg["latent_rank"]) > FP8_BLOCK
    if bug == "rope_pairs_swapped":
        return not kernel and int(cfg["d_r"]) > 0
    if bug == "alpha_k_from_latent":
        return not kernel and cfg.get("norm") != "none"
    if bug == "one_sequence":
        return cfg["seqlens"][-1] > 0
    return True
