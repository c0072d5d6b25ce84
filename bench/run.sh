#!/usr/bin/env bash
# Runs every benchmark of gpu-deploy-guard in one go and prints one table (`make bench`).
#
#   bench/run.sh            the full run, about 10 minutes once built; the table goes to target/bench/summary.md
#   bench/run.sh --smoke    the same steps at tiny sizes (< 90 s once built): checks that the
#                           harness still produces numbers, exits non-zero if it does not
#
# What it measures (BENCHMARKS.md explains how to read it):
#   1. criterion: policy::decide alone, lab nodes and a large node   (benches/decision.rs)
#   2. criterion: a whole review in-process, parse+decide+serialize  (benches/review.rs)
#   3. oha over TLS on loopback against the release binary and the floor server
#      (benches/floor_server.rs), HTTP/1.1 keep-alive and HTTP/2: CPU per review (user+system
#      CPU time from /proc around a fixed number of requests, floor and ours alternating), p50
#      and p99 at fixed rates of 200 and 1,000 reviews/s, and the highest rate of each
#   4. resident memory of both servers, idle and at peak
#   5. every executable bench/sections/*.sh, see "Extra sections" below
#   6. the audit at cluster scale (benches/audit.rs, its own table), when that file exists, and
#      what the continuous audit holds at 5,000 and 15,000 nodes (benches/auditor.rs)
# and, since timings on a shared 2-core machine move with whatever else runs, the same costs as
# instruction counts under callgrind, which do not: per decision and per in-process review
# (bench/count.sh), and per request for both servers over TLS (user space, all threads).
#
# Knobs (environment):
#   BENCH_DURATION  seconds per load run (8; smoke: 1)
#   BENCH_ROUNDS    highest-rate runs per server and cell, floor and ours alternating; the best
#                   counts (2; smoke: 1)
#   BENCH_BIN       the gpu-deploy-guard binary to load (default: build target/release's), e.g.
#                   an older build for a before/after comparison
#   BENCH_PIN       1 pins the servers to one CPU and oha to another with taskset (default when
#                   there are at least 2 CPUs); 0 lets the scheduler place them
#   BENCH_OUT       output directory (target/bench)
#   OHA             an oha binary to use instead of finding or installing one
#
# Extra sections: an executable bench/sections/NAME.sh is called as
#   bench/sections/NAME.sh OUT_DIR [--smoke]
# after the load tests. Its standard output (markdown: a `### title` line and a table) is added
# to the summary as it is; its standard error goes to OUT_DIR/NAME.log. A non-zero exit fails the
# run. It should start and stop whatever it needs itself (the API-server latency section brings
# its own control plane).
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
SMOKE=0
[[ ${1:-} == --smoke ]] && SMOKE=1

OUT=${BENCH_OUT:-$ROOT/target/bench}
if ((SMOKE)); then
    DURATION=${BENCH_DURATION:-1}
    ROUNDS=${BENCH_ROUNDS:-1}
    CRITERION=(--warm-up-time 0.2 --measurement-time 0.5 --sample-size 10)
    COUNT_ITERATIONS=5
    COUNT_CASES='large-node-review-allowed$'
    SERVER_REQUESTS=20
    CPU_REQUESTS=200
    CELLS=(h1-c16 h2-c16)
else
    DURATION=${BENCH_DURATION:-8}
    ROUNDS=${BENCH_ROUNDS:-2}
    CRITERION=(--warm-up-time 1 --measurement-time 4)
    COUNT_ITERATIONS=200
    COUNT_CASES=.
    SERVER_REQUESTS=500
    # About 2 s of one core per run: 1% of it is two clock ticks of /proc's user and system times.
    CPU_REQUESTS=${BENCH_CPU_REQUESTS:-20000}
    CELLS=(h1-c16 h2-c16)
fi
# Fixed rates (reviews/s) for the latency runs: a busy cluster's API server sends a few hundred.
RATES=(200 1000)
CARGO=${CARGO:-cargo}
BODY_ALLOWED=$ROOT/benches/fixtures/large-node-review-allowed.json
BODY_DENIED=$ROOT/benches/fixtures/large-node-review-denied.json

