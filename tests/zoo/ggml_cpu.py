"""ggml-org/llama.cpp's CPU path (ggml) for DeepSeek MLA (absorbed, flash attention on), with a QK-norm.

Imitated public code (read for this file, none of it copied):
  - ggml-org/llama.cpp:src/models/deepseek2.cpp (is_mla branch): q_nope_absorbed = ggml_mul_mat(wk_b,
    q_nope); Qcur = ggml_concat(q_nope_absorbed, q_pe); Kcur = ggml_concat(kv_cmpr, k_pe) stored
    in the K cache; Vcur = kv_cmpr (the latent view of K); build_attn(..., v_mla = wv_b, kq_scale)
  - ggml-org/llama.cpp:src/llama-graph.cpp build_attn_mha (flash_attn branch): ggml_flash_attn_ext(q, k,
    v, kq_mask, kq_scale) with GGML_PREC_F32, then cur = ggml_mul_mat(v_mla, cur); an F32 K/V
    would be cast to F16 there, so the fp32 profile is not reachable with FA (see PROFILES)
  - ggml-org/llama.cpp:ggml/src/ggml-cpu/ops.cpp: ggml_compute_forward_flash_attn_ext_f16 (path choice),
    ..._f16_one_chunk (per query row, one key at a time), ggml_flash_attn_ext_reduce_partials
    (the decode split-KV path), ggml_compute_forward_rms_norm_f32; ggml-cpu/vec.h and its .cpp:
    ggml_vec_dot_bf16/_f16, ggml_vec_mad_f32/_f16, ggml_vec_scale_f32/_f16 (x86 AVX2/F16C form)
Activations are F32. Every ggml_mul_mat with a bf16/f16 weight converts its F32 input to the
weight's vec_dot type (RNE) and accumulates the dot in fp32, giving F32.

QK-norm added as a ggml graph would (no new kernel; the FA kernel has no per-key scale):
  - query: ggml_rms_norm (sum of fp32 squares in double, mean -> float, 1.0f/sqrtf(mean + eps),
    y = x*scale*w, fused with the gain mul) then ggml_mul by the key gain: alpha_q is folded into
    the query before wk_b (conventions §1.2 variant q_normed_first); unified: one rms_norm over
    ggml_concat(q_nope, q_pe) (q_pe rotated first under rope_then_norm) with gamma_q, the rope
    slice then rotated (norm_then_rope), the content slice times gamma_k[:d_c]
  - rope parts: rms_norm(.) * gain and ggml_rope_ext in F32 with the case's fp32 cos/sin tables
    (ggml would compute its own theta: conventions §1.3 fixes the tables), stored to the K cache
  - alpha_k: at append, k0c = ggml_mul_mat(W_UK_g, kv_cmpr) (F32); the scalar with rms_norm's
    arithmetic (a small custom op), cached in an F32 side tensor [cells, G]
  - FA needs alpha_k inside K: per group K_g = ggml_mul(K latent view (cache type), alpha_k) ->
    result in the cache type (one more rounding of alpha_k * c); blockwise K_g = [that ; k_rope],
    unified K_g = cache type(alpha_k * [c ; k_rope]); K gets G heads (FA broadcasts head h to
    h / (H/G)), V stays the 1-head latent view. norm none: exactly the upstream MLA K and V.
Rounding points (D = cache/weight type, bf16 or f16):
  1 gained normalized query F32 -> D (wk_b mul_mat input); q_latent F32 (not stored);
  2 rope parts F32 (query), key rope stored -> D; 3 alpha_k F32, K_g latent alpha_k*c -> D;
  4 FA: Q F32 -> D (q_to_vec_dot), s = vec_dot(K_g[t], Q) fp32, s*scale (float kq_scale),
    per key: if s > M: M = s, ms = expf(Mold - M), VKQ *= ms; else vs = expf(s - M);
    VKQ += v*vs; S = S*ms + vs. VKQ fp32 (FMA), as upstream does for a bf16 V; for an f16 V
    upstream keeps an f16 accumulator (VKQ16: each scale and mad in fp32, stored back to f16),
    a known defect (terms below half its step are rounded away, an error growing with the
    context; qkmla fails it): here that is the bug `v_acc_f16`, and the correct run is the fix,
    the fp32 accumulator; end: VKQ (-> f32) * (1/S)
  5 decode split-KV (K/V f16, one query token, n_kv >= 512 cells): NTH = 8 thread chunks of
    ceil(n_kv/8) cells, partial (M, S, VKQ32) each, merged in fp32 (expf), VKQ * (1/S)
  6 FA output (latent_out) F32 -> D as the wv_b mul_mat input; out = fp32 dot, F32.
Cells: one sequence per llama_decode call (S_q query tokens), cells 0..T_b-1 in position order,
n_kv = T_b padded to 256; the causal mask is -inf (skipped) past pos(i). Sparse top-k: the
mask admits exactly the listed cells (walked in cell order, not index order). Sinks:
ggml_flash_attn_ext_add_sinks (the sink joins M and S after the KV loop; in the split path in
the first chunk). lse: not a ggml output; delivered as M + logf(S) from the kernel's final
running max and sum before the sink step (natural log, fp32; -inf for a row without keys).
Delivered (all F32, ggml's result type): out, lse, latent_out (the FA output). Module level only.
Profiles: bf16 (-ctk bf16, bf16 weights) and fp16 (-ctk f16, f16 weights). Not applicable: fp32
(FA casts an F32 cache to F16: an f16 design), fp64 (no f64 attention in ggml), fp8 and
fp8-block128 (no e4m3 cache type in ggml); `run` raises NotApplicable on them.
"""
import numpy as np

