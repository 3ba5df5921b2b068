#!/usr/bin/env python3
"""Structured probes: the reference's own outputs, packaged or perturbed the way a probe suite
would, audited on model-shaped cases.

    probes.py QKMLA_BINARY WORK_DIR --seeds A-B [--markdown FILE] [--profiles bf16,fp16,...]

For each seed a case is drawn as `run_zoo.py --long` draws it (model preset, 128-2048 cached
tokens; the profile is taken in turn from --profiles), written with `qkmla golden`, and its
reference outputs are delivered as:

| probe | what | expected |
|---|---|---|
| ref_in_D | out, latent_out rounded to the stored dtype D, lse in fp32 | PASS |
| ref_D_as_f32 | the same values widened to F32 (what `.float()` gives) | PASS |
| ref_f32 | out, latent_out rounded straight to fp32 | PASS |
| ref_D_as_f64 | the rounded values widened to F64 | PASS |
| ref_other16 | out, latent_out rounded to the 16-bit format D is not (fp16 for bf16, else bf16) | PASS |
| noise_1ulp | ref_in_D with one ulp of D added or subtracted at random per element | reported |
| scale_1pct | out and latent_out times 1.01 | FAIL |
| head_scale_10pct | one head's out and latent_out times 1.10 | FAIL |
| heads_swapped | two heads' out, latent_out and lse swapped | FAIL |
| seq_swapped | two sequences' out, latent_out and lse swapped (batch >= 2, both live) | FAIL |
| row_zeroed | one live row of out and latent_out set to zero | FAIL |
| lse_shift_seq | one sequence's lse + max(0.25, 4 ulp of D at the sequence's largest \|lse\|) | FAIL |
| denominator_D | every row times (1 + d), d uniform in +-half an ulp of D at 1 (a row sum rounded to D) | reported |
| head_scale_1pct | one head times 1.01 | reported |

Exit 1 when a probe's verdict differs from its expectation (a FAIL probe that passes, a PASS probe
that fails or is refused). "reported" probes are listed with their ratios only: whether they
should fail depends on how far the case's legitimate designs reach. A FAIL probe whose change is
below MIN_EFFECT (the largest relative L2 change over the outputs, against ref_in_D) is reported
instead: on a case whose heads coincide (one key group, uniform attention) a swap changes nothing.
"""
import argparse
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import run_zoo  # noqa: E402
from common import BF16, STORED, load, save_outputs  # noqa: E402

OUTPUTS = ("out", "lse", "latent_out")
MIN_EFFECT = 5e-3  # a FAIL probe changes some output by at least 0.5 % (rel_l2), else reported
ULP_AT_1 = {np.float64: 2.0 ** -52, np.float32: 2.0 ** -23, BF16: 2.0 ** -7, np.float16: 2.0 ** -10}


def live_rows(cs):
    """[B, S_q] mask of the query rows that see at least one token (their reference is finite)."""
    ref = np.asarray(cs.ref("lse"), dtype=np.float64)
    return np.all(np.isfinite(ref), axis=2) & (np.asarray(cs.seqlens)[:, None] > 0)


def base(cs, dtype):
    """The reference outputs: out and latent_out in `dtype`, lse in fp32."""
    outs = {}
    for k in OUTPUTS:
        r = cs.ref(k)
        if r is not None:
            outs[k] = np.asarray(r, np.float64).astype(np.float32 if k == "lse" else dtype)
    return outs


def perturbed(outs, f):
    """Applies f(name, float64 array) -> array to every output, rounding back to its dtype."""
    return {k: np.asarray(f(k, np.asarray(v, np.float64).copy())).astype(v.dtype)
            for k, v in outs.items()}


def probes(cs, rng):
    D = STORED[cs.profile]
    live = live_rows(cs)
    b_live = [b for b in range(cs.B) if live[b].any()]
    ref = base(cs, D)
    yield "ref_in_D", "PASS", ref
    yield "ref_D_as_f32", "PASS", {k: v.astype(np.float32) for k, v in ref.items()}
    yield "ref_f32", "PASS", base(cs, np.float32)
    yield "ref_D_as_f64", "PASS", {k: v.astype(np.float64) for k, v in ref.items()}
    # a file's dtype says its own rounding point: values rounded to another (or narrower) format
    # than D are a correct kernel's that writes that format (fp16 in range only)
    other = base(cs, np.float16 if D == BF16 else BF16)
    if all(np.isfinite(v[np.isfinite(ref[k])].astype(np.float64)).all() for k, v in other.items()):
        yield "ref_other16", "PASS", other
    ulp = ULP_AT_1[D]

    def noise(k, x):
        if k == "lse":
            return x
        e = np.floor(np.log2(np.maximum(np.abs(x), 1e-300)))
        return x + rng.choice([-1.0, 1.0], size=x.shape) * ulp * np.exp2(e)
    # reported, not PASS: where attention is one-hot (outliers), latent_out is a cached row exactly
    # and every correct design delivers it exactly, so an ulp on every element is a real deviation
    yield "noise_1ulp", "reported", perturbed(ref, noise)
    yield "scale_1pct", "FAIL", perturbed(ref, lambda k, x: x if k == "lse" else x * 1.01)
    h = int(rng.integers(cs.H))

    def head_scale(s):
        def f(k, x):
            if k != "lse":
                x[:, :, h] *= s
            return x
        return f
    yield "head_scale_10pct", "FAIL", perturbed(ref, head_scale(1.10))
    if cs.H >= 2:
        h2 = (h + 1 + int(rng.integers(cs.H - 1))) % cs.H

        def swap_heads(k, x):
            x[:, :, [h, h2]] = x[:, :, [h2, h]]
            return x
        yield "heads_swapped", "FAIL", perturbed(ref, swap_heads)
    if len(b_live) >= 2:
        b1, b2 = b_live[0], b_live[1]

        def swap_seqs(k, x):
            x[[b1, b2]] = x[[b2, b1]]
            return x
        yield "seq_swapped", "FAIL", perturbed(ref, swap_seqs)
    rows = np.argwhere(live)
    if len(rows):
        b, i = rows[int(rng.integers(len(rows)))]

        def zero_row(k, x):
            if k != "lse":
                x[b, i, h] = 0.0
            return x
        yield "row_zeroed", "FAIL", perturbed(ref, zero_row)
    if b_live and "lse" in ref:
        bs = b_live[int(rng.integers(len(b_live)))]

        # A design that stores its logits in D moves lse by up to about an ulp of D at the largest
        # logit (~ |lse|): 0.25 passed legitimately on fp16/bf16 large_logits near 270 (probe
        # seeds 555510, 555511, 555515, 555516, 555521), so the shift is 4 such ulps at least.
        lse_b = np.abs(ref["lse"][bs])
        top = float(lse_b[np.isfinite(lse_b)].max(initial=0.0))
        step = max(0.25, 4 * ULP_AT_1[D] * float(np.exp2(np.floor(np.log2(top))))) if top > 0 else 0.25

        def shift(k, x):
            if k == "lse":
                x[bs] += step
            return x
        yield "lse_shift_seq", "FAIL", perturbed(ref, shift)
    d = rng.uniform(-ulp / 2, ulp / 2, size=(cs.B, cs.S, cs.H, 1))
    yield "denominator_D", "reported", perturbed(ref, lambda k, x: x if k == "lse" else x * (1 + d))
    yield "head_scale_1pct", "reported", perturbed(ref, head_scale(1.01))


