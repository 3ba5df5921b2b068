#!/usr/bin/env bash
# python.pytest_example: installs the C++ build into a temporary prefix, `pip install`s ./python
# against it (only the bindings compile: CMAKE_PREFIX_PATH finds the installed qkmla), then runs
# the pytest example and the import smoke check of README. Usage: run_python_tests.sh BUILD VENV WORK
set -euo pipefail
build=$(cd "$1" && pwd)
venv=$(cd "$2" && pwd)
mkdir -p "$3" && work=$(cd "$3" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work/prefix" && mkdir -p "$work"
cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"
"$venv/bin/python" -m pip install -q --disable-pip-version-check pytest
t0=$SECONDS
CMAKE_PREFIX_PATH="$work/prefix" "$venv/bin/python" -m pip install -q --disable-pip-version-check \
  --config-settings=build-dir="$work/pybuild" "$here"
echo "pip install ./python: $((SECONDS - t0)) s"
cd "$work"
"$venv/bin/python" -c "import qkmla; c = qkmla.golden(preset='tiny', profile='bf16'); assert qkmla.audit(c, out=c.ref['out'], lse=c.ref['lse']).passed; print('import check: ok')"
"$venv/bin/python" -m pytest -q -s "$here/examples/test_my_kernel.py" -p no:cacheprovider
