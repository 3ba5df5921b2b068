#!/usr/bin/env bash
# install.consumer: installs the build into a temporary prefix, configures and builds
# tests/consumer against it with find_package(qkmla), runs it. Usage: run_consumer.sh BUILD WORK
set -euo pipefail
build=$1
work=$2
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"
ls "$work/prefix/include/qkmla/qkmla.hpp" "$work/prefix/lib/libqkmla.a" "$work/prefix/lib/cmake/qkmla/qkmlaConfig.cmake"
cmake -S "$here" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_TYPE=Release > "$work/configure.log"
cmake --build "$work/build" -j2 > "$work/build.log" || { tail -30 "$work/build.log"; exit 1; }
"$work/build/consumer"
