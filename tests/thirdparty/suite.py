"""The third-party audit suite: seeded golden cases (shapes, norms, scenarios, profiles), audited
through the qkmla CLI exactly as a kernel author would, for every legitimate design of the
independent NumPy implementation (mla_numpy.py: must PASS) and every plausible bug (must FAIL
wherever its effect is far beyond rounding). Prints a kill / false-alarm matrix; --json writes
every verdict.

usage: suite.py QKMLA_BINARY WORK_DIR --seeds FIRST-LAST [--json FILE] [--markdown FILE] [--jobs N]
                [--min-named FRACTION]
Exit 1 when a legitimate design fails, a bug with a large effect passes, or the diagnosis names
the convention of fewer than FRACTION of the failing convention-bug audits."""
import argparse
import concurrent.futures
import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import mla_numpy  # noqa: E402

# spec_f32: q_latent and rope parts stored, outputs unrounded fp32 (conventions §3's design returned
# as .float() gives it): an F32 out is consistent with it, so it is admissible beside fp32.
DESIGNS = ["fp32", "bf16_p", "stored_out", "q_latent32", "explicit", "spec_f32", "gram32"]
BUG_DESIGNS = ["fp32", "stored_out"]  # each bug is a variant of these correct implementations
SHAPES = [  # (preset, norm)
    ("tiny", "blockwise"), ("tiny", "unified"), ("tiny", "none"), ("tiny-nope", "blockwise"), ("tiny-g1", "blockwise"),
    ("tiny-g1", "unified"), ("paper-g8", "blockwise"),
]
SCENARIOS = ["normal", "outliers", "tiny_keys", "large_logits"]
PROFILES = ["fp32", "bf16", "fp16", "fp8"]


# The convention each convention bug is (harness/diagnose.hpp names); a FAIL must name it.
EXPECTED = {
    "lse_no_scale": "lse=max_unscaled", "scale_bf16": "softmax_scale=bf16", "rope_style_swapped": "rope_style=swapped",
    "rope_pos_plus1": "rope_pos=+1", "eps_x10": "eps=x10", "eps_div10": "eps=/10", "ms_over_dm1": "rms_mean=d-1",
    "no_gamma_q": "gamma_cq=missing", "no_gamma_rk": "gamma_rk=missing", "unified_rope_unscaled": "unified_rope=no_alpha_k",
    "noncausal": "causal=flipped", "fp8_scale_missing": "fp8_scale=missing", "fp8_scale_twice": "fp8_scale=twice",
    "split_avg": "split=average", "self_excluded": "causal=exclusive",
}


