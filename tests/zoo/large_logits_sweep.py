#!/usr/bin/env python3
"""False alarms of the module styles that store their scores, on `large_logits` cases only.

    large_logits_sweep.py QKMLA_BINARY WORK_DIR --seeds A-B [--markdown FILE] [--undeclared-form]
                          [--styles a,b,...] [--profiles fp16,bf16]

Where a near tie of two logits near 270 meets scores stored in fp16 or bf16 (ulp 0.25 or 2), one
row's output moves by percent with each rounding draw (proofs/budgets.md, "stored scores"). The
zoo's own cases draw `large_logits` once in four and a module level about half the time; this
sweep takes run_zoo's case for each seed and forces scenario `large_logits`, module level, profile
fp16 on even seeds and bf16 on odd ones, then runs each listed style's correct implementation and
audits it. Exit 1 on any false alarm (FAIL or exit 2). `--undeclared-form` drops the explicit
styles' `--form explicit`, as a user who does not say the form would. `--styles` replaces the
list (any zoo styles; fastmath's approximate exp2 and rsqrt move large logits the most);
`--profiles` the profiles, taken in turn by seed (default fp16 on even seeds, bf16 on odd).
"""
import argparse
import importlib
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import run_zoo  # noqa: E402
from common import load, save_outputs  # noqa: E402

STYLES = ["hf_eager_explicit", "mlx_sdpa", "torch_eager", "sdpa_explicit", "jax_xla"]


def spec_of(seed, presets_text, profiles=("fp16", "bf16")):
    spec = run_zoo.case_spec(seed, presets_text, False)
    spec.update(scenario="large_logits", level="module", profile=profiles[seed % len(profiles)])
    for k in ("topk", "attn_sink", "latent_rank"):
        spec.pop(k, None)
    return spec


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("binary")
    ap.add_argument("work_dir")
    ap.add_argument("--seeds", required=True, help="A-B (inclusive)")
    ap.add_argument("--markdown")
    ap.add_argument("--undeclared-form", action="store_true",
                    help="audit the explicit styles without their --form (conventions §5 item 3)")
    ap.add_argument("--profiles", default="fp16,bf16", help="profiles, taken in turn by seed")
    ap.add_argument("--styles", help="comma-separated zoo styles (default: " + ",".join(STYLES) + ")")
    a = ap.parse_args()
    styles = a.styles.split(",") if a.styles else STYLES
    profiles = tuple(a.profiles.split(","))
    lo, _, hi = a.seeds.partition("-")
    seeds = range(int(lo), int(hi or lo) + 1)
    binary = os.path.abspath(a.binary)
    os.makedirs(a.work_dir, exist_ok=True)
    presets_text = run_zoo.list_presets(binary)
    counts = {s: [0, 0] for s in styles}  # audits, false alarms
    alarms, worst, by_stat = [], {}, {}
    t0 = time.time()
    for seed in seeds:
        spec = spec_of(seed, presets_text, profiles)
        case = os.path.join(a.work_dir, f"case{seed}.safetensors")
        subprocess.run(run_zoo.golden_cmd(binary, spec, case), check=True, capture_output=True,
                       timeout=600)
        cs = load(case)
        refs = [k for k in run_zoo.OUTPUTS if cs.ref(k) is not None]
        for style in styles:
            mod = importlib.import_module(style)
            if not run_zoo.applicable(mod, cs):
                continue
            with np.errstate(all="ignore"):
                outs = {k: v for k, v in mod.run(cs, None).items() if k in refs}
            path = os.path.join(a.work_dir, f"{style}.safetensors")
            save_outputs(outs, path)
            args = () if a.undeclared_form else getattr(mod, "AUDIT_ARGS", ())
            r = run_zoo.audit(binary, case, path, style, args)
            counts[style][0] += 1
            ratio = max((v for t in r["judged"].values() for v in t.values() if v is not None),
                        default=0.0)
            if ratio > worst.get(style, (0, 0))[0]:
                worst[style] = (ratio, seed)
            for t, st in r["judged"].items():
                for s, v in st.items():
                    if v is not None and v > by_stat.get(s, (0, ""))[0]:
                        by_stat[s] = (v, f"seed {seed} {style} {t}")
            if r["rc"] != 0:
                counts[style][1] += 1
                alarms.append(f"seed {seed} {style} ({spec['preset']}, {spec['profile']}, "
                              f"{spec['norm']}): rc {r['rc']}, largest ratio {ratio:.2f}")
        os.remove(case)
    lines = [f"# large_logits sweep (tests/zoo/large_logits_sweep.py)", "",
             f"- binary: `{binary}`", f"- seeds: {seeds[0]}-{seeds[-1]} (profiles {', '.join(profiles)} in turn by seed)",
             f"- forms: {'undeclared (no --form)' if a.undeclared_form else 'as each style declares'}",
             f"- wall time: {time.time() - t0:.0f} s", "",
             "| style | audits | false alarms | largest ratio (seed) |", "|---|---:|---:|---|"]
    for s in styles:
        w = worst.get(s, (0.0, "-"))
        lines.append(f"| {s} | {counts[s][0]} | {counts[s][1]} | {w[0]:.2f} ({w[1]}) |")
    lines += ["", "## Largest ratio by statistic", "", "| statistic | largest ratio | where |",
              "|---|---:|---|"]
    lines += [f"| {s} | {v:.3g} | {w} |" for s, (v, w) in sorted(by_stat.items())]
    lines += ["", "## False alarms", ""] + [f"- {x}" for x in alarms or ["none"]]
    text = "\n".join(lines) + "\n"
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(text)
    print(text)
    return 1 if alarms else 0


if __name__ == "__main__":
    sys.exit(main())
