#!/usr/bin/env bash
# bench/compare_pytorch.sh without torch (the comparison itself installs several GB and takes
# minutes, so no test runs it): the scripts parse, --help prints the usage, a build directory
# without train_gpt is refused before any venv is made, and the driver refuses bad options with
# exit 2 before it imports torch (an --llmc folder without llm.c's trainer too).
BUILD=$1
TMP_PREFIX=compare_pytorch
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/bench_lib.sh"
BENCH=$(cd "$(dirname "$0")/../../bench" && pwd)

check "the shell script parses" bash -n "$BENCH/compare_pytorch.sh"
check "the Python files compile" python3 -c 'import ast, sys
for f in sys.argv[1:]: ast.parse(open(f).read(), f)' "$BENCH/compare_pytorch.py" \
    "$BENCH/compare_pytorch_gpt.py" "$BENCH/compare_llmc.py"
"$BENCH/compare_pytorch.sh" --help >"$TMP/help" 2>&1
check "--help exits 0" test $? = 0
check "--help prints the usage" grep -q "^usage: bench/compare_pytorch.sh" "$TMP/help"
check "--help names the venv variable" grep -q "MT_TORCH_VENV" "$TMP/help"

MT_TORCH_VENV=$TMP/venv "$BENCH/compare_pytorch.sh" "$TMP/nobuild" >"$TMP/nb.out" 2>"$TMP/nb.err"
check "a build without train_gpt exits 1" test $? = 1
check "and says so" grep -q "train_gpt or mtrun missing" "$TMP/nb.err"
check "and makes no venv" test ! -e "$TMP/venv"

driver() { python3 "$BENCH/compare_pytorch.py" --build "$BUILD" "$@"; }
refuses_options driver compare_pytorch.py "--configs 3y" "--configs 2x" "--steps 2 --warmup 2" \
    "--configs 1,3" "--configs 0" "--configs 1x5" "--rounds x"
python3 "$BENCH/compare_pytorch.py" --build "$TMP/nobuild" >"$TMP/d.out" 2>"$TMP/d.err"
check "the driver refuses a build without train_gpt (exit 2)" test $? = 2
check "naming it" grep -q "nobuild/bin/mtrun not found" "$TMP/d.err"
python3 "$BENCH/compare_pytorch.py" --build "$BUILD" --llmc "$TMP" >"$TMP/l.out" 2>"$TMP/l.err"
check "the driver refuses an --llmc folder that is not llm.c (exit 2)" test $? = 2
check "naming what is missing" grep -q "no train_gpt2.c and llmc/ there" "$TMP/l.err"
finish
