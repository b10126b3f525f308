#!/usr/bin/env bash
# meshtrain's train_gpt against PyTorch FSDP2 (+ TP) on gloo: the same GPT (12 x 768, 12 heads,
# seq 64, byte vocabulary, f32 by default), the same global batch and rank count, runs
# alternated; prints a table of median step times and their ratio (issue 20's target: <= 0.8).
# The PyTorch side is bench/compare_pytorch_gpt.py, the driver bench/compare_pytorch.py (its
# options follow the build directory: `bench/compare_pytorch.sh build --help` lists them).
#
# It makes a Python venv at $MT_TORCH_VENV (default BUILD_DIR/torch-venv), not the repo's .venv,
# and installs torch (and numpy) there from PyPI on first use ($MT_TORCH_VERSION, default 2.15.0). The
# PyPI wheel for Linux x86_64 pulls NVIDIA's CUDA libraries as dependencies even though only the
# CPU is used here: several GB of download and disk (docs/benchmarks.md, "Against PyTorch").
#
# usage: bench/compare_pytorch.sh [BUILD_DIR [DRIVER OPTIONS...]]   (BUILD_DIR default: build)
#        bench/compare_pytorch.sh --help
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then
    sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
fi
build=${1:-build}
[ $# -gt 0 ] && shift
venv=${MT_TORCH_VENV:-$build/torch-venv}
version=${MT_TORCH_VERSION:-2.15.0}

[ -x "$build/bin/train_gpt" ] && [ -x "$build/bin/mtrun" ] ||
    { echo "compare_pytorch: $build/bin/train_gpt or mtrun missing: build first (scripts/build)" >&2; exit 1; }

if ! "$venv/bin/python" -c 'import torch' 2>/dev/null; then
    echo "compare_pytorch: installing torch==$version and numpy from PyPI into $venv (several GB with its CUDA dependencies)" >&2
    python3 -m venv "$venv"
    "$venv/bin/pip" install --disable-pip-version-check -q "torch==$version" numpy
fi
exec "$venv/bin/python" "$here/compare_pytorch.py" --build "$build" "$@"
