#!/usr/bin/env python3
"""Turns what bench/run.sh left in OUT_DIR into one markdown table, on standard output.

    summarize.py OUT_DIR [--check]

--check (the smoke run): exit 1, naming what is missing, unless every part produced numbers:
criterion estimates for every expected benchmark, a non-zero rate with only HTTP 200 answers for
every load run, and the memory figures."""
import glob
import json
import os
import sys

# The targets. Ratios are what count: the absolute figures depend on the machine.
MIN_RATIO = 0.85
MAX_P99_S = 0.001
MAX_PEAK_RSS_KIB = 30 * 1024
MAX_IDLE_RSS_KIB = 15 * 1024

EXPECTED_CRITERION = {
    "decision/large-node-review-allowed",
    "decision/lab-node-1-dcgm-exporter-off",
    "review/full/large-node-review-allowed",
    "review/floor/large-node-review-allowed",
    "review/router/large-node-review-allowed",
    "scan/scan/large-node-review-allowed",
}
PROTOCOL = {"h1": "HTTP/1.1", "h2": "HTTP/2"}

problems = []


def criterion(out):
    """full_id -> (median ns, bytes per iteration or None), for benchmarks run since the start."""
    started = os.path.getmtime(os.path.join(out, "started"))
    found = {}
    for path in glob.glob(os.path.join(out, "criterion", "**", "new", "benchmark.json"), recursive=True):
        if os.path.getmtime(path) < started:
            continue
        with open(path) as f:
            bench = json.load(f)
        with open(os.path.join(os.path.dirname(path), "estimates.json")) as f:
            median = json.load(f)["median"]["point_estimate"]
        throughput = bench.get("throughput") or {}
        found[bench["full_id"]] = (median, throughput.get("Bytes"))
    return found


def load(out, name):
    path = os.path.join(out, "load", name + ".json")
    try:
        with open(path) as f:
            result = json.load(f)
    except (OSError, ValueError) as e:
        problems.append(f"load run {name}: {e}")
        return None
    codes = result.get("statusCodeDistribution") or {}
    rps = result["summary"].get("requestsPerSec") or 0
    if rps <= 0 or set(codes) != {"200"}:
        problems.append(f"load run {name}: {rps} requests/s, status codes {codes}, "
                        f"errors {result.get('errorDistribution')}")
    return result


def counts(path):
    """`name number` lines, as bench/count.sh and run.sh write them; empty when absent."""
    try:
        with open(path) as f:
            return {name: int(n) for name, n in (line.split() for line in f if line.strip())}
    except OSError:
        return {}


def best(out, prefix):
    """The highest-rate run among the rounds `prefix-1`, `prefix-2`, ..."""
    names = sorted(os.path.basename(p)[:-5] for p in glob.glob(os.path.join(out, "load", prefix + "-*.json")))
    if not names:
        problems.append(f"load run {prefix}: none")
        return None
    runs = [r for r in (load(out, n) for n in names) if r]
    return max(runs, key=lambda r: r["summary"]["requestsPerSec"], default=None)


def thousands(n):
    return "–" if n is None else f"{n / 1000:.0f} k"


def duration(ns):
    if ns < 1_000:
        return f"{ns:.0f} ns"
    if ns < 1_000_000:
        return f"{ns / 1_000:.2f} µs"
    return f"{ns / 1_000_000:.2f} ms"


def ms(seconds):
    return "–" if seconds is None else f"{seconds * 1000:.2f}"


def verdict(ok):
    return "met" if ok else "**missed**"


