"""Golden cases drawn as the zoo draws them, for the real-kernel scripts beside this file.

    python3 gpu/scripts/zoo_cases.py QKMLA OUT_DIR A B [--long] [--features] [--kernel]

Writes OUT_DIR/s<seed>-<preset>-<profile>-<scenario>-<norm>-sq<S_q>.safetensors for each seed in
[A, B] whose spec (tests/zoo/run_zoo.py: case_spec, or long_case_spec with --long: model presets,
128-2048 cached tokens) is module level with profile fp32, bf16 or fp16 (what torch_sdpa.py,
torch_absorbed.py and jax_sdpa.py take). Cases with sparse top-k or a sink are left out unless
--features: those scripts pass neither to the kernel, so their outputs answer another question.
--kernel also writes the seeds whose spec is kernel level (`golden --level kernel`, conventions §2;
vllm_triton_mla.py takes them), as s<seed>-<preset>-<profile>-<scenario>-<norm>-sq<S_q>-kernel;
without it only module-level cases are written, as before. Prints each path written.
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "zoo"))
import run_zoo  # noqa: E402


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    binary, out, a, b = args[0], args[1], int(args[2]), int(args[3])
    draw = run_zoo.long_case_spec if "--long" in sys.argv else run_zoo.case_spec
    os.makedirs(out, exist_ok=True)
    presets = run_zoo.list_presets(binary)
    for seed in range(a, b + 1):
        spec = draw(seed, presets, True)
        levels = ("module", "kernel") if "--kernel" in sys.argv else ("module",)
        if spec["level"] not in levels or spec["profile"] not in ("fp32", "bf16", "fp16"):
            continue
        if "--features" not in sys.argv and (spec.get("topk") or spec.get("attn_sink")):
            continue
        name = (f"s{seed}-{spec['preset']}-{spec['profile']}-{spec['scenario']}-{spec['norm']}"
                f"-sq{spec['sq']}{'-kernel' if spec['level'] == 'kernel' else ''}.safetensors")
        path = os.path.join(out, name)
        subprocess.run(run_zoo.golden_cmd(binary, spec, path), check=True, capture_output=True)
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
