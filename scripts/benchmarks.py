#!/usr/bin/python3
"""The headline benchmarks of epx, run the way anyone can repeat them (scripts/benchmarks.sh).

Every figure is a ratio measured in one run against a yardstick of the same run:

* the one-copy limit: `epx bench` times a memcpy and a streaming-store copy of exactly the
  bytes the op moves, by the same processes, interleaved with the epx iterations;
* Open MPI: `--baseline mpi` (epx_mpi_baseline, epx_mpi_collective) or `--peers mpi`
  (epx_mpi_p2p_baseline) on the same routing / data, in the same invocation;
* torch.distributed gloo: `python3 -m epx.bench` (interleaved per iteration) and
  `--peers gloo` of `epx bench --op pp|engram`.

A ratio > 1 always means epx is faster: epx GB/s / limit GB/s, or peer time / epx time.
Steps with a peer run `rounds` times (epx and its peer in turns) and report the median.

Writes (default: in place) BENCHMARKS.md's text between <!-- figures:begin --> and
<!-- figures:end -->, docs/img/benchmarks.json (every figure, every round, the exact argv)
and docs/img/benchmarks.svg, and the README's headline figures (the rows naming a figure id);
the `sim` step docs/img/sim_published.svg. Rows of steps not
run this time (--only) are kept from the JSON already there, with their own date and commit.
"""

import argparse
import json
import os
import shutil
import signal
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the checkout
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the bench_* modules beside this file
from bench_output import (BEGIN, END, SIM_BEGIN, SIM_END, markdown, readme_headline,  # noqa: E402
                          replace_region, sim_accuracy, svg_chart)
from bench_run import OP_INFO, OPS, REPO, Run, Skip, StepError, fmt_ratio, not_measured, now  # noqa: E402
from bench_steps import (step_collective, step_engram, step_ep_gloo, step_ep_limit, step_ep_mpi,  # noqa: E402
                         step_multinode, step_pp, step_sim)

# What readers of this file use (tests/docs/test_benchmarks_script.py: the steps, the figures,
# the markers of BENCHMARKS.md's region).
__all__ = ["main", "steps", "OPS", "BEGIN", "END"]


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="scripts/benchmarks.sh", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="tiny sizes and few iterations (a smoke test for CI, < 2 min); the sim step is skipped")
    ap.add_argument("--out", metavar="DIR",
                    help="write benchmarks.json, benchmarks.svg, figures.md and BENCHMARKS.md (the repo's with "
                         "the new figures) into DIR instead of updating BENCHMARKS.md and docs/img/ in place")
    ap.add_argument("--build", default="build", metavar="DIR", help="the build to measure (default build)")
    ap.add_argument("--only", metavar="A,B", help="only these steps (names or prefixes, see --list)")
    ap.add_argument("--rounds", type=int, default=0,
                    help="rounds of epx and its peer in turns (default: 3 full, 1 with --quick)")
    ap.add_argument("--list", action="store_true", help="print the steps and exit")
    ap.add_argument("--keep-logs", action="store_true", help="keep every command's output (the path is printed)")
    a = ap.parse_args(argv)
    a.build = a.build if os.path.isabs(a.build) else os.path.join(REPO, a.build)
    if a.rounds <= 0:
        a.rounds = 1 if a.quick else 3
    return a



def steps(r):
    """(name, what it measures, function -> rows, the ops it writes)."""
    return [
        ("ep-bf16", "EP bf16 compact at 4096 tok vs the one-copy limit and Open MPI",
         lambda: step_ep_limit(r, "bf16"),
         ["ep_bf16_dispatch_limit", "ep_bf16_combine_limit", "ep_round_trip_mpi_large"]),
        ("ep-fp8", "EP FP8 dispatch at 4096 tok vs the one-copy limit", lambda: step_ep_limit(r, "fp8"),
         ["ep_fp8_dispatch_limit", "ep_fp8_combine_limit"]),
        ("ep-expanded", "EP expanded layout at 4096 tok vs the one-copy limit", lambda: step_ep_limit(r, "expanded"),
         ["ep_expanded_dispatch_limit", "ep_expanded_combine_limit"]),
        ("ep-mpi", "EP round trip at 128 tok vs Open MPI", lambda: step_ep_mpi(r), ["ep_round_trip_mpi_small"]),
        ("ep-gloo", "EP from PyTorch vs torch gloo (python -m epx.bench)", lambda: step_ep_gloo(r),
         ["ep_round_trip_gloo_python", "ep_round_trip_gloo_expanded", "ep_round_trip_gloo_cpp"]),
        ("all-gather", "all_gather 64 MiB vs the copy limit and MPI", lambda: step_collective(r, "all_gather", "64M"),
         ["all_gather_limit", "all_gather_mpi"]),
        ("reduce-scatter", "reduce_scatter 64 MiB vs the copy limit and MPI",
         lambda: step_collective(r, "reduce_scatter", "64M"), ["reduce_scatter_limit", "reduce_scatter_mpi"]),
        ("all-reduce", "all_reduce 64 MiB vs the copy limit and MPI", lambda: step_collective(r, "all_reduce", "64M"),
         ["all_reduce_limit", "all_reduce_mpi"]),
        ("all-reduce-16k", "all_reduce 16 KiB vs MPI", lambda: step_collective(r, "all_reduce", "16K"),
         ["all_reduce_small_mpi"]),
        ("pp", "PP send/recv vs a copy, MPI and gloo", lambda: step_pp(r),
         ["pp_large_recv_limit", "pp_large_recv_mpi", "pp_large_planned_mpi", "pp_large_recv_gloo",
          "pp_small_pingpong_mpi"]),
        ("engram", "Engram fetch vs a copy, MPI and gloo", lambda: step_engram(r),
         ["engram_copy", "engram_mpi", "engram_gloo"]),
        ("multinode", "2 × 2 namespace machines: EP and all_reduce vs Open MPI", lambda: step_multinode(r),
         ["x2_ep_round_trip_mpi", "x2_all_reduce_mpi"]),
        ("sim", "the simulator's published-vs-predicted panels (epx sim published)", None, []),
    ]


