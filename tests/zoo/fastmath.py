"""Approximate fp32 exp2 and rsqrt, as GPU kernels get them from the hardware.

Real kernels do not call a correctly rounded exp2 or 1/sqrt: FlashMLA and CUTLASS compile with
--use_fast_math (exp2f -> ex2.approx.ftz.f32), FlashInfer calls ex2.approx.ftz.f32 through inline
PTX, Triton lowers tl.exp2 to it, and CUDA's rsqrtf (PyTorch's torch.rsqrt on a GPU, fused RMSNorm
kernels) is rsqrt.approx, documented within 2 ulp. Their exact bits are the hardware's; what
these models reproduce is the kind of error: deterministic, a function of the argument, about
1-2 ulp, and one-signed over stretches of arguments (so it does not average away in a sum).

- ex2_approx: x = n + f, f in [0, 1) split at 1/128 (a 128-entry table of 2^(i/128), each
  rounded to fp32) times a degree-2 polynomial for 2^r, r in [0, 1/128), evaluated in fp32;
  results below 2^-126 flush to zero (.ftz).
- rsqrt_approx: a 12-bit seed (1/sqrt(x) rounded to 12 significant bits) and one Newton step
  y (1.5 - 0.5 x y^2) in fp32, the way a table-seeded fast rsqrt is refined.

Only the fp32 paths use them; fp64 kernels keep the correctly rounded functions.
`python3 fastmath.py` measures both over 2^20 arguments (as written: ex2_approx at most 2.28 ulp,
0.49 on average, equal to the correctly rounded value on 57.5 % of them; rsqrt_approx 2.40 ulp,
0.44, 63.5 %; test zoo.fastmath_error_bounds) and exits 1 if either is off by more than 2.5 ulp
or agrees with the correctly rounded function on more than 90 % of them (then it models nothing).
"""
import numpy as np

F32 = np.float32
_TABLE = np.exp2(np.arange(128, dtype=np.float64) / 128).astype(F32)    # [128] 2^(i/128), fp32
_C1 = F32(np.log(2.0))
_C2 = F32(np.log(2.0) ** 2 / 2)


def ex2_approx(x):
    """2^x in fp32, within ~2 ulp, results below 2^-126 flushed to zero (ex2.approx.ftz.f32)."""
    x = np.asarray(x, F32)
    with np.errstate(invalid="ignore", over="ignore"):
        finite = np.isfinite(x) & (x > F32(-127)) & (x < F32(128))
        xs = np.where(finite, x, F32(0))
        n = np.floor(xs)
        f = (xs - n).astype(F32)                         # exact: x minus its integer part
        i = np.minimum((f * F32(128)).astype(np.int64), 127)
        r = (f - (i / 128.0).astype(F32)).astype(F32)    # exact, in [0, 1/128)
        t = (_C2 * r).astype(F32)
        t = (t + _C1).astype(F32)
        t = (t * r).astype(F32)
        t = (t + F32(1)).astype(F32)
        y = (_TABLE[i] * t).astype(F32)
        y = np.ldexp(y.astype(np.float64), n.astype(np.int64)).astype(F32)  # exact but for ftz
        y = np.where(y < F32(2.0 ** -126), F32(0), y)
        y = np.where(finite, y, np.where(x >= F32(128), F32(np.inf), F32(0)))
        return np.where(np.isnan(x), F32(np.nan), y).astype(F32)


def rsqrt_approx(x):
    """1/sqrt(x) in fp32 through a 12-bit seed and one fp32 Newton step (a few ulp)."""
    x = np.asarray(x, F32)
    with np.errstate(divide="ignore", invalid="ignore"):
        exact = 1.0 / np.sqrt(x.astype(np.float64))
        m, e = np.frexp(exact)
        y = np.ldexp(np.round(m * 4096) / 4096, e).astype(F32)           # the seed: 12 bits
        h = (F32(0.5) * x).astype(F32)
        h = (h * y).astype(F32)
        h = (h * y).astype(F32)
        y1 = (y * (F32(1.5) - h).astype(F32)).astype(F32)
        return np.where(np.isfinite(exact) & (x > 0), y1, exact.astype(F32)).astype(F32)


def _ulps(got, exact):
    ulp = np.spacing(np.abs(exact).astype(F32)).astype(np.float64)
    return np.abs(got.astype(np.float64) - exact) / ulp


def _measure(name, got, exact):
    e = _ulps(got, exact)
    same = float(np.mean(got == exact.astype(F32)))
    ok = e.max() <= 2.5 and same <= 0.9
    print(f"{name}: max {e.max():.2f} ulp, mean {e.mean():.2f} ulp, equal to the correctly rounded "
          f"value on {100 * same:.1f} % {'ok' if ok else 'FAILED (bound 2.5 ulp, equal <= 90 %)'}")
    return ok


if __name__ == "__main__":
    rng = np.random.default_rng(7)
    xs = rng.uniform(-120, 120, 1 << 20).astype(F32)
    ok = _measure("ex2_approx", ex2_approx(xs), np.exp2(xs.astype(np.float64)))
    ys = np.exp(rng.uniform(-20, 20, 1 << 20)).astype(F32)
    ok &= _measure("rsqrt_approx", rsqrt_approx(ys), 1.0 / np.sqrt(ys.astype(np.float64)))
    raise SystemExit(0 if ok else 1)