from common import BF16, load

LEVELS = ("module",)
PROFILES = ("bf16", "fp16")
FEATURES = ("topk", "attn_sink")
N_PAD = 256          # upstream pads n_kv to 256 cells with flash attention
NTH = 8              # threads: chunks of the decode split-KV path
SPLIT_MIN_KV = 512   # ggml: use_split_kv_path needs nek1 >= 512

BUGS = {
    "one_head": "the last head's absorbed query uses W_UK of group (g + 1) % G (view offset slip)",
    "one_sequence": "the last sequence's mask hides its first cell (position 0 masked)",
    "row_denominator_bf16": "the row sum S rounded to bf16 before 1/S",
    "scale_bias": "FA output (latent_out) scaled by 1.01 (a stray attn_factor) before wv_b",
    "no_rescale": "online softmax: ms applied to S but VKQ not rescaled on a new max",
    "eps_outside_sqrt": "RMS scalars as 1/(sqrtf(mean) + eps)",
    "topk_off_by_one": "sparse: the mask admits cell index + 1 for each listed token",
    "sink_in_lse": "lse read after the sink step (the sink folded into the returned lse)",
    "v_acc_f16": "upstream's f16 V accumulator (ggml_vec_mad_f16 into VKQ16) for an f16 cache",
}


class NotApplicable(Exception):
    """The case's profile has no upstream (ggml) counterpart (see PROFILES)."""


def bug_applies(cfg, bug):
    if cfg.get("profile") not in PROFILES or cfg.get("level", "module") != "module":
        return False
    norm, G = cfg.get("norm", "blockwise"), int(cfg["groups"])
    sl = [int(x) for x in cfg["seqlens"]]
    if bug == "one_head":
        return G > 1
    if bug == "one_sequence":
        return bool(sl) and sl[-1] >= 2 and not cfg.get("topk")
    if bug == "no_rescale":
        return max(sl + [0]) >= 2
    if bug == "eps_outside_sqrt":
        return norm != "none"
    if bug == "topk_off_by_one":
        return bool(cfg.get("topk"))
    if bug == "sink_in_lse":
        return bool(cfg.get("attn_sink"))
    if bug == "v_acc_f16":
        return cfg.get("profile") == "fp16"
    return bug in BUGS


F32 = np.float32


