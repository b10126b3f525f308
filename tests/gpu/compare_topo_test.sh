#!/usr/bin/env bash
# Checks tests/gpu/compare_topo.py (used by tests/gpu/run.sh on a GPU machine) on a fixture:
# an nvidia-smi-style matrix (tab-separated, as nvidia-smi prints it) made from the fixture's
# report agrees with its JSON, and one changed code, or a GPU fewer, is reported; two JSON
# reports of the same machine agree (the export reloaded), and a changed bus id is reported.
#   usage: compare_topo_test.sh MT_TOPO FIXTURE_XML
set -u
MT_TOPO=$1
FIXTURE=$2
HERE=$(cd "$(dirname "$0")" && pwd)
CMP="python3 $HERE/compare_topo.py"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fails=0
expect() { # expected exit status, description, command...
    local want=$1 what=$2
    shift 2
    "$@" >"$TMP/out" 2>&1
    local rc=$?
    if [ "$rc" -ne "$want" ]; then
        echo "FAIL: $what: exit $rc, expected $want"
        cat "$TMP/out"
        fails=$((fails + 1))
    else
        echo "ok: $what: $(tail -n 1 "$TMP/out")"
    fi
}

"$MT_TOPO" --input "$FIXTURE" --json >"$TMP/mt.json" || { echo "mt-topo failed"; exit 1; }
"$MT_TOPO" --input "$FIXTURE" >"$TMP/mt.txt" || exit 1
# nvidia-smi's layout: a header line that starts with a tab, tab-separated cells, " X " padded.
awk '/^ +GPU0/ { inmat = 1; sub(/^ +/, ""); gsub(/  +/, "\t"); print "\t" $0; next }
     inmat && /^(GPU|NIC)[0-9]/ { gsub(/  +/, "\t"); sub(/\tX\t/, "\t X \t"); print; next }
     inmat { exit }' "$TMP/mt.txt" >"$TMP/smi.txt"
expect 0 "nvidia-smi layout agrees" $CMP smi "$TMP/smi.txt" "$TMP/mt.json"
# One GPU pair changed.
awk -F'\t' 'BEGIN { OFS = "\t" } /^GPU0\t/ { $3 = ($3 == "SYS" ? "NODE" : "SYS") } { print }' \
    "$TMP/smi.txt" >"$TMP/smi-bad.txt"
expect 1 "a changed GPU pair is reported" $CMP smi "$TMP/smi-bad.txt" "$TMP/mt.json"
grep -v '^GPU0' "$TMP/smi.txt" | sed 's/^\tGPU0\t/\t/' >"$TMP/smi-fewer.txt"
expect 1 "a missing GPU is reported" $CMP smi "$TMP/smi-fewer.txt" "$TMP/mt.json"
expect 2 "unreadable input" $CMP smi /nonexistent "$TMP/mt.json"

"$MT_TOPO" --input "$FIXTURE" --export-nccl "$TMP/export.xml" >/dev/null || exit 1
"$MT_TOPO" --input "$TMP/export.xml" --json >"$TMP/export.json" || exit 1
expect 0 "the export reloaded agrees" $CMP json "$TMP/export.json" "$TMP/mt.json"
python3 - "$TMP/export.json" "$TMP/bad.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d["gpus"][0]["pci_bus_id"] = "0000:ff:00.0"
json.dump(d, open(sys.argv[2], "w"))
PY
expect 1 "a changed bus id is reported" $CMP json "$TMP/bad.json" "$TMP/mt.json"
[ "$fails" -eq 0 ] && echo "compare_topo_test: all passed" || echo "compare_topo_test: $fails failed"
exit $((fails > 0))
