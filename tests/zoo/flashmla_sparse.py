"""A serving engine running QK-normed MLA decode through DeepSeek's FlashMLA sparse kernels
(DeepSeek-V3.2 style: an index list per query row, an attention sink, a bf16 or a 656-byte fp8
cache), emulated in NumPy at the kernels' rounding points.

Sources (deepseek-ai/FlashMLA 9241ae3, read, not copied):
- flash_mla/flash_mla_interface.py: flash_mla_with_kvcache (indices -> sparse_decode_fwd, which
  asserts is_fp8_kvcache and causal=False; attn_sink scales out by exp(lse)/(exp(lse)+exp(sink)),
  "no effect on the returned softmax_lse"; out [b, s_q, h_q, 512], lse [b, h_q, s_q]) and
  flash_mla_sparse_fwd (bf16 kv [s_kv, 1, 576], indices [s_q, 1, topk]).
- csrc/api/sparse_decode.h (sm_scale * LOG_2_E with LOG_2_E = 1.44269504f from csrc/api/common.h;
  Decode_Sm90_Impl::get_meta: num_sm_parts = num_sms / s_q / (h_q/64), 5 blocks of fixed
  overhead, 64-token blocks; lse allocated [b, s_q, h_q] and returned transposed);
  csrc/smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.cu (get_mla_metadata_kernel:
  the payload split of every request's topk/64 blocks over the SM parts; ported to Python below).
- csrc/sm90/decode/sparse_fp8/splitkv_mla.cuh (the V32 model): scale_softmax (row max of the raw
  fp32 scores times scale*log2e, m init -1e30, exp2f, P cast to bf16 for P.V, fp32 row sum of
  the unrounded P per quad lane, l = l*corr + sum, quad shuffle reduce at the end), the producer
  warpgroup (token -1: block 0, slot UINT_MAX % 64, its fp8 codes and scales zeroed, the rope
  part read but the score masked by is_kv_valid), the epilogue (no split: o * __fdividef(1,
  l + exp2f(sink*log2e - m)) -> bf16, lse = logf(l) + m / M_LOG2E, +inf for l == 0; split:
  o_accum = o / l in fp32 and lse_accum = log2f(l) + m, -inf for l == 0);
  components/dequant.h cvt_fp8x8_bf16x8 (e4m3 -> fp32 -> bf16, times the bf16 copy of the fp32
  128-block scale, a bf16 product: exact for FlashMLA's power-of-two scales); config.h store_o.
- csrc/smxx/decode/combine/combine.cu flash_fwd_mla_combine_kernel (per-split base-2 lse,
  butterfly max and sum over 32 lanes, lse / M_LOG2E written before the sink, then
  global_lse += log2f(1 + exp2f(sink*log2e - global_lse)), weights exp2f(lse_j - global_lse),
  o = sum w_j o_j in fp32 (fma) -> bf16).
- csrc/sm90/prefill/sparse/phase1.cuh (flash_mla_sparse_fwd on sm90, the bf16 path): 64-token
  blocks taken in pairs by two warpgroups: WG0 block 2j with its QK^T over tiles 0-3 then 4-8,
  WG1 block 2j+1 over tiles 4-8 then 0-3; WG0's online softmax first, WG1's max taken against
  WG0's new max; WG0 then rescales its fp32 P by exp2f(m0 - m1) and stores it in bf16 a second
  time for WG1's half of P.V (each warpgroup owns half of the 512 output columns, so block 2j's
  P is rounded differently in the two halves); invalid indices zero-filled by cp.async; epilogue
  1/(l + exp2f(sink*log2e - m)) -> bf16, lse = logf(l) + m * CUDART_LN2_F, +inf for l == 0.
- FlashMLA/tests/quant.py (quantize_k_cache / dequantize_k_cache, the 656-byte V32_FP8Sparse layout;
  abs_indices2indices_in_kvcache: block_table[b, t // page] * page + t % page, -1 kept) and
  FlashMLA/tests/ref.py (ref_sparse_attn_decode: the sink as 1/(1 + exp(sink - lse)), lse without it).
- FlashMLA compiles with --use_fast_math: exp2f is ex2.approx.ftz (fastmath.ex2_approx), logf is
  lg2.approx times ln 2, log2f lg2.approx (modelled as fp32 rounding of the exact log2); the
  reciprocals (__fdividef, 1.0f / x) are modelled as correctly rounded fp32.
- The engine: vLLM's FlashMLASparseImpl (vllm/v1/attention/backends/mla/flashmla_sparse.py):
  an fp8_ds_mla cache goes to flash_mla_with_kvcache (sparse fp8 decode), a bf16 cache to
  flash_mla_sparse_fwd (_forward_bf16_kv; q padded to 64 heads on Hopper, request-relative top-k
  indices converted to global cache slots through the block table); page size 64.

What the engine does here:
- Profiles: bf16 (the bf16 cache, flash_mla_sparse_fwd) and fp8-block128 (FlashMLA's fp8 cache:
  e4m3 latent with one fp32 power-of-two scale per 128 values, bf16 rope not quantized, the
  sparse fp8 decode kernel). Kernel sizes are generalized: r latent and d_r rope dims (576 =
  512 + 64 in the real kernel), r/2 per warpgroup half, the same 64-token blocks and k16 MMA steps;
  heads padded to 64 (or 128) as vLLM pads them (no numerical effect).
- Index lists: a top-k case's indices (in their order, -1 pads kept in place) padded with -1 to a
  multiple of 64 (decode kernel: topk % 64) or 128 (sparse_fwd: topk % 128), then converted to
  global slots of a shuffled 64-token page pool (NaN in every unfilled slot; page 0 is the null
  block, never assigned) through the block table. A case without top-k: DeepSeek-V3.2 with a
  context shorter than its index_topk attends every visible token, so the engine lists each
  row's causal window (all T_b tokens when not causal) in ascending order; a row that sees
  nothing gets only -1s.
- Module level (conventions §1.2, default variant): fp32 GEMMs written once to bf16: q_latent =
  (q_nope * gamma_cq * gamma_ck) . W_UK_g^T (fp32 accumulate -> bf16), rope parts normalized and
  rotated in fp32 with the fp32 tables -> bf16, alpha_q and alpha_k in fp32 through torch.rsqrt
  on the GPU (fastmath.rsqrt_approx); the append path forms c . W_UK_g transiently in fp32 for
  alpha_k (from the latent the cache holds: the fp8 case's dequantized one), cached as an fp32
  side array [slots, G] beside the pages. out = bmm(latent_out (bf16), W_UV_g) fp32 -> bf16.
- How alpha enters: FlashMLA's cache row is key and value at once (sV aliases sK), so alpha_k
  cannot be folded into the cached latent (and G groups would need G copies), and it is per key,
  so it cannot go into q. The engine runs a one-line fork of each kernel: under blockwise norm the
  QK^T MMA keeps the latent tiles and the rope tile in separate fp32 accumulators and the score
  is fma(s_latent, fp32(alpha_q * alpha_k[slot, g(h)]), s_rope); under unified the whole fp32
  accumulator is multiplied by that factor; norm = none runs the kernels unmodified (one
  accumulator over [latent; rope]). The fork loads alpha_k beside the token's scales (zeroed for
  a -1 index, like them). Kernel level: the case's q_latent, q_rope, alpha_q, alpha_k, kv_c
  (+ kv_c_scale) and k_rope go into the same pool and fork unchanged.
- Outputs: latent_out (the kernel's bf16 out), out in bf16 (module level), lse fp32 natural log
  (FlashMLA's own base), transposed to [B, S_q, H] and +inf (FlashMLA's empty row) mapped to -inf.
"""
import numpy as np