def short(op):
    """A figure's name in a progress line: ep_fp8_dispatch_limit -> fp8 dispatch/limit."""
    words = [w for w in op.split("_") if w not in ("ep", "x2")]
    return " ".join(words[:-1]) + "/" + words[-1] if len(words) > 1 else op


def selected(name, only):
    return not only or any(name == o or name.startswith(o) for o in only)


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    r = Run(a)
    all_steps = steps(r)
    if a.list:
        for name, what, _, ops in all_steps:
            print("%-15s %s" % (name, what))
        shutil.rmtree(r.tmp, ignore_errors=True)
        return 0
    only = [o.strip() for o in a.only.split(",") if o.strip()] if a.only else []
    unknown = [o for o in only if not any(n == o or n.startswith(o) for n, _, _, _ in all_steps)]
    if unknown:
        raise SystemExit("--only: no step %s (see --list)" % ", ".join(unknown))
    if not os.access(r.epx, os.X_OK):
        raise SystemExit("no %s: build first (bash scripts/run.sh build) or pass --build DIR" % r.epx)
    paths = output_paths(a, r)

    # SIGTERM ends the run like Ctrl-C: the finally blocks remove namespaces and temp files.
    signal.signal(signal.SIGTERM, interrupted)
    todo = [s for s in all_steps if selected(s[0], only)]
    t0 = time.monotonic()
    load0 = os.getloadavg()[0]
    print("benchmarks: %d step(s)%s, build %s, commit %s, %s; load %.2f%s" % (
        len(todo), " (--quick)" if a.quick else "", os.path.relpath(a.build, REPO), r.commit, r.machine, load0,
        "" if a.quick or load0 < 1.0 else " (busy: the ratios will be noisier)"), flush=True)
    try:
        new_rows, failed, sim = run_steps(r, todo, t0, paths)
    except KeyboardInterrupt:
        print("\nbenchmarks: interrupted; nothing written", flush=True)
        cleanup(r, keep=a.keep_logs)
        return 130

    minutes = (time.monotonic() - t0) / 60
    rows = merged_rows(r, new_rows, paths["json"])
    wrote = write_outputs(r, rows, describe(a, r, len(todo), minutes, load0, rows, sim, paths), sim, paths)
    print("benchmarks: %.1f min; wrote %s%s" % (minutes, ", ".join(os.path.relpath(p) for p in wrote),
                                                "; FAILED: " + ", ".join(failed) if failed else ""), flush=True)
    cleanup(r, keep=a.keep_logs)
    return 1 if failed else 0


def output_paths(a, r):
    """Where the run writes: into --out DIR, or in place (docs/img/, BENCHMARKS.md, README.md,
    docs/sim.md; the sim step's JSON then only in the run's temp dir)."""
    if a.out:
        out_dir = os.path.abspath(a.out)
        os.makedirs(out_dir, exist_ok=True)
        return {"out_dir": out_dir, "json": os.path.join(out_dir, "benchmarks.json"),
                "svg": os.path.join(out_dir, "benchmarks.svg"), "sim_svg": os.path.join(out_dir, "sim_published.svg"),
                "sim_json": os.path.join(out_dir, "sim_published.json")}
    img = os.path.join(REPO, "docs", "img")
    os.makedirs(img, exist_ok=True)
    return {"out_dir": None, "json": os.path.join(img, "benchmarks.json"), "svg": os.path.join(img, "benchmarks.svg"),
            "sim_svg": os.path.join(img, "sim_published.svg"), "sim_json": os.path.join(r.tmp, "sim_published.json")}