def effect(outs, ref):
    """The probe's own change: the largest rel_l2 of an output against ref_in_D's (run_zoo.stats)."""
    return max(run_zoo.stats(v, ref[k], k)["rel_l2"] for k, v in outs.items())


def worst(judged):
    """The largest ratio the audit printed (run_zoo.audit's `judged`) and where (tensor.statistic)."""
    best = (0.0, "")
    for t, st in judged.items():
        for s, v in st.items():
            if isinstance(v, (int, float)) and v == v and v > best[0]:
                best = (float(v), f"{t}.{s}")
    return best


def run_seed(binary, work, seed, profile, presets_text):
    spec = run_zoo.long_case_spec(seed, presets_text, False)
    spec.update(profile=profile, level="module")
    for k in ("topk", "attn_sink"):
        spec.pop(k, None)
    d = os.path.join(work, f"seed{seed}")
    os.makedirs(d, exist_ok=True)
    case = os.path.join(d, "case.safetensors")
    g = subprocess.run(run_zoo.golden_cmd(binary, spec, case), capture_output=True, text=True)
    if g.returncode != 0:
        return spec, [("golden", "-", 0.0, g.returncode, (g.stderr or g.stdout)[-300:], 0.0, "")]
    cs = load(case)
    rng = np.random.default_rng([seed, 3])
    ref = base(cs, STORED[cs.profile])
    rows = []
    for name, expect, outs in probes(cs, rng):
        eff = effect(outs, ref)
        if expect == "FAIL" and eff < MIN_EFFECT:
            expect = "reported"
        path = os.path.join(d, f"{name}.safetensors")
        save_outputs(outs, path)
        res = run_zoo.audit(binary, case, path, name)
        ratio, where = worst(res["judged"])
        rows.append((name, expect, eff, res["rc"], str(res["verdict"] or res["stderr"][-200:]),
                     ratio, where))
    return spec, rows


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("binary")
    ap.add_argument("work_dir")
    ap.add_argument("--seeds", required=True, help="A-B (inclusive), or a comma-separated list of those")
    ap.add_argument("--profiles", default="bf16,fp16,fp32,fp8,fp8-block128")
    ap.add_argument("--markdown")
    a = ap.parse_args()
    seeds = []
    for part in a.seeds.split(","):
        lo, _, hi = part.partition("-")
        seeds += list(range(int(lo), int(hi or lo) + 1))
    profiles = a.profiles.split(",")
    binary = os.path.abspath(a.binary)
    presets_text = run_zoo.list_presets(binary)
    lines = ["# qkmla structured probes", "", f"- binary: `{binary}`", f"- seeds: {a.seeds}", "",
             "| seed | case | probe | expected | change | exit | verdict | largest ratio | where |",
             "|---|---|---|---|---|---|---|---|---|"]
    bad = 0
    for s in seeds:
        spec, rows = run_seed(binary, a.work_dir, s, profiles[s % len(profiles)], presets_text)
        what = (f"{spec['preset']} {spec['profile']} {spec['norm']} {spec['scenario']} "
                f"sq={spec['sq']} seqlens={spec['seqlens']}")
        for name, expect, eff, rc, verdict, ratio, where in rows:
            wrong = ((expect == "PASS" and rc != 0) or (expect == "FAIL" and rc != 1)
                     or expect == "-")
            bad += wrong
            lines.append(f"| {s} | {what} | {name} | {expect} | {eff:.2g} | {rc} | {verdict[:60]} | "
                         f"{ratio:.3g} | {where} |" + (" **unexpected**" if wrong else ""))
        print("\n".join(lines[-len(rows):]), file=sys.stderr, flush=True)
    lines += ["", f"- probes whose verdict differs from the expectation: {bad}"]
    md = "\n".join(lines)
    print(md)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(md + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