from common import BF16, FP8_BLOCK, load
from fastmath import ex2_approx, rsqrt_approx

LEVELS = ("module", "kernel")
PROFILES = ("bf16", "fp8-block128")
FEATURES = ("topk", "attn_sink")

F32, F64 = np.float32, np.float64
LOG_2_E = F32(1.44269504)              # csrc/api/common.h
CUDART_L2E_F = F32(1.442695041)        # math_constants.h
M_LOG2E_F = F32(1.4426950408889634)    # (float)M_LOG2E
CUDART_LN2_F = F32(0.693147181)
NUM_SMS = 132                          # H800 / H100 SXM
BLOCK = 64                             # TOPK_BLOCK_SIZE / B_TOPK
PAGE = 64                              # page_block_size
MMA_K = 16                             # bf16 WGMMA k step
FIXED_OVERHEAD = 5                     # Decode_Sm90_Impl::get_meta
MAX_INIT_VAL = F32(-1e30)


# ----------------------------------------------------------------------------- fp32 helpers
def _f32(x):
    return np.asarray(x, F64).astype(F32)


def _bf(x):                                        # round to bf16, widened back to fp32
    return np.asarray(x, F32).astype(BF16).astype(F32)


def _fma(a, b, c):                                 # one rounding of a*b + c
    with np.errstate(invalid="ignore", over="ignore"):
        return _f32(np.asarray(a, F64) * np.asarray(b, F64) + np.asarray(c, F64))


def _mul(a, b):
    with np.errstate(invalid="ignore", over="ignore"):
        return _f32(np.asarray(a, F64) * np.asarray(b, F64))


def _add(a, b):
    with np.errstate(invalid="ignore", over="ignore"):
        return _f32(np.asarray(a, F64) + np.asarray(b, F64))


def _log2f(x):                                     # lg2.approx.f32 (modelled as rounded)
    with np.errstate(divide="ignore", invalid="ignore"):
        return _f32(np.log2(np.asarray(x, F64)))


def _logf(x):                                      # --use_fast_math logf: lg2.approx * ln 2
    return _mul(_log2f(x), F32(np.log(2.0)))


def _rcp(x):                                       # __fdividef(1, x) / 1.0f / x
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return _f32(1.0 / np.asarray(x, F64))


