#!/usr/bin/env bash
# The third-party audit suite's kill / false-alarm matrix (proofs/budgets.md): k fitted on seeds
# 1-300, validated on the held-out seeds 301-1300. Writes reports/audit-suite-fit.md and
# reports/audit-suite.md. About 45 minutes on 2 cores. Usage: bash reports/audit_suite.sh [build dir]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
venv="$build/tests/interop/venv"
[ -x "$venv/bin/python" ] || { echo "run the interop test first (it creates $venv)" >&2; exit 2; }
bin=$(mktemp -d)/qkmla
cp "$build/src/qkmla" "$bin"  # the binary audited, fixed for the run
how="Made by \`bash reports/audit_suite.sh\` at commit $(git describe --always --dirty --abbrev=12), $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores."
work=$(mktemp -d)
"$venv/bin/python" tests/thirdparty/suite.py "$bin" "$work" --seeds 1-300 --markdown reports/audit-suite-fit.md --how "$how (fit)" || true
"$venv/bin/python" tests/thirdparty/suite.py "$bin" "$work" --seeds 301-1300 --markdown reports/audit-suite.md --how "$how (held out)"
