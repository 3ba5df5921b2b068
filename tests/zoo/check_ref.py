"""Validate zoo styles directly against a golden case's ref.* tensors (rel_l2 per output)."""
import importlib
import sys

import numpy as np

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from common import load  # noqa: E402


def rel_l2(x, y):
    x = np.asarray(x, np.float64)
    y = np.asarray(y, np.float64)
    fx, fy = np.isfinite(x), np.isfinite(y)
    if np.any(fx != fy) or np.any(x[~fx] != y[~fy]):
        return float("inf")
    d = np.linalg.norm(x[fy] - y[fy])
    n = np.linalg.norm(y[fy])
    return d / n if n > 0 else d


def check(style, path, bug=None):
    mod = importlib.import_module(style)
    cs = load(path)
    outs = mod.run(cs, bug) if bug else mod.run(cs)
    res = {}
    for k, v in outs.items():
        ref = cs.ref(k)
        if ref is not None:
            res[k] = rel_l2(v, ref)
    return cs, res


if __name__ == "__main__":
    style = sys.argv[1]
    for p in sys.argv[2:]:
        cs, res = check(style, p)
        print(f"{style:16s} {cs.profile:5s} {cs.norm:9s} {cs.level:6s} {p.rsplit('/',1)[-1]:40s}",
              " ".join(f"{k}={v:.2e}" for k, v in res.items()))
