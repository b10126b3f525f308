#!/bin/sh
# Regenerates tests/fixtures/topologies/expected/<fixture>.txt and .json from the current
# mt-topo. Read the changes (git diff) against the fixture before committing them: the expected
# reports are checked facts, not a snapshot of whatever the tool prints.
# usage: tests/tools/update_expected.sh [MT_TOPO]   (default: build/bin/mt-topo)
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=${1:-$root/build/bin/mt-topo}
case $bin in /*) ;; *) bin=$(pwd)/$bin ;; esac
cd "$root/tests/fixtures/topologies"
mkdir -p expected
unset MT_TOPO_FILE
for f in *.xml; do
    name=${f%.xml}
    "$bin" --input "$f" >"expected/$name.txt"
    "$bin" --input "$f" --json >"expected/$name.json"
done
echo "wrote $(ls expected | wc -l) files in tests/fixtures/topologies/expected"
