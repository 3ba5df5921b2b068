#!/usr/bin/env python3
"""Reference paged decode kernels in the FlashMLA and FlashInfer layouts.

Written from docs/layouts.md only (plus docs/conventions.md sections 1.2 and 2), without reading
qkmla's C++ sources, as an independent check of `qkmla golden --layout` / `qkmla audit --layout`.

    paged_kernels.py CASE.safetensors OUT.safetensors --layout flashmla|flashinfer
                     [--bug NAME] [--lse-base 2]
    paged_kernels.py --self-test

Only the tensors prefixed `flashmla.` / `flashinfer.` and the config in the metadata are read.
Each sequence's pages are walked through the block table (flashmla) or kv_indptr/kv_indices
(flashinfer); logits, a max-subtracted softmax, latent_out and lse are computed in float32
(float64 when the stored dtype is float64).  --bug injects a plausible integration mistake.

FlashMLA also takes sparse top-k (config `topk` > 0: `flashmla.indices [B, S_q, K]`, global
cache slots page * P + offset, -1 pads; exactly the listed slots are attended, in index order,
instead of the causal window) and attention sinks (config `attn_sink`: `flashmla.attn_sink [H]`;
the output is scaled by 1 / (1 + exp(s_h - lse)) before it is stored, lse is returned without it).

Profile fp8-block128 (config `profile`): FlashMLA's `flashmla.k_cache` is its packed fp8 cache,
U8 [num_blocks, P, 1, W] with W = r + 4 ceil(r/128) + 2 d_r bytes per slot: the r e4m3 codes, the
ceil(r/128) little-endian fp32 scales (scale j for latent values 128 j ... 128 j + 127), the d_r
little-endian bf16 rope values; latent value l = code_l * scale_{l / 128}.  FlashInfer's
`flashinfer.ckv_scale_cache` is then [num_pages, P, ceil(r/128)].  Bug `per_token_scale` (that
profile, r > 128 only; a no-op elsewhere) dequantizes every latent value of a slot with the
slot's first block scale, as a kernel written for one scale per token would.
"""
import argparse, json, math, struct, sys

import ml_dtypes
import numpy as np

DT = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
      "F8_E4M3": ml_dtypes.float8_e4m3fn, "I64": np.int64, "I32": np.int32, "U8": np.uint8}
DT_NAME = {np.dtype(v): k for k, v in DT.items()}
BUGS = ["block_table_shift", "lse_transposed", "lse_base2", "no_alpha", "reads_past_len",
        "topk_off_by_one", "sink_in_lse", "sink_ignored", "per_token_scale"]
BLOCK = 128                                                 # fp8-block128: latent values per scale


def is_block128(cfg):
    return cfg.get("profile") == "fp8-block128"


def block_scales(scale, r, bug=None):
    """Expand per-block scales [..., ceil(r/128)] to one per latent value [..., r]; with bug
    per_token_scale every value takes the first block's scale."""
    cols = np.zeros(r, np.int64) if bug == "per_token_scale" else np.arange(r) // BLOCK
    return scale[..., cols]


