#!/usr/bin/env bash
# cmake/ucx.cmake without building: configures the source tree (no tests, no CUDA) against fake
# UCX roots and checks what MT_UCX_ROOT does.
#  - a folder without UCX: configure fails naming MT_UCX_ROOT and what it lacks;
#  - a UCX 1.9 root (ucp_version.h says so): fails, asking for >= 1.10;
#  - a 1.22 root with lib/ucx/libuct_cuda.so.0: configure says "UCX 1.22 from MT_UCX_ROOT=...;
#    CUDA transports ... ON", and the generated meshtrain.pc links the static library from that
#    root (ucxlibdir=<root>/lib, -L${ucxlibdir} -lucp ...), the package config keeps the root;
#  - the same root without the module: "... OFF".
# The libraries are empty files: nothing is linked here.
# Usage: ucx_root.sh SOURCE_DIR
SOURCE=${1:?usage: ucx_root.sh SOURCE_DIR}
TMP_PREFIX=ucx_root
source "$(dirname "$0")/../lib.sh"

fake_root() { # DIR MAJOR MINOR
    mkdir -p "$1/include/ucp/api" "$1/lib/ucx"
    printf '#define UCP_API_MAJOR    %s\n#define UCP_API_MINOR    %s\n' "$2" "$3" \
        >"$1/include/ucp/api/ucp_version.h"
    for lib in ucp uct ucs ucm; do : >"$1/lib/lib$lib.so"; done
}
# says LOG TEXT: the log holds TEXT, across the line breaks CMake puts into long messages
says() { tr -s ' \n' '  ' <"$1" | grep -qF -- "$2"; }
configure() { # NAME ROOT
    cmake -S "$SOURCE" -B "$TMP/build-$1" -DMT_CUDA=OFF -DMT_BUILD_TESTS=OFF \
          -DMT_UCX_ROOT="$2" >"$TMP/$1.log" 2>&1
}

mkdir -p "$TMP/empty"
if configure empty "$TMP/empty"; then
    fail "configure with an MT_UCX_ROOT holding no UCX succeeded"
else
    check "no UCX: the error names the root and what it lacks" says "$TMP/empty.log" \
        "MT_UCX_ROOT=$TMP/empty is not a UCX installation: it lacks include/ucp/api/ucp_version.h, lib/libucp.so"
fi

fake_root "$TMP/old" 1 9
if configure old "$TMP/old"; then
    fail "configure with UCX 1.9 succeeded"
else
    check "UCX 1.9 refused" says "$TMP/old.log" "holds UCX 1.9; meshtrain needs UCX >= 1.10"
fi

fake_root "$TMP/cuda" 1 22
: >"$TMP/cuda/lib/ucx/libuct_cuda.so.0"
if configure cuda "$TMP/cuda"; then
    check "1.22 with the CUDA module: configure reports it" says "$TMP/cuda.log" \
        "meshtrain: UCX 1.22 from MT_UCX_ROOT=$TMP/cuda; CUDA transports (lib/ucx/libuct_cuda.so) ON"
    check "meshtrain.pc: ucxlibdir is the root's lib/" has_line "$TMP/build-cuda/meshtrain.pc" \
        "ucxlibdir=$TMP/cuda/lib"
    check "meshtrain.pc: the static library links UCX from there" grep -qF \
        -- '-L${ucxlibdir} -lucp -luct -lucs -lucm' "$TMP/build-cuda/meshtrain.pc"
    check "meshtrainConfig.cmake keeps the root for the static component" has_text \
        "$TMP/build-cuda/meshtrainConfig.cmake" "set(_mt_ucx_root \"$TMP/cuda\")"
else
    fail "configure against a 1.22 root failed: $(grep -m1 -A3 'Error' "$TMP/cuda.log")"
fi

fake_root "$TMP/plain" 1 22
if configure plain "$TMP/plain"; then
    check "1.22 without the CUDA module: OFF" says "$TMP/plain.log" \
        "meshtrain: UCX 1.22 from MT_UCX_ROOT=$TMP/plain; CUDA transports (lib/ucx/libuct_cuda.so) OFF"
else
    fail "configure against a 1.22 root without CUDA failed: $(grep -m1 -A3 'Error' "$TMP/plain.log")"
fi

finish
