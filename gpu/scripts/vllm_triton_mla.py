"""vLLM's real Triton MLA decode kernel, unmodified, on golden cases, under Triton's interpreter.

Run with torch (CPU), triton and packaging:
VLLM_TRITON_DECODE=/path/to/triton_decode_attention.py python3 gpu/scripts/vllm_triton_mla.py
CASE_DIR OUT_DIR [--kernel-file PATH] [--raw-interpreter] [--truncating-casts] [--features]
[--page-size N] [--sm-count N]. The kernel file is vLLM's own
`vllm-project/vllm vllm/v1/attention/ops/triton_decode_attention.py` (v0.34.0 was used; keep it
outside this repository: its code is not ours to commit); it is imported as it is, with
TRITON_INTERPRET=1, and called the way
`vllm-project/vllm vllm/v1/attention/backends/mla/triton_mla.py` `TritonMLAImpl.forward_mqa` and
the MLA layer around it
(`vllm-project/vllm vllm/model_executor/layers/attention/mla_attention.py`: `_prepare_mqa_query`,
`process_weights_after_loading`, `_v_up_proj`) call it:

    W_UK_T = W_UK.permute(1, 2, 0) [N, P, L]; W_UV = W_UV.transpose(0, 1) [N, L, V]    (stored D)
    ql_nope = bmm(q_nope.transpose(0, 1), W_UK_T).transpose(0, 1)                        (D)
    q = cat(ql_nope, q_pe)                         rope: fp32 with the case's tables, -> D once
    kv_cache [blocks, page, r + d_r] = cat(kv_c, k_pe) per token (D), pages handed out shuffled
    o = zeros(rows, N, r, D); lse = zeros(rows, N, D); attn_logits [rows, N, splits, r + 1] f32
    num_kv_splits = _compute_num_kv_splits(max_seq_len, sm_count)  (next_pow2(max(1, L // 512)))
    S_q > 1: block_table.repeat_interleave(S_q); causal: seq_lens + arange(1 - S_q, 1)
    decode_attention_fwd(q, kv_cache.unsqueeze(2), kv_cache[..., :r], o, lse, block_table,
                         seq_lens, attn_logits, splits, scale, page, k_scale=1, v_scale=1,
                         is_mla=True)
    out = bmm(o.transpose(0, 1), W_UV).transpose(0, 1)                                    (D)

Module level: norm `none` only (vLLM's MLA layer has no QK-norm; a normed module around it would
be ours, not vLLM's). Kernel level, any norm: q_latent, q_rope, kv_c, k_rope from the case (§2).
QK-normed kernel cases fold alpha_q into the query and alpha_k into G per-group keys, each product
fp32 then rounded once to D (blockwise: the latent part only; unified: latent and rope parts,
conventions §1.2-1.3); the value stays the unscaled latent, so these run the kernel's GQA path
(`is_mla=False`, V read from its own buffer, here the latent expanded over the G kv heads).
vLLM schedules no decode for an empty sequence: a T_b = 0 sequence is not launched and its rows
are out = 0, lse = -inf. fp8 profiles are skipped (vLLM's fp8 cache has one per-tensor scale and
quantizes the rope part; the cases have per-token scales and a bf16 rope part), as are top-k and
sinks (the kernel has neither) and the kernel's MHA path (G = H) in bf16 / fp16 (bf16 and fp16
element-wise products and tl.sum, which the interpreter cannot run as the GPU does).

Interpreter shims (on unless --raw-interpreter; the kernel source is untouched): Triton 3.9's
interpreter keeps bf16 as raw uint16 bits, so tl.dot on bf16 multiplies the bit patterns and
fp32 -> bf16 casts (`p.to(v.dtype)`, the stores to o and lse) truncate. The shim gives tl.dot
on bf16 operands their exact fp32 values (fp32 accumulate, as the GPU's bf16 MMA) and rounds
fp32 -> bf16 to nearest even (the GPU's cvt.rn); any other bf16 arithmetic raises
(--truncating-casts keeps the interpreter's truncation: a probe of the judge). Not emulated:
fp32 tl.dot runs in IEEE fp32 (the GPU default is TF32), tl.exp / tl.log are NumPy's (the GPU's
are ex2.approx / lg2.approx based), accumulation orders are NumPy's.
vllm.* shims: vllm.platforms.current_platform (is_rocm False, is_cuda True, fp8 e4m3fn,
num_compute_units = --sm-count, 132 = H100 SXM) and vllm.triton_utils (the real triton, tl).
Delivers module out, latent_out (o as stored), lse (D, natural log: the kernel uses tl.exp /
tl.log); kernel latent_out, lse. Writes OUT_DIR/<case>__VLLM_TRITON.safetensors, prints one JSON
line per case with rel_l2 against ref.*; judge with `qkmla audit CASE OUT --form absorbed`.
"""
import argparse
import importlib.util
import json
import os
import sys
import types
import warnings