# Nothing from an earlier run may pass for this one's.
rm -rf "$OUT/load" "$OUT/sections" "$OUT/callgrind" "$OUT/cpu"
rm -f "$OUT"/{instructions,server-instructions,audit,auditor,memory,env}.txt "$OUT/summary.md"
mkdir -p "$OUT/load" "$OUT/sections" "$OUT/cpu"
# The summary takes criterion results newer than this; older ones stay as criterion's baseline.
touch "$OUT/started"
export CRITERION_HOME=$OUT/criterion
log() { printf '== [%3ds] %s\n' "$SECONDS" "$*" >&2; }

# --- the load generator -------------------------------------------------------------------
# oha: HTTP/1.1 keep-alive and HTTP/2, a fixed request rate (-q) with latency correction,
# percentiles in JSON. Installed from crates.io (pinned) into the cache the first time, by
# tests/build/oha.sh, outside the work tree so a fresh clone (CI) reuses it.
find_oha() {
    if [[ -n ${OHA:-} ]]; then
        echo "$OHA"
    else
        # The smoke run's 1-second runs at low rates do not need an optimised client.
        if ((SMOKE)); then
            CARGO=$CARGO bash "$ROOT/tests/build/oha.sh" --debug
        else
            CARGO=$CARGO bash "$ROOT/tests/build/oha.sh"
        fi
    fi
}
OHA=$(find_oha)

# --- build --------------------------------------------------------------------------------
log "building the release binary and the benches"
# make build's command (cargo auditable), so the binary make built is fresh, not compiled again.
CARGO=$CARGO bash tests/build/release.sh --quiet --bin gpu-deploy-guard
BIN=${BENCH_BIN:-$ROOT/target/release/gpu-deploy-guard}
FLOOR=$("$CARGO" bench --locked --quiet --no-run --bench floor_server --message-format=json |
    python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "floor_server" and m.get("executable"):
        print(m["executable"])')
[[ -x $FLOOR ]] || { log "cannot find the floor_server executable"; exit 1; }

# --- 1 and 2: criterion ------------------------------------------------------------------
for bench in decision review scan policy; do
    log "criterion: $bench"
    "$CARGO" bench --locked --quiet --bench "$bench" -- "${CRITERION[@]}" >"$OUT/criterion-$bench.log" 2>&1 ||
        { cat "$OUT/criterion-$bench.log" >&2; exit 1; }
done

# --- 6: the audit at cluster scale --------------------------------------------------------
if [[ -f benches/audit.rs ]]; then
    log "audit bench"
    GDG_BENCH_SMOKE=$SMOKE "$CARGO" bench --locked --quiet --bench audit >"$OUT/audit.txt" 2>"$OUT/audit.log" ||
        { cat "$OUT/audit.log" >&2; exit 1; }
fi
# What the continuous audit holds, piece by piece, at 5,000 and 15,000 nodes (heap bytes).
log "auditor bench"
GDG_BENCH_SMOKE=$SMOKE "$CARGO" bench --locked --quiet --bench auditor >"$OUT/auditor.txt" 2>"$OUT/auditor.log" ||
    { cat "$OUT/auditor.log" >&2; exit 1; }

if command -v valgrind >/dev/null; then
    log "callgrind: instructions per decision and per review"
    bench/count.sh --iterations "$COUNT_ITERATIONS" --cases "$COUNT_CASES" decision review scan \
        >"$OUT/instructions.txt"
else
    log "valgrind not installed: no instruction counts"
fi

# --- 3 and 4: the servers under load ------------------------------------------------------
CPUS=$(nproc)
PIN=${BENCH_PIN:-$((CPUS >= 2))}
server_on=() load_on=()
if ((PIN)); then
    # The servers share the last CPU (only one is loaded at a time), oha gets the first.
    server_on=(taskset -c $((CPUS - 1)))
    load_on=(taskset -c 0)
fi

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() {
    local port=$1 pid=$2
    for _ in $(seq 100); do
        kill -0 "$pid" 2>/dev/null || { log "server $pid exited"; return 1; }
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return 0
        sleep 0.1
    done
    log "nothing listens on $port"
    return 1
}
status_kib() { awk -v key="$2:" '$1 == key { print $2 }' "/proc/$1/status"; }
# User and system CPU time of a process, all threads, in clock ticks (fields 14 and 15; the
# command name in field 2 has no spaces here).
cpu_times() { awk '{ print $14, $15 }' "/proc/$1/stat"; }

PIDS=()
cleanup() {
    local pid
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap cleanup EXIT

"$BIN" certs --out "$OUT/certs" --ip 127.0.0.1 --dns localhost --force >/dev/null 2>&1
OURS_PORT=$(free_port) ADMIN_PORT=$(free_port) FLOOR_PORT=$(free_port)
# Logs at warn, as a production install would run under load; denials are logged at info.
RUST_LOG=warn "${server_on[@]}" "$BIN" serve --listen "127.0.0.1:$OURS_PORT" \
    --admin-listen "127.0.0.1:$ADMIN_PORT" \
    --tls-cert "$OUT/certs/tls.crt" --tls-key "$OUT/certs/tls.key" 2>"$OUT/ours.log" &
OURS_PID=$!
PIDS+=("$OURS_PID")
"${server_on[@]}" "$FLOOR" --serve "127.0.0.1:$FLOOR_PORT" \
    --tls-cert "$OUT/certs/tls.crt" --tls-key "$OUT/certs/tls.key" >"$OUT/floor.log" 2>&1 &
FLOOR_PID=$!
PIDS+=("$FLOOR_PID")
wait_port "$OURS_PORT" "$OURS_PID"
wait_port "$FLOOR_PORT" "$FLOOR_PID"
sleep 0.5
{
    echo "ours_idle_rss_kib $(status_kib "$OURS_PID" VmRSS)"
    echo "floor_idle_rss_kib $(status_kib "$FLOOR_PID" VmRSS)"
} >"$OUT/memory.txt"

# One oha run; writes OUT/load/NAME.json and adds the server's CPU use to it: % of one CPU, and
# user and system CPU seconds (from /proc/PID/stat, all threads) during the run. RATE is `max`, a
# number of reviews/s, or `nNUMBER`: that many requests as fast as they go.
load() {
    local name=$1 server=$2 proto=$3 conns=$4 rate=$5 body=$6
    local port=$FLOOR_PORT pid=$FLOOR_PID
    [[ $server == ours ]] && port=$OURS_PORT pid=$OURS_PID
    local args=(--no-tui --output-format json -c "$conns"
        -m POST -H 'Content-Type: application/json' -D "$body" --insecure)
    case $rate in
    max) args+=(-z "${DURATION}s") ;;
    n*) args+=(-n "${rate#n}") ;;
    *) args+=(-z "${DURATION}s" -q "$rate" --latency-correction) ;;
    esac
    [[ $proto == h2 ]] && args+=(--http2)
    local before after
    before=$(cpu_times "$pid")
    "${load_on[@]}" "$OHA" "${args[@]}" "https://127.0.0.1:$port/validate" >"$OUT/load/$name.json"
    after=$(cpu_times "$pid")
    python3 - "$OUT/load/$name.json" "$before" "$after" "$(getconf CLK_TCK)" <<'EOF2'