def run_steps(r, todo, t0, paths):
    """Runs the steps in turn, a progress line each: (rows by id, the failed steps, the sim
    step's (JSON, argv) or None). A step that is skipped or fails writes its rows as such."""
    new_rows, failed, sim = {}, [], None
    for i, (name, what, fn, ops) in enumerate(todo, 1):
        el = time.monotonic() - t0
        print("[%2d/%d %2d:%02d] %-15s %s ..." % (i, len(todo), el // 60, el % 60, name, what), end="", flush=True)
        s0 = time.monotonic()
        r.step_load = round(os.getloadavg()[0], 2)  # 1-min average: the previous step's ranks count too
        try:
            if name == "sim":
                sim = step_sim(r, paths["sim_svg"], paths["sim_json"])
                msg = "%d profiles, panels in %s" % (len(sim[0]), os.path.basename(paths["sim_svg"]))
            else:
                for rw in fn():
                    new_rows[rw["id"]] = rw
                msg = "; ".join("%s %s" % (short(op), fmt_ratio(new_rows[op]["ratio"]) if
                                           new_rows[op]["status"] == "ok" else "skipped: " + new_rows[op]["why"])
                                for op in ops if op in new_rows)
            print(" %s (%.0f s)" % (msg, time.monotonic() - s0), flush=True)
        except Skip as e:
            print(" SKIP: %s" % e, flush=True)
            for op in ops:
                new_rows[op] = not_measured(r, op, "skipped", str(e))
        except StepError as e:
            print(" FAILED: %s" % e, flush=True)
            failed.append(name)
            for op in ops:
                new_rows[op] = not_measured(r, op, "failed", str(e))
    return new_rows, failed, sim


def merged_rows(r, new_rows, json_path):
    """Every figure in OPS order: this run's row, else the one the JSON already has."""
    old = {}
    if os.path.exists(json_path):
        try:
            with open(json_path) as f:
                old = {rw["id"]: rw for rw in json.load(f).get("rows", []) if rw.get("id") in OP_INFO}
        except (OSError, ValueError):
            old = {}
    rows = []
    for op, _, _ in OPS:
        if op in new_rows:
            rows.append(new_rows[op])
        elif op in old:
            rows.append(old[op])
        else:
            rows.append(not_measured(r, op, "not run", "not run yet (--only)"))
    return rows


def describe(a, r, nsteps, minutes, load0, rows, sim, paths):
    """(meta: the tables' and the chart's captions, the JSON document)."""
    invocation = "bash scripts/benchmarks.sh" + (" --quick" if a.quick else "") + (
        " --only " + a.only if a.only else "")
    meta = {"invocation": invocation,
            "summary": "%s, %d step(s) in %.1f min, load %.2f at the start, %s" % (
                "smoke-test sizes" if a.quick else "full run", nsteps, minutes, load0, now() + " UTC"),
            "chart_note": "%s; %s; commit %s%s" % (r.machine, now() + " UTC", r.commit,
                                                    "; --quick sizes" if a.quick else "")}
    doc = {"generated": now(), "invocation": invocation, "minutes": round(minutes, 2), "quick": a.quick,
           "load_at_start": load0, "machine": r.machine, "commit": r.commit, "ops": [op for op, _, _ in OPS],
           "rows": rows}
    if sim is not None:
        doc["sim_published"] = {"svg": os.path.basename(paths["sim_svg"]),
                                "argv": r.portable(sim[1])}  # numbers: docs/sim.md §9
    return meta, doc


def write_outputs(r, rows, described, sim, paths):
    """Writes the JSON, the chart, the tables (and README's headline figures in place), the
    sim step's tables; returns the paths written."""
    meta, doc = described
    out_dir = paths["out_dir"]
    write(paths["json"], json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    write(paths["svg"], svg_chart(rows, meta))
    fragment = markdown(rows, meta)
    with open(os.path.join(REPO, "BENCHMARKS.md")) as f:
        bench_md = replace_region(f.read(), fragment)
    if out_dir:
        write(os.path.join(out_dir, "figures.md"), fragment + "\n")
        write(os.path.join(out_dir, "BENCHMARKS.md"), bench_md)
    else:
        write(os.path.join(REPO, "BENCHMARKS.md"), bench_md)
        readme = os.path.join(REPO, "README.md")
        with open(readme) as f:
            write(readme, readme_headline(f.read(), rows))
    wrote = [paths["json"], paths["svg"]] + ([os.path.join(out_dir, "figures.md"),
                                              os.path.join(out_dir, "BENCHMARKS.md")]
                                             if out_dir else [os.path.join(REPO, "BENCHMARKS.md")])
    if sim is not None:
        wrote += [paths["sim_svg"], write_sim(r, sim, out_dir)]
    return wrote


def write_sim(r, sim, out_dir):
    """docs/sim.md's accuracy tables (in place) or DIR/sim_accuracy.md; returns the path."""
    table = sim_accuracy(sim[0], sim[1], r, "img/sim_published.svg")
    if out_dir:
        path = os.path.join(out_dir, "sim_accuracy.md")
        write(path, table + "\n")
        return path
    path = os.path.join(REPO, "docs", "sim.md")
    with open(path) as f:
        text = f.read()
    b, e = text.find(SIM_BEGIN), text.find(SIM_END)
    if b < 0 or e < b:
        raise SystemExit("docs/sim.md has no %s ... %s region" % (SIM_BEGIN, SIM_END))
    write(path, text[:b] + table + text[e + len(SIM_END):])
    return path


def interrupted(signum, frame):
    raise KeyboardInterrupt()


def write(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def cleanup(r, keep):
    if keep:
        print("benchmarks: logs kept in %s" % r.tmp)
    else:
        shutil.rmtree(r.tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