os.environ["TRITON_INTERPRET"] = "1"
# -inf - -inf = NaN in the rows of BLOCK_H past the last head (mask_h false; never stored)
warnings.filterwarnings("ignore", category=RuntimeWarning, module="triton.runtime.interpreter")

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "zoo"))
from common import load, save_outputs  # noqa: E402

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

TORCH_DT = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
# vllm-project/vllm vllm/config/cache.py CacheConfig.DEFAULT_BLOCK_SIZE (v0.34.0); the Triton MLA
# backend accepts it (get_supported_kernel_block_sizes: MultipleOf(16))
PAGE_SIZE = 64
SM_COUNT = 132      # H100 SXM5 multi_processor_count (CudaPlatform.num_compute_units)
# vllm-project/vllm vllm/v1/attention/backends/mla/triton_mla.py, module constants
_MIN_WORK_PER_SPLIT = 512
_SPLIT_OCCUPANCY_MULTIPLIER = 2


# ----------------------------------------------------------------------------- vllm.* shims
class _CudaHopperPlatform:
    """The few current_platform members the kernel file and forward_mqa read, as CudaPlatform
    answers them on an H100: not ROCm (is_hip_ False: BLOCK 32, BLOCK_H 16, the Lk 576 split),
    CUDA, fp8 = float8_e4m3fn, compute capability 9.0."""

    def __init__(self, sm_count):
        self.sm_count = sm_count

    def is_rocm(self):
        return False

    def is_cuda(self):
        return True

    def fp8_dtype(self):
        return torch.float8_e4m3fn

    def num_compute_units(self, device_id=0):
        return self.sm_count

    def get_device_capability(self, device_id=0):
        return (9, 0)


def import_kernel(path, sm_count):
    vllm = types.ModuleType("vllm")
    plat = types.ModuleType("vllm.platforms")
    plat.current_platform = _CudaHopperPlatform(sm_count)
    tu = types.ModuleType("vllm.triton_utils")
    tu.triton, tu.tl = triton, tl          # vllm/triton_utils/__init__.py with HAS_TRITON
    vllm.platforms, vllm.triton_utils = plat, tu
    sys.modules.update({"vllm": vllm, "vllm.platforms": plat, "vllm.triton_utils": tu})
    name = "vllm.v1.attention.ops.triton_decode_attention"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def install_interpreter_shims(rne=True):
    """bf16 in Triton's interpreter as the GPU computes it (see the docstring); any bf16 op the
    shim does not cover raises instead of computing on bit patterns. rne=False keeps the
    interpreter's truncating fp32 -> bf16 casts (a probe of the judge, not the GPU's behaviour)."""
    from triton.runtime import interpreter as itp
    bld = itp.InterpreterBuilder
    orig_dot, orig_cast, orig_bin, orig_un = (bld.create_dot, bld.cast_impl, bld.binary_op,
                                              bld.unary_op)
    orig_sum = itp.ReduceOps.sum

    def f32(h):
        if h.dtype.scalar == tl.bfloat16:
            return (np.asarray(h.data).astype(np.uint32) << np.uint32(16)).view(np.float32)
        return h.data

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if tl.bfloat16 not in (a.dtype.scalar, b.dtype.scalar):
            return orig_dot(self, a, b, d, input_precision, max_num_imprecise_acc)
        return itp.TensorHandle(np.matmul(f32(a), f32(b), dtype=d.data.dtype) + d.data,
                                d.dtype.scalar)

    def cast_impl(self, src, dst_type):
        if rne and src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            data = np.asarray(src.data, np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)
            return itp.TensorHandle(data, dst_type.scalar)
        return orig_cast(self, src, dst_type)

    def binary_op(self, lhs, rhs, op):
        if tl.bfloat16 in (lhs.dtype.scalar, rhs.dtype.scalar):
            raise NotImplementedError("bf16 element-wise arithmetic under the interpreter")
        return orig_bin(self, lhs, rhs, op)

    def unary_op(self, arg, op):
        if arg.dtype.scalar == tl.bfloat16:
            raise NotImplementedError("bf16 unary op under the interpreter")
        return orig_un(self, arg, op)

    def rsum(self, input):
        if input.dtype.scalar == tl.bfloat16:
            raise NotImplementedError("bf16 tl.sum under the interpreter")
        return orig_sum(self, input)

    bld.create_dot, bld.cast_impl, bld.binary_op, bld.unary_op = (create_dot, cast_impl,
                                                                  binary_op, unary_op)
    itp.ReduceOps.sum = rsum