import json, sys
path, before, after, hz = sys.argv[1], sys.argv[2].split(), sys.argv[3].split(), int(sys.argv[4])
with open(path) as f:
    result = json.load(f)
user = (int(after[0]) - int(before[0])) / hz
system = (int(after[1]) - int(before[1])) / hz
result["serverCpuUserSeconds"] = user
result["serverCpuSystemSeconds"] = system
result["serverCpuPercent"] = 100.0 * (user + system) / result["summary"]["total"]
with open(path, "w") as f:
    json.dump(result, f)
EOF2
}
max_rps() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["summary"]["requestsPerSec"])' "$1"; }

log "load: servers ${server_on[*]:-unpinned}, oha ${load_on[*]:-unpinned}"
for proto in h1 h2; do
    # CPU per review: the same number of requests to each server, floor and ours alternating,
    # so that whatever else the machine does hits both alike. A warm-up run first: connections,
    # TLS sessions and allocator pools are not what a review costs.
    log "load: $proto, CPU per review ($CPU_REQUESTS requests per run, $((ROUNDS + 1)) rounds)"
    for server in floor ours; do
        load "$proto-$server-warmup" "$server" "$proto" 16 "n$((CPU_REQUESTS / 10 + 10))" "$BODY_ALLOWED"
    done
    for ((round = 1; round <= ROUNDS + 1; round++)); do
        order=(floor ours)
        ((round % 2 == 0)) && order=(ours floor)
        for server in "${order[@]}"; do
            load "$proto-$server-cpu-$round" "$server" "$proto" 16 "n$CPU_REQUESTS" "$BODY_ALLOWED"
        done
    done
    # Latency at fixed rates, each server in turn.
    for rate in "${RATES[@]}"; do
        log "load: $proto, $rate reviews/s for ${DURATION}s"
        for server in floor ours; do
            load "$proto-$server-rate$rate" "$server" "$proto" 8 "$rate" "$BODY_ALLOWED"
        done
    done
