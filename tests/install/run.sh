#!/usr/bin/env bash
# Installs the build tree into a temporary prefix and checks the installed package:
#  - it holds the public headers only, and the installed library exports exactly what they declare;
#  - the installed CMake and pkg-config files name no CUDA directory of the build machine (the .pc
#    file's cudalibdir variable aside: pkg-config has no find step) and --cflags gives meshtrain's
#    include directory alone;
#  - the documentation and the examples are installed;
#  - the consumer programs (tests/install/consumer: C and C++) link shared and static, with
#    find_package(meshtrain) and with pkg-config, and run; the shared CMake build finds nothing
#    but meshtrain (no pkg-config, no CUDA toolkit), the static one is a plain C project; the C
#    consumer also runs under the installed mtrun on 2 ranks;
#  - the installed examples build out of tree against the package; fsdp_mlp runs 2 steps, and
#    custom_model gives the same losses on 1, 2 and 4 ranks under the installed mtrun.
# Usage: run.sh BUILD_DIR SOURCE_DIR [C_COMPILER]
set -euo pipefail

build_dir=${1:?usage: run.sh BUILD_DIR SOURCE_DIR [C_COMPILER]}
source_dir=${2:?usage: run.sh BUILD_DIR SOURCE_DIR [C_COMPILER]}
cc=${3:-${CC:-cc}}
cxx=${CXX:-c++}
consumer_src="$source_dir/tests/install/consumer"

