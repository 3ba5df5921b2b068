"""qkmla for a kernel's own tests: golden cases of QK-normed (or plain) MLA and audits of a kernel's
outputs against them, judged exactly as the `qkmla audit` CLI judges (the same C++ code).

    c = qkmla.golden(preset="tiny", profile="bf16", seqlens=[0, 37], sq=2)
    out, lse = my_kernel(**c.inputs)
    qkmla.audit(c, out=out, lse=lse).assert_pass()

Arrays: numpy arrays, anything with __array__ or DLPack (torch CPU tensors; copy GPU tensors to
the CPU first). Inputs and outputs in bf16 and fp8 use ml_dtypes' bfloat16 and float8_e4m3fn, the
ecosystem's numpy dtypes; reference tensors (`Case.ref`) are float64."""
import json

import ml_dtypes
import numpy as np

from . import _qkmla

QkmlaError = _qkmla.QkmlaError  # a ValueError: bad options or arrays, with the CLI's message

_NP = {"F64": np.dtype(np.float64), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
       "BF16": np.dtype(ml_dtypes.bfloat16), "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
       "I32": np.dtype(np.int32), "U8": np.dtype(np.uint8)}
_NAME = {v: k for k, v in _NP.items()}
_TORCH = {"torch.bfloat16": "BF16", "torch.float8_e4m3fn": "F8_E4M3"}


def _to_numpy(x):
    """numpy, __array__, or DLPack; torch tensors in dtypes numpy lacks go through float32."""
    if isinstance(x, np.ndarray):
        return x
    name = _TORCH.get(str(getattr(x, "dtype", "")))
    if name is not None:  # exact: bf16 and e4m3 values are float32 values
        return x.detach().cpu().float().numpy().astype(_NP[name])
    if hasattr(x, "__array__"):
        return np.asarray(x)
    if hasattr(x, "__dlpack__"):
        return np.from_dlpack(x)
    raise TypeError(f"not an array: {type(x).__name__}")


def _triple(name, x):
    a = _to_numpy(x)
    if a.dtype not in _NAME:
        raise QkmlaError(f"{name}: dtype {a.dtype} is not one of {sorted(_NP)}")
    return (_NAME[a.dtype], list(a.shape), np.ascontiguousarray(a, dtype=np.float64).ravel())


def _array(triple):
    dtype, shape, values = triple
    return values.reshape(shape).astype(_NP[dtype])


class Case:
    """A golden case: `.config` (conventions §9 keys), `.inputs` (name -> numpy array in its stored
    dtype), `.ref` (reference outputs, float64, keyed without the `ref.` prefix), `.metadata`."""

    def __init__(self, handle):
        self._h = handle
        self.config = json.loads(handle.config_json())
        names = handle.names()
        self.inputs = {n: _array(handle.tensor(n)) for n in names if not n.startswith("ref.")}
        self.ref = {n[4:]: _array(handle.tensor(n)) for n in names if n.startswith("ref.")}
        self.metadata = dict(handle.metadata())

    def kernel_args(self, layout):
        """The inputs as the named kernel takes them (docs/layouts.md), keyed by its argument names
        (`q`, `k_cache`, `block_table`, ... for "flashmla"; `q_nope`, `ckv_cache`, `kv_indptr`, ...
        for "flashinfer") plus `softmax_scale`: torch tensors when torch is importable, else numpy
        arrays. The case must have been made with `golden(..., layout=layout)`."""
        prefix = layout + "."
        args = {n[len(prefix):]: x for n, x in self.inputs.items() if n.startswith(prefix)}
        if not args:
            raise QkmlaError(f"this case holds no {layout} inputs: make it with golden(..., layout='{layout}')")
        try:
            import torch
        except ImportError:
            torch = None
        if torch is not None:
            args = {n: _to_torch(torch, x) for n, x in args.items()}
        args["softmax_scale"] = self.config["softmax_scale"]
        return args

    def save(self, path):
        """The safetensors file `qkmla golden -o` writes (the CLI and other clients read it)."""
        self._h.save(str(path))

    def __repr__(self):
        c = self.config
        return f"qkmla.Case({c['preset']}, {c['profile']}, seqlens={c['seqlens']}, s_q={c['s_q']})"


def _to_torch(torch, x):
    """numpy (ml_dtypes for bf16 / e4m3) -> torch, the same bits."""
    name = str(x.dtype)
    if name == "bfloat16":
        return torch.from_numpy(x.view(np.int16).copy()).view(torch.bfloat16)
    if name == "float8_e4m3fn":
        return torch.from_numpy(x.view(np.uint8).copy()).view(torch.float8_e4m3fn)
    return torch.from_numpy(np.ascontiguousarray(x))


