#!/usr/bin/env bash
# Fails (exit 1) when a C++/CUDA source of the tree is not clang-format clean; lists the files.
# Fix with: clang-format -i $(git ls-files '*.cpp' '*.hpp' '*.cu' '*.cuh')
set -uo pipefail
fmt="$1"
root="$2"
cd "$root" || exit 2
mapfile -t files < <(find src reference gpu tests \( -name '*.cpp' -o -name '*.hpp' -o -name '*.cu' -o -name '*.cuh' \) | sort)
bad=()
for f in "${files[@]}"; do
  "$fmt" --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
echo "clang-format: ${#files[@]} files checked, ${#bad[@]} not clean"
for f in "${bad[@]}"; do echo "  $f"; done
[ ${#bad[@]} -eq 0 ]