def main():
    out = sys.argv[1]
    check = "--check" in sys.argv[2:]
    lines = ["# gpu-deploy-guard benchmarks", ""]
    env = {}
    with open(os.path.join(out, "env.txt")) as f:
        for line in f:
            key, _, value = line.rstrip("\n").partition(" ")
            env[key] = value
    lines += [f"Machine: {env.get('machine')}; rustc {env.get('rustc')}, oha {env.get('oha')}; "
              f"load runs of {env.get('load_duration_s')} s; CPU pinning: {env.get('pinning')}.", ""]

    marks = criterion(out)
    for want in sorted(EXPECTED_CRITERION - set(marks)):
        problems.append(f"criterion: no result for {want}")
    instructions = counts(os.path.join(out, "instructions.txt"))
    if instructions and any(n <= 0 for n in instructions.values()):
        problems.append(f"callgrind: a case counted no instructions: {instructions}")

    lines += ["## 1. The decision alone (`policy::decide`)", "",
              "Median time (criterion) and instructions (callgrind) per decision.", "",
              "| review | time | instructions |", "|---|---|---|"]
    for full_id, (ns, _) in sorted(marks.items()):
        if full_id.startswith("decision/"):
            lines.append(f"| {full_id[len('decision/'):]} | {duration(ns)} | "
                         f"{thousands(instructions.get(full_id))} |")

    lines += ["", "## 2. A whole review in-process", "",
              "`full`: parse, decide, serialize. `parse`/`respond`: its parts. `router`: the axum "
              "handler with limits and metrics. `floor`: the floor server's work on the same body. "
              "`scan`: the body scanner alone (the fields the webhook needs; the rest skipped, checked). "
              "Median time (criterion) and instructions (callgrind) per review.",
              "", "| step / review | time | body MB/s | instructions |", "|---|---|---|---|"]
    for full_id, (ns, size) in sorted(marks.items()):
        if full_id.startswith(("review/", "scan/")):
            rate = f"{size / ns * 1e3:.0f}" if size else ""
            lines.append(f"| {full_id.split('/', 1)[1]} | {duration(ns)} | {rate} | "
                         f"{thousands(instructions.get(full_id))} |")

    others = sorted(k for k in marks if not k.startswith(("decision/", "review/", "scan/")))
    if others:
        lines += ["", "## Other criterion benchmarks", "", "| benchmark | time |", "|---|---|"]
        lines += [f"| {k} | {duration(marks[k][0])} |" for k in others]

    lines += ["", "## 3. The server over TLS on loopback (oha, large-node body, allowed)", ""]
    per_request = counts(os.path.join(out, "server-instructions.txt"))
    lines += ["### CPU per review", "",
              "User+system CPU time of each server process (all threads, from /proc/PID/stat) around "
              "a fixed number of requests over 16 connections, floor and ours alternating; the median "
              "of the rounds. Beside it, user-space instructions per request under callgrind (see "
              "below), which do not move with the machine's load. `floor/ours` ≥ 0.85 is the target: "
              "ours may cost at most 1/0.85 = 1.18 × the floor's CPU.", "",
              "| protocol | requests × rounds | floor µs CPU (user + sys) | ours µs CPU (user + sys) | "
              "floor/ours CPU | floor/ours instructions | target (≥ 0.85) |",
              "|---|---|---|---|---|---|---|"]
    worst_ratio = None
    for proto in ("h1", "h2"):
        per = {}
        for server in ("floor", "ours"):
            runs = []
            for path in sorted(glob.glob(os.path.join(out, "load", f"{proto}-{server}-cpu-*.json"))):
                r = load(out, os.path.basename(path)[:-5])
                if r:
                    n = sum((r.get("statusCodeDistribution") or {}).values()) or 1
                    runs.append((r["serverCpuUserSeconds"] / n * 1e6, r["serverCpuSystemSeconds"] / n * 1e6, n))
            if not runs:
                problems.append(f"load: no CPU runs for {proto} {server}")
                continue
            runs.sort(key=lambda t: t[0] + t[1])
            per[server] = (runs[len(runs) // 2], len(runs))
        if len(per) < 2:
            continue
        (fu, fs, n), rounds = per["floor"]
        (ou, os_, _), _ = per["ours"]
        ratio = (fu + fs) / (ou + os_) if ou + os_ else 0
        if fu + fs <= 0 or ou + os_ <= 0:
            problems.append(f"load: no CPU time measured for {proto}")
        worst_ratio = ratio if worst_ratio is None else min(worst_ratio, ratio)
        floor_n, ours_n = per_request.get(f"{proto}-floor"), per_request.get(f"{proto}-ours")
        by_count = f"{floor_n / ours_n:.2f}" if floor_n and ours_n else "–"
        lines.append(f"| {PROTOCOL[proto]} | {n} × {rounds} | {fu + fs:.1f} ({fu:.1f} + {fs:.1f}) | "
                     f"{ou + os_:.1f} ({ou:.1f} + {os_:.1f}) | {ratio:.2f} | {by_count} | "
                     f"{verdict(ratio >= MIN_RATIO)} |")

    lines += ["", "### Latency at fixed rates", "",
              "oha at a fixed rate with latency correction (a late request counts from when it should "
              "have been sent), 8 connections, pinned to another CPU than the server. Target: ours "
              "p99 ≤ 1 ms at 1,000/s.", "",
              "| protocol | rate | floor p50 / p99 ms | ours p50 / p99 ms | ours CPU % | target |",
              "|---|---|---|---|---|---|"]
    worst_p99 = None
    rates = sorted({int(os.path.basename(p)[:-5].split("-rate")[1])
                    for p in glob.glob(os.path.join(out, "load", "*-ours-rate*.json"))})
    if not rates:
        problems.append("load: no fixed-rate runs")
    for proto in ("h1", "h2"):
        for rate in rates:
            f, o = load(out, f"{proto}-floor-rate{rate}"), load(out, f"{proto}-ours-rate{rate}")
            if not f or not o:
                continue
            fp, op = f["latencyPercentiles"], o["latencyPercentiles"]
            target = ""
            if rate == 1000:
                worst_p99 = op["p99"] if worst_p99 is None else max(worst_p99, op["p99"])
                target = verdict(op["p99"] is not None and op["p99"] <= MAX_P99_S)
            lines.append(f"| {PROTOCOL[proto]} | {rate}/s | {ms(fp['p50'])} / {ms(fp['p99'])} | "
                         f"{ms(op['p50'])} / {ms(op['p99'])} | {o['serverCpuPercent']:.0f} | {target} |")

    lines += ["", "### Highest rate", "",
              "For reference, not a target: each server's highest rate (best of the rounds, floor and "
              "ours alternating) and its CPU use (% of one CPU) at that rate; oha shares the machine.",
              "", "| protocol | conns | floor req/s | ours req/s | ours/floor | CPU floor / ours |",
              "|---|---|---|---|---|---|"]
    cells = sorted({os.path.basename(p).split("-floor-max-")[0]
                    for p in glob.glob(os.path.join(out, "load", "*-floor-max-*.json"))})
    if not cells:
        problems.append("load: no highest-rate runs")
    for cell in cells:
        proto, conns = cell.split("-c")
        runs = {k: best(out, f"{cell}-{k}") for k in ("floor-max", "ours-max")}
        if any(r is None for r in runs.values()):
            continue
        floor_rps = runs["floor-max"]["summary"]["requestsPerSec"]
        ours_rps = runs["ours-max"]["summary"]["requestsPerSec"]
        cpu = f"{runs['floor-max']['serverCpuPercent']:.0f} / {runs['ours-max']['serverCpuPercent']:.0f}"
        lines.append(f"| {PROTOCOL[proto]} | {conns} | {floor_rps:.0f} | {ours_rps:.0f} | "
                     f"{ours_rps / floor_rps if floor_rps else 0:.2f} | {cpu} |")
    denied = load(out, "h1-c16-ours-denied-max")
    if denied:
        lines += ["", f"A denied review (HTTP/1.1, 16 connections, highest rate): "
                      f"{denied['summary']['requestsPerSec']:.0f} req/s, ours at "
                      f"{denied['serverCpuPercent']:.0f}% CPU."]

    if per_request:
        lines += ["", "### CPU cost per request (callgrind)", "",
                  "User-space instructions per request of each server over TLS, all threads, "
                  "large-node body, 4 connections; TLS, HTTP, parsing and answering included, the "
                  "kernel's share not. Unlike req/s, these do not move with the machine's load.", "",
                  "| protocol | floor | ours | floor/ours |", "|---|---|---|---|"]
        for proto in ("h1", "h2"):
            floor_n, ours_n = per_request.get(f"{proto}-floor"), per_request.get(f"{proto}-ours")
            if not floor_n or not ours_n:
                problems.append(f"callgrind: no per-request count for {proto}")
                continue
            lines.append(f"| {PROTOCOL[proto]} | {thousands(floor_n)} | {thousands(ours_n)} | "
                         f"{floor_n / ours_n:.2f} |")

    memory = {}
    with open(os.path.join(out, "memory.txt")) as f:
        for line in f:
            key, _, value = line.partition(" ")
            if value.strip():
                memory[key] = int(value)
    want = ["ours_idle_rss_kib", "ours_peak_rss_kib", "ours_after_rss_kib", "floor_idle_rss_kib",
            "floor_peak_rss_kib"]
    for key in want:
        if key not in memory:
            problems.append(f"memory: no {key}")
    mib = lambda key: f"{memory[key] / 1024:.1f}" if key in memory else "–"
    lines += ["", "## 4. Resident memory (MiB; peak is VmHWM after all load runs)", "",
              "| server | idle | peak | after the load | targets (idle < 15, peak < 30) |",
              "|---|---|---|---|---|",
              f"| ours | {mib('ours_idle_rss_kib')} | {mib('ours_peak_rss_kib')} | "
              f"{mib('ours_after_rss_kib')} | "
              f"{verdict(memory.get('ours_idle_rss_kib', 1 << 30) < MAX_IDLE_RSS_KIB)}, "
              f"{verdict(memory.get('ours_peak_rss_kib', 1 << 30) < MAX_PEAK_RSS_KIB)} |",
              f"| floor | {mib('floor_idle_rss_kib')} | {mib('floor_peak_rss_kib')} | | |"]

    audit = os.path.join(out, "audit.txt")
    if os.path.exists(audit):
        with open(audit) as f:
            table = f.read().rstrip()
        if len(table.splitlines()) < 2:
            problems.append("audit bench: no rows")
        lines += ["", "## 6. The audit at cluster scale (benches/audit.rs, best of its runs)", "",
                  "```text", table, "```"]
        # Columns: nodes, pods, nodes MB, pods MB, parse ms, audit ms, print ms, total ms, peak MB.
        for row in (line.split() for line in table.splitlines()[1:]):
            if len(row) == 9 and row[0] == "5000":
                total_ms = float(row[7])
                lines += ["", f"Audit of 5,000 nodes: {total_ms / 1000:.2f} s in all "
                              f"(target < 0.5 s: {verdict(total_ms < 500)})."]

    auditor = os.path.join(out, "auditor.txt")
    if os.path.exists(auditor):
        with open(auditor) as f:
            table = f.read().rstrip()
        if len(table.splitlines()) < 3:
            problems.append("auditor bench: no rows")
        lines += ["", "## 6. What the continuous audit holds (benches/auditor.rs, heap MiB)", "",
                  "```text", table, "```"]

    for path in sorted(glob.glob(os.path.join(out, "sections", "*.md"))):
        with open(path) as f:
            text = f.read().strip()
        if not text:
            problems.append(f"section {os.path.basename(path)} printed nothing")
            continue
        lines += ["", text]

    if worst_ratio is not None:
        lines += ["", f"Worst CPU-per-review ratio floor/ours {worst_ratio:.2f} (target ≥ {MIN_RATIO}); "
                      f"worst p99 of ours at 1,000/s {ms(worst_p99)} ms (target ≤ 1 ms)."]
    print("\n".join(lines))
    if problems:
        print("\nbench harness problems:\n" + "\n".join("- " + p for p in problems), file=sys.stderr)
        if check:
            sys.exit(1)


if __name__ == "__main__":
    main()
