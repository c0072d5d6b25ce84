#!/usr/bin/env bash
# Instructions per iteration of every case of the given criterion benches, counted by callgrind:
# unlike a time, the count does not move with whatever else the machine runs, so it shows the
# effect of a code change even on a busy machine. Prints `bench/case instructions` lines.
#
#   bench/count.sh [--iterations N] [--cases REGEX] decision review
#
# Builds the benches with the bench profile first. Needs valgrind.
set -euo pipefail
cd "$(dirname "$0")/.."

ITERATIONS=200
CASES=.
while [[ ${1:-} == --* ]]; do
    case $1 in
    --iterations) ITERATIONS=$2 ;;
    --cases) CASES=$2 ;;
    *) echo "count.sh: unknown option $1" >&2; exit 2 ;;
    esac
    shift 2
done
command -v valgrind >/dev/null || { echo "count.sh: valgrind is not installed" >&2; exit 1; }

for bench in "$@"; do
    exe=$(cargo bench --locked --quiet --no-run --bench "$bench" --message-format=json |
        python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and "bench" in m["target"]["kind"]:
        print(m["executable"])')
    GDG_BENCH_LIST=1 "$exe" | grep -E -- "$CASES" | while read -r case; do
        # The first iteration pays for lazy set-up (allocator pools, tracing's callsite cache);
        # one uncounted run keeps that out of the figure.
        collected=$(GDG_BENCH_COUNT=$((ITERATIONS + 1)) GDG_BENCH_CASE=$case \
            valgrind --tool=callgrind --callgrind-out-file=/dev/null --toggle-collect='*counted*' \
            "$exe" 2>&1 | awk '/Collected :/ { print $NF }')
        once=$(GDG_BENCH_COUNT=1 GDG_BENCH_CASE=$case \
            valgrind --tool=callgrind --callgrind-out-file=/dev/null --toggle-collect='*counted*' \
            "$exe" 2>&1 | awk '/Collected :/ { print $NF }')
        echo "$bench/$case $(((collected - once) / ITERATIONS))"
    done
done
