#!/usr/bin/env python3
"""Two builds of epx, one benchmark, interleaved: A B A B ... in one run, and the ratio of
their medians pair by pair.

    python3 scripts/ab_bench.py --rounds 5 OLD/src/tools/epx build/src/tools/epx -- \\
        bench --op all_reduce --bytes 64M --ranks 8 --iters 5 --warmup 1

Each run writes `epx bench --json`; the figures compared are every per-call median the report
has: `dispatch` / `combine` (EP: the slowest rank's p50 per iteration), the collective's
(`--op all_gather | reduce_scatter | all_reduce`) and PP's one-way latency per message size
(`--op pp`: recv p50, first in-flight setting). On a shared machine absolute times drift; the
pairs are seconds apart, so the per-pair ratio B/A (> 1: B slower) is what to quote, as its
median over the rounds.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def figures(report):
    """{name: microseconds} for every per-call median of one `epx bench --json` report."""
    out = {}
    for key in ("dispatch", "combine", "all_gather", "reduce_scatter", "all_reduce"):
        v = report.get(key)
        if isinstance(v, dict) and "max_rank_us" in v:
            out[key] = v["max_rank_us"]["p50"]
    for size in report.get("sizes", []) if report.get("op") == "pp" else []:
        runs = size.get("epx") or []
        if runs:
            out[f"pp {size['bytes']} B"] = runs[0]["recv_us"]["p50"]
    return out


def run(epx, args, path, timeout):
    cmd = [epx] + args + ["--json", path, "--no-progress"]
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=timeout)
    if done.returncode != 0:
        sys.exit(f"ab_bench: {' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    with open(path) as f:
        return figures(json.load(f))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", help="the first epx binary (the old build)")
    ap.add_argument("b", help="the second epx binary (the new build)")
    ap.add_argument("--rounds", type=int, default=5, help="pairs to run (default 5)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per run")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="-- then the epx arguments (bench ...)")
    o = ap.parse_args()
    args = o.args[1:] if o.args[:1] == ["--"] else o.args
    if not args:
        ap.error("give the epx arguments after --, e.g. -- bench --op all_reduce --bytes 16K --ranks 8")
    rows = {}
    with tempfile.TemporaryDirectory(prefix="epx-ab-") as tmp:
        for r in range(o.rounds):
            fa = run(o.a, args, os.path.join(tmp, "a.json"), o.timeout)
            fb = run(o.b, args, os.path.join(tmp, "b.json"), o.timeout)
            for name in fa.keys() & fb.keys():
                rows.setdefault(name, []).append((fa[name], fb[name]))
            print(f"round {r + 1}/{o.rounds}: " + ", ".join(f"{n} {fa[n]:.1f}/{fb[n]:.1f} us" for n in sorted(fa.keys() & fb.keys())),
                  file=sys.stderr, flush=True)
    if not rows:
        sys.exit("ab_bench: the reports have no figure in common")
    print(f"{'figure':<22} {'A p50 us':>12} {'B p50 us':>12} {'B/A (median of pairs)':>24}  pairs")
    for name in sorted(rows):
        pairs = rows[name]
        ratios = [b / a for a, b in pairs if a > 0]
        print(f"{name:<22} {statistics.median(a for a, _ in pairs):12.1f} {statistics.median(b for _, b in pairs):12.1f} "
              f"{statistics.median(ratios):24.3f}  " + " ".join(f"{x:.2f}" for x in ratios))


if __name__ == "__main__":
    main()
