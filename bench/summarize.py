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
              "Median time (criterion) and instructions (callgrind) per review.",
              "", "| step / review | time | body MB/s | instructions |", "|---|---|---|---|"]
    for full_id, (ns, size) in sorted(marks.items()):
        if full_id.startswith("review/"):
            rate = f"{size / ns * 1e3:.0f}" if size else ""
            lines.append(f"| {full_id[len('review/'):]} | {duration(ns)} | {rate} | "
                         f"{thousands(instructions.get(full_id))} |")

    others = sorted(k for k in marks if not k.startswith(("decision/", "review/")))
    if others:
        lines += ["", "## Other criterion benchmarks", "", "| benchmark | time |", "|---|---|"]
        lines += [f"| {k} | {duration(marks[k][0])} |" for k in others]

    lines += ["", "## 3. The server over TLS on loopback (oha, large-node body, allowed)", "",
              "Highest rate of each server (best of the rounds), our share of the floor's, each "
              "server's CPU use (% of one CPU) at that rate; then latency of both at half of the floor's highest "
              "rate (fixed rate, latency-corrected), and of ours at half of its own highest rate.", "",
              "| protocol | conns | floor req/s | ours req/s | ours/floor | CPU floor / ours | "
              "fixed rate | floor p50 / p99 ms | ours p50 / p99 ms | "
              "ours at half its own rate: p50 / p99 ms | targets (≥0.85, p99 ≤ 1 ms) |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    worst_ratio, worst_p99 = None, None
    cells = sorted({os.path.basename(p).split("-floor-max-")[0]
                    for p in glob.glob(os.path.join(out, "load", "*-floor-max-*.json"))})
    if not cells:
        problems.append("load: no runs")
    for cell in cells:
        proto, conns = cell.split("-c")
        runs = {k: best(out, f"{cell}-{k}") for k in ("floor-max", "ours-max")}
        runs.update({k: load(out, f"{cell}-{k}") for k in ("floor-half", "ours-half", "ours-halfown")})
        if any(r is None for r in runs.values()):
            continue
        floor_rps = runs["floor-max"]["summary"]["requestsPerSec"]
        ours_rps = runs["ours-max"]["summary"]["requestsPerSec"]
        ratio = ours_rps / floor_rps if floor_rps else 0
        fixed = int(floor_rps / 2)
        p = {k: runs[k]["latencyPercentiles"] for k in ("floor-half", "ours-half", "ours-halfown")}
        own = int(ours_rps / 2)
        p99 = p["ours-half"]["p99"]
        worst_ratio = ratio if worst_ratio is None else min(worst_ratio, ratio)
        worst_p99 = p99 if worst_p99 is None else max(worst_p99, p99)
        cpu = f"{runs['floor-max']['serverCpuPercent']:.0f} / {runs['ours-max']['serverCpuPercent']:.0f}"
        lines.append(
            f"| {PROTOCOL[proto]} | {conns} | {floor_rps:.0f} | {ours_rps:.0f} | {ratio:.2f} | {cpu} | "
            f"{fixed}/s | {ms(p['floor-half']['p50'])} / {ms(p['floor-half']['p99'])} | "
            f"{ms(p['ours-half']['p50'])} / {ms(p99)} | "
            f"{own}/s: {ms(p['ours-halfown']['p50'])} / {ms(p['ours-halfown']['p99'])} | "
            f"{verdict(ratio >= MIN_RATIO)}, {verdict(p99 is not None and p99 <= MAX_P99_S)} |")
    denied = load(out, "h1-c16-ours-denied-max")
    if denied:
        lines += ["", f"A denied review (HTTP/1.1, 16 connections, highest rate): "
                      f"{denied['summary']['requestsPerSec']:.0f} req/s, ours at "
                      f"{denied['serverCpuPercent']:.0f}% CPU."]

    per_request = counts(os.path.join(out, "server-instructions.txt"))
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

    for path in sorted(glob.glob(os.path.join(out, "sections", "*.md"))):
        with open(path) as f:
            text = f.read().strip()
        if not text:
            problems.append(f"section {os.path.basename(path)} printed nothing")
            continue
        lines += ["", text]

    if worst_ratio is not None:
        lines += ["", f"Worst throughput ratio {worst_ratio:.2f} (target ≥ {MIN_RATIO}); worst p99 at "
                      f"half the floor's rate {ms(worst_p99)} ms (target ≤ 1 ms)."]
    print("\n".join(lines))
    if problems:
        print("\nbench harness problems:\n" + "\n".join("- " + p for p in problems), file=sys.stderr)
        if check:
            sys.exit(1)


if __name__ == "__main__":
    main()