# ----------------------------------------------------------------------------- helpers
def compute_num_kv_splits(max_seq_len, sm_count):
    """_compute_num_kv_splits of the Triton MLA backend, as written there."""
    ideal_splits = triton.next_power_of_2(max(1, max_seq_len // _MIN_WORK_PER_SPLIT))
    return min(ideal_splits, sm_count * _SPLIT_OCCUPANCY_MULTIPLIER)


def rotate(x, cos, sin, style):
    """conventions §1.1 Rot_p in fp32 on fp32 values x [..., d_r], cos/sin [..., d_r/2]."""
    h = x.shape[-1] // 2
    a, b = (x[..., 0::2], x[..., 1::2]) if style == "interleaved" else (x[..., :h], x[..., h:])
    ya, yb = a * cos - b * sin, a * sin + b * cos
    if style == "interleaved":
        return torch.stack([ya, yb], -1).flatten(-2)
    return torch.cat([ya, yb], -1)


def rel_l2(x, ref):
    x = np.asarray(x).astype(np.float64)
    y = np.asarray(ref).astype(np.float64)
    m = np.isfinite(y)
    if not np.array_equal(np.isfinite(x), m):
        return float("inf")
    n = np.linalg.norm(np.where(m, y, 0))
    d = np.linalg.norm(np.where(m, x - np.where(m, y, 0), 0))
    return float(d / n) if n > 0 else float(d)


class Skip(Exception):
    def __init__(self, reason, quiet=False):
        super().__init__(reason)
        self.quiet = quiet      # top-k / sinks: printed only under --features


# ----------------------------------------------------------------------------- one case
def run_case(path, kern, opts):
    cs = load(path)
    if cs.profile not in ("fp32", "bf16", "fp16"):
        raise Skip(f"profile {cs.profile}: vLLM's Triton MLA fp8 cache has one per-tensor scale "
                   "and an fp8 rope part; the case has per-token/block scales and a bf16 rope")
    if cs.features():
        raise Skip(f"{'/'.join(cs.features())}: decode_attention_fwd has no top-k or sink",
                   quiet=True)
    if cs.level == "module" and cs.norm != "none":
        raise Skip(f"module level, norm {cs.norm}: vLLM's MLA layer has no QK-norm")
    D = TORCH_DT[np.dtype(cs.stored).name]
    B, S, H, G, r, dr, dv = cs.B, cs.S, cs.H, cs.G, cs.r, cs.dr, cs.dv
    hpg = H // G

    def T_(name):  # the case tensor as stored (exact in D)
        return torch.from_numpy(np.asarray(cs.get(name, np.float32))).to(D)

    live = [b for b in range(B) if cs.seqlens[b] > 0]   # vLLM never schedules an empty decode
    seq = torch.tensor([cs.seqlens[b] for b in live], dtype=torch.int32)
    folded = cs.level == "kernel" and cs.norm != "none"
    nkv = G if folded else 1
    if folded and hpg == 1 and D != torch.float32:
        raise Skip("G = H: the kernel's MHA path (_fwd_kernel_stage1) multiplies and tl.sums "
                   f"in {np.dtype(cs.stored).name}, which the interpreter cannot run as a GPU does")
    # ---- the query [rows, H, r + d_r] and the cache rows [B, T, nkv, r + d_r], latent [B, T, r]
    if cs.level == "module":
        w_uk = T_("w_uk").view(r, G, cs.dc)[:, torch.arange(H) // hpg, :]       # W_UK [L, N, P]
        w_uv = T_("w_uv").view(r, G, dv)[:, torch.arange(H) // hpg, :]          # W_UV [L, N, V]
        W_UK_T, W_UV = w_uk.permute(1, 2, 0), w_uv.transpose(0, 1)
        q_nope = T_("q_nope")[live].reshape(-1, H, cs.dc)                      # [rows, N, P]
        ql_nope = q_nope.new_empty((q_nope.shape[0], H, r))
        torch.bmm(q_nope.transpose(0, 1), W_UK_T, out=ql_nope.transpose(0, 1))
        kv_c = T_("kv_c")
        if dr:
            cos = torch.from_numpy(cs.get("rope_cos", np.float32))
            sin = torch.from_numpy(cs.get("rope_sin", np.float32))
            pos = torch.tensor([[cs.seqlens[b] - S + i for i in range(S)] for b in live])
            qpe = rotate(T_("q_pe")[live].float(), cos[pos][:, :, None], sin[pos][:, :, None],
                         cs.rope_style).to(D).reshape(-1, H, dr)
            Tm = kv_c.shape[1]
            k_rope = rotate(T_("k_pe").float(), cos[:Tm][None], sin[:Tm][None],
                            cs.rope_style).to(D)
            q = torch.cat((ql_nope, qpe), dim=-1)
        else:
            q, k_rope = ql_nope, None
        keys = torch.cat((kv_c, k_rope), -1) if dr else kv_c
        keys = keys[:, :, None, :]
    else:
        qlat = T_("q_latent")[live]                                             # [b, S, H, r]
        qr = T_("q_rope")[live] if dr else None
        kv_c = T_("kv_c")
        kr = T_("k_rope") if dr else None
        if folded:
            aq = torch.from_numpy(cs.get("alpha_q", np.float32))[live][..., None]   # [b,S,H,1]
            ak = torch.from_numpy(cs.get("alpha_k", np.float32))[..., None]         # [B,T,G,1]
            qlat = (qlat.float() * aq).to(D)
            kc = (kv_c.float()[:, :, None, :] * ak).to(D)                           # [B,T,G,r]
            if dr and cs.norm == "unified":
                qr = (qr.float() * aq).to(D)
                kr = (kr.float()[:, :, None, :] * ak).to(D)
            elif dr:
                kr = kr[:, :, None, :].expand(-1, -1, G, -1)
            keys = torch.cat((kc, kr), -1) if dr else kc
        else:
            keys = (torch.cat((kv_c, kr), -1) if dr else kv_c)[:, :, None, :]
        q = (torch.cat((qlat, qr), -1) if dr else qlat).reshape(-1, H, r + dr)
    # ---- paged cache: block 0 is the null block, pages handed out shuffled, unused slots NaN
    P = opts["page_size"]
    npg = [-(-cs.seqlens[b] // P) for b in live]
    ids = 1 + torch.randperm(sum(npg), generator=torch.Generator().manual_seed(1234))
    nblocks = 1 + sum(npg)
    block_table = torch.zeros((len(live), max(npg + [1])), dtype=torch.int32)
    cache = torch.full((nblocks, P, nkv, r + dr), float("nan"), dtype=D)
    lat_cache = torch.full((nblocks, P, 1, r), float("nan"), dtype=D) if folded else None
    k = 0
    for j, b in enumerate(live):
        block_table[j, :npg[j]] = ids[k:k + npg[j]]
        k += npg[j]
        for t in range(cs.seqlens[b]):
            cache[block_table[j, t // P], t % P] = keys[b, t]
            if folded:
                lat_cache[block_table[j, t // P], t % P, 0] = kv_c[b, t]
    # ---- TritonMLAImpl.forward_mqa
    rows = q.shape[0]
    o = torch.zeros(rows, H, r, dtype=q.dtype)
    lse = torch.zeros(rows, H, dtype=q.dtype)
    num_kv_splits = compute_num_kv_splits(int(seq.max()), opts["sm_count"])
    attn_logits = torch.empty((rows, H, num_kv_splits, r + 1), dtype=torch.float32)
    if folded:     # GQA path: K = the folded per-group keys, V = the latent over the kv heads
        k_buffer, v_buffer = cache, lat_cache.expand(-1, -1, G, -1)
    else:
        k_buffer = cache                                   # kv_c_and_k_pe_cache.unsqueeze(2)
        v_buffer = k_buffer[..., :r]                       # kv_c_cache
    seq_lens = seq
    if S > 1:
        block_table = block_table.repeat_interleave(S, dim=0)
        if cs.causal:
            offsets = torch.arange(1 - S, 1, dtype=seq_lens.dtype)
            seq_lens = (seq_lens.unsqueeze(1) + offsets).flatten().clamp(min=0)
        else:
            seq_lens = seq_lens.repeat_interleave(S)
    one = torch.tensor(1.0, dtype=torch.float32)           # layer._k_scale default
    kern.decode_attention_fwd(q, k_buffer, v_buffer, o, lse, block_table, seq_lens, attn_logits,
                              num_kv_splits, cs.scale, P, k_scale=one, v_scale=one,
                              is_mla=not folded, sliding_window=None)
    # ---- back to the case's layout; T_b = 0 rows: out 0, lse -inf
    lat = torch.zeros(B, S, H, r, dtype=D)
    lse_all = torch.full((B, S, H), float("-inf"), dtype=D)
    lat[live] = o.view(len(live), S, H, r)
    lse_all[live] = lse.view(len(live), S, H)
    st = np.dtype(cs.stored)
    outs = {"latent_out": lat.float().numpy().astype(st), "lse": lse_all.float().numpy().astype(st)}
    if cs.level == "module":
        out = torch.empty(rows, H, dv, dtype=D)
        torch.bmm(o.view(-1, H, r).transpose(0, 1), W_UV, out=out.transpose(0, 1))  # _v_up_proj
        out_all = torch.zeros(B, S, H, dv, dtype=D)
        out_all[live] = out.view(len(live), S, H, dv)
        outs["out"] = out_all.float().numpy().astype(st)
    info = {"level": cs.level, "profile": cs.profile, "norm": cs.norm, "S_q": S,
            "seqlens": cs.seqlens, "page_size": P, "num_kv_splits": num_kv_splits,
            "path": "gqa(is_mla=False), alpha folded" if folded else "mla(is_mla=True)",
            "kv_group_num": H // nkv,
            "rel_l2": {n: rel_l2(v, cs.ref(n)) for n, v in outs.items() if cs.ref(n) is not None}}
    return outs, info


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cases")
    ap.add_argument("out_dir")
    ap.add_argument("--kernel-file", default=os.environ.get("VLLM_TRITON_DECODE"))
    ap.add_argument("--page-size", type=int, default=PAGE_SIZE)
    ap.add_argument("--sm-count", type=int, default=SM_COUNT)
    ap.add_argument("--raw-interpreter", action="store_true",
                    help="no shims: the interpreter's own bf16 (bit-pattern dots, truncation)")
    ap.add_argument("--truncating-casts", action="store_true",
                    help="shim the bf16 dots only, keep the interpreter's truncating casts (probe)")
    ap.add_argument("--features", action="store_true")
    a = ap.parse_args()
    cases, out_dir, kfile = a.cases, a.out_dir, a.kernel_file
    if not kfile or not os.path.exists(kfile):
        print("give vLLM's kernel file: --kernel-file PATH or VLLM_TRITON_DECODE",
              file=sys.stderr)
        return 2
    opts = {"page_size": a.page_size, "sm_count": a.sm_count}
    raw = a.raw_interpreter
    if not raw:
        install_interpreter_shims(rne=not a.truncating_casts)
    kern = import_kernel(kfile, opts["sm_count"])
    print(json.dumps({"torch": torch.__version__, "triton": triton.__version__,
                      "TRITON_INTERPRET": os.environ["TRITON_INTERPRET"], "kernel_file": kfile,
                      "interpreter_shims": "none" if raw else ("bf16 dot only, truncating casts"
                                                               if a.truncating_casts else
                                                               "bf16 dot + RNE casts"),
                      **opts}), flush=True)
    os.makedirs(out_dir, exist_ok=True)
    errors = 0
    for name in sorted(f for f in os.listdir(cases) if f.endswith(".safetensors")):
        row = {"case": name, "backend": "VLLM_TRITON"}
        try:
            outs, info = run_case(os.path.join(cases, name), kern, opts)
            save_outputs(outs, os.path.join(out_dir, name[: -len(".safetensors")]
                                            + "__VLLM_TRITON.safetensors"))
            row.update(info, ok=True, delivered={k: str(v.dtype) for k, v in outs.items()})
        except Skip as e:
            if e.quiet and not a.features:
                continue
            row.update(ok=False, skipped=str(e))
        except Exception as e:  # noqa: BLE001  (an interpreter refusal is reported, not hidden)
            row.update(ok=False, error=f"{type(e).__name__}: {str(e)[:300]}")
            errors += 1
        print(json.dumps(row), flush=True)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
