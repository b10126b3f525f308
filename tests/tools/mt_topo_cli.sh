#!/bin/sh
# mt-topo as a user runs it: the live report of this machine, MT_TOPO_FILE, --export-nccl, bad
# options (exit 2, usage) and bad input (exit 1, exactly one line on stderr, nothing on stdout).
# usage: mt_topo_cli.sh MT_TOPO FIXTURE_DIR
set -u
bin=$1
fix=$2
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
unset MT_TOPO_FILE
fail=0
bad() {
    echo "FAIL: $*"
    fail=1
}

# Live: packages, NUMA nodes, cores; this machine has no NVIDIA GPU.
"$bin" >"$tmp/live.txt" 2>"$tmp/live.err" || bad "live report exited $?: $(cat "$tmp/live.err")"
for want in "Source: live" "Packages: " "NUMA nodes: " "Cores: " "No NVIDIA GPU found."; do
    grep -q "^$want" "$tmp/live.txt" || bad "live report has no line starting '$want':
$(cat "$tmp/live.txt")"
done
"$bin" --json >"$tmp/live.json" 2>"$tmp/live.err" || bad "live --json exited $?"
"$here/json_report_check.sh" "$tmp/live.json" live || bad "live JSON report: fields"
python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); sys.exit(0 if r["gpus"] == [] and r["cores"] else 1)' \
    "$tmp/live.json" || bad "live JSON report does not have \"gpus\": [] and a core count"

# MT_TOPO_FILE stands in for --input; --input wins over it.
f=$fix/nccl-issue2397-2xA100pcie-cx6dx-icelake-hostA.xml
g=$fix/hwloc-aws-p4d.24xl-nixl.xml
MT_TOPO_FILE=$f "$bin" >"$tmp/env.txt" 2>/dev/null || bad "MT_TOPO_FILE report exited $?"
grep -qx "Source: $f" "$tmp/env.txt" || bad "MT_TOPO_FILE is not the source: $(head -1 "$tmp/env.txt")"
MT_TOPO_FILE=$f "$bin" --input "$g" >"$tmp/env.txt" 2>/dev/null || bad "--input with MT_TOPO_FILE exited $?"
grep -qx "Source: $g" "$tmp/env.txt" || bad "--input does not win over MT_TOPO_FILE"

# --export-nccl FILE writes the file and prints the report; '-' prints only the XML.
"$bin" --input "$g" --export-nccl "$tmp/x.xml" >"$tmp/r.txt" 2>"$tmp/r.err" || bad "export exited $?"
head -1 "$tmp/x.xml" | grep -q '^<system version="1"' || bad "export file does not start with <system version=\"1\""
grep -q "^Recommended TP groups:" "$tmp/r.txt" || bad "no report beside --export-nccl FILE"
"$bin" --input "$g" --export-nccl - >"$tmp/x2.xml" 2>/dev/null || bad "export to - exited $?"
cmp -s "$tmp/x.xml" "$tmp/x2.xml" || bad "--export-nccl - differs from the file export"
"$bin" --input "$tmp/x.xml" >"$tmp/back.txt" 2>/dev/null || bad "the export does not load"
tail -n +2 "$tmp/r.txt" >"$tmp/a" && tail -n +2 "$tmp/back.txt" >"$tmp/b"
diff -u "$tmp/a" "$tmp/b" || bad "the exported file gives another report (diff above)"

# Bad options: exit 2, usage on stderr, nothing on stdout.
for args in "--bogus" "--input" "--export-nccl" "stray"; do
    "$bin" $args >"$tmp/out" 2>"$tmp/err"
    rc=$?
    [ $rc -eq 2 ] || bad "mt-topo $args exited $rc, expected 2"
    [ -s "$tmp/out" ] && bad "mt-topo $args wrote to stdout"
    grep -q "^usage: mt-topo" "$tmp/err" || bad "mt-topo $args printed no usage"
done
"$bin" --help >"$tmp/out" 2>&1 && grep -q "^usage: mt-topo" "$tmp/out" || bad "--help"
"$bin" --version | grep -q "^mt-topo (meshtrain) " || bad "--version"

# Bad input: exit 1, one line "mt-topo: ..." on stderr naming the problem, nothing on stdout.
cp "$fix/nccl-ibmcloud-gx3d-h100x8-vsi-topo.xml" "$tmp/full.xml"
head -c 3000 "$tmp/full.xml" >"$tmp/truncated.xml"
printf '<?xml version="1.0"?>\n<topo><cpu numaid="0"/></topo>\n' >"$tmp/wrongroot.xml"
cat >"$tmp/badtarget.xml" <<'XML'
<system version="1">
  <cpu numaid="0" affinity="0000ffff">
    <pci busid="0000:01:00.0" class="0x030200" link_speed="" link_width="">
      <gpu dev="0" sm="90"><nvlink target="0000:99:00.0" count="4" tclass="0x030200"/></gpu>
    </pci>
  </cpu>
</system>
XML
truncate -s 100M "$tmp/huge.xml"
mkdir "$tmp/dir.xml"
check_bad() { # file, words the message must contain
    f=$1
    shift
    "$bin" --input "$f" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    [ $rc -eq 1 ] || bad "mt-topo --input $f exited $rc, expected 1"
    [ -s "$tmp/out" ] && bad "mt-topo --input $f wrote to stdout: $(head -3 "$tmp/out")"
    [ "$(wc -l <"$tmp/err")" -eq 1 ] || bad "mt-topo --input $f: stderr is not one line:
$(cat "$tmp/err")"
    grep -q "^mt-topo: " "$tmp/err" || bad "mt-topo --input $f: no 'mt-topo: ' prefix"
    for w in "$@"; do
        grep -q -- "$w" "$tmp/err" || bad "mt-topo --input $f: message lacks '$w': $(cat "$tmp/err")"
    done
}
check_bad "$tmp/missing.xml" "missing.xml" "No such file"
check_bad "$tmp/dir.xml" "is a directory"
check_bad "$tmp/truncated.xml" "truncated.xml"
check_bad "$tmp/wrongroot.xml" "<topo>"
check_bad "$tmp/badtarget.xml" "0000:99:00.0" "names no GPU"
check_bad "$tmp/huge.xml" "huge.xml" "MiB"
MT_TOPO_FILE=$tmp/missing.xml "$bin" >"$tmp/out" 2>"$tmp/err"
[ $? -eq 1 ] && [ ! -s "$tmp/out" ] && [ "$(wc -l <"$tmp/err")" -eq 1 ] || bad "MT_TOPO_FILE naming a missing file"
# An export that cannot be written: exit 1, one line, no report.
"$bin" --input "$g" --export-nccl "$tmp/no/such/dir.xml" >"$tmp/out" 2>"$tmp/err"
[ $? -eq 1 ] && [ ! -s "$tmp/out" ] && [ "$(wc -l <"$tmp/err")" -eq 1 ] || bad "export to a missing directory: $(cat "$tmp/err")"

[ $fail -eq 0 ] && echo "mt_topo_cli: all checks passed"
exit $fail
