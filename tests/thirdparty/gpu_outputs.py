"""thirdparty.flash_h200_outputs: a real GPU kernel's outputs, judged without a device.

tests/data/gpu-outputs/h200-flash-pd-bf16-sq1.safetensors is what PyTorch 2.11's flash-attention
backend returned on an H200 (reports/device-h200-2026-12-04.md: gpu/scripts/torch_sdpa.py on the
device bundle's case pd-bf16-sq1) for the golden case regenerated below with the bundle's
arguments. The audit (explicit form, default designs) must PASS it, and FAIL it with `out` scaled
by 1.01 (a 1 % scale: bias 13.8x the correct implementations' there) and sequence 1's `lse`
shifted by 0.01 nats (seq_shift 32x), both in one file: each tensor is judged on its own, so both
failures must be named.
Usage: gpu_outputs.py QKMLA DATA_DIR WORK_DIR
"""
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "zoo"))
from common import BF16, read_safetensors, save_outputs  # noqa: E402


def audit(qkmla, case, outs):
    p = subprocess.run([qkmla, "audit", case, outs, "--form", "explicit", "--no-diagnose"],
                       capture_output=True, text=True)
    verdict = [ln for ln in p.stdout.splitlines() if ln.startswith("verdict:")]
    print(f"{os.path.basename(outs)}: exit {p.returncode}, {verdict[-1] if verdict else p.stderr}")
    return p.returncode, p.stdout


def main():
    qkmla, data, work = sys.argv[1:4]
    os.makedirs(work, exist_ok=True)
    case = os.path.join(work, "pd-bf16-sq1.safetensors")
    # The arguments gpu/scripts/prepare_device_bundle.sh gave the case the device ran.
    subprocess.run([qkmla, "golden", "--preset", "paper-decode", "--batch", "2", "--sq", "1",
                    "--profile", "bf16", "--seqlens", "600,130", "--seed", "11", "-o", case],
                   check=True, capture_output=True)
    real = os.path.join(data, "gpu-outputs", "h200-flash-pd-bf16-sq1.safetensors")
    t, _ = read_safetensors(real)
    out, lse = t["out"].astype(np.float64), t["lse"]
    broken = os.path.join(work, "broken.safetensors")
    lse_b = lse.copy()
    lse_b[1] += np.float32(0.01)
    save_outputs({"out": (out * 1.01).astype(BF16), "lse": lse_b}, broken)
    failures = []
    rc, text = audit(qkmla, case, real)
    if rc != 0:
        failures.append("the flash backend's own outputs did not PASS:\n" + text)
    rc, text = audit(qkmla, case, broken)
    if rc != 1 or "failed: bias=" not in text or "failed: seq_shift=" not in text:
        failures.append("out x 1.01 (bias) and lse + 0.01 on sequence 1 (seq_shift) were not both "
                        "failed:\n" + text)
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
