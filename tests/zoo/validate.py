#!/usr/bin/env python3
"""Check every correct zoo style directly against a golden case's ref.* (no audit involved).

    validate.py QKMLA_BINARY WORK_DIR [--seed 50100] [--quick]
    validate.py --files CASE.safetensors ...

Generates cases over presets x profiles x norms (plus rope order/style, S_q, causal variants),
runs each applicable style, and prints rel_l2 of out / lse / latent_out against ref.*.
Expected: about the stored dtype's rounding (bf16 ~1e-3, fp16 ~1e-4, fp32 ~1e-6, fp64 ~1e-15),
larger for designs that round more (torch_eager's bf16 scores, explicit keys) on peaked cases.
"""
import argparse
import importlib
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from common import load  # noqa: E402
from run_zoo import STYLES, applicable, stats  # noqa: E402


def check_file(path, out=sys.stdout):
    cs = load(path)
    worst = {}
    for style in STYLES:
        mod = importlib.import_module(style)
        if not applicable(mod, cs):
            continue
        with np.errstate(all="ignore"):
            o = mod.run(cs)
        cols = []
        for k in ("out", "lse", "latent_out"):
            ref = cs.ref(k)
            if k in o and ref is not None:
                st = stats(o[k], ref, k)
                cols.append(f"{k}={st.get('rel_l2', float('inf')):.1e}"
                            + ("" if not st.get("nonfinite") else f"(NONFINITE {st['nonfinite']})"))
                worst[(style, k)] = st.get("rel_l2", float("inf"))
        c = cs.cfg
        print(f"{os.path.basename(path):28s} {c.get('preset', '?'):9s} {cs.level:6s} {cs.profile:4s} "
              f"{cs.norm:9s} {cs.rope_order[:4]} {cs.rope_style[:4]} sq={cs.S} "
              f"{'c' if cs.causal else 'nc'} {c.get('scenario', '?'):12s} {style:15s} " + " ".join(cols),
              file=out, flush=True)
    return worst


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary", nargs="?")
    ap.add_argument("work_dir", nargs="?")
    ap.add_argument("--seed", type=int, default=50100)
    ap.add_argument("--files", nargs="*")
    ap.add_argument("--presets", default="tiny,tiny-nope,paper-g8")
    ap.add_argument("--profiles", default="fp64,fp32,bf16,fp16,fp8")
    ap.add_argument("--norms", default="blockwise,unified,none")
    ap.add_argument("--scenario", default="normal")
    ap.add_argument("--level", default="module")
    a = ap.parse_args()
    if a.files:
        for f in a.files:
            check_file(f)
        return
    os.makedirs(a.work_dir, exist_ok=True)
    seed = a.seed
    i = 0
    for preset in a.presets.split(","):
        for prof in a.profiles.split(","):
            for norm in a.norms.split(","):
                i += 1
                sq = [1, 2, 4][i % 3]
                sl = [0, sq, 64 if preset == "paper-g8" else 100]
                order = ["norm_then_rope", "rope_then_norm"][i % 2]
                style = ["interleaved", "half"][(i // 2) % 2]
                path = os.path.join(a.work_dir, f"v{i}.safetensors")
                cmd = [a.binary, "golden", "--preset", preset, "--profile", prof, "--norm", norm,
                       "--sq", str(sq), "--batch", "3", "--seqlens", ",".join(map(str, sl)),
                       "--rope-order", order, "--rope-style", style, "--scenario", a.scenario,
                       "--seed", str(seed + i), "-o", path]
                if a.level != "module":
                    cmd += ["--level", a.level]
                p = subprocess.run(cmd, capture_output=True, text=True)
                if p.returncode != 0:
                    print(f"golden failed ({preset} {prof} {norm}): {p.stderr.strip()[-300:]}")
                    continue
                check_file(path)


if __name__ == "__main__":
    main()