# ----------------------------------------------------------------------------- ggml primitives
def _fma32(a, b, c):
    """fp32 fused multiply-add (product exact in double, one rounding to float)."""
    return (a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(F32)


def _rms_scale(x, eps, bug):
    """ggml_compute_forward_rms_norm_f32's scale: double sum of float squares, mean -> float."""
    ssq = np.sum((x * x).astype(F32).astype(np.float64), -1)
    mean = (ssq / x.shape[-1]).astype(F32)
    if bug == "eps_outside_sqrt":
        return (F32(1) / (np.sqrt(mean) + eps)).astype(F32)
    return (F32(1) / np.sqrt(mean + eps)).astype(F32)


def _rms_norm_mul(x, w, eps, bug):
    """ggml_rms_norm fused with ggml_mul(., w): y = x*scale*w, left to right in float."""
    return ((x * _rms_scale(x, eps, bug)[..., None]).astype(F32) * w).astype(F32)


def _rope(x, cos, sin, style):
    """ggml_rope_ext in F32 (NORM = interleaved pairs, NEOX = halves), the case's tables."""
    h = x.shape[-1] // 2
    a, b = (x[..., 0::2], x[..., 1::2]) if style == "interleaved" else (x[..., :h], x[..., h:])
    ya = (a * cos).astype(F32) - (b * sin).astype(F32)
    yb = (a * sin).astype(F32) + (b * cos).astype(F32)
    if style == "interleaved":
        return np.stack([ya, yb], -1).reshape(x.shape).astype(F32)
    return np.concatenate([ya, yb], -1).astype(F32)


def _mul_mat(w, x, D):
    """ggml_mul_mat(w [.., K] in D, x F32): x -> D (vec_dot type), fp32 dot, F32 result.
    w: [..., N, K] (rows), x: [..., K]  ->  [..., N]"""
    xq = x.astype(D).astype(F32)
    return np.einsum("...nk,...k->...n", w.astype(F32), xq).astype(F32)


# ----------------------------------------------------------------------------- graph
def _graph_inputs(cs, bug):
    """Q [B,S,H,DK] F32, K [B,T,Gk,DK] in D (Gk = G, or 1 under norm none), V [B,T,r] in D."""
    D = cs.stored
    B, S, H, G, r, dc, dr = cs.B, cs.S, cs.H, cs.G, cs.r, cs.dc, cs.dr
    eps = F32(cs.eps)
    T_max = cs.raw("kv_c").shape[1]
    gmap = np.arange(H) // (H // G)
    qn, c = cs.get("q_nope", F32), cs.get("kv_c", F32)
    wk = cs.raw("w_uk").reshape(r, G, dc)                         # W_UK_g = wk[:, g, :]
    wk_b = np.transpose(wk, (1, 0, 2))                             # [G, r(rows), dc]
    pos = np.array([[max(T - S + i, 0) for i in range(S)] for T in cs.seqlens])
    if dr:
        cos, sin = cs.get("rope_cos", F32), cs.get("rope_sin", F32)
        rq = lambda x: _rope(x, cos[pos][:, :, None], sin[pos][:, :, None], cs.rope_style)  # noqa
        rk = lambda x: _rope(x, cos[:T_max][None], sin[:T_max][None], cs.rope_style)        # noqa
        qp, kp = cs.get("q_pe", F32), cs.get("k_pe", F32)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        kr = qr = ak = None
        if cs.norm == "none":
            q_in = qn
            if dr:
                qr, kr = rq(qp), rk(kp)
        elif cs.norm == "blockwise":
            q_in = (_rms_norm_mul(qn, cs.get("gamma_cq", F32), eps, bug) * cs.get("gamma_ck", F32)).astype(F32)
            if dr:
                grq, grk = cs.get("gamma_rq", F32), cs.get("gamma_rk", F32)
                if cs.rope_order == "norm_then_rope":
                    qr, kr = rq(_rms_norm_mul(qp, grq, eps, bug)), rk(_rms_norm_mul(kp, grk, eps, bug))
                else:
                    qr, kr = _rms_norm_mul(rq(qp), grq, eps, bug), _rms_norm_mul(rk(kp), grk, eps, bug)
        else:
            gq, gk = cs.get("gamma_q", F32), cs.get("gamma_k", F32)
            if dr:
                qraw = qp if cs.rope_order == "norm_then_rope" else rq(qp)
                y = _rms_norm_mul(np.concatenate([qn, qraw], -1), gq, eps, bug)
                qr = rq(y[..., dc:]) if cs.rope_order == "norm_then_rope" else y[..., dc:]
                kraw = kp if cs.rope_order == "norm_then_rope" else rk(kp)
                kr = rk((kp * gk[dc:]).astype(F32)) if cs.rope_order == "norm_then_rope" \
                    else (kraw * gk[dc:]).astype(F32)
            else:
                y = _rms_norm_mul(qn, gq, eps, bug)
            q_in = (y[..., :dc] * gk[:dc]).astype(F32)
        # append path: alpha_k from the F32 content key (ggml_mul_mat of the latent, D exact)
        if cs.norm != "none":
            k0c = np.stack([_mul_mat(wk[:, g, :].T[None, None], c, D) for g in range(G)], 2)  # [B,T,G,dc]
            if cs.norm == "unified" and dr:
                kst = np.broadcast_to(kraw[:, :, None, :], (B, T_max, G, dr))
                ak = _rms_scale(np.concatenate([k0c, kst], -1), eps, bug)
            else:
                ak = _rms_scale(k0c, eps, bug)                       # [B,T,G]
        # q_nope_absorbed = ggml_mul_mat(wk_b, q): wk_b broadcast over heads h -> h / (H/G)
        wq = gmap.copy()
        if bug == "one_head":
            wq[-1] = (wq[-1] + 1) % G
        q_lat = _mul_mat(wk_b[wq][None, None], q_in, D)              # [B,S,H,r]
        Q = np.concatenate([q_lat, qr], -1) if dr else q_lat
        kr_d = kr.astype(D) if dr else None                          # K cache rope part
        if cs.norm == "none":
            K = (np.concatenate([cs.raw("kv_c"), kr_d], -1) if dr else cs.raw("kv_c"))[:, :, None, :]
        else:
            akx = ak[..., None]                                      # [B,T,G,1]
            cG = np.broadcast_to(c[:, :, None, :], (B, T_max, G, r))
            if cs.norm == "unified":
                kv = np.concatenate([cG, np.broadcast_to(kr_d.astype(F32)[:, :, None, :],
                                                         (B, T_max, G, dr))], -1) if dr else cG
                K = (kv * akx).astype(F32).astype(D)
            else:
                K = (cG * akx).astype(F32).astype(D)
                if dr:
                    K = np.concatenate([K, np.broadcast_to(kr_d[:, :, None, :], (B, T_max, G, dr))], -1)
    return Q.astype(F32), K, cs.raw("kv_c")


def _one_chunk(q_q, K, V, cells, scale, D, bug):
    """ggml_compute_forward_flash_attn_ext_f16_one_chunk for the H rows of one query token over
    the listed (unmasked) cells, in order. q_q [H, DK] (already in D, as f32), K [T, Gk, DK] D,
    V [T, r] D. Returns M [H], S [H], VKQ32 [H, r] (unnormalized)."""
    H = q_q.shape[0]
    Gk = K.shape[1]
    kh = np.arange(H) // (H // Gk)
    f16_acc = D == np.float16 and bug == "v_acc_f16"
    M = np.full(H, -np.inf, F32)
    S = np.zeros(H, F32)
    r = V.shape[-1]
    VKQ = np.zeros((H, r), np.float16 if f16_acc else F32)
    if cells.size:
        Kc = K[cells].astype(F32)                                  # [n, Gk, DK]
        s_all = np.einsum("nhd,hd->hn", Kc[:, kh, :], q_q).astype(F32)   # vec_dot, fp32
        s_all = (s_all * F32(scale)).astype(F32)                   # s = s*scale; s += 0 (mask)
        Vc = V[cells].astype(F32)
    with np.errstate(invalid="ignore", over="ignore"):
        for j in range(cells.size):
            s = s_all[:, j]
            Mold = M
            new = s > M
            M = np.where(new, s, M).astype(F32)
            ms = np.where(new, np.exp((Mold - M).astype(F32)), F32(1)).astype(F32)
            vs = np.where(new, F32(1), np.exp((s - M).astype(F32))).astype(F32)
            if bug != "no_rescale":
                # ggml_vec_scale_f16 / _f32 (ms == 1 where no new max: exact)
                VKQ = (VKQ.astype(F32) * ms[:, None]).astype(F32).astype(VKQ.dtype)
            # ggml_vec_mad_f16: fp32 FMA, stored back to f16; ggml_vec_mad_f32: fp32 FMA
            VKQ = _fma32(np.broadcast_to(Vc[j], VKQ.shape), vs[:, None], VKQ.astype(F32)).astype(VKQ.dtype)
            S = (S * ms + vs).astype(F32)
    return M, S, VKQ.astype(F32)


def _sink(M, S, VKQ, s_h):
    """The sinks block after the KV loop (one_chunk)."""
    new = s_h > M
    with np.errstate(invalid="ignore", over="ignore"):
        ms = np.where(new, np.exp((M - s_h).astype(F32)), F32(1)).astype(F32)
        vs = np.where(new, F32(1), np.exp((s_h - M).astype(F32))).astype(F32)
    VKQ = (VKQ * ms[:, None]).astype(F32)
    M = np.where(new, s_h, M).astype(F32)
    return M, (S * ms + vs).astype(F32), VKQ


def _reduce(parts):
    """ggml_flash_attn_ext_reduce_partials: merge (M, S, VKQ) of the chunks in fp32."""
    M, S, VKQ = parts[0][0] * 0 - np.inf, np.zeros_like(parts[0][1]), np.zeros_like(parts[0][2])
    M = M.astype(F32)
    with np.errstate(invalid="ignore", over="ignore"):
        for Mc, Sc, Vc in parts:
            use = Sc != 0
            Mn = np.fmax(M, Mc).astype(F32)
            so = np.exp((M - Mn).astype(F32)).astype(F32)
            sn = np.exp((Mc - Mn).astype(F32)).astype(F32)
            VKQ = np.where(use[:, None], (VKQ * so[:, None]).astype(F32) + (Vc * sn[:, None]).astype(F32), VKQ).astype(F32)
            S = np.where(use, (S * so).astype(F32) + (Sc * sn).astype(F32), S).astype(F32)
            M = np.where(use, Mn, M).astype(F32)
    return M, S, VKQ


def run(case, bug=None):
    cs = load(case)
    if cs.profile not in PROFILES or cs.level not in LEVELS:
        raise NotApplicable(f"ggml_cpu runs profiles {PROFILES} at module level, not "
                            f"{cs.profile} / {cs.level}")
    D = cs.stored
    B, S_q, H, G, r = cs.B, cs.S, cs.H, cs.G, cs.r
    Q, K, V = _graph_inputs(cs, bug)
    topk = cs.raw("indices") if cs.has("indices") else None
    sinks = cs.get("attn_sink", F32) if cs.has("attn_sink") else None
    lat = np.zeros((B, S_q, H, r), F32)
    lse = np.full((B, S_q, H), -np.inf, F32)
    for b in range(B):
        T = cs.seqlens[b]
        n_kv = max(N_PAD, -(-T // N_PAD) * N_PAD)
        split = D == np.float16 and S_q == 1 and n_kv >= SPLIT_MIN_KV    # K/V f16, one token
        if T == 0:
            continue                         # a sequence without cells is never decoded
        for i in range(S_q):
            pos = T - S_q + i
            if topk is not None:
                idx = topk[b, i][topk[b, i] >= 0].astype(np.int64)
                if bug == "topk_off_by_one":
                    idx = idx + 1
                cells = np.sort(idx)                                 # mask: cell order
            else:
                last = pos if cs.causal else T - 1
                cells = np.arange(max(last + 1, 0)) if T > 0 else np.arange(0)
                if bug == "one_sequence" and b == B - 1:
                    cells = cells[cells > 0]
            q_q = Q[b, i].astype(D).astype(F32)                          # q_to_vec_dot
            if split:
                chunk = -(-n_kv // NTH)
                parts, parts_ns = [], []
                for th in range(NTH):
                    c0, c1 = th * chunk, min((th + 1) * chunk, n_kv)
                    if c0 >= n_kv:
                        continue
                    cc = cells[(cells >= c0) & (cells < c1)]
                    M, S, VKQ = _one_chunk(q_q, K[b], V[b], cc, cs.scale, D, bug)
                    parts_ns.append((M, S, VKQ))
                    if sinks is not None and c0 == 0:
                        M, S, VKQ = _sink(M, S, VKQ, sinks)
                    parts.append((M, S, VKQ))
                M, S, VKQ = _reduce(parts)
                Mn, Sn, _ = _reduce(parts_ns)                             # pre-sink M, S
            else:
                M, S, VKQ = _one_chunk(q_q, K[b], V[b], cells, cs.scale, D, bug)
                Mn, Sn = M, S
                if sinks is not None:
                    M, S, VKQ = _sink(M, S, VKQ, sinks)
            if bug == "sink_in_lse":
                Mn, Sn = M, S
            den = S.astype(BF16).astype(F32) if bug == "row_denominator_bf16" else S
            with np.errstate(divide="ignore"):
                s_inv = np.where(den == 0, F32(0), F32(1) / den).astype(F32)
                lse[b, i] = (Mn + np.log(Sn)).astype(F32)
            lat[b, i] = (VKQ * s_inv[:, None]).astype(F32)
    if bug == "scale_bias":
        lat = (lat * F32(1.01)).astype(F32)
    # cur = ggml_mul_mat(v_mla = wv_b, cur): latent F32 -> D, fp32 dot, F32
    wv = cs.raw("w_uv").reshape(r, G, cs.dv)
    wv_b = np.transpose(wv, (1, 2, 0))[np.arange(H) // (H // G)]    # [H, dv(rows), r]
    out = _mul_mat(wv_b[None, None], lat, D)
    return {"out": out, "lse": lse, "latent_out": lat}
