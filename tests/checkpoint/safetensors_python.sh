#!/usr/bin/env bash
# Files exchanged between mt-ckpt's safetensors code and the Python safetensors package (see
# safetensors_python.py). Needs the virtual environment scripts/setup makes; without it the test
# fails (CI runs scripts/setup first, so a missing one is a broken setup, not a skip).
#   safetensors_python.sh PYTHON ST_CONVERT
set -u
python=$1
convert=$2
if [ ! -x "$python" ]; then
    echo "FAIL: $python does not exist: run scripts/setup (it creates the .venv with numpy and" \
         "safetensors that this test uses), or configure with -DMT_TEST_PYTHON=<python>" >&2
    exit 1
fi
if ! "$python" -c 'import numpy, safetensors' 2>/dev/null; then
    echo "FAIL: $python cannot import numpy and safetensors: run scripts/setup" >&2
    exit 1
fi
exec "$python" "$(dirname "$0")/safetensors_python.py" "$convert"
