#!/usr/bin/env python3
"""Layer rules of README "Layout": every #include of a project header must point to the same folder
or to a layer below. Also: no string surgery on implementation ids (core/impl_id.hpp parses and
prints them). Exit 1 with one line per violation."""
import pathlib
import re
import sys

ROOT = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[2])

# folder -> the layers it may include (besides itself). Layers are named by their include prefix.
ALLOWED = {
    "src/core": set(),
    "src/gemm": set(),
    "src/io": {"core"},
    "src/metrics": {"core"},
    "reference": {"core", "gemm"},
    "gpu": {"core", "gemm"},
    "src/bounds": {"core"},
    "src/impl": {"core", "bounds", "gpu", "gemm"},
    "src/harness": {"core", "io", "metrics", "reference", "impl", "bounds", "gpu"},
    "src/render": {"core", "io", "metrics", "harness"},
    "src/report": {"core", "io", "metrics", "harness", "render", "gpu"},
    "src/gate": {"core", "io", "metrics", "harness", "render"},
    "src/api": {"core", "io", "metrics", "harness", "render", "report", "gate"},
    "src/cli": {"core", "io", "metrics", "reference", "impl", "bounds", "gpu", "gemm", "harness", "render", "report", "gate"},
}
# The one header gpu/ shares with src/ (device code: C++17, no dependencies).
GPU_MAY_INCLUDE = {"core/attention_math.hpp"}
LAYER_OF_PREFIX = {p.split("/")[-1]: p for p in ALLOWED}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
ID_SURGERY = re.compile(r'\.impl\s*\.\s*(substr|rfind|find|compare)\s*\(|impl_id[^;]*\.substr\(')


def main() -> int:
    bad = []
    for folder, allowed in ALLOWED.items():
        own = folder.split("/")[-1]
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix not in {".hpp", ".cpp", ".cu", ".cuh", ".inc"}:
                continue
            rel = path.relative_to(ROOT)
            for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                m = INCLUDE.match(line)
                if m:
                    inc = m.group(1)
                    layer = inc.split("/")[0] if "/" in inc else own
                    if layer not in LAYER_OF_PREFIX:
                        bad.append(f"{rel}:{n}: includes \"{inc}\": not a project layer")
                    elif layer != own and layer not in allowed:
                        bad.append(f"{rel}:{n}: includes \"{inc}\": {folder} may include only {sorted(allowed) or 'nothing'}")
                    elif own == "gpu" and layer == "core" and inc not in GPU_MAY_INCLUDE:
                        bad.append(f"{rel}:{n}: includes \"{inc}\": gpu/ may include only {sorted(GPU_MAY_INCLUDE)} from src/")
                if folder.startswith("src") and ID_SURGERY.search(line):
                    bad.append(f"{rel}:{n}: takes an implementation id apart by string surgery (use parse_impl_id)")
    for b in bad:
        print(b)
    print(f"check_layers: {len(bad)} violation(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