def golden(preset=None, profile=None, seqlen=None, seqlens=None, sq=None, level="module",
           scenario=None, seed=None, heads=None, groups=None, latent_rank=None, d_c=None, d_r=None,
           d_v=None, norm=None, rope_order=None, rope_style=None, causal=None, ref_bits=113,
           inputs=None, round_inputs=False, config=None, layout=None, page_size=64, topk=None,
           attn_sink=None):
    """A golden case, as `qkmla golden` makes it. Generated from the seed (defaults: preset tiny,
    profile bf16, one sequence of 64 tokens), or from `inputs` (name -> array, conventions §2 names; the
    config from the arguments given and `config`, else inferred from shapes and dtypes).
    `topk=K` draws sparse index sets, `attn_sink=True` per-head sink logits (conventions §1.5)."""
    if seqlen is not None and seqlens is not None:
        raise QkmlaError("give seqlen or seqlens, not both")
    if topk is not None or attn_sink is not None:
        config = dict(config or {})
        if topk is not None:
            config["topk"] = int(topk)
        if attn_sink is not None:
            config["attn_sink"] = bool(attn_sink)
    given = dict(preset=preset, profile=profile, scenario=scenario, seed=seed, heads=heads,
                 groups=groups, latent_rank=latent_rank, d_c=d_c, d_r=d_r, d_v=d_v, norm=norm,
                 rope_order=rope_order, rope_style=rope_style, causal=causal, sq=sq,
                 seqlens=[seqlen] if seqlen is not None else seqlens)
    opts = {"level": level, "ref_bits": ref_bits, "round_inputs": round_inputs,
            "layout": layout or "dense", "page_size": page_size}
    if inputs is None:
        opts.update({k: v for k, v in given.items() if v is not None})
        if config:
            opts["config_json"] = json.dumps(config)
    else:
        keys = {"sq": "s_q"}
        cfg = {keys.get(k, k): v for k, v in given.items() if v is not None and k != "preset"}
        cfg.update(config or {})
        if "seqlens" in cfg:
            cfg["batch"] = len(cfg["seqlens"])
        opts["config_json"] = json.dumps(cfg) if cfg else ""
        opts["inputs"] = {n: _triple(n, x) for n, x in inputs.items()}
    return Case(_qkmla.golden(opts))


def load(path):
    """A golden case from its safetensors file."""
    return Case(_qkmla.load(str(path)))


class Verdict:
    """An audit's verdict: `.passed`, `.rows` (per tensor: rel_l2, max_ulp, baseline_ratio,
    yardstick, failed checks), `.diagnosis` (conventions the outputs match, on FAIL), `.missing`,
    `.json` (dict); `str()` is the CLI's table."""

    def __init__(self, d):
        self.passed = d["passed"]
        self.rows = d["rows"]
        self.diagnosis = d["diagnosis"]
        self.missing = d["missing"]
        self.json = json.loads(d["json"])
        self._table = d["table"]

    def __bool__(self):
        return self.passed

    def __str__(self):
        return self._table

    def assert_pass(self):
        """AssertionError carrying the whole table (pytest shows it) unless every tensor passed."""
        if not self.passed:
            raise AssertionError("qkmla audit failed\n" + self._table)


def audit(case, out=None, lse=None, latent_out=None, alpha_k=None, q_latent=None, alpha_q=None,
          label="third_party", lse_base="e", empty_lse=None, form="", design=None,
          diagnose=True, layout=None, softmax_lse=None, o=None, kv_chunk=0):
    """Judges the given outputs against `case` (a Case or a path), as `qkmla audit` does. With
    `layout="flashmla"` give FlashMLA's `out` and `softmax_lse` ([B, H, S_q], +inf for empty
    rows); with `layout="flashinfer"` its `o` and `lse` (docs/layouts.md)."""
    if not isinstance(case, Case):
        case = load(case)
    given = dict(out=out, lse=lse, latent_out=latent_out, alpha_k=alpha_k, q_latent=q_latent,
                 alpha_q=alpha_q, softmax_lse=softmax_lse, o=o)
    outputs = {n: _triple(n, x) for n, x in given.items() if x is not None}
    if empty_lse is None:
        empty_lse = "+inf" if layout == "flashmla" else "-inf"
    opts = dict(label=label, lse_base=str(lse_base), empty_lse=empty_lse, form=form,
                design=design or "", diagnose=diagnose, layout=layout or "dense",
                kv_chunk=int(kv_chunk))
    return Verdict(_qkmla.audit(case._h, outputs, opts))


__all__ = ["Case", "Verdict", "QkmlaError", "golden", "load", "audit"]
