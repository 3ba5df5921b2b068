#!/usr/bin/env bash
# The gate's baseline_ratio on seeds the judge was fitted on (1-10) and on held-out seeds
# (1001-1015, >= 1000 cases): correct absorbed variants in every profile (fp8 included), the GPU
# kernels' CPU model, and the shape classes (NoPE, G = 1, norm none). Judged exactly as `qkmla gate`
# judges (baseline_k and budgets from src/gate/budgets.toml). Writes reports/gate-baselines.md and
# exits 1 on any failed verdict. About 15 minutes on 2 cores. Usage: bash reports/gate_baselines.sh [build]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
tmp=$(mktemp -d)
config() {  # $1: seeds, comma-separated
  cat <<TOML
ref_bits = 113
tensors = ["out", "lse", "alpha_k", "latent_out"]
[[entry]]
name = "correct.tiny"
presets = ["tiny"]
scenarios = ["normal", "outliers", "tiny_keys", "large_logits"]
profiles = ["fp64", "fp32", "bf16", "fp16", "fp8"]
norms = ["blockwise", "unified"]
rope_orders = ["norm_then_rope", "rope_then_norm"]
seqlens = [0, 17, 40]
sq = 2
seeds = [$1]
impls = ["cpu.absorbed", "cpu.absorbed.alpha_q_folded", "cpu.absorbed.q_normed_first", "cpu.absorbed.gamma_merged", "cpu.explicit"]
expect = "pass"
[[entry]]
name = "gpu-model.tiny"
presets = ["tiny"]
scenarios = ["normal", "outliers", "tiny_keys", "large_logits"]
profiles = ["fp32", "bf16", "fp16", "fp8"]
norms = ["blockwise", "unified"]
rope_orders = ["norm_then_rope", "rope_then_norm"]
seqlens = [0, 65, 130]
sq = 2
seeds = [$1]
impls = ["gpu.model", "gpu.model.explicit"]
expect = "pass"
[[entry]]
name = "correct.shapes"
presets = ["tiny-nope", "tiny-g1"]
scenarios = ["normal", "outliers", "tiny_keys", "large_logits"]
profiles = ["fp32", "bf16", "fp16", "fp8"]
norms = ["blockwise", "unified", "none"]
seqlens = [0, 17, 40]
sq = 2
seeds = [$1]
impls = ["cpu.absorbed", "cpu.absorbed.alpha_q_folded", "cpu.absorbed.q_normed_first", "cpu.absorbed.gamma_merged", "gpu.model"]
expect = "pass"
TOML
}
run() {  # $1: name, $2: seeds
  config "$2" > "$tmp/$1.toml"
  local t0=$SECONDS
  "$build/src/qkmla" gate --config "$tmp/$1.toml" --format json -o "$tmp/$1.json" 2>/dev/null || true
  echo $((SECONDS - t0)) > "$tmp/$1.seconds"
}
run fit "$(seq -s, 1 10)"
run held_out "$(seq -s, 1001 1015)"
status=0
python3 - "$tmp" "$(git describe --always --dirty --abbrev=12)" > reports/gate-baselines.md <<'PY' || status=$?
import collections, datetime, json, re, sys
tmp, commit = sys.argv[1], sys.argv[2]
print("# Gate baseline ratios: fitted seeds vs held-out seeds\n")
print(f"Made by `bash reports/gate_baselines.sh` at commit {commit}, {datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC,"
      " CPU only (gpu.* rows are the kernels' CPU model). Judged as `qkmla gate` judges: PASS iff every value is"
      " finite where the truth is and baseline_ratio <= max(baseline_k, small-sample allowance) and every budget"
      " holds (proofs/budgets.md).\n")
bad = 0
for run, seeds in (("fit", "1-10"), ("held_out", "1001-1015")):
    j = json.load(open(f"{tmp}/{run}.json"))
    secs = open(f"{tmp}/{run}.seconds").read().strip()
    cases = {c["name"].rsplit("/", 1)[0] for c in j["cases"]}
    mx = collections.defaultdict(lambda: (0.0, ""))
    n, fails = collections.Counter(), collections.Counter()
    for c in j["cases"]:
        m = re.search(r"baseline_ratio=([0-9.e+-]+|nan|inf)", c["message"])
        if c["classname"].startswith("reference"):
            fails["reference"] += not c["ok"]
            continue
        impl = re.sub(r"\.(fp64|fp32|bf16|fp16|fp8)", "", c["classname"])
        parts = c["name"].split("/")
        key = (c["suite"], impl, "large_logits" if parts[1] == "large_logits" else "other", parts[-1])
        n[key] += 1
        fails[key] += not c["ok"]
        r = float(m.group(1)) if m else float("nan")
        if r > mx[key][0]:
            mx[key] = (r, c["name"])
    total_fail = sum(fails.values())
    bad += total_fail
    print(f"## {run.replace('_', '-')} seeds {seeds}: {len(cases)} cases, {sum(n.values())} verdicts, "
          f"{total_fail} failed, {secs} s\n")
    print("| entry | implementation | scenarios | tensor | verdicts | failed | max baseline_ratio | where |")
    print("|---|---|---|---|---:|---:|---:|---|")
    for k in sorted(mx):
        print(f"| {' | '.join(k)} | {n[k]} | {fails[k]} | {mx[k][0]:.3g} | {mx[k][1]} |")
    print()
sys.exit(1 if bad else 0)
PY
cat reports/gate-baselines.md
exit $status