def _mma(a, b, dims, acc=None):
    """WGMMA emulation: a [R, K] times b [N, K]^T with an fp32 accumulator, one rounding per
    k16 step, the k steps taken over `dims` (a list of (start, end) ranges) in that order."""
    acc = np.zeros((a.shape[0], b.shape[0]), F32) if acc is None else acc
    with np.errstate(invalid="ignore", over="ignore"):
        for lo, hi in dims:
            for k in range(lo, hi, MMA_K):
                e = min(k + MMA_K, hi)
                acc = _f32(acc.astype(F64) + a[:, k:e].astype(F64) @ b[:, k:e].astype(F64).T)
    return acc


# ----------------------------------------------------------------------------- engine: prelude
def _rot(x, cos, sin, style):
    h = x.shape[-1] // 2
    if style == "interleaved":
        a, b = x[..., 0::2], x[..., 1::2]
    else:
        a, b = x[..., :h], x[..., h:]
    ya, yb = (a * cos - b * sin).astype(F32), (a * sin + b * cos).astype(F32)
    if style == "interleaved":
        return np.stack([ya, yb], -1).reshape(x.shape)
    return np.concatenate([ya, yb], -1)


def _inv_rms(ssq, n, eps):                         # torch.rsqrt(mean + eps) on the GPU
    return rsqrt_approx((ssq / F32(n) + F32(eps)).astype(F32))


