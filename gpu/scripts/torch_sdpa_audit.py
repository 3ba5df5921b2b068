"""Judges the outputs of gpu/scripts/torch_sdpa.py, jax_sdpa.py or torch_absorbed.py here:
python3 gpu/scripts/torch_sdpa_audit.py QKMLA CASE_DIR OUT_DIR [LOG]. Runs
`qkmla audit CASE OUTPUTS --form F --format json` on every OUT_DIR/<case>__<backend>.safetensors
(F: absorbed for a backend named *ABSORBED*, as torch_absorbed.py's, else explicit) and prints a
markdown table (case, backend, delivered, verdict, out and lse ratios, the verdict line); LOG (the
runner's JSON lines) adds the backends that refused a case. Exit 1 when any audit fails (exit 1)
or cannot run (exit 2).
"""
import json
import os
import subprocess
import sys


def ratio(report, tensor):
    for t in report["tensors"]:
        if t["tensor"] == tensor and t.get("judged"):
            return f"{t['baseline_ratio']:.3g}"
    return "-"


def main():
    qkmla, cases, outs = sys.argv[1:4]
    refused = []
    if len(sys.argv) > 4:
        for line in open(sys.argv[4]):
            if not line.startswith("{"):  # PyTorch's warnings, interleaved in the log
                continue
            row = json.loads(line)
            if "backend" in row and not row["ok"]:
                refused.append(row)
    print("| case | backend | delivered | verdict | out ratio | lse ratio | verdict line |")
    print("|---|---|---|---|---:|---:|---|")
    bad = 0
    for name in sorted(os.listdir(outs)):
        if not name.endswith(".safetensors") or "__" not in name:
            continue
        case, backend = name[: -len(".safetensors")].split("__")
        p = subprocess.run([qkmla, "audit", os.path.join(cases, case + ".safetensors"),
                            os.path.join(outs, name), "--form",
                            "absorbed" if "ABSORBED" in backend else "explicit", "--format", "json",
                            "--label", backend.lower()],
                           capture_output=True, text=True)
        if p.returncode not in (0, 1):
            print(f"| {case} | {backend} | - | ERROR (exit {p.returncode}) | - | - | "
                  f"{p.stderr.strip()[:200]} |")
            bad += 1
            continue
        r = json.loads(p.stdout)
        delivered = ", ".join(f"{t['tensor']} {t['delivered']}" for t in r["tensors"]
                              if t["tensor"] in ("out", "lse"))
        print(f"| {case} | {backend} | {delivered} | {r['verdict']} | {ratio(r, 'out')} | "
              f"{ratio(r, 'lse')} | {r['verdict_line']} |")
        bad += p.returncode != 0
    for row in refused:
        print(f"| {row['case'][: -len('.safetensors')]} | {row['backend']} | - | refused by "
              f"PyTorch | - | - | {row['error'][:120]} |")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