done
for cell in "${CELLS[@]}"; do
    proto=${cell%-c*} conns=${cell#*-c}
    log "load: $cell, highest rate for ${DURATION}s"
    for ((round = 1; round <= ROUNDS; round++)); do
        order=(floor ours)
        ((round % 2 == 0)) && order=(ours floor)
        for server in "${order[@]}"; do
            load "$cell-$server-max-$round" "$server" "$proto" "$conns" max "$BODY_ALLOWED"
        done
    done
done
# The less common path: a denied review (its message, and a log line at info).
log "load: denied review"
load "h1-c16-ours-denied-max" ours h1 16 max "$BODY_DENIED"

{
    echo "ours_peak_rss_kib $(status_kib "$OURS_PID" VmHWM)"
    echo "ours_after_rss_kib $(status_kib "$OURS_PID" VmRSS)"
    echo "floor_peak_rss_kib $(status_kib "$FLOOR_PID" VmHWM)"
} >>"$OUT/memory.txt"
cleanup
PIDS=()

# User-space instructions per request of a server over TLS, under callgrind: counted from after
# a warm-up to after SERVER_REQUESTS more requests (4 connections), all threads included.
server_instructions() {
    local name=$1 proto=$2
    shift 2
    local port
    port=$(free_port)
    local cmd=("${@//PORT/$port}")
    RUST_LOG=warn valgrind --tool=callgrind --callgrind-out-file="$OUT/callgrind/$name.%p" \
        "${cmd[@]}" >"$OUT/callgrind/$name.log" 2>&1 &
    local pid=$!
    PIDS+=("$pid")
    local i
    for ((i = 0; i < 300; i++)); do
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
        sleep 0.1
    done
    local args=(--no-tui --output-format json -c 4 -m POST -H 'Content-Type: application/json'
        -D "$BODY_ALLOWED" --insecure "https://127.0.0.1:$port/validate")
    [[ $proto == h2 ]] && args+=(--http2)
    "$OHA" -n 50 "${args[@]}" >/dev/null
    callgrind_control --zero "$pid" >/dev/null
    "$OHA" -n "$SERVER_REQUESTS" "${args[@]}" >"$OUT/callgrind/$name.json"
    callgrind_control --dump "$pid" >/dev/null
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    local total
    total=$(awk '/^summary:/ { print $2 }' "$OUT/callgrind/$name.$pid.1")
    echo "$name $((total / SERVER_REQUESTS))" >>"$OUT/server-instructions.txt"
}

if command -v valgrind >/dev/null; then
    log "callgrind: instructions per request, both servers"
    mkdir -p "$OUT/callgrind"
    for proto in h1 h2; do
        server_instructions "$proto-floor" "$proto" "$FLOOR" --serve "127.0.0.1:PORT" \
            --tls-cert "$OUT/certs/tls.crt" --tls-key "$OUT/certs/tls.key"
        server_instructions "$proto-ours" "$proto" "$BIN" serve --listen "127.0.0.1:PORT" \
            --admin-listen 127.0.0.1:0 --tls-cert "$OUT/certs/tls.crt" --tls-key "$OUT/certs/tls.key"
    done
    PIDS=()
fi

# --- 5: extra sections --------------------------------------------------------------------
for section in bench/sections/*.sh; do
    [[ -x $section ]] || continue
    name=$(basename "$section" .sh)
    log "section: $name"
    smoke_arg=()
    ((SMOKE)) && smoke_arg=(--smoke)
    "$section" "$OUT" "${smoke_arg[@]}" >"$OUT/sections/$name.md" 2>"$OUT/$name.log" ||
        { log "section $name failed; see $OUT/$name.log"; exit 1; }
done

# --- the table ----------------------------------------------------------------------------
{
    echo "machine $(uname -srm); $(nproc) CPUs: $(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo)"
    echo "load_duration_s $DURATION"
    echo "pinning ${server_on[*]:-none} (servers) / ${load_on[*]:-none} (oha)"
    echo "oha $("$OHA" --version | awk '{ print $2 }')"
    echo "rustc $(rustc --version | awk '{ print $2 }')"
} >"$OUT/env.txt"
check=()
((SMOKE)) && check=(--check)
python3 bench/summarize.py "$OUT" "${check[@]}" >"$OUT/summary.md"
cat "$OUT/summary.md"