def _dequant_f32(codes, scales, r):
    """fp8-block128 latent as fp32 values (code * its 128-block scale, exact)."""
    sc = scales.astype(F32)[..., np.arange(r) // FP8_BLOCK]
    return codes.astype(F32) * sc


def engine_prelude(cs):
    """Module level: the kernel inputs the model code writes (bf16), alphas in fp32."""
    D, B, S, H, G, r, dc, dr = cs.stored, cs.B, cs.S, cs.H, cs.G, cs.r, cs.dc, cs.dr
    eps = cs.eps
    T = cs.raw("kv_c").shape[1]
    if cs.is_fp8():
        c = _dequant_f32(cs.raw("kv_c"), cs.raw("kv_c_scale"), r)
    else:
        c = cs.get("kv_c", F32)
    qn = cs.get("q_nope", F32)                                   # [B,S,H,dc]
    w_uk = cs.get("w_uk", F64).reshape(r, G, dc)                 # [r,G,dc]
    hg = np.arange(H) // (H // G)
    pos = np.array([[max(Tb - S + i, 0) for i in range(S)] for Tb in cs.seqlens])
    if dr:
        cos, sin = cs.get("rope_cos", F32), cs.get("rope_sin", F32)
        qcos, qsin = cos[pos][:, :, None, :], sin[pos][:, :, None, :]
        kcos, ksin = cos[:T][None], sin[:T][None]
        qp, kp = cs.get("q_pe", F32), cs.get("k_pe", F32)
    # append path: the transient content key per group, fp32 GEMM
    with np.errstate(invalid="ignore", over="ignore"):
        k0c = _f32(np.einsum("btr,rgd->btgd", c.astype(F64), w_uk))        # [B,T,G,dc]
        ssq_k = np.sum(k0c * k0c, -1, dtype=F32)
    q_rope = k_rope = None
    aq = ak = None
    with np.errstate(invalid="ignore", over="ignore"):
        if cs.norm == "none":
            q_in = qn
            if dr:
                q_rope = _rot(qp, qcos, qsin, cs.rope_style)
                k_rope = _rot(kp, kcos, ksin, cs.rope_style)
        elif cs.norm == "blockwise":
            q_in = qn * (cs.get("gamma_cq", F32) * cs.get("gamma_ck", F32))
            aq = _inv_rms(np.sum(qn * qn, -1, dtype=F32), dc, eps)
            ak = _inv_rms(ssq_k, dc, eps)
            if dr:
                grq, grk = cs.get("gamma_rq", F32), cs.get("gamma_rk", F32)

                def part(x, cs_, sn_, g):
                    if cs.rope_order == "norm_then_rope":
                        n = x * _inv_rms(np.sum(x * x, -1, dtype=F32), dr, eps)[..., None] * g
                        return _rot(n.astype(F32), cs_, sn_, cs.rope_style)
                    y = _rot(x, cs_, sn_, cs.rope_style)
                    return (y * _inv_rms(np.sum(y * y, -1, dtype=F32), dr, eps)[..., None] * g).astype(F32)
                q_rope = part(qp, qcos, qsin, grq)
                k_rope = part(kp, kcos, ksin, grk)
        else:                                                      # unified
            gq, gk = cs.get("gamma_q", F32), cs.get("gamma_k", F32)
            q_in = qn * (gq[:dc] * gk[:dc])
            ssq_q = np.sum(qn * qn, -1, dtype=F32)
            if dr:
                if cs.rope_order == "norm_then_rope":
                    ssq_q = ssq_q + np.sum(qp * qp, -1, dtype=F32)
                    ssq_k = ssq_k + np.sum(kp * kp, -1, dtype=F32)[..., None]
                    q_rope = _rot((qp * gq[dc:]).astype(F32), qcos, qsin, cs.rope_style)
                    k_rope = _rot((kp * gk[dc:]).astype(F32), kcos, ksin, cs.rope_style)
                else:
                    qq = _rot(qp, qcos, qsin, cs.rope_style)
                    kk = _rot(kp, kcos, ksin, cs.rope_style)
                    ssq_q = ssq_q + np.sum(qq * qq, -1, dtype=F32)
                    ssq_k = ssq_k + np.sum(kk * kk, -1, dtype=F32)[..., None]
                    q_rope, k_rope = (qq * gq[dc:]).astype(F32), (kk * gk[dc:]).astype(F32)
            aq = _inv_rms(ssq_q, dc + dr, eps)
            ak = _inv_rms(ssq_k, dc + dr, eps)
        # absorption bmm: fp32 accumulate, written in D
        q_lat = _f32(np.einsum("bshd,rhd->bshr", q_in.astype(F64), w_uk[:, hg, :])).astype(D)
    inp = {"q_latent": q_lat, "kv_c": cs.raw("kv_c")}
    if cs.is_fp8():
        inp["kv_c_scale"] = cs.raw("kv_c_scale")
    if dr:
        inp["q_rope"], inp["k_rope"] = q_rope.astype(D), k_rope.astype(D)
    if aq is not None:
        inp["alpha_q"], inp["alpha_k"] = aq.astype(F32), ak.astype(F32)
    return inp


def kernel_level_inputs(cs):
    names = ("q_latent", "q_rope", "kv_c", "kv_c_scale", "k_rope", "alpha_q", "alpha_k")
    return {n: cs.raw(n) for n in names if cs.has(n)}


# ----------------------------------------------------------------------------- engine: cache
def build_pool(cs, inp):
    """Shuffled 64-token pages, NaN in every slot no token fills, block table. Page 0 is the
    engine's null block (vLLM's block pool never hands it out) and one spare page is left."""
    B, r, dr, G = cs.B, cs.r, cs.dr, cs.G
    lens = cs.seqlens
    npg = [-(-T // PAGE) for T in lens]
    total = sum(npg) + 2
    perm = 1 + np.random.default_rng([int(cs.cfg.get("seed", 0)), 656]).permutation(total - 1)
    nslot = total * PAGE
    fp8 = cs.is_fp8()
    pool = {"lat": np.full((nslot, r), np.nan, F32)}   # bf16 values (bf16 cache)
    if fp8:
        pool["code"] = np.full((nslot, r), np.nan, F32)          # e4m3 values (0x7F: NaN)
        pool["scale"] = np.full((nslot, -(-r // FP8_BLOCK)), np.nan, F32)
    pool["rope"] = np.full((nslot, dr), np.nan, F32)
    if "alpha_k" in inp:
        pool["ak"] = np.full((nslot, G), np.nan, F32)
    table = np.full((B, max(max(npg), 1)), -1, np.int64)
    k = 0
    for b, T in enumerate(lens):
        for j in range(npg[b]):
            table[b, j] = perm[k + j]
            t = np.arange(j * PAGE, min((j + 1) * PAGE, T))
            s = perm[k + j] * PAGE + (t - j * PAGE)
            if fp8:
                pool["code"][s] = inp["kv_c"][b, t].astype(F32)
                pool["scale"][s] = inp["kv_c_scale"][b, t].astype(F32)
            else:
                pool["lat"][s] = inp["kv_c"][b, t].astype(F32)
            if dr:
                pool["rope"][s] = inp["k_rope"][b, t].astype(F32)
            if "ak" in pool:
                pool["ak"][s] = inp["alpha_k"][b, t].astype(F32)
        k += npg[b]
    return pool, table


def engine_indices(cs, table, multiple, bug):
    """[B, S, K_pad] global cache slots (-1 pads), K_pad a multiple of `multiple`."""
    B, S = cs.B, cs.S
    if cs.has("indices"):
        rows = cs.raw("indices").astype(np.int64)                # [B,S,K], -1 anywhere
    else:
        wins = []
        for b, T in enumerate(cs.seqlens):
            for i in range(S):
                n = (T - S + i + 1 if cs.causal else T) if T > 0 else 0
                wins.append(np.arange(max(n, 0)))
        K = max([w.size for w in wins] + [1])
        rows = np.full((B, S, K), -1, np.int64)
        for n, w in enumerate(wins):
            rows[n // S, n % S, :w.size] = w
    K = rows.shape[-1]
    kp = max(-(-K // multiple) * multiple, multiple)
    abs_idx = np.full((B, S, kp), -1, np.int64)
    abs_idx[..., :K] = rows
    if bug == "indices_not_paged":                               # request-relative indices passed on
        return abs_idx
    ok = abs_idx >= 0
    a = np.where(ok, abs_idx, 0)
    glob = table[np.arange(B)[:, None, None], a // PAGE] * PAGE + a % PAGE
    return np.where(ok, glob, -1)


# ----------------------------------------------------------------------------- kernel pieces
def _gather(cs, pool, ids, fp8, bug, rope_zero):
    """A 64-token block as the producer leaves it in shared memory: latent [n, r] and rope
    [n, dr] as bf16 values in fp32, alpha_k [n, G] for the fork, and the validity mask."""
    nslot = pool["lat"].shape[0]
    if fp8:                                           # V32: -1 -> block 0, slot UINT_MAX % 64
        valid = ids != -1
        slot = np.where(valid, ids, (2 ** 32 - 1) % PAGE)
    else:                                             # sparse_fwd: t >= 0 && t < s_kv, else zero-fill
        valid = (ids >= 0) & (ids < nslot)
        slot = np.where(valid, ids, 0)
    rope = pool["rope"][slot].copy()
    if fp8:
        code = np.where(valid[:, None], pool["code"][slot], F32(0))          # codes zeroed for -1
        sc = np.where(valid[:, None], pool["scale"][slot], F32(0))           # scales zeroed for -1
        sc_b = _bf(sc)                                                       # (bf16)scales_float[i]
        scol = sc_b[:, np.arange(cs.r) // FP8_BLOCK]
        with np.errstate(invalid="ignore", over="ignore"):
            lat = _bf(_bf(code) * scol)                                      # bf16 x bf16 -> bf16
            if bug == "rope_scaled":                                         # rope dequantized too
                rope = _bf(rope * sc_b[:, -1:])
    else:
        lat = np.where(valid[:, None], pool["lat"][slot], F32(0))
    if rope_zero:
        rope = np.where(valid[:, None], rope, F32(0))
    ak = np.where(valid[:, None], pool["ak"][slot], F32(0)) if "ak" in pool else None
    return lat, rope, ak, valid


def _scores(cs, q, qr, rc_q, lat, rope, ak, gmap, content_dims, wg1):
    """QK^T through the fork: [H, n] fp32 raw scores (before the softmax scale)."""
    r, dr = cs.r, cs.dr
    both = _order_all(content_dims, [(r, r + dr)], wg1) if dr else content_dims

    def one_acc():                                    # one accumulator over [latent; rope]
        if not dr:
            return _mma(q, lat, content_dims)
        return _mma(np.concatenate([q, qr], 1), np.concatenate([lat, rope], 1), both)
    if ak is None or cs.norm == "none":               # unmodified kernel
        return one_acc()
    rc = _mul(rc_q[:, None], ak[:, gmap].T)          # fork: fp32(alpha_q * alpha_k[slot, g(h)])
    if cs.norm == "unified":                          # whole score scaled
        return _mul(one_acc(), rc)
    s_c = _mma(q, lat, content_dims)                  # blockwise: latent tiles alone
    if dr:
        return _fma(s_c, rc, _mma(qr, rope, [(0, dr)]))
    return _mul(s_c, rc)


def _order_all(content_dims, rope_dims, wg1):
    """Tile order over [latent; rope]: WG0 / decode: latent tiles then rope; sparse_fwd's WG1:
    the second latent half, the rope tile, then the first latent half."""
    if wg1:
        return content_dims[:1] + rope_dims + content_dims[1:]
    return content_dims + rope_dims


def _lane_sums(p, pairwise):
    """Per quad lane q (columns 8k + 2q + e) sequential fp32 sums of one block's P."""
    n = p.shape[1]
    pp = np.zeros((p.shape[0], BLOCK), F32)
    pp[:, :n] = p
    v = pp.reshape(p.shape[0], 8, 4, 2)               # [H, k, q, e]
    out = np.zeros((p.shape[0], 4), F32)
    for k in range(8):
        if pairwise:                                  # sparse_fwd: cur += p(i) + p(i+1)
            out = _add(out, _add(v[:, k, :, 0], v[:, k, :, 1]))
        else:                                         # decode: cur += p(i), i over (k, e)
            out = _add(out, v[:, k, :, 0])
            out = _add(out, v[:, k, :, 1])
    return out


def _quad(l4):                                        # shfl_xor 1 then 2
    return _add(_add(l4[:, 0], l4[:, 1]), _add(l4[:, 2], l4[:, 3]))


# ----------------------------------------------------------------------------- sparse fp8 decode
def schedule(B, topk_pad, parts):
    """get_mla_metadata_kernel: (begin_req, begin_block, begin_split, first_split, end_req,
    end_block, last_split) per SM part, and num_splits (prefix sums)."""
    nb = (max(topk_pad, 1) - 1) // BLOCK + 1
    total = B * (nb + FIXED_OVERHEAD)
    payload = -(-total // parts) + FIXED_OVERHEAD
    metas, num_splits = [], [0] * (B + 1)
    now_req = now_block = now_split = cum = 0
    for _ in range(parts):
        m = dict(begin_req=now_req, begin_block=now_block, begin_split=now_split,
                 first_split=now_block != 0)
        remain = payload
        while now_req < B:
            if remain >= nb - now_block + FIXED_OVERHEAD:
                cum += now_split + 1
                num_splits[now_req + 1] = cum
                remain -= nb - now_block + FIXED_OVERHEAD
                now_req, now_block, now_split = now_req + 1, 0, 0
            else:
                if remain - FIXED_OVERHEAD > 0:
                    now_block += remain - FIXED_OVERHEAD
                    now_split += 1
                break
        m["end_req"] = now_req if now_block > 0 else now_req - 1
        m["end_block"] = now_block if now_block > 0 else nb
        er = m["end_req"]
        m["last_split"] = er >= 0 and m["end_block"] != nb
        if m["begin_req"] == m["end_req"]:
            m["first_split"] = m["last_split"] = m["first_split"] or m["last_split"]
        metas.append(m)
    return metas, num_splits, nb


def sparse_fp8_decode(cs, inp, pool, gidx, sink, bug):
    """flash_mla_with_kvcache(is_fp8_kvcache=True, indices=...) on sm90: returns the fp32 output
    just before its bf16 store [B,S,H,r] and lse [B,S,H] (natural log, +inf when empty)."""
    B, S, H, G, r, dr = cs.B, cs.S, cs.H, cs.G, cs.r, cs.dr
    gmap = np.arange(H) // (H // G)
    hpad = 64 * max(-(-H // 64), 1)
    parts = max(NUM_SMS // S // (hpad // 64), 1)
    kp = gidx.shape[-1]
    metas, num_splits, nb = schedule(B, kp, parts)
    scale2 = _mul(F32(cs.scale), LOG_2_E)
    q_all = inp["q_latent"].astype(F32)
    qr_all = inp["q_rope"].astype(F32) if dr else None
    aq_all = inp["alpha_q"].astype(F32) if "alpha_q" in inp else None
    cdims = [(0, r)]
    o_fin = np.zeros((B, S, H, r), F32)
    lse = np.full((B, S, H), np.inf, F32)
    o_acc, l_acc = {}, {}
    sink_t = np.full(H, -np.inf, F32) if sink is None else _mul(sink, CUDART_L2E_F)   # rAttn_sink
    for m in metas:
        if m["begin_req"] >= B:
            continue
        for b in range(m["begin_req"], m["end_req"] + 1):
            start = m["begin_block"] if b == m["begin_req"] else 0
            end = m["end_block"] if b == m["end_req"] else nb
            if b == m["begin_req"]:
                no_split = not m["first_split"]
            elif b == m["end_req"]:
                no_split = not m["last_split"]
            else:
                no_split = True
            for i in range(S):
                q, aq = q_all[b, i], (aq_all[b, i] if aq_all is not None else None)
                qr = qr_all[b, i] if dr else None
                rM = np.full(H, MAX_INIT_VAL, F32)
                rL4 = np.zeros((H, 4), F32)
                rO = np.zeros((H, r), F32)
                for blk in range(start, end):
                    ids = gidx[b, i, blk * BLOCK:(blk + 1) * BLOCK]
                    lat, rope, ak, valid = _gather(cs, pool, ids, True, bug, False)
                    s = _scores(cs, q, qr, aq, lat, rope, ak, gmap, cdims, False)
                    s = np.where(valid[None, :], s, F32(-np.inf)).astype(F32)
                    cur = _mul(s.max(1), scale2)
                    new = np.maximum(cur, rM)
                    corr = ex2_approx(_add(rM, -new))
                    rO = _mul(rO, corr[:, None])
                    p = ex2_approx(_fma(s, scale2, -new[:, None]))
                    rL4 = _fma(rL4, corr[:, None], _lane_sums(p, False))
                    rO = _mma(_bf(p), lat.T.copy(), [(0, p.shape[1])], rO)
                    rM = new
                rL = _quad(rL4)
                den = _bf(rL) if bug == "row_denominator_bf16" else rL
                live = rL != 0
                if no_split:
                    with np.errstate(invalid="ignore", over="ignore"):
                        o_sc = np.where(live, _rcp(_add(den, ex2_approx(_add(sink_t, -rM)))), F32(0))
                    o_fin[b, i] = _mul(rO, o_sc[:, None])
                    lsum = rL
                    if bug == "sink_in_lse":
                        lsum = _add(rL, ex2_approx(_add(sink_t, -rM)))
                    if bug == "lse_base2":
                        val = _add(_log2f(lsum), rM)
                    else:
                        val = _add(_logf(lsum), _f32(rM.astype(F64) / F64(M_LOG2E_F)))
                    lse[b, i] = np.where(live, val, F32(np.inf))
                else:
                    split = num_splits[b] + (m["begin_split"] if b == m["begin_req"] else 0)
                    o_sc = np.where(live, _rcp(den), F32(0))
                    o_acc[(b, i, split)] = _mul(rO, o_sc[:, None])
                    l_acc[(b, i, split)] = np.where(live, _add(_log2f(rL), rM), F32(-np.inf))
    for b in range(B):
        n = num_splits[b + 1] - num_splits[b]
        if n <= 1:
            continue
        for i in range(S):
            sp = range(num_splits[b], num_splits[b + 1])
            o_fin[b, i], lse[b, i] = _combine([o_acc[(b, i, j)] for j in sp],
                                              [l_acc[(b, i, j)] for j in sp], sink, bug)
    return o_fin, lse


def _combine(os_, ls, sink, bug):
    """flash_fwd_mla_combine_kernel for one (b, s_q) row, all heads: lanes hold splits j, j+32..."""
    n, H = len(ls), ls[0].shape[0]
    nl = -(-n // 32)
    lanes = np.full((nl, 32, H), -np.inf, F32)
    for j in range(n):
        lanes[j // 32, j % 32] = ls[j]
    mx = lanes.max((0, 1))
    mx = np.where(mx == -np.inf, F32(0), mx)
    tot = np.zeros((32, H), F32)
    for k in range(nl):
        tot = _add(tot, ex2_approx(_add(lanes[k], -mx)))
    for off in (16, 8, 4, 2, 1):                       # butterfly: every lane ends with one tree
        tot = _add(tot, tot[np.arange(32) ^ off])
    s = tot[0]
    glob = np.where(s == 0, F32(np.inf), _add(_log2f(s), mx))
    lse = glob if bug == "lse_base2" else _f32(glob.astype(F64) / F64(M_LOG2E_F))
    if sink is not None:
        with np.errstate(invalid="ignore", over="ignore"):
            fin = glob != np.inf
            e = ex2_approx(_fma(sink, CUDART_L2E_F, -np.where(fin, glob, F32(0))))
            upd = _add(glob, _log2f(_add(F32(1), e)))
            glob = np.where(fin, upd, np.where(sink == -np.inf, F32(np.inf), _mul(sink, CUDART_L2E_F)))
        if bug == "sink_in_lse":
            lse = _f32(glob.astype(F64) / F64(M_LOG2E_F))
    res = np.zeros_like(os_[0])
    for j in range(n):
        w = ex2_approx(_add(ls[j], -glob))
        res = _fma(w[:, None], os_[j], res)
    return res, lse


# ----------------------------------------------------------------------------- sparse_fwd (bf16)
def sparse_fwd_bf16(cs, inp, pool, gidx, sink, bug):
    """flash_mla_sparse_fwd on sm90 (csrc/sm90/prefill/sparse/phase1.cuh), one q token (b, i) at a time: fp32 output just
    before its bf16 store [B,S,H,r] and lse [B,S,H] (natural, +inf when empty)."""
    B, S, H, G, r, dr = cs.B, cs.S, cs.H, cs.G, cs.r, cs.dr
    gmap = np.arange(H) // (H // G)
    half = r // 2
    scale2 = _mul(F32(cs.scale), LOG_2_E)
    q_all = inp["q_latent"].astype(F32)
    qr_all = inp["q_rope"].astype(F32) if dr else None
    aq_all = inp["alpha_q"].astype(F32) if "alpha_q" in inp else None
    dims0 = [(0, half), (half, r)]                    # WG0: tiles 0-3, 4-7 (then 8: rope)
    dims1 = [(half, r), (0, half)]                    # WG1: tiles 4-7 (8: rope), then 0-3
    sink_t = np.full(H, -np.inf, F32) if sink is None else _mul(sink, CUDART_L2E_F)   # rAttn_sink
    o_fin = np.zeros((B, S, H, r), F32)
    lse = np.full((B, S, H), np.inf, F32)
    nblk = gidx.shape[-1] // BLOCK
    for b in range(B):
        for i in range(S):
            q, qr = q_all[b, i], (qr_all[b, i] if dr else None)
            aq = aq_all[b, i] if aq_all is not None else None
            rM0 = np.full(H, MAX_INIT_VAL, F32)
            rM1 = rM0.copy()
            l0, l1 = np.zeros((H, 4), F32), np.zeros((H, 4), F32)
            o0, o1 = np.zeros((H, half), F32), np.zeros((H, r - half), F32)
            for j in range(0, nblk, 2):
                blocks = []
                for w, dims in ((0, dims0), (1, dims1)):
                    ids = gidx[b, i, (j + w) * BLOCK:(j + w + 1) * BLOCK]
                    lat, rope, ak, valid = _gather(cs, pool, ids, False, bug, True)
                    s = _scores(cs, q, qr, aq, lat, rope, ak, gmap, dims, w == 1)
                    blocks.append((np.where(valid[None, :], s, F32(-np.inf)).astype(F32), lat))
                (s0, v0), (s1, v1) = blocks
                # WG0 online softmax
                new0 = np.maximum(rM0, _mul(s0.max(1), scale2))
                sc0 = ex2_approx(_add(rM0, -new0))
                o0 = _mul(o0, sc0[:, None])
                p0 = ex2_approx(_fma(s0, scale2, -new0[:, None]))
                l0 = _fma(l0, sc0[:, None], _lane_sums(p0, True))
                rM0 = new0
                # WG1 online softmax against WG0's new max (sM)
                new1 = np.maximum(new0, _mul(s1.max(1), scale2))
                sc1 = ex2_approx(_add(rM1, -new1))
                o1 = _mul(o1, sc1[:, None])
                p1 = ex2_approx(_fma(s1, scale2, -new1[:, None]))
                l1 = _fma(l1, sc1[:, None], _lane_sums(p1, True))
                rM1 = new1
                # WG1: o1 += bf16(P1) V1[:, half:];  WG0: o0 += bf16(P0) V0[:, :half]
                o1 = _mma(_bf(p1), v1[:, half:].T.copy(), [(0, BLOCK)], o1)
                o0 = _mma(_bf(p0), v0[:, :half].T.copy(), [(0, BLOCK)], o0)
                # WG0: rescale to new1, P0 stored again in bf16 for WG1's half
                sf = ex2_approx(_add(rM0, -new1))
                rM0 = new1
                p0s = _bf(_mul(p0, sf[:, None]))
                o0 = _mul(o0, sf[:, None])
                l0 = _mul(l0, sf[:, None])
                o0 = _mma(_bf(p1), v1[:, :half].T.copy(), [(0, BLOCK)], o0)
                o1 = _mma(p0s, v0[:, half:].T.copy(), [(0, BLOCK)], o1)
            rL = _add(_quad(l0), _quad(l1))
            rM = rM1
            live = rL != 0
            den = _bf(rL) if bug == "row_denominator_bf16" else rL
            with np.errstate(invalid="ignore", over="ignore"):
                sfin = np.where(live, _rcp(_add(den, ex2_approx(_add(sink_t, -rM)))), F32(0))
            o_fin[b, i] = np.concatenate([_mul(o0, sfin[:, None]), _mul(o1, sfin[:, None])], 1)
            lsum = _add(rL, ex2_approx(_add(sink_t, -rM))) if bug == "sink_in_lse" else rL
            if bug == "lse_base2":
                val = _add(_log2f(lsum), rM)
            else:
                val = _add(_logf(lsum), _mul(rM, CUDART_LN2_F))
            lse[b, i] = np.where(live, val, F32(np.inf))
    return o_fin, lse


# ----------------------------------------------------------------------------- engine: run
def run(case, bug=None):
    cs = load(case)
    D = cs.stored
    inp = kernel_level_inputs(cs) if cs.level == "kernel" else engine_prelude(cs)
    pool, table = build_pool(cs, inp)
    sink = cs.get("attn_sink", F32) if cs.has("attn_sink") else None
    if cs.is_fp8():
        gidx = engine_indices(cs, table, BLOCK, bug)             # decode kernel: topk % 64
        o, lse = sparse_fp8_decode(cs, inp, pool, gidx, sink, bug)
    else:
        gidx = engine_indices(cs, table, 2 * BLOCK, bug)         # sparse_fwd: topk % 128
        o, lse = sparse_fwd_bf16(cs, inp, pool, gidx, sink, bug)
    if bug == "one_head":
        o[:, :, -1] = _mul(o[:, :, -1], F32(1.05))
    if bug == "one_sequence":
        o[-1] = _mul(o[-1], F32(1.004))
    if bug == "scale_bias":
        o = _mul(o, F32(1.01))
    lat = o.astype(BF16)                                         # the kernel's bf16 out
    # engine: FlashMLA's lse [B, H, S_q] back to [B, S_q, H]; its +inf (no token) -> -inf
    lse = np.where(lse == np.inf, F32(-np.inf), lse).astype(F32)
    if cs.level == "kernel":
        return {"latent_out": lat.astype(D), "lse": lse}
    G, r, dv, H = cs.G, cs.r, cs.dv, cs.H
    wv = cs.get("w_uv", F64).reshape(r, G, dv)[:, np.arange(H) // (H // G), :]   # [r,H,dv]
    out = _f32(np.einsum("bshr,rhv->bshv", lat.astype(F64), wv)).astype(D)        # bmm w_vc
    return {"out": out, "lse": lse, "latent_out": lat.astype(D)}


BUGS = {
    "one_head": "the last head's kernel output scaled by 1.05 before its bf16 store",
    "one_sequence": "the last sequence's kernel output scaled by 1.004 before its bf16 store",
    "row_denominator_bf16": "the softmax row sum l rounded to bf16 before the epilogue's division",
    "scale_bias": "the kernel output scaled by 1.01",
    "lse_base2": "lse returned in the kernel's base 2 (log2(l) + m, the / log2(e) forgotten)",
    "indices_not_paged": "request-relative top-k indices passed without the block-table "
                         "conversion (abs_indices2indices_in_kvcache skipped)",
    "sink_in_lse": "the sink term exp(s_h) folded into the returned lse as well",
    "rope_scaled": "fp8 cache: the rope part dequantized with the last 128-block's scale",
}


def bug_applies(cfg, bug):
    live = [int(T) for T in cfg["seqlens"]]
    if bug == "one_sequence":
        return live[-1] > 0
    if bug == "sink_in_lse":
        return bool(cfg.get("attn_sink")) and any(live)
    if bug == "rope_scaled":
        return cfg["profile"] == "fp8-block128" and int(cfg["d_r"]) > 0 and any(live)
    return any(live)
