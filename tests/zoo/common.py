"""Shared plumbing for the zoo: reading a golden case, dtype tables, writing outputs.

Only I/O and dtype bookkeeping live here. The arithmetic of each implementation (rope, norms,
absorption, softmax) is written inside its own style file, in that style's idiom, so the zoo's
styles do not share a numerical core (one convention slip would otherwise hide in all of them).

Facts checked against the real loader (safetensors 0.8, numpy 2.4, ml_dtypes 0.7):
- `safetensors.numpy.load_file` raises "data type 'bfloat16' not understood" unless ml_dtypes
  is imported first; with it, BF16 tensors come back as ml_dtypes.bfloat16 arrays and F8_E4M3
  as ml_dtypes.float8_e4m3fn.
- ml_dtypes rounds float64 -> bfloat16 directly (RNE), not via float32.
- `load_file` fails on F8_E4M3 ("module 'numpy' has no attribute 'float8_e4m3fn'"), so cases are
  read by the small header parser below (8-byte LE length, JSON header, raw LE data), which
  maps F8_E4M3 to ml_dtypes.float8_e4m3fn; for the other dtypes it agrees with load_file.
"""
import json

import ml_dtypes  # noqa: F401  (registers bfloat16 / float8 with numpy before safetensors loads)
import numpy as np
import struct

from safetensors.numpy import save_file

BF16 = ml_dtypes.bfloat16
F8E4M3 = ml_dtypes.float8_e4m3fn

# stored dtype per profile (conventions §3); fp8: the latent cache is e4m3 + per-token scale, the rest
# bf16; fp8-block128: e4m3 + one power-of-two scale per 128 latent values (kv_c_scale [B, T, ceil(r/128)])
STORED = {"fp64": np.float64, "fp32": np.float32, "bf16": BF16, "fp16": np.float16, "fp8": BF16,
          "fp8-block128": BF16}
# accumulate dtype per profile
ACCUM = {"fp64": np.float64, "fp32": np.float32, "bf16": np.float32, "fp16": np.float32,
         "fp8": np.float32, "fp8-block128": np.float32}
# latent values per scale in fp8-block128 (conventions §3; the last block shorter when r % 128 != 0)
FP8_BLOCK = 128


_DT = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": BF16,
       "F8_E4M3": F8E4M3, "I32": np.int32, "I64": np.int64, "U8": np.uint8, "I8": np.int8}


def read_safetensors(path):
    """(tensors, metadata) of a safetensors file, every dtype of conventions §9 included."""
    with open(path, "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0]
    hdr = json.loads(blob[8:8 + n])
    meta = hdr.pop("__metadata__", {}) or {}
    base = 8 + n
    out = {}
    for name, d in hdr.items():
        dt = np.dtype(_DT[d["dtype"]]).newbyteorder("<")
        a, b = d["data_offsets"]
        arr = np.frombuffer(blob[base + a:base + b], dtype=dt).reshape(d["shape"])
        out[name] = arr.astype(dt.newbyteorder("="), copy=True)
    return out, meta


class Case:
    """A golden case: config + tensors exactly as stored in the file."""

    def __init__(self, path):
        self.path = str(path)
        self.t, md = read_safetensors(self.path)
        self.cfg = json.loads(md["qkmla.config"])
        c = self.cfg
        self.B, self.S = int(c["batch"]), int(c["s_q"])
        self.H, self.G = int(c["heads"]), int(c["groups"])
        self.r, self.dc, self.dr, self.dv = (int(c["latent_rank"]), int(c["d_c"]),
                                             int(c["d_r"]), int(c["d_v"]))
        self.eps = float(c["eps"])
        self.scale = float(c["softmax_scale"])
        self.norm = c.get("norm", "blockwise")
        self.rope_order = c.get("rope_order", "norm_then_rope")
        self.rope_style = c.get("rope_style", "interleaved")
        self.causal = bool(c.get("causal", True))
        self.profile = c["profile"]
        self.level = c.get("level", "module")
        self.seqlens = [int(x) for x in np.asarray(self.t["seqlens"]).reshape(-1)]
        self.stored = STORED[self.profile]
        self.accum = ACCUM[self.profile]

    def has(self, name):
        return name in self.t and self.t[name].size > 0

    def raw(self, name):
        return self.t[name]

    def get(self, name, dtype=None):
        """Tensor widened (exactly) to `dtype` (default: the profile's accumulate type)."""
        x = self.t[name]
        return np.asarray(x).astype(dtype or self.accum)

    def ref(self, name):
        return self.t.get("ref." + name)

    def is_fp8(self):
        return self.t["kv_c"].dtype == F8E4M3

    def is_block128(self):
        """fp8-block128: kv_c_scale is [B, T_max, ceil(r/128)], not [B, T_max]."""
        return self.is_fp8() and self.t["kv_c_scale"].ndim == 3

    def features(self):
        """The §1.5 features this case uses: a subset of ("topk", "attn_sink")."""
        return tuple(f for f, n in (("topk", "indices"), ("attn_sink", "attn_sink")) if self.has(n))


def load(case):
    return case if isinstance(case, Case) else Case(case)


def to_dtype(x, dtype):
    """Round (RNE, straight from x's precision) to `dtype`."""
    return np.asarray(x).astype(dtype)


def save_outputs(outs, path, meta=None):
    """Write outputs in the dtype each one is delivered in (bf16 via ml_dtypes)."""
    arrs = {k: np.ascontiguousarray(v) for k, v in outs.items()}
    save_file(arrs, str(path), metadata=meta)