def unpack_flashmla_fp8(kc, r, d_r, bug=None):
    """FlashMLA's packed fp8 cache U8 [NB, P, 1, W] -> float32 [NB, P, r + d_r]: per slot the
    dequantized latent (code * scale of its 128-block) then the bf16 rope (docs/layouts.md)."""
    nb = -(-r // BLOCK)
    W = r + 4 * nb + 2 * d_r
    if kc.dtype != np.uint8 or kc.ndim != 4 or kc.shape[2] != 1 or kc.shape[3] != W:
        raise ValueError(f"flashmla.k_cache: want U8 [NB, P, 1, {W}], got {kc.dtype} {kc.shape}")
    raw = np.ascontiguousarray(kc[:, :, 0, :])                              # [NB, P, W] bytes
    codes = raw[..., :r].view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    scale = np.ascontiguousarray(raw[..., r:r + 4 * nb]).view("<f4").astype(np.float32)
    rope_bits = np.ascontiguousarray(raw[..., r + 4 * nb:]).view("<u2").astype(np.uint16)
    rope = rope_bits.view(ml_dtypes.bfloat16).astype(np.float32)
    return np.concatenate([codes * block_scales(scale, r, bug), rope], axis=-1)


def pack_flashmla_fp8(codes, scale, rope):
    """The inverse, written byte by byte from the docs: codes [..., r] e4m3, scale [..., nb] F32,
    rope [..., d_r] bf16 -> U8 [..., W] (little-endian scales and rope)."""
    c = np.ascontiguousarray(codes.astype(ml_dtypes.float8_e4m3fn)).view(np.uint8)
    sb = np.ascontiguousarray(scale.astype("<f4")).view(np.uint8)
    rb = np.ascontiguousarray(rope.astype(ml_dtypes.bfloat16)).view(np.uint16).astype("<u2")
    return np.concatenate([c, sb, np.ascontiguousarray(rb).view(np.uint8)], axis=-1)


def load(path):
    """Parse a safetensors file directly (bf16 and e4m3 included): (tensors, config)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", {}) or {}
    tensors = {}
    for name, h in header.items():
        a, b = h["data_offsets"]
        tensors[name] = np.frombuffer(data[a:b], dtype=DT[h["dtype"]]).reshape(h["shape"]).copy()
    return tensors, json.loads(meta.get("qkmla.config", "{}"))


def save(path, tensors):
    header, blobs, off = {}, [], 0
    for name, arr in tensors.items():
        arr = np.ascontiguousarray(arr)
        raw = arr.tobytes()
        header[name] = {"dtype": DT_NAME[arr.dtype], "shape": list(arr.shape),
                        "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    hb = json.dumps(header).encode()
    hb += b" " * (-len(hb) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)) + hb + b"".join(blobs))


def attend(ql, qr, aq, C, Kr, ak, pos, cfg, no_alpha=False, window=True):
    """One query row (all heads) against the gathered tokens C [n,r], Kr [n,d_r], ak [n,G].

    The row sees tokens t <= pos when causal (window=False: all the given tokens, as for a top-k
    index set); returns (latent_out [H,r], lse [H]) or None."""
    H, G = cfg["heads"], cfg["groups"]
    n = C.shape[0]
    if cfg["causal"] and window:
        n = max(0, min(n, pos + 1))
    if n == 0:
        return None
    C, Kr = C[:n], Kr[:n]
    acc = C.dtype
    content = ql @ C.T                                     # [H, n]
    rope = qr @ Kr.T                                       # [H, n]
    if cfg["norm"] != "none" and not no_alpha:
        a = aq[:, None] * ak[:n, np.arange(H) // (H // G)].T  # [H, n]: alpha_q * alpha_k[g(h)]
    else:
        a = np.ones((H, n), acc)
    sigma = acc.type(cfg["softmax_scale"])
    if cfg["norm"] == "unified":
        s = sigma * a * (content + rope)
    else:
        s = sigma * (a * content + rope)
    m = s.max(axis=1, keepdims=True)
    e = np.exp(s - m)
    tot = e.sum(axis=1, keepdims=True)
    return (e / tot) @ C, (m + np.log(tot))[:, 0]


def acc_type(stored):
    return np.float64 if stored == np.float64 else np.float32


def flashmla(t, cfg, bug=None):
    q, kc, bt = t["flashmla.q"], t["flashmla.k_cache"], t["flashmla.block_table"]
    acc = acc_type(q.dtype)
    B, S, H, _ = q.shape
    P, r = kc.shape[1], cfg["latent_rank"]
    if is_block128(cfg):                                    # packed fp8 cache, decoded to fp32
        qf, kf = q.astype(acc), unpack_flashmla_fp8(kc, r, int(cfg["d_r"]), bug).astype(acc)
    else:
        qf, kf = q.astype(acc), kc[:, :, 0, :].astype(acc)  # [NB, P, r + d_r]
    norm = cfg["norm"] != "none"
    aq = t["flashmla.alpha_q"].astype(acc) if norm else None
    akc = t["flashmla.alpha_k_cache"].astype(acc) if norm else None
    out = np.zeros((B, S, H, r), acc)
    lse = np.full((B, S, H), np.inf, np.float32)           # [B, S_q, H] until written out
    sink = cfg.get("attn_sink", False)
    s_h = t["flashmla.attn_sink"].astype(acc) if sink else None
    if cfg.get("topk", 0) > 0:
        idx = t["flashmla.indices"]
        flat = kf.reshape(-1, kf.shape[-1])                 # [NB*P, r + d_r]: global slot order
        aflat = akc.reshape(-1, akc.shape[-1]) if norm else None
        for b in range(B):
            for i in range(S):
                slots = np.array([int(x) for x in idx[b, i] if x >= 0], np.int64)  # index order
                if bug == "topk_off_by_one":
                    slots = np.minimum(slots + 1, flat.shape[0] - 1)
                K = flat[slots]
                res = attend(qf[b, i, :, :r], qf[b, i, :, r:], aq[b, i] if norm else None,
                             K[:, :r], K[:, r:], aflat[slots] if norm else None, 0, cfg,
                             bug == "no_alpha", window=False)
                if res is not None:
                    out[b, i], lse[b, i] = apply_sink(res, s_h, bug) if sink else res
        return flashmla_outputs(out, lse, q.dtype, bug)
    for b in range(B):
        T = int(t["flashmla.cache_seqlens"][b])
        npg = -(-T // P)
        if bug == "block_table_shift":
            pages = [bt[b, j + 1] if j + 1 < npg else bt[b, npg - 1] for j in range(npg)]
        else:
            pages = [bt[b, j] for j in range(npg)]
        L = npg * P if bug == "reads_past_len" else T       # tokens the kernel believes it has
        K = kf[pages].reshape(-1, kf.shape[-1])[:L]
        ak = akc[pages].reshape(-1, akc.shape[-1])[:L] if norm else None
        for i in range(S):
            res = attend(qf[b, i, :, :r], qf[b, i, :, r:], aq[b, i] if norm else None,
                         K[:, :r], K[:, r:], ak, L - S + i, cfg, bug == "no_alpha")
            if res is not None:
                out[b, i], lse[b, i] = apply_sink(res, s_h, bug) if sink else res
    return flashmla_outputs(out, lse, q.dtype, bug)


def apply_sink(res, s_h, bug=None):
    """Scale one row's latent_out [H,r] by exp(lse)/(exp(lse)+exp(s_h)) = 1/(1+exp(s_h-lse)),
    in the accumulate type; the lse returned is the one without the sink."""
    o, l = res
    with np.errstate(over="ignore"):
        f = np.ones_like(l) / (np.ones_like(l) + np.exp(s_h - l))   # s_h = -inf: f = 1
    if bug != "sink_ignored":
        o = o * f[:, None]
    if bug == "sink_in_lse":                                 # log(exp(lse) + exp(s_h)), stably
        m = np.maximum(l, s_h)
        with np.errstate(invalid="ignore"):
            l = np.where(np.isneginf(s_h), l, m + np.log1p(np.exp(-np.abs(l - s_h))))
    return o, l


def flashmla_outputs(out, lse, dtype, bug=None):
    B, S, H = lse.shape
    if bug == "lse_transposed":
        lse_out = np.ascontiguousarray(lse).reshape(B, H, S)   # raw [B,S_q,H] buffer, wrong shape
    else:
        lse_out = np.ascontiguousarray(lse.transpose(0, 2, 1))
    return {"out": out.astype(dtype), "softmax_lse": lse_out.astype(np.float32)}


def flashinfer(t, cfg, bug=None, base2=False):
    qn, qp = t["flashinfer.q_nope"], t["flashinfer.q_pe"]
    acc = acc_type(qn.dtype)
    ckv = t["flashinfer.ckv_cache"].astype(acc)
    if "flashinfer.ckv_scale_cache" in t and is_block128(cfg):   # one scale per 128-block
        sc = t["flashinfer.ckv_scale_cache"].astype(acc)    # [NP, P, ceil(r/128)]
        ckv = ckv * block_scales(sc, ckv.shape[-1], bug)
    elif "flashinfer.ckv_scale_cache" in t:                 # fp8: value = code * scale
        ckv = ckv * t["flashinfer.ckv_scale_cache"].astype(acc)[:, :, None]
    kpe = t["flashinfer.kpe_cache"].astype(acc)
    P = ckv.shape[1]
    qo, kvp, kvi = t["flashinfer.qo_indptr"], t["flashinfer.kv_indptr"], t["flashinfer.kv_indices"]
    norm = cfg["norm"] != "none"
    aq = t["flashinfer.alpha_q"].astype(acc) if norm else None
    akc = t["flashinfer.alpha_k_cache"].astype(acc) if norm else None
    N, H, r = qn.shape
    qnf, qpf = qn.astype(acc), qp.astype(acc)
    o = np.zeros((N, H, r), acc)
    lse = np.full((N, H), -np.inf, np.float32)
    for b in range(len(qo) - 1):
        T = int(t["flashinfer.kv_len"][b])
        lo, hi = int(kvp[b]), int(kvp[b + 1])
        if bug == "block_table_shift":                      # off by one; clamp reads to the array
            pages = [kvi[min(j + 1, len(kvi) - 1)] for j in range(lo, hi)]
        else:
            pages = [kvi[j] for j in range(lo, hi)]
        L = len(pages) * P if bug == "reads_past_len" else T
        C = ckv[pages].reshape(-1, r)[:L]
        Kr = kpe[pages].reshape(-1, kpe.shape[-1])[:L]
        ak = akc[pages].reshape(-1, akc.shape[-1])[:L] if norm else None
        S = int(qo[b + 1]) - int(qo[b])
        for i in range(S):
            n = int(qo[b]) + i
            res = attend(qnf[n], qpf[n], aq[n] if norm else None, C, Kr, ak, L - S + i, cfg,
                         bug == "no_alpha")
            if res is not None:
                o[n], lse[n] = res
    if base2 or bug == "lse_base2":
        lse = lse / np.float32(math.log(2.0))
    return {"o": o.astype(qn.dtype), "lse": lse.astype(np.float32)}


# ---------------------------------------------------------------- self-test

def dense_reference(d, cfg):
    """Plain float64 loops over the dense tensors: latent_out [B,S,H,r], lse [B,S,H].

    With `indices` the listed tokens replace the causal window; with `attn_sink` latent_out is
    scaled by 1 / (1 + exp(s_h - lse)) and lse is left without the sink."""
    B, S, H, r = d["q_latent"].shape
    G = cfg["groups"]
    out = np.zeros((B, S, H, r))
    lse = np.full((B, S, H), np.nan)                        # nan marks "sees no token"
    kv = d["kv_c"].astype(np.float64)
    if "kv_c_scale" in d and d["kv_c_scale"].ndim == 3:     # fp8-block128: scale per 128-block
        r = kv.shape[-1]
        kv = kv * np.stack([d["kv_c_scale"][:, :, l // BLOCK] for l in range(r)], -1)
    elif "kv_c_scale" in d:
        kv = kv * d["kv_c_scale"][:, :, None]
    for b in range(B):
        T = cfg["seqlens"][b]
        for i in range(S):
            if "indices" in d:
                vis = [int(t) for t in d["indices"][b, i] if t >= 0]
            else:
                vis = [t for t in range(T) if not cfg["causal"] or t <= T - S + i]
            for h in range(H):
                g = h // (H // G)
                logits = []
                for t in vis:
                    c = float(np.dot(d["q_latent"][b, i, h].astype(np.float64), kv[b, t]))
                    rp = float(np.dot(d["q_rope"][b, i, h].astype(np.float64),
                                      d["k_rope"][b, t].astype(np.float64)))
                    a = 1.0 if cfg["norm"] == "none" else \
                        float(d["alpha_q"][b, i, h]) * float(d["alpha_k"][b, t, g])
                    z = a * (c + rp) if cfg["norm"] == "unified" else a * c + rp
                    logits.append(cfg["softmax_scale"] * z)
                if logits:
                    w = np.exp(np.array(logits) - max(logits))
                    out[b, i, h] = (w / w.sum()) @ kv[b, vis]
                    lse[b, i, h] = max(logits) + math.log(w.sum())
                    if "attn_sink" in d:
                        out[b, i, h] /= 1.0 + math.exp(float(d["attn_sink"][h]) - lse[b, i, h])
    return out, lse


def make_paged(d, cfg, P, rng):
    """Lay the dense case out in both layouts: shuffled pages, NaN in unused slots, one spare."""
    B, S, H, r = d["q_latent"].shape
    dr, G = d["q_rope"].shape[-1], cfg["groups"]
    seq = cfg["seqlens"]
    npg = [-(-T // P) for T in seq]
    order = rng.permutation(sum(npg) + 1)                  # the last id is the spare page
    pages, k = [], 0
    for n in npg:
        pages.append([int(x) for x in order[k:k + n]])
        k += n
    NB = len(order)
    fp8 = "kv_c_scale" in d
    blk = fp8 and d["kv_c_scale"].ndim == 3                 # fp8-block128
    ckv = np.full((NB, P, r), np.nan, np.float32)
    kpe = np.full((NB, P, dr), np.nan, np.float32)
    akc = np.full((NB, P, G), np.nan, np.float32)
    scl = np.full((NB, P) + d["kv_c_scale"].shape[2:] if blk else (NB, P), np.nan, np.float32)
    W = r + 4 * -(-r // BLOCK) + 2 * dr
    packed = np.full((NB, P, 1, W), 0xFF, np.uint8)         # unfilled slots: all 0xFF bytes
    for b in range(B):
        for t in range(seq[b]):
            p, s = pages[b][t // P], t % P
            ckv[p, s] = d["kv_c"][b, t].astype(np.float32)
            kpe[p, s] = d["k_rope"][b, t]
            scl[p, s] = d["kv_c_scale"][b, t] if fp8 else 1.0
            if blk:
                packed[p, s, 0] = pack_flashmla_fp8(d["kv_c"][b, t], d["kv_c_scale"][b, t],
                                                    d["k_rope"][b, t])
            if cfg["norm"] != "none":
                akc[p, s] = d["alpha_k"][b, t]
    mb = max(1, max(npg))
    bt = np.full((B, mb), -1, np.int32)
    for b in range(B):
        bt[b, :npg[b]] = pages[b]
    out = {"flashinfer.q_nope": d["q_latent"].reshape(B * S, H, r),
           "flashinfer.q_pe": d["q_rope"].reshape(B * S, H, dr),
           "flashinfer.ckv_cache": ckv.astype(ml_dtypes.float8_e4m3fn) if fp8 else ckv,
           "flashinfer.kpe_cache": kpe,
           "flashinfer.qo_indptr": np.arange(B + 1, dtype=np.int32) * S,
           "flashinfer.kv_indptr": np.concatenate([[0], np.cumsum(npg)]).astype(np.int32),
           "flashinfer.kv_indices": np.array(sum(pages, []), np.int32),
           "flashinfer.kv_len": np.array(seq, np.int32),
           "flashinfer.kv_last_page_len": np.array([T - (n - 1) * P if T else 0
                                                    for T, n in zip(seq, npg)], np.int32)}
    if fp8:
        out["flashinfer.ckv_scale_cache"] = scl
    if not fp8 or blk:
        out.update({"flashmla.q": np.concatenate([d["q_latent"], d["q_rope"]], -1),
                    "flashmla.k_cache": packed if blk else
                    np.concatenate([ckv, kpe], -1)[:, :, None, :],
                    "flashmla.block_table": bt,
                    "flashmla.cache_seqlens": np.array(seq, np.int32)})
        if "indices" in d:                                  # token -> global slot page * P + offset
            idx = d["indices"]
            glob = np.full(idx.shape, -1, np.int32)
            for b, i, k in zip(*np.nonzero(idx >= 0)):
                t = int(idx[b, i, k])
                glob[b, i, k] = pages[b][t // P] * P + t % P
            out["flashmla.indices"] = glob
        if "attn_sink" in d:
            out["flashmla.attn_sink"] = d["attn_sink"]
    if cfg["norm"] != "none":
        out["flashinfer.alpha_q"] = d["alpha_q"].reshape(B * S, H)
        out["flashinfer.alpha_k_cache"] = akc
        if not fp8 or blk:
            out["flashmla.alpha_q"], out["flashmla.alpha_k_cache"] = d["alpha_q"], akc
    return out


def self_test():
    rng = np.random.default_rng(7)
    ok = True
    for norm in ["blockwise", "unified", "none"]:
        for causal in [True, False]:
            for fp8 in [False, True]:
                B, S, H, G, r, dr, P = 4, 3, 4, 2, 8, 4, 4
                seq = [5, 0, 13, 2]
                cfg = dict(heads=H, groups=G, latent_rank=r, d_r=dr, softmax_scale=0.3, norm=norm,
                           causal=causal, s_q=S, seqlens=seq, profile="fp8" if fp8 else "fp32")
                f = lambda *s: rng.standard_normal(s).astype(np.float32)
                d = {"q_latent": f(B, S, H, r), "q_rope": f(B, S, H, dr),
                     "kv_c": f(B, 13, r), "k_rope": f(B, 13, dr),
                     "alpha_q": rng.uniform(.5, 2, (B, S, H)).astype(np.float32),
                     "alpha_k": rng.uniform(.5, 2, (B, 13, G)).astype(np.float32)}
                if fp8:
                    d["kv_c_scale"] = (np.abs(d["kv_c"]).max(-1) / 448).astype(np.float32)
                    d["kv_c"] = (d["kv_c"] / d["kv_c_scale"][:, :, None]).astype(
                        ml_dtypes.float8_e4m3fn)
                ref_o, ref_l = dense_reference(d, cfg)
                t = make_paged(d, cfg, P, rng)
                got = {"flashinfer": flashinfer(t, cfg)}
                if not fp8:
                    got["flashmla"] = flashmla(t, cfg)
                for lay, res in got.items():
                    if lay == "flashmla":
                        o, l, empty = res["out"], res["softmax_lse"].transpose(0, 2, 1), np.inf
                    else:
                        o, l, empty = res["o"].reshape(B, S, H, r), res["lse"].reshape(B, S, H), -np.inf
                    seen = ~np.isnan(ref_l)
                    good = (np.allclose(o, ref_o, rtol=1e-5, atol=1e-5)
                            and np.allclose(l[seen], ref_l[seen], rtol=1e-5, atol=1e-5)
                            and np.all(l[~seen] == empty) and np.all(o[~seen] == 0))
                    # the bugs must change the result (block_table_shift needs a multi-page seq)
                    for bug in ["block_table_shift", "no_alpha", "reads_past_len"]:
                        if bug == "no_alpha" and norm == "none":
                            continue
                        bad = flashmla(t, cfg, bug) if lay == "flashmla" else flashinfer(t, cfg, bug)
                        k = "out" if lay == "flashmla" else "o"
                        if np.array_equal(bad[k], res[k], equal_nan=True):
                            good = False
                            print(f"  bug {bug} had no effect")
                    print(f"{'PASS' if good else 'FAIL'} {lay:10s} norm={norm:9s} causal={causal} "
                          f"fp8={fp8}")
                    ok &= good
    ok &= self_test_sparse_sink(rng)
    ok &= self_test_block128(rng)
    print("self-test:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


def draw_indices(rng, seq, S, K, causal):
    """indices [B, S, K]: a set of [ceil(n/2), n] tokens of the row's window (n = min(K, window)),
    in random order, -1 pads in random places."""
    idx = np.full((len(seq), S, K), -1, np.int32)
    for b, T in enumerate(seq):
        for i in range(S):
            w = max(0, T - S + i + 1) if causal else T
            n = min(K, w)
            m = int(rng.integers(-(-n // 2), n + 1)) if n else 0
            toks = rng.permutation(w)[:m]
            where = rng.permutation(K)[:m]
            idx[b, i, where] = toks
    return idx


def small_inputs(rng, cfg, kv, k_rope, topk, sink):
    """The self-tests' dense kernel inputs around a given latent cache: queries, statistics, and
    top-k indices and sinks when asked (B = 4, S = 3, H = 4, G = 2, 13 cache rows)."""
    B, S, H, G, r, dr = 4, cfg["s_q"], cfg["heads"], cfg["groups"], cfg["latent_rank"], cfg["d_r"]
    f = lambda *s: rng.standard_normal(s).astype(np.float32)
    d = {"q_latent": f(B, S, H, r), "q_rope": f(B, S, H, dr), **kv, "k_rope": k_rope,
         "alpha_q": rng.uniform(.5, 2, (B, S, H)).astype(np.float32),
         "alpha_k": rng.uniform(.5, 2, (B, 13, G)).astype(np.float32)}
    if topk:
        d["indices"] = draw_indices(rng, cfg["seqlens"], S, topk, cfg["causal"])
    if sink:
        d["attn_sink"] = np.array([1.5, -0.5, 3.0, -np.inf], np.float32)
    return d


def self_test_sparse_sink(rng):
    """FlashMLA with top-k indices and/or sinks against the float64 loops, and the new bugs."""
    ok = True
    for norm in ["blockwise", "unified", "none"]:
        for causal in [True, False]:
            for topk, sink in [(5, False), (0, True), (5, True), (40, True)]:
                B, S, H, G, r, dr, P = 4, 3, 4, 2, 8, 4, 4
                seq = [5, 0, 13, 2]
                cfg = dict(heads=H, groups=G, latent_rank=r, d_r=dr, softmax_scale=0.3, norm=norm,
                           causal=causal, s_q=S, seqlens=seq, profile="fp32", topk=topk,
                           attn_sink=sink)
                f = lambda *s: rng.standard_normal(s).astype(np.float32)
                d = small_inputs(rng, cfg, {"kv_c": f(B, 13, r)}, f(B, 13, dr), topk, sink)
                ref_o, ref_l = dense_reference(d, cfg)
                t = make_paged(d, cfg, P, rng)
                res = flashmla(t, cfg)
                o, l = res["out"], res["softmax_lse"].transpose(0, 2, 1)
                seen = ~np.isnan(ref_l)
                good = (np.allclose(o, ref_o, rtol=1e-5, atol=1e-5)
                        and np.allclose(l[seen], ref_l[seen], rtol=1e-5, atol=1e-5)
                        and np.all(l[~seen] == np.inf) and np.all(o[~seen] == 0))
                bugs = (["topk_off_by_one"] if topk else []) + \
                       (["sink_in_lse", "sink_ignored"] if sink else [])
                for bug in bugs:
                    bad = flashmla(t, cfg, bug)
                    if all(np.array_equal(bad[k], res[k], equal_nan=True) for k in res):
                        good = False
                        print(f"  bug {bug} had no effect")
                if sink:                                    # sink_in_lse touches lse only
                    bad = flashmla(t, cfg, "sink_in_lse")
                    good &= np.array_equal(bad["out"], res["out"])
                    bl = bad["softmax_lse"].transpose(0, 2, 1).astype(np.float64)
                    with np.errstate(invalid="ignore"):       # nan marks rows without tokens
                        want = np.logaddexp(ref_l, d["attn_sink"].astype(np.float64))
                    good &= np.allclose(bl[seen], want[seen], rtol=1e-5, atol=1e-5)
                print(f"{'PASS' if good else 'FAIL'} flashmla   norm={norm:9s} causal={causal} "
                      f"topk={topk} sink={sink}")
                ok &= good
    return ok


def quantize_block128(c):
    """conventions section 3, fp8-block128: power-of-two scale per 128-block, RNE e4m3 codes.
    c [..., r] float64 -> (codes [..., r] e4m3, scale [..., ceil(r/128)] F32)."""
    r = c.shape[-1]
    nb = -(-r // BLOCK)
    scale = np.zeros(c.shape[:-1] + (nb,), np.float32)
    for j in range(nb):
        amax = np.abs(c[..., j * BLOCK:(j + 1) * BLOCK]).max(-1)
        x = np.maximum((amax / 448).astype(np.float32), np.float32(1e-4))
        scale[..., j] = np.exp2(np.ceil(np.log2(x))).astype(np.float32)
    codes = (c / np.stack([scale[..., l // BLOCK] for l in range(r)], -1)).astype(
        ml_dtypes.float8_e4m3fn)
    return codes, scale


def self_test_block128_bytes():
    """The packed slot decoded against bytes written by hand with struct (little-endian)."""
    r, dr = 130, 2                                          # two blocks, the second of 2 values
    codes = np.zeros(r, ml_dtypes.float8_e4m3fn)
    codes[0], codes[127], codes[128], codes[129] = 1.5, -2.0, 3.0, 448.0
    raw = codes.view(np.uint8).tobytes() + struct.pack("<ff", 0.25, 8.0) + \
        struct.pack("<HH", 0x3F80, 0xC040)                  # bf16 1.0, -3.0
    kc = np.frombuffer(raw, np.uint8).reshape(1, 1, 1, -1)
    got = unpack_flashmla_fp8(kc, r, dr)[0, 0]
    want = np.zeros(r + dr, np.float32)
    want[0], want[127], want[128], want[129], want[130], want[131] = \
        0.375, -0.5, 24.0, 3584.0, 1.0, -3.0
    good = np.array_equal(got, want) and np.array_equal(
        pack_flashmla_fp8(codes, np.array([0.25, 8.0], np.float32),
                          np.array([1.0, -3.0], np.float32)).tobytes(), raw)
    bad = unpack_flashmla_fp8(kc, r, dr, "per_token_scale")[0, 0]
    good &= bad[128] == 0.75 and bad[129] == 112.0 and bad[0] == 0.375
    empty = unpack_flashmla_fp8(np.full((1, 1, 1, len(raw)), 0xFF, np.uint8), r, dr)
    good &= bool(np.all(np.isnan(empty)))
    print(f"{'PASS' if good else 'FAIL'} flashmla   fp8-block128 packed bytes (r={r}, d_r={dr})")
    return good


def self_test_block128(rng):
    """fp8-block128 in both layouts (FlashMLA's packed U8 cache built here from the docs)
    against the float64 loops, with top-k and sinks on FlashMLA; bug per_token_scale."""
    ok = self_test_block128_bytes()
    for norm in ["blockwise", "unified", "none"]:
        for causal in [True, False]:
            for r, topk, sink in [(200, 0, False), (200, 5, True), (32, 0, True)]:
                B, S, H, G, dr, P = 4, 3, 4, 2, 4, 4
                seq = [5, 0, 13, 2]
                cfg = dict(heads=H, groups=G, latent_rank=r, d_r=dr, softmax_scale=0.1, norm=norm,
                           causal=causal, s_q=S, seqlens=seq, profile="fp8-block128", topk=topk,
                           attn_sink=sink)
                f = lambda *s: rng.standard_normal(s).astype(np.float32)
                bf = lambda a: a.astype(ml_dtypes.bfloat16).astype(np.float32)
                # blocks of different magnitudes, so that their scales differ
                mag = np.exp2(rng.integers(-3, 4, (B, 13, -(-r // BLOCK))))
                c = rng.standard_normal((B, 13, r)) * np.stack(
                    [mag[:, :, l // BLOCK] for l in range(r)], -1)
                codes, scale = quantize_block128(c)
                d = small_inputs(rng, cfg, {"kv_c": codes, "kv_c_scale": scale}, bf(f(B, 13, dr)),
                                 topk, sink)
                ref_o, ref_l = dense_reference(d, cfg)
                t = make_paged(d, cfg, P, rng)
                for lay in ["flashmla"] + ([] if topk or sink else ["flashinfer"]):
                    run = (lambda bug=None: flashmla(t, cfg, bug)) if lay == "flashmla" else \
                        (lambda bug=None: flashinfer(t, cfg, bug))
                    res = run()
                    if lay == "flashmla":
                        o, l, empty = res["out"], res["softmax_lse"].transpose(0, 2, 1), np.inf
                    else:
                        o, l, empty = res["o"].reshape(B, S, H, r), res["lse"].reshape(B, S, H), -np.inf
                    seen = ~np.isnan(ref_l)
                    tol = 1e-5 * max(1.0, float(np.abs(ref_o).max()))  # fp32 on values up to ~30
                    good = (np.allclose(o, ref_o, rtol=1e-5, atol=tol)
                            and np.allclose(l[seen], ref_l[seen], rtol=1e-5, atol=1e-5)
                            and np.all(l[~seen] == empty) and np.all(o[~seen] == 0))
                    if not good:
                        print("  max |out - ref|", np.nanmax(np.abs(o - ref_o)), "max |lse - ref|",
                              np.nanmax(np.abs(l[seen] - ref_l[seen])), "max |ref|", np.abs(ref_o).max())
                    bad = run("per_token_scale")
                    changed = not all(np.array_equal(bad[k], res[k], equal_nan=True) for k in res)
                    if changed != (r > BLOCK):
                        good = False
                        print(f"  bug per_token_scale {'changed' if changed else 'had no effect'}")
                    print(f"{'PASS' if good else 'FAIL'} {lay:10s} norm={norm:9s} causal={causal} "
                          f"fp8-block128 r={r} topk={topk} sink={sink}")
                    ok &= good
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case", nargs="?")
    ap.add_argument("out", nargs="?")
    ap.add_argument("--layout", choices=["flashmla", "flashinfer"])
    ap.add_argument("--bug", choices=BUGS)
    ap.add_argument("--lse-base", choices=["e", "2"], default="e")
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args()
    if a.self_test:
        return self_test()
    if not (a.case and a.out and a.layout):
        ap.error("CASE, OUT and --layout are required")
    t, cfg = load(a.case)
    if a.layout == "flashmla":
        res = flashmla(t, cfg, a.bug)
    else:
        res = flashinfer(t, cfg, a.bug, base2=a.lse_base == "2")
    save(a.out, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