def case_spec(seed):
    """A deterministic case for each seed: it cycles through shapes, scenarios, profiles, S_q and
    the rope conventions, so any window of seeds covers all of them."""
    rng = np.random.default_rng(seed)
    profile = PROFILES[seed % len(PROFILES)]
    preset, norm = SHAPES[(seed // len(PROFILES)) % len(SHAPES)]
    scenario = SCENARIOS[(seed // (len(PROFILES) * len(SHAPES))) % len(SCENARIOS)]
    sq = [1, 2, 4][seed % 3]
    long = preset == "paper-g8"
    seqlens = [0, int(rng.integers(sq, 24 if long else 48)), int(rng.integers(sq, 40 if long else 90))]
    args = ["--preset", preset, "--norm", norm, "--scenario", scenario, "--profile", profile, "--sq", str(sq),
            "--seqlens", ",".join(map(str, seqlens)), "--seed", str(seed),
            "--rope-order", ["norm_then_rope", "rope_then_norm"][(seed // 3) % 2],
            "--rope-style", ["interleaved", "half"][(seed // 5) % 2]]
    if seed % 11 == 0:
        args.append("--no-causal")
    return dict(preset=preset, norm=norm, scenario=scenario, profile=profile, sq=sq, args=args)


def bug_applies(bug, spec):
    d_r0 = spec["preset"] == "tiny-nope"
    if bug in ("rope_style_swapped", "rope_pos_plus1", "no_gamma_rk") and d_r0:
        return False
    if bug in ("eps_x10", "eps_div10", "ms_over_dm1", "no_gamma_q", "no_gamma_rk") and spec["norm"] == "none":
        return False
    if bug == "unified_rope_unscaled" and (spec["norm"] != "unified" or d_r0):
        return False
    if bug.startswith("fp8_") and spec["profile"] != "fp8":
        return False
    if bug in ("noncausal", "self_excluded") and "--no-causal" in spec["args"]:
        return False
    return True


def rel_l2(x, y):
    m = np.isfinite(y) & np.isfinite(x)
    d = np.linalg.norm(x[m].astype(np.float64) - y[m].astype(np.float64))
    n = np.linalg.norm(y[m].astype(np.float64))
    return d / n if n > 0 else d


def audit(qkmla, case, outputs, extra=()):
    r = subprocess.run([qkmla, "audit", case, outputs, "--format", "json", *extra], capture_output=True, text=True)
    if r.returncode not in (0, 1):
        raise RuntimeError(f"audit exit {r.returncode}: {r.stderr}")
    return json.loads(r.stdout)


def one_case(qkmla, work, seed):
    spec = case_spec(seed)
    d = os.path.join(work, f"s{seed}")
    os.makedirs(d, exist_ok=True)
    case = os.path.join(d, "case.safetensors")
    subprocess.run([qkmla, "golden", *spec["args"], "-o", case], check=True, capture_output=True)
    _, t = mla_numpy.load(case)
    refs = {k[4:]: v.astype(np.float64) for k, v in t.items() if k.startswith("ref.")}

    def errors(res):  # rel_l2 of each primary output against the reference
        return {k: rel_l2(res[k].astype(np.float64), refs[k]) for k in ("out", "lse") if k in res}

    rows = []
    correct_err = {}
    delivered = {}  # design -> tensor -> the dtype it delivers
    for design in DESIGNS:
        path = os.path.join(d, f"{design}.safetensors")
        res = mla_numpy.Run(case, design).run()
        mla_numpy.save(res, path)
        correct_err[design] = errors(res)
        delivered[design] = {k: str(res[k].dtype) for k in ("out", "lse") if k in res}
        a = audit(qkmla, case, path, ["--form", "explicit"] if design == "explicit" else [])  # as its author would say
        rows.append(dict(seed=seed, spec={k: v for k, v in spec.items() if k != "args"}, design=design, bug="",
                         verdict=a["verdict"], err=correct_err[design], failed=[f for x in a["tensors"] for f in x["failed"]],
                         tensors={x["tensor"]: [x["rel_l2"], x["yardstick_rel_l2"], x["baseline_ratio"]] for x in a["tensors"]}))
    for design in BUG_DESIGNS:
        for bug in mla_numpy.BUGS:
            if not bug_applies(bug, spec):
                continue
            path = os.path.join(d, f"{design}-{bug}.safetensors")
            res = mla_numpy.Run(case, design, bug).run()
            mla_numpy.save(res, path)
            err = errors(res)
            a = audit(qkmla, case, path)
            # What every correct design that delivers the same dtype makes on this case: a dtype
            # says only its own rounding point (conventions §5), so these are all admissible.
            admissible = {t: max(correct_err[x][t] for x in DESIGNS
                                 if delivered[x].get(t) == str(res[t].dtype) and t in correct_err[x])
                          for t in err if any(delivered[x].get(t) == str(res[t].dtype) for x in DESIGNS)}
            rows.append(dict(seed=seed, spec={k: v for k, v in spec.items() if k != "args"}, design=design, bug=bug,
                             verdict=a["verdict"], err=err, correct_err=admissible,
                             diagnosis=[d["convention"] for d in a.get("diagnosis", [])],
                             tensors={x["tensor"]: [x["rel_l2"], x["yardstick_rel_l2"], x["baseline_ratio"]] for x in a["tensors"]}))
    for f in os.listdir(d):
        os.remove(os.path.join(d, f))
    os.rmdir(d)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("qkmla")
    ap.add_argument("work")
    ap.add_argument("--seeds", default="1-20")
    ap.add_argument("--json")
    ap.add_argument("--markdown", help="write the kill / false-alarm matrix as Markdown to FILE")
    ap.add_argument("--how", default="", help="a line saying how the run was made (for --markdown)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--min-named", type=float, default=0.0,
                    help="fail when the diagnosis names the convention of fewer failing convention-bug audits")
    args = ap.parse_args()
    first, last = map(int, args.seeds.split("-"))
    rows = []
    with concurrent.futures.ProcessPoolExecutor(args.jobs) as ex:
        for r in ex.map(one_case, [args.qkmla] * (last - first + 1), [args.work] * (last - first + 1), range(first, last + 1)):
            rows.extend(r)
    if args.json:
        with open(args.json, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    bad = summarize(rows, args.min_named)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(rows, args.seeds, args.how))
    sys.exit(1 if bad else 0)


def large_effect(r):
    """The bug's error on out or lse is more than 10x every admissible correct design's on the case:
    each of the suite's correct designs that delivers that tensor in the same dtype (conventions §5:
    an F32 out says only that out was not rounded, so q_latent or P may have been)."""
    return any(r["err"].get(t, 0) > 10 * max(e, 1e-300) for t, e in r["correct_err"].items())


def markdown(rows, seeds, how):
    """The kill / false-alarm matrix of a run, for reports/."""
    legit = [r for r in rows if not r["bug"]]
    cases = len({r["seed"] for r in rows})
    out = [f"# Third-party audit suite: seeds {seeds} ({cases} cases)", "", how, "",
           "Every audit ran `qkmla audit` on a golden case and the outputs of the independent NumPy implementation",
           "(`tests/thirdparty/mla_numpy.py`). A bug is *large* where its `out` or `lse` error exceeds 10x the correct",
           "implementation's of every admissible design (same delivered dtype, same case); those must FAIL, legitimate designs must PASS.", "",
           "## Legitimate designs", "", "| design | audits | pass | largest baseline_ratio |", "|---|---:|---:|---:|"]
    for design in DESIGNS:
        rs = [r for r in legit if r["design"] == design]
        worst = max((v[2] or 0 for r in rs for v in r["tensors"].values()), default=0)
        out.append(f"| {design} | {len(rs)} | {sum(r['verdict'] == 'PASS' for r in rs)} | {worst:.2f} |")
    out += ["", "## Bugs", "",
            "| bug | what | large-effect audits | killed | smallest largest-ratio of those | small-effect audits | killed | diagnosis names it |",
            "|---|---|---:|---:|---:|---:|---:|---:|"]
    for bug, what in mla_numpy.BUGS.items():
        rs = [r for r in rows if r["bug"] == bug]
        big = [r for r in rs if large_effect(r)]
        small = [r for r in rs if r not in big]
        failing = [r for r in rs if r["verdict"] == "FAIL"]
        named = "-" if bug not in EXPECTED else f"{sum(EXPECTED[bug] in r['diagnosis'] for r in failing)} / {len(failing)}"
        weakest = min((max((v[2] or 0) for v in r["tensors"].values()) for r in big), default=float("nan"))
        out.append(f"| {bug} | {what} | {len(big)} | {sum(r['verdict'] == 'FAIL' for r in big)} | {weakest:.3g} | "
                   f"{len(small)} | {sum(r['verdict'] == 'FAIL' for r in small)} | {named} |")
    return "\n".join(out) + "\n"


def summarize(rows, min_named=0.0):
    bad = 0
    legit = [r for r in rows if not r["bug"]]
    print(f"legitimate designs: {sum(r['verdict'] == 'PASS' for r in legit)} of {len(legit)} audits pass")
    for design in DESIGNS:
        rs = [r for r in legit if r["design"] == design]
        fails = [r for r in rs if r["verdict"] != "PASS"]
        bad += len(fails)
        print(f"  {design:<12} {len(rs) - len(fails):>5} / {len(rs):<5} pass")
        for r in fails[:3]:
            print(f"    false alarm: seed {r['seed']} {r['spec']}: {r['failed']}")
    print("bugs (among audits where the bug's error is > 10x every admissible correct design's):")
    named = [r for r in rows if r["bug"] in EXPECTED and r["verdict"] == "FAIL"]
    right = [r for r in named if EXPECTED[r["bug"]] in r["diagnosis"]]
    print(f"diagnosis: names the bug's convention in {len(right)} of {len(named)} failing audits of convention bugs")
    for r in [r for r in named if r not in right][:4]:
        print(f"    missed: {r['bug']} seed {r['seed']} {r['spec']}: diagnosis {r['diagnosis']}")
    if named and len(right) < min_named * len(named):
        print(f"  fewer than {min_named:.0%} named")
        bad += 1
    for bug in mla_numpy.BUGS:
        rs = [r for r in rows if r["bug"] == bug]
        big = [r for r in rs if large_effect(r)]
        killed = [r for r in big if r["verdict"] == "FAIL"]
        small_killed = sum(r["verdict"] == "FAIL" for r in rs if r not in big)
        bad += len(big) - len(killed)
        print(f"  {bug:<22} killed {len(killed):>4} / {len(big):<4} large-effect audits"
              f"  (and {small_killed} of {len(rs) - len(big)} small-effect ones)")
        for r in [r for r in big if r["verdict"] != "FAIL"][:2]:
            print(f"    survived: seed {r['seed']} {r['design']} {r['spec']} err {r['err']} vs {r['correct_err']}: {r['tensors']}")
    return bad


if __name__ == "__main__":
    main()
