#!/usr/bin/env bash
# Installs the build tree into a temporary prefix, checks that it holds the public headers only
# and that the installed library exports exactly what they declare, then builds the consumer
# programs (C and C++) against it with find_package(meshtrain) and with pkg-config, and runs them:
# the C consumer by hand and under the installed mtrun on 2 ranks.
# Usage: run.sh BUILD_DIR SOURCE_DIR [C_COMPILER]
set -euo pipefail

build_dir=${1:?usage: run.sh BUILD_DIR SOURCE_DIR [C_COMPILER]}
source_dir=${2:?usage: run.sh BUILD_DIR SOURCE_DIR [C_COMPILER]}
cc=${3:-${CC:-cc}}
consumer_src="$source_dir/tests/install/consumer"

work=$(mktemp -d "${TMPDIR:-/tmp}/meshtrain-install.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix="$work/prefix"

step() { echo "install test: $*"; }

step "cmake --install $build_dir --prefix $prefix"
cmake --install "$build_dir" --prefix "$prefix" > "$work/install.log" ||
    { cat "$work/install.log"; exit 1; }

config=$(find "$prefix" -name meshtrainConfig.cmake | head -n 1)
pcfile=$(find "$prefix" -name meshtrain.pc | head -n 1)
[[ -n $config ]] || { echo "install test: no meshtrainConfig.cmake under $prefix" >&2; exit 1; }
[[ -n $pcfile ]] || { echo "install test: no meshtrain.pc under $prefix" >&2; exit 1; }
[[ -f $prefix/include/meshtrain/meshtrain.h ]] ||
    { echo "install test: headers missing under $prefix/include" >&2; exit 1; }
libdir=$(dirname "$(dirname "$pcfile")")

step "installed headers are the public ones, and the library exports what they declare"
installed=$(cd "$prefix/include" && find . -type f | sort)
public=$(cd "$source_dir/include" && find . -type f | sort)
[[ $installed == "$public" ]] ||
    { echo "install test: installed headers differ from include/:"; diff <(echo "$public") \
          <(echo "$installed"); exit 1; }
python3 "$source_dir/tests/arch/check_exports.py" "$libdir/libmeshtrain.so" "$prefix/include"

step "find_package(meshtrain) from $consumer_src"
cmake -S "$consumer_src" -B "$work/cmake-build" -DCMAKE_PREFIX_PATH="$prefix" \
      -DCMAKE_C_COMPILER="$cc" -DCMAKE_BUILD_TYPE=Release > "$work/configure.log" 2>&1 ||
    { cat "$work/configure.log"; exit 1; }
cmake --build "$work/cmake-build" > "$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
"$work/cmake-build/consumer" # by hand: one process, its own store
"$work/cmake-build/consumer_cxx"
step "the consumer under the installed mtrun, 2 ranks"
"$prefix/bin/mtrun" --standalone --nproc_per_node 2 "$work/cmake-build/consumer"

step "pkg-config --cflags --libs meshtrain"
export PKG_CONFIG_PATH="$(dirname "$pcfile")${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
pc_flags=$(pkg-config --cflags --libs meshtrain)
echo "install test: pkg-config gives: $pc_flags"
# The flags must point into the temporary prefix, not where the build tree was configured to go.
[[ $pc_flags == *"$prefix"* ]] ||
    { echo "install test: pkg-config flags do not point into $prefix" >&2; exit 1; }
# shellcheck disable=SC2086 # the flags are words on purpose
"$cc" -std=c11 -o "$work/consumer-pc" "$consumer_src/main.c" $pc_flags -Wl,-rpath,"$libdir"
"$work/consumer-pc"
# shellcheck disable=SC2086
"${CXX:-c++}" -std=c++17 -o "$work/consumer-pc-cxx" "$consumer_src/main.cpp" $pc_flags \
    -Wl,-rpath,"$libdir"
"$work/consumer-pc-cxx"

step "ok"