work=$(mktemp -d "${TMPDIR:-/tmp}/meshtrain-install.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix="$work/prefix"

step() { echo "install test: $*"; }
die() { echo "install test: $*" >&2; exit 1; }

# cmake_project NAME SOURCE [CMAKE_ARGS...]: configures and builds SOURCE in $work/NAME against the
# installed package; shows the log of the step that failed.
cmake_project() {
    local name=$1 src=$2
    shift 2
    cmake -S "$src" -B "$work/$name" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_C_COMPILER="$cc" \
          -DCMAKE_BUILD_TYPE=Release "$@" > "$work/$name.configure.log" 2>&1 ||
        { cat "$work/$name.configure.log"; die "configuring $src ($name) failed"; }
    cmake --build "$work/$name" > "$work/$name.build.log" 2>&1 ||
        { cat "$work/$name.build.log"; die "building $src ($name) failed"; }
}

# run_static PROGRAM [ARGS...]: PROGRAM must not load libmeshtrain.so (it linked the archive).
run_static() {
    local libs
    libs=$(ldd "$1") || die "ldd $1 failed"
    if grep -q libmeshtrain <<<"$libs"; then
        die "$1 should hold libmeshtrain.a, yet it loads libmeshtrain.so"
    fi
    "$@"
}

step "cmake --install $build_dir --prefix $prefix"
cmake --install "$build_dir" --prefix "$prefix" > "$work/install.log" ||
    { cat "$work/install.log"; die "cmake --install failed"; }

config=$(find "$prefix" -name meshtrainConfig.cmake | head -n 1)
pcfile=$(find "$prefix" -name meshtrain.pc | head -n 1)
[[ -n $config ]] || die "no meshtrainConfig.cmake under $prefix"
[[ -n $pcfile ]] || die "no meshtrain.pc under $prefix"
[[ -f $prefix/include/meshtrain/meshtrain.h ]] || die "headers missing under $prefix/include"
libdir=$(dirname "$(dirname "$pcfile")")
[[ -f $libdir/libmeshtrain.a ]] || die "no libmeshtrain.a in $libdir"

step "installed headers are the public ones, and the library exports what they declare"
installed=$(cd "$prefix/include" && find . -type f | sort)
public=$(cd "$source_dir/include" && find . -type f | sort)
[[ $installed == "$public" ]] ||
    { echo "install test: installed headers differ from include/:"; diff <(echo "$public") \
          <(echo "$installed"); exit 1; }
python3 "$source_dir/tests/arch/check_exports.py" "$libdir/libmeshtrain.so" "$prefix/include"

step "documentation and examples installed"
for f in "$source_dir"/docs/*.md; do
    [[ -f $prefix/share/doc/meshtrain/$(basename "$f") ]] ||
        die "$(basename "$f") missing from $prefix/share/doc/meshtrain"
done
for f in "$source_dir"/examples/*.c "$source_dir"/examples/CMakeLists.txt; do
    [[ -f $prefix/share/meshtrain/examples/$(basename "$f") ]] ||
        die "$(basename "$f") missing from $prefix/share/meshtrain/examples"
done

pcdir=$(dirname "$pcfile")
export PKG_CONFIG_PATH="$pcdir${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
step "the installed package names no CUDA directory of this machine"
cuda_libdir=$(pkg-config --variable=cudalibdir meshtrain)
cmake_files=$(find "$prefix" -path '*/cmake/meshtrain/*' -type f)
for dir in /usr/local/cuda ${cuda_libdir:+"$cuda_libdir"}; do
    # shellcheck disable=SC2086 # one file a word
    if grep -n -F "$dir" $cmake_files; then die "the installed CMake package names $dir"; fi
    if grep -v '^cudalibdir=' "$pcfile" | grep -n -F "$dir"; then
        die "meshtrain.pc names $dir outside its cudalibdir variable"
    fi
done

step "find_package(meshtrain), shared: no dependency looked for (pkg-config, Threads, CUDA off)"
cmake_project shared "$consumer_src" -DCMAKE_DISABLE_FIND_PACKAGE_PkgConfig=ON \
    -DCMAKE_DISABLE_FIND_PACKAGE_Threads=ON -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON
"$work/shared/consumer" # by hand: one process, its own store
"$work/shared/consumer_cxx"
step "the consumer under the installed mtrun, 2 ranks"
"$prefix/bin/mtrun" --standalone --nproc_per_node 2 "$work/shared/consumer"

step "find_package(meshtrain COMPONENTS static) from a plain C project"
cmake_project static-c "$consumer_src" -DCONSUMER_STATIC=ON -DCONSUMER_CXX=OFF
run_static "$work/static-c/consumer_static"
step "find_package(meshtrain COMPONENTS static), C++"
cmake_project static-cxx "$consumer_src" -DCONSUMER_STATIC=ON -DCONSUMER_CXX=ON
run_static "$work/static-cxx/consumer_cxx_static"

step "pkg-config --cflags is meshtrain's include directory alone"
pc_cflags=$(pkg-config --cflags meshtrain)
read -r -a words <<< "$pc_cflags"
[[ ${#words[@]} -eq 1 && ${words[0]} == -I* ]] ||
    die "pkg-config --cflags meshtrain gives '$pc_cflags', expected one -I"
[[ $(realpath "${words[0]#-I}") == $(realpath "$prefix/include") ]] ||
    die "pkg-config --cflags meshtrain gives '$pc_cflags', not $prefix/include"

step "pkg-config --cflags --libs meshtrain (shared)"
pc_flags=$(pkg-config --cflags --libs meshtrain)
echo "install test: pkg-config gives: $pc_flags"
# The flags must point into the temporary prefix, not where the build tree was configured to go.
[[ $pc_flags == *"$prefix"* ]] || die "pkg-config flags do not point into $prefix"
# shellcheck disable=SC2086 # the flags are words on purpose
"$cc" -std=c11 -o "$work/consumer-pc" "$consumer_src/main.c" $pc_flags -Wl,-rpath,"$libdir" ||
    die "linking main.c with pkg-config (shared) failed"
"$work/consumer-pc"
# shellcheck disable=SC2086
"$cxx" -std=c++17 -o "$work/consumer-pc-cxx" "$consumer_src/main.cpp" $pc_flags \
    -Wl,-rpath,"$libdir" || die "linking main.cpp with pkg-config (shared) failed"
"$work/consumer-pc-cxx"

step "pkg-config --static --cflags --libs meshtrain, with libmeshtrain.a"
pc_static=$(pkg-config --static --cflags --libs meshtrain)
echo "install test: pkg-config --static gives: $pc_static"
# Where both are installed, -lmeshtrain picks the .so: name the archive.
[[ $pc_static == *" -lmeshtrain "* ]] || die "no -lmeshtrain in '$pc_static'"
pc_static=${pc_static/ -lmeshtrain / -l:libmeshtrain.a }
# shellcheck disable=SC2086
"$cc" -std=c11 -o "$work/consumer-pc-static" "$consumer_src/main.c" $pc_static ||
    die "linking main.c with pkg-config --static failed"
run_static "$work/consumer-pc-static"
# shellcheck disable=SC2086
"$cxx" -std=c++17 -o "$work/consumer-pc-cxx-static" "$consumer_src/main.cpp" $pc_static ||
    die "linking main.cpp with pkg-config --static failed"
run_static "$work/consumer-pc-cxx-static"

step "the installed examples, built out of tree"
cmake_project examples "$prefix/share/meshtrain/examples"
"$work/examples/fsdp_mlp" --steps 2 --layers 2 --width 16 --batch 4

# The model-of-your-own example (docs/custom-model.md) under the installed mtrun: the same global
# batch on 1, 2 and 4 ranks gives the same losses (FSDP averages exactly), and the loss falls.
for np in 1 2 4; do
    step "custom_model on $np rank(s)"
    "$prefix/bin/mtrun" --standalone --nproc_per_node "$np" "$work/examples/custom_model" \
        --steps 10 > "$work/custom$np.log" 2>&1 || { cat "$work/custom$np.log"; die "custom_model on $np rank(s) failed"; }
    sed -n 's/^\[rank0\]:step \([0-9]*\) loss \([0-9.]*\)$/\1 \2/p' "$work/custom$np.log" \
        > "$work/custom$np.loss"
    cat "$work/custom$np.loss" | tr '\n' ' '
    echo
done
for np in 1 2 4; do
    [[ $(wc -l < "$work/custom$np.loss") == 10 ]] ||
        die "custom_model on $np rank(s) printed no 10 losses"
done
for np in 2 4; do
    awk 'NR == FNR { a[$1] = $2; next }
         { d = a[$1] - $2; if (d < 0) d = -d; if (d > 1e-5 * (a[$1] > 1 ? a[$1] : 1)) bad++ }
         END { exit bad > 0 }' "$work/custom1.loss" "$work/custom$np.loss" ||
        die "custom_model's losses on $np ranks differ from 1 rank's (see above)"
done
awk 'NR == 1 { first = $2 } { last = $2 } END { exit !(last < 0.8 * first) }' \
    "$work/custom1.loss" || die "custom_model's loss did not fall by 20% in 10 steps"

step "ok"
