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
import datetime
import json
import math
import os
import platform
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from xml.sax.saxutils import escape

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True  # no __pycache__ in the checkout
sys.path.insert(0, os.path.join(REPO, "tests", "multinode"))
import machines  # noqa: E402  (the namespace machines, shared with tests/e2e/check_diagnose.py)
BEGIN, END = "<!-- figures:begin -->", "<!-- figures:end -->"

# Every figure the script writes: id -> (group, figure). The table and the chart keep this
# order; a step that cannot run still writes its rows, marked skipped, with the reason.
OPS = [
    ("ep_bf16_dispatch_limit", "EP vs the one-copy limit", "dispatch, bf16 compact"),
    ("ep_bf16_combine_limit", "EP vs the one-copy limit", "combine, bf16 compact"),
    ("ep_fp8_dispatch_limit", "EP vs the one-copy limit", "dispatch, FP8 compact"),
    ("ep_fp8_combine_limit", "EP vs the one-copy limit", "combine after FP8"),
    ("ep_expanded_dispatch_limit", "EP vs the one-copy limit", "dispatch, bf16 expanded"),
    ("ep_expanded_combine_limit", "EP vs the one-copy limit", "combine, bf16 expanded"),
    ("ep_round_trip_mpi_large", "EP vs the peers", "round trip vs Open MPI, large batch"),
    ("ep_round_trip_mpi_small", "EP vs the peers", "round trip vs Open MPI, small batch"),
    ("ep_round_trip_gloo_python", "EP vs the peers", "round trip from Python vs gloo, compact"),
    ("ep_round_trip_gloo_expanded", "EP vs the peers", "round trip from Python vs gloo, expanded"),
    ("ep_round_trip_gloo_cpp", "EP vs the peers", "round trip, C++ bench vs gloo, compact"),
    ("all_gather_limit", "Bucket collectives", "all_gather, busbw vs the copy limit"),
    ("all_gather_mpi", "Bucket collectives", "all_gather vs MPI_Allgather"),
    ("reduce_scatter_limit", "Bucket collectives", "reduce_scatter, busbw vs the copy limit"),
    ("reduce_scatter_mpi", "Bucket collectives", "reduce_scatter vs MPI_Reduce_scatter"),
    ("all_reduce_limit", "Bucket collectives", "all_reduce, busbw vs the copy limit"),
    ("all_reduce_mpi", "Bucket collectives", "all_reduce vs MPI_Allreduce"),
    ("all_reduce_small_mpi", "Bucket collectives", "all_reduce small (latency) vs MPI_Allreduce"),
    ("pp_large_recv_limit", "PP and Engram", "PP large message, recv vs a copy"),
    ("pp_large_recv_mpi", "PP and Engram", "PP large message, recv vs MPI_Send/Recv"),
    ("pp_large_planned_mpi", "PP and Engram", "PP large message, planned tensor vs MPI"),
    ("pp_large_recv_gloo", "PP and Engram", "PP large message, recv vs gloo send/recv"),
    ("pp_small_pingpong_mpi", "PP and Engram", "PP small message, ping-pong one way vs MPI"),
    ("engram_copy", "PP and Engram", "Engram fetch vs a copy of the same bytes"),
    ("engram_mpi", "PP and Engram", "Engram rows/s vs MPI"),
    ("engram_gloo", "PP and Engram", "Engram rows/s vs gloo"),
    ("x2_ep_round_trip_mpi", "Across 2 × 2 machines", "EP round trip vs Open MPI"),
    ("x2_all_reduce_mpi", "Across 2 × 2 machines", "all_reduce vs MPI_Allreduce"),
]
OP_INFO = {op: (group, figure) for op, group, figure in OPS}


class StepError(Exception):
    """A step that could not produce its figures (a command failed); the run goes on."""


class Skip(Exception):
    """A step this machine cannot run (no root for namespaces, no Open MPI, ...)."""


# ----------------------------------------------------------------------------------------
# The run: options, machine, commands
# ----------------------------------------------------------------------------------------

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


class Run:
    """What every step needs: the options, the tools, a temp dir, the machine and commit."""

    def __init__(self, a):
        self.a = a
        self.quick = a.quick
        self.epx = os.path.join(a.build, "src", "tools", "epx")
        self.python = "/usr/bin/python3"
        self.tmp = tempfile.mkdtemp(prefix="epx_benchmarks_")
        self.commit = git_commit()
        self.machine = machine()
        self.env = dict(os.environ)
        pp = os.path.join(a.build, "python")
        if pp not in self.env.get("PYTHONPATH", "").split(":"):
            self.env["PYTHONPATH"] = pp + (":" + self.env["PYTHONPATH"] if self.env.get("PYTHONPATH") else "")
        self.logs = []
        self.step_load = None

    def portable(self, argv):
        """argv as the JSON keeps it: paths inside the checkout relative to it, the run's
        scratch directory as $WORK (both differ from machine to machine)."""
        def one(a):
            a = a.replace(self.tmp, "$WORK")
            return a.replace(REPO + os.sep, "") if REPO + os.sep in a else a
        return [one(a) for a in argv]

    def shown(self, argv):
        """The command as the table shows it: the build's tools by their repo-relative path,
        no --json FILE (every command gets one; the JSON keeps the full argv)."""
        if argv[:3] == ["ip", "netns", "exec"] and self.epx in argv:
            # 2 x 2 machines: the launcher line is BENCHMARKS.md's (Method, "Shapes").
            np_ = argv[argv.index("-np") + 1] if "-np" in argv else "4"
            return "ip netns exec NS1 oshrun NET --hostfile H -np %s %s" % (np_, self.shown(argv[argv.index(self.epx):]))
        out, skip = [], False
        for w in argv:
            if skip:
                skip = False
                continue
            if w == "--json":
                skip = True
                continue
            if w.startswith(self.a.build + "/") or w.startswith(REPO + "/"):
                w = os.path.relpath(w, REPO)
            elif w == self.python:
                w = "python3"
            out.append(w)
        return " ".join(shlex.quote(w) for w in out)

    def run(self, name, argv, timeout, env=None):
        """Runs argv (stdout and stderr to a log of this run); StepError when it fails."""
        log = os.path.join(self.tmp, "%02d-%s.log" % (len(self.logs), name))
        self.logs.append(log)
        with open(log, "w") as f:
            f.write("$ %s\n" % " ".join(shlex.quote(w) for w in argv))
            f.flush()
            # Its own process group: a timeout or Ctrl-C ends the command and its ranks.
            p = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, cwd=REPO, env=env or self.env,
                                 start_new_session=True)
            try:
                rc = p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                kill_group(p)
                raise StepError("%s: no result after %d s (log %s)" % (name, timeout, log))
            except BaseException:
                kill_group(p)
                raise
        if rc != 0:
            raise StepError("%s: exit %d: %s" % (name, rc, last_lines(log)))
        with open(log) as f:
            return f.read()

    def json_of(self, name, argv, timeout, env=None):
        """Runs argv + --json FILE and returns (the JSON, the argv as run)."""
        path = os.path.join(self.tmp, "%s-%d.json" % (name, len(self.logs)))
        argv = argv + ["--json", path]
        self.run(name, argv, timeout, env)
        if not os.path.exists(path):
            raise StepError("%s: no JSON written" % name)
        with open(path) as f:
            return json.load(f), argv


def kill_group(p):
    """Ends a command this script started and everything in its process group (its ranks)."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except OSError:
        pass
    p.wait()


def last_lines(log, n=3):
    with open(log, errors="replace") as f:
        lines = [ln.strip() for ln in f if ln.strip() and not ln.startswith("$ ")]
    return " | ".join(lines[-n:]) or "(no output)"


def git_commit():
    try:
        c = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                           check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no", "--", "src",
                                "include", "python", "bench", "CMakeLists.txt"], capture_output=True,
                               text=True).stdout.strip()
        return c + ("+" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine():
    cpu = platform.processor() or "cpu"
    try:
        with open("/proc/cpuinfo") as f:
            for ln in f:
                if ln.startswith("model name"):
                    cpu = ln.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
            mem = ", %d GB" % round(kb / 2 ** 20)
    except (OSError, ValueError, IndexError):
        pass
    return "%s, %d cores%s" % (cpu, os.cpu_count() or 0, mem)


def now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")


def median(xs):
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return statistics.median(xs) if xs else None


def ratio(num, den):
    return num / den if den and num is not None else None


# ----------------------------------------------------------------------------------------
# Rows
# ----------------------------------------------------------------------------------------

def row(r, op, epx, yardstick, rounds, argv, shape="", detail=""):
    """One figure: epx's number and its yardstick's (text, as measured in the median round),
    the ratio (median over rounds, > 1 = epx faster), the rounds, the command."""
    group, figure = OP_INFO[op]
    return {"id": op, "group": group, "figure": figure, "shape": shape, "status": "ok",
            "epx": epx, "yardstick": yardstick, "ratio": median(rounds), "rounds": rounds,
            "detail": detail, "command": r.shown(argv), "argv": r.portable(argv), "machine": r.machine, "date": now(),
            "commit": r.commit, "load_at_step_start": r.step_load, "quick": r.quick}


def not_measured(r, op, status, why):
    group, figure = OP_INFO[op]
    return {"id": op, "group": group, "figure": figure, "shape": "", "status": status, "why": why,
            "epx": "", "yardstick": "", "ratio": None, "rounds": [], "detail": "", "command": "", "argv": [],
            "machine": r.machine, "date": now(), "commit": r.commit, "quick": r.quick}


def gbps(x):
    return "%.1f GB/s" % x if x is not None else "-"


def us_text(x):
    if x is None:
        return "-"
    if x >= 10000:
        return "%.1f ms" % (x / 1000)
    return "%.0f µs" % x if x >= 100 else "%.1f µs" % x


# ----------------------------------------------------------------------------------------
# Steps
# ----------------------------------------------------------------------------------------

def ep_shape(r, tokens):
    if r.quick:
        return ["--ranks", "4", "--hidden", "1024", "--topk", "4", "--experts", "16", "--tokens", str(min(tokens, 64))]
    return ["--ranks", "8", "--hidden", "7168", "--topk", "8", "--experts", "256", "--tokens", str(tokens)]


def ep_shape_text(r, tokens):
    return ("4 ranks, H 1024, top-4 of 16, %d tok" % min(tokens, 64) if r.quick else
            "8 ranks, H 7168, top-8 of 256, %d tok" % tokens)


def ep_iters(r, large):
    if r.quick:
        return ["--iters", "3", "--warmup", "1"]
    return ["--iters", "4", "--warmup", "1"] if large else ["--iters", "50", "--warmup", "5"]


def step_ep_limit(r, variant):
    """EP dispatch + combine at the large batch against the one-copy limit (memcpy and a
    streaming copy of the same bytes, interleaved in the same processes); the bf16 run also
    times Open MPI's alltoallv dispatcher on the same routing (--baseline mpi)."""
    tokens = 4096
    extra = {"bf16": ["--baseline", "mpi"], "fp8": ["--fp8"], "expanded": ["--layout", "expanded"]}[variant]
    argv = [r.epx, "bench"] + ep_shape(r, tokens) + ep_iters(r, True) + \
        ["--counters-overhead", "0", "--no-progress"] + extra
    runs = []
    for k in range(r.a.rounds if variant == "bf16" else max(1, r.a.rounds - 1)):
        j, full = r.json_of("ep-%s" % variant, argv, 900)
        runs.append(j)
    shape = ep_shape_text(r, tokens) + ("" if variant == "bf16" else ", " + variant)
    rows = []
    for opname in ("dispatch", "combine"):
        rs = [j[opname]["ratio_vs_limit"] for j in runs]
        mid = runs[rs.index(median_member(rs))]
        o = mid[opname]
        rows.append(row(r, "ep_%s_%s_limit" % (variant, opname), gbps(o["algbw_gbps"]),
                        "%s %s" % (o["limit"], gbps(o["limit_gbps"])), rs, full, shape,
                        "avg max-rank %s" % us_text(o["max_rank_us"]["avg"])))
    if variant == "bf16":
        rows.append(mpi_row(r, "ep_round_trip_mpi_large", runs, full, ep_shape_text(r, tokens)))
    return rows


def median_member(xs):
    """The element of xs nearest to their median (the round whose other numbers are shown)."""
    m = median(xs)
    return min(xs, key=lambda x: abs(x - m)) if m is not None else xs[0]


def mpi_row(r, op, runs, argv, shape):
    rs = []
    for j in runs:
        b = j.get("baseline", {})
        if not b.get("available"):  # the rest of the step's figures stand
            return not_measured(r, op, "skipped", "Open MPI baseline: %s" % b.get("why_unavailable", "not run"))
        if not b.get("verified"):
            raise StepError("the MPI baseline's output differs from epx's: %s" % b.get("verify_detail"))
        rs.append(b["speedup_epx_vs_mpi"]["round_trip"])
    j = runs[rs.index(median_member(rs))]
    e = j["dispatch"]["max_rank_us"]["avg"] + j["combine"]["max_rank_us"]["avg"]
    m = j["baseline"]["dispatch"]["max_rank_us"]["avg"] + j["baseline"]["combine"]["max_rank_us"]["avg"]
    return row(r, op, us_text(e), "Open MPI " + us_text(m), rs, argv, shape,
               "avg max-rank; dispatch %.2fx, combine %.2fx" % (
                   j["baseline"]["speedup_epx_vs_mpi"]["dispatch"], j["baseline"]["speedup_epx_vs_mpi"]["combine"]))


def step_ep_mpi(r):
    """The decode-sized round trip against Open MPI (`--baseline mpi`: epx_mpi_baseline, a
    Megatron-style MPI_Alltoallv dispatcher, same routing, outputs compared by hash)."""
    argv = [r.epx, "bench"] + ep_shape(r, 128) + ep_iters(r, False) + \
        ["--counters-overhead", "0", "--no-progress", "--baseline", "mpi"]
    runs = []
    for _ in range(r.a.rounds):
        j, full = r.json_of("ep-mpi", argv, 600)
        runs.append(j)
    return [mpi_row(r, "ep_round_trip_mpi_small", runs, full, ep_shape_text(r, 128))]


def step_ep_gloo(r):
    """python -m epx.bench: EPBuffer from PyTorch against a Megatron-style all_to_all_single
    dispatcher over gloo, interleaved per iteration; and the C++ bench on the same routing."""
    if r.quick:
        shape = ["--ranks", "4", "--tokens", "32", "--hidden", "512", "--experts", "16", "--topk", "4",
                 "--iters", "3", "--warmup", "1"]
        text = "4 ranks, H 512, top-4 of 16, 32 tok"
    else:
        shape = ["--ranks", "8", "--tokens", "128", "--hidden", "7168", "--experts", "256", "--topk", "8",
                 "--iters", "20", "--warmup", "3"]
        text = "8 ranks, H 7168, top-8 of 256, 128 tok"
    argv = [r.python, "-m", "epx.bench"] + shape + ["--no-overlap", "--epx", r.epx]
    runs = []
    for _ in range(max(1, r.a.rounds - 1)):
        j, full = r.json_of("ep-gloo", argv, 900)
        runs.append(j)
    rows = []
    for op, key, which, label in (("ep_round_trip_gloo_python", "compact round trip", "gloo/epx p50", "Python"),
                                  ("ep_round_trip_gloo_expanded", "expanded round trip", "gloo/epx p50", "Python"),
                                  ("ep_round_trip_gloo_cpp", "compact round trip", "gloo/C++ p50", "C++")):
        rs = [j["python"]["ratios"][key][which] for j in runs]
        if any(x is None for x in rs):
            raise StepError("python -m epx.bench gave no %s ratio" % which)
        j = runs[rs.index(median_member(rs))]
        us = j["python"]["max_rank_us"]
        gloo = us["a2a_dispatch"]["p50"] + us["a2a_combine"]["p50"]
        lay = key.split()[0]
        if label == "C++":
            e = j["cpp"][lay]["dispatch"]["p50"] + j["cpp"][lay]["combine"]["p50"]
        else:
            e = us["epx_%s_dispatch" % lay]["p50"] + us["epx_%s_combine" % lay]["p50"]
        rows.append(row(r, op, us_text(e), "gloo " + us_text(gloo), rs, full, text,
                        "p50 max-rank, dispatch + combine"))
    return rows


def step_collective(r, op, size):
    """`epx bench --op OP --bytes N --baseline mpi`: one BucketBuffer call against the copy
    limit (every rank copying N bytes at once, interleaved) and the MPI collective."""
    ranks = "4" if r.quick else "8"
    small = size == "16K"
    if r.quick:
        size = "16K" if small else "1M"
        it = ["--iters", "5", "--warmup", "1"]
    else:
        it = ["--iters", "200", "--warmup", "10"] if small else ["--iters", "5", "--warmup", "1"]
    argv = [r.epx, "bench", "--op", op, "--bytes", size, "--ranks", ranks, "--baseline", "mpi", "--no-progress"] + it
    runs = []
    for _ in range(r.a.rounds):
        j, full = r.json_of(op, argv, 600)
        runs.append(j)
    no_mpi = None
    for j in runs:
        b = j.get("baseline", {})
        if not j["check"]["ok"]:
            raise StepError("%s: epx's result differs from docs/spec.md §8: %s" % (op, j["check"]["failures"][:2]))
        if not b.get("ran"):
            no_mpi = "MPI baseline: %s" % b.get("why_not", "not run")
        elif not b.get("verified"):
            raise StepError("MPI %s's result differs: %s" % (op, b.get("verify_detail")))
    shape = "%s ranks, %s float32, algorithm %s" % (ranks, size, runs[0]["algorithm"])
    rows = []
    if not small:
        rs = [j["limit"]["busbw_vs_limit"] for j in runs]
        j = runs[rs.index(median_member(rs))]
        rows.append(row(r, op + "_limit", "busbw " + gbps(j[op]["busbw_gbps"]),
                        "%s %s per rank" % (j["limit"]["limit"], gbps(j["limit"]["limit_gbps"])), rs, full, shape))
    op_id = "all_reduce_small_mpi" if small else op + "_mpi"
    if no_mpi:
        return rows + [not_measured(r, op_id, "skipped", no_mpi)]
    rs = [j["baseline"]["speedup"] for j in runs]
    j = runs[rs.index(median_member(rs))]
    rows.append(row(r, op_id, us_text(j[op]["max_rank_us"]["avg"]),
                    "MPI " + us_text(j["baseline"]["max_rank_us"]["avg"]), rs, full, shape, "avg max-rank"))
    return rows


def peers_missing(j, what):
    """{peer: why} for the peers of an `epx bench --op pp|engram` run that did not run (their
    figures are skipped, the rest stand); a peer that ran and disagrees fails the step."""
    missing = {}
    peers = {p["name"]: p for p in j["peers"]}
    for name in ("mpi", "gloo"):
        p = peers.get(name, {})
        if not p.get("ran"):
            missing[name] = "%s peer %s: %s" % (what, name, p.get("why_not") or "not run")
        elif not p.get("verified"):
            raise StepError("%s peer %s: not the same bytes as epx: %s" % (what, name, p.get("verify_detail")))
    return missing


def step_pp(r):
    """`epx bench --op pp`: pipelines of two ranks (2k -> 2k+1), a stream of messages and a
    ping-pong per size, MPI and gloo in the same invocation, in turns (--peer-rounds)."""
    large = 1048576 if r.quick else 58720256
    ranks = "4" if r.quick else "8"
    it = ["--iters", "3", "--warmup", "1"] if r.quick else ["--iters", "5", "--warmup", "1"]
    argv = [r.epx, "bench", "--op", "pp", "--ranks", ranks, "--pp-pattern", "pairs", "--pp-sizes",
            "16384,%d" % large, "--pp-inflight", "1", "--peers", "mpi,gloo", "--peer-rounds", str(r.a.rounds),
            "--no-progress"] + it
    j, full = r.json_of("pp", argv, 900)
    missing = peers_missing(j, "PP")
    if not all(s["correct"] for s in j["sizes"]):
        raise StepError("epx's PP delivered wrong bytes")
    sizes = {s["bytes"]: s for s in j["sizes"]}
    big, small = sizes[large], sizes[16384]
    e = big["epx"][0]
    peer = {p["name"]: p for p in big["peers"]}
    spk = {p["name"]: p for p in small["peers"]}
    shape = "%s ranks as %d pairs, %s" % (ranks, int(ranks) // 2, "1 MiB" if r.quick else "56 MiB (4096 × 7168 bf16)")
    rounds = "%d rounds in turns" % r.a.rounds

    def vs_peer(op, name, epx_us, what):
        if name in missing:
            return not_measured(r, op, "skipped", missing[name])
        p = peer[name]["stream_us"]["p50"]
        return row(r, op, us_text(epx_us), "%s %s" % ("MPI" if name == "mpi" else name, us_text(p)),
                   [ratio(p, epx_us)], full, shape, "p50 per message%s; %s" % (what, rounds))

    rows = [row(r, "pp_large_recv_limit", us_text(e["recv_us"]["p50"]), "copy " + us_text(big["copy_us"]["p50"]),
                [ratio(big["copy_us"]["p50"], e["recv_us"]["p50"])], full, shape, "p50 per message; " + rounds),
            vs_peer("pp_large_recv_mpi", "mpi", e["recv_us"]["p50"], ", into the rank's own tensor"),
            vs_peer("pp_large_planned_mpi", "mpi", e["planned_us"]["p50"], ", into a tensor planned in the window"),
            vs_peer("pp_large_recv_gloo", "gloo", e["recv_us"]["p50"], "")]
    if "mpi" in missing:
        return rows + [not_measured(r, "pp_small_pingpong_mpi", "skipped", missing["mpi"])]
    mpi_pairs = spk["mpi"]["pair_latency_us"]
    pair_ratios = [ratio(m["p50"], x["p50"]) for m, x in zip(mpi_pairs, small["pair_latency_us"])]
    rows.append(row(r, "pp_small_pingpong_mpi", us_text(median([x["p50"] for x in small["pair_latency_us"]])),
                    "MPI " + us_text(median([m["p50"] for m in mpi_pairs])), [statistics.mean(pair_ratios)], full,
                    "%s ranks as %d pairs, 16 KiB" % (ranks, int(ranks) // 2),
                    "p50 one way (ping-pong / 2), mean of the pairs' ratios; " + rounds))
    return rows


def step_engram(r):
    """`epx bench --op engram`: remote row fetch of a sharded table against a copy of the same
    bytes, MPI and gloo (requests and rows by all-to-all) in turns (--peer-rounds)."""
    if r.quick:
        shape = ["--ranks", "4", "--engram-rows", "4096", "--engram-layers", "2", "--engram-hidden", "256",
                 "--engram-entries", "8", "--tokens", "64", "--iters", "3", "--warmup", "1"]
        text = "4 ranks, 2 layers × 4096 rows of 256 bf16, 64 tok × 8"
    else:
        shape = ["--ranks", "4", "--engram-rows", "131072", "--engram-layers", "2", "--engram-hidden", "256",
                 "--engram-entries", "24", "--tokens", "512", "--iters", "10", "--warmup", "2"]
        text = "4 ranks, 2 layers × 131072 rows of 256 bf16, 512 tok × 24"
    argv = [r.epx, "bench", "--op", "engram"] + shape + ["--peers", "mpi,gloo", "--peer-rounds", str(r.a.rounds),
                                                           "--no-progress"]
    j, full = r.json_of("engram", argv, 900)
    if not j["correct"]:
        raise StepError("epx's Engram fetched wrong rows")
    missing = peers_missing(j, "Engram")
    f = j["fetch_us"]["p50"]
    note = "p50 of the slowest rank, path %s; %d rounds in turns" % (j["path"], r.a.rounds)
    return [
        row(r, "engram_copy", us_text(f), "copy " + us_text(j["copy_us"]["p50"]), [ratio(j["copy_us"]["p50"], f)],
            full, text, note),
        not_measured(r, "engram_mpi", "skipped", missing["mpi"]) if "mpi" in missing else
        row(r, "engram_mpi", us_text(f), "MPI " + us_text(j["peer_us"]["mpi"]["p50"]),
            [ratio(j["peer_us"]["mpi"]["p50"], f)], full, text, note),
        not_measured(r, "engram_gloo", "skipped", missing["gloo"]) if "gloo" in missing else
        row(r, "engram_gloo", us_text(f), "gloo " + us_text(j["peer_us"]["gloo"]["p50"]),
            [ratio(j["peer_us"]["gloo"]["p50"], f)], full, text, note),
    ]


# ----------------------------------------------------------------------------------------
# Two machines of two ranks: network namespaces (the recipe of tests/multinode/run.sh)
# ----------------------------------------------------------------------------------------

class Namespaces:
    """Two "machines" (tests/multinode/machines.py: network namespaces on a bridge, UCX over
    TCP on a veth, each rank with its own /dev/shm through agent.sh), with the hostfile and
    the launcher of this script's 2 × 2 runs. Everything is removed by close()."""

    def __init__(self, work):
        self.work = work
        self.m = None

    def open(self):
        if os.geteuid() != 0:
            raise Skip("needs root to create network namespaces")
        for tool in ("ip", "unshare", "oshrun"):
            if not shutil.which(tool):
                raise Skip("no %s" % tool)
        try:
            self.m = machines.Machines(2)
        except OSError as e:
            raise Skip("cannot make the namespace machines (no CAP_NET_ADMIN?): %s" % e)
        with open(os.path.join(self.work, "hosts2"), "w") as f:
            f.write("".join("%s slots=2\n" % ns for ns in self.m.ns))

    def launcher(self):
        """oshrun over the two machines with the network's settings only (epx sets the rest)."""
        agent = os.path.join(REPO, "tests", "multinode", "agent.sh")
        return ["ip", "netns", "exec", self.m.ns[0], "oshrun", "--allow-run-as-root", "--oversubscribe",
                "--mca", "plm_rsh_agent", agent, "--mca", "oob_tcp_if_include", "10.201.0.0/24",
                "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "10.201.0.0/24",
                "-x", "UCX_TLS=tcp,sysv,posix,self", "-x", "UCX_NET_DEVICES=eth1", "-x", "EPX_MN_LOG",
                "--hostfile", os.path.join(self.work, "hosts2"), "-np", "4"]

    def close(self):
        if self.m is not None:
            self.m.remove()
            self.m = None


def step_multinode(r):
    """2 machines × 2 ranks (network namespaces, UCX over TCP on a veth): the EP round trip
    and all_reduce against Open MPI in the same oshrun job (--transport shmem)."""
    if not os.path.exists(os.path.join(r.a.build, "tests", "epx_multinode_rank")):
        raise Skip("the build has no OpenSHMEM transport")
    work = os.path.join(r.tmp, "x2")
    os.makedirs(work, exist_ok=True)
    env = dict(r.env, EPX_MN_LOG=work)
    ns = Namespaces(work)
    try:
        ns.open()
        tokens = 64 if r.quick else 512
        it = ["--iters", "3", "--warmup", "1"] if r.quick else ["--iters", "5", "--warmup", "1"]
        ep_argv = ns.launcher() + [r.epx, "bench", "--transport", "shmem", "--baseline", "mpi", "--tokens",
                                   str(tokens), "--timeout-ms", "60000", "--no-progress"] + it
        if r.quick:
            ep_argv[-len(it):-len(it)] = ["--hidden", "1024", "--topk", "4", "--experts", "16"]
        runs = []
        for _ in range(r.a.rounds):
            j, ep_full = r.json_of("x2-ep", ep_argv, 300, env)
            runs.append(j)
        shape = "2 × 2 ranks, %s, %d tok" % ("H 1024, top-4 of 16" if r.quick else "H 7168, top-8 of 256", tokens)
        rows = [mpi_row(r, "x2_ep_round_trip_mpi", runs, ep_full, shape)]
        size = "1M" if r.quick else "16M"
        ar_argv = ns.launcher() + [r.epx, "bench", "--transport", "shmem", "--op", "all_reduce", "--bytes", size,
                                   "--baseline", "mpi", "--timeout-ms", "60000", "--no-progress"] + it
        ars = []
        for _ in range(r.a.rounds):
            j, ar_full = r.json_of("x2-all-reduce", ar_argv, 300, env)
            if not j.get("baseline", {}).get("ran") or not j["baseline"].get("verified"):
                raise StepError("2 × 2 all_reduce: MPI baseline not run or not verified")
            ars.append(j)
        rs = [j["baseline"]["speedup"] for j in ars]
        j = ars[rs.index(median_member(rs))]
        rows.append(row(r, "x2_all_reduce_mpi", us_text(j["all_reduce"]["max_rank_us"]["avg"]),
                        "MPI " + us_text(j["baseline"]["max_rank_us"]["avg"]), rs, ar_full,
                        "2 × 2 ranks, %s float32, algorithm %s" % (size, j["algorithm"]), "avg max-rank"))
        return rows
    finally:
        ns.close()


# ----------------------------------------------------------------------------------------
# The simulator's published-vs-predicted panels
# ----------------------------------------------------------------------------------------

SIM_BEGIN, SIM_END = "<!-- sim-accuracy:begin -->", "<!-- sim-accuracy:end -->"


def step_sim(r, out_svg, out_json):
    """`epx sim published`: every built-in profile's published series predicted at its EP
    sizes (calibrated points, blind predictions), drawn as SVG panels; returns the JSON and
    the argv."""
    if r.quick:
        raise Skip("not with --quick (the published series take ~1 min and ~5 GB)")
    argv = [r.epx, "sim", "published", "--svg", out_svg, "--json", out_json]
    r.run("sim", argv, 1200)
    with open(out_json) as f:
        return json.load(f), argv


def sim_accuracy(profiles, argv, r, svg_link):
    """docs/sim.md's accuracy tables: per profile and series, every EP size's prediction
    next to the published figure (error against the middle of a published range)."""
    def pub_text(v):
        if v is None:
            return "-"
        lo, hi = v if isinstance(v, list) else (v, v)
        return "%g" % lo if lo == hi else "%g–%g" % (lo, hi)

    def err(model, v):
        if v is None:
            return ""
        lo, hi = v if isinstance(v, list) else (v, v)
        mid = (lo + hi) / 2
        return ("%+.1f %%" % (100 * (model - mid) / mid)).replace("-", "−")

    lines = [SIM_BEGIN,
             "Generated by `bash scripts/benchmarks.sh --only sim` (`%s`, %s UTC, commit %s); "
             "the panels: [%s](%s)." % (r.shown(argv), now(), r.commit, os.path.basename(svg_link), svg_link)]
    for p in profiles:
        for s in p["series"]:
            metric = "DeepEP's bottleneck GB/s" if s.get("metric") == "deepep" else "GB/s per rank"
            lines += ["", "**%s, %s** (%s, and max-rank µs)" % (p["profile"], s["label"], metric), "",
                      "| EP | dispatch model | published | error | combine model | published | error | point |",
                      "|---|---|---|---|---|---|---|---|"]
            for pt in s["points"]:
                pub = pt.get("published") or {}
                d, c = pt["dispatch_gbps"], pt["combine_gbps"]
                dt = "%.1f (%.1f µs)" % (d, pt["dispatch_us"])
                ct = "%.1f (%.1f µs)" % (c, pt["combine_us"])
                dp = pub_text(pub.get("dispatch_gbps")) + (" (%g µs)" % pub["dispatch_us"] if pub.get("dispatch_us") else "")
                cp = pub_text(pub.get("combine_gbps")) + (" (%g µs)" % pub["combine_us"] if pub.get("combine_us") else "")
                kind = ("calibrated on" if pub.get("calibrate") else "held out") if pub else "**blind prediction**"
                lines.append("| %d | %s | %s | %s | %s | %s | %s | %s |" % (
                    pt["ep"], dt, dp, err(d, pub.get("dispatch_gbps")), ct, cp, err(c, pub.get("combine_gbps")), kind))
    lines.append(SIM_END)
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------
# Output: the markdown tables, the SVG chart, the JSON
# ----------------------------------------------------------------------------------------

def fmt_ratio(x):
    if x is None:
        return "-"
    return "%.2fx" % x if x < 10 else "%.1fx" % x


def markdown(rows, meta):
    lines = [BEGIN,
             "Generated by `%s` (%s); the rows of earlier runs keep their own date and commit. "
             "Ratio > 1: epx is faster (vs a limit, epx's GB/s / the limit's; vs a peer, the peer's time / "
             "epx's). Several rounds: the median, all of them in `docs/img/benchmarks.json`." % (
                 meta["invocation"], meta["summary"])]
    group = None
    for rw in rows:
        if rw["group"] != group:
            group = rw["group"]
            lines += ["", "**%s**" % group, "",
                      "| figure | epx | yardstick, same run | ratio | rounds | command | machine, date, commit |",
                      "|---|---|---|---|---|---|---|"]
        where = "%s; %s UTC; %s" % (rw["machine"], rw["date"], rw["commit"])
        if rw["status"] != "ok":
            lines.append("| %s | %s: %s | | | | | %s |" % (rw["figure"], rw["status"], rw["why"].replace("|", "/"),
                                                           where))
            continue
        rounds = ", ".join(fmt_ratio(x) for x in rw["rounds"])
        fig = "%s (%s)" % (rw["figure"], rw["shape"]) if rw["shape"] else rw["figure"]
        lines.append("| %s | %s | %s | **%s** | %s | `%s` | %s |" % (
            fig, rw["epx"], rw["yardstick"], fmt_ratio(rw["ratio"]), rounds, rw["command"], where))
    lines += ["", "![epx against the one-copy limit and the peers, per operation](docs/img/benchmarks.svg)",
              END]
    return "\n".join(lines)


COLOURS = {"limit": "#4c72b0", "mpi": "#dd8452", "gloo": "#55a868", "copy": "#4c72b0"}


def yardstick_kind(rw):
    y = rw["yardstick"].lower()
    if y.startswith("gloo"):
        return "gloo"
    if y.startswith("mpi") or y.startswith("open mpi"):
        return "mpi"
    return "limit"


def svg_chart(rows, meta):
    """Horizontal bars on a log axis, one per figure, grouped as the tables are; 1x marked.
    Bars have class "mark" and a <title> (the figure, the ratio, both sides' numbers)."""
    ok = [rw for rw in rows if rw["status"] == "ok" and rw["ratio"]]
    lo = 10 ** math.floor(math.log10(min([0.5] + [rw["ratio"] for rw in ok])))
    hi = 10 ** math.ceil(math.log10(max([2.0] + [rw["ratio"] for rw in ok])))
    left, width, bar, gap = 330, 440, 16, 6
    groups = []
    for rw in rows:
        if not groups or groups[-1][0] != rw["group"]:
            groups.append((rw["group"], []))
        groups[-1][1].append(rw)
    top = 72
    bottom = top + sum(24 + len(g[1]) * (bar + gap) for g in groups)
    total_w, height = left + width + 70, bottom + 30

    def x_of(v):
        v = min(hi, max(lo, v))
        return left + width * (math.log10(v) - math.log10(lo)) / (math.log10(hi) - math.log10(lo))

    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" '
           'font-family="sans-serif" font-size="12">' % (total_w, height, total_w, height),
           '<title>epx against the one-copy limit and its peers</title>',
           '<rect width="100%" height="100%" fill="white"/>',
           '<text x="10" y="20" font-size="15" font-weight="bold">epx against the one-copy limit and its peers '
           '(same-run ratio, log scale; &gt; 1 = epx faster)</text>',
           '<text x="10" y="38" fill="#555">%s</text>' % escape(meta["chart_note"])]
    lx = 10
    for kind, label in (("limit", "vs the one-copy limit (a copy of the same bytes)"), ("mpi", "vs Open MPI"),
                        ("gloo", "vs torch gloo")):
        out.append('<rect x="%d" y="47" width="12" height="12" fill="%s"/>' % (lx, COLOURS[kind]))
        out.append('<text x="%d" y="57">%s</text>' % (lx + 16, escape(label)))
        lx += 16 + int(6.4 * len(label)) + 18
    decades = round(math.log10(hi / lo))
    tick = lo
    while tick <= hi * 1.0001:
        for m in ((1, 2, 5) if decades <= 3 else (1,)):
            t = tick * m
            if t <= hi * 1.0001:
                out.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#e4e4e4"/>' % (x_of(t), top, x_of(t),
                                                                                          bottom))
                out.append('<text x="%.1f" y="%d" text-anchor="middle" fill="#555">%gx</text>' % (
                    x_of(t), bottom + 16, t))
        tick *= 10
    y = top
    for name, rs in groups:
        out.append('<text x="10" y="%d" font-weight="bold">%s</text>' % (y + 16, escape(name)))
        y += 24
        for rw in rs:
            out.append('<text x="%d" y="%d" text-anchor="end">%s</text>' % (left - 8, y + bar - 4,
                                                                            escape(rw["figure"])))
            if rw["status"] == "ok" and rw["ratio"]:
                v = rw["ratio"]
                x0, x1 = sorted((x_of(v), x_of(1.0)))
                out.append('<rect class="mark" x="%.1f" y="%d" width="%.1f" height="%d" fill="%s">'
                           '<title>%s: %s (epx %s; %s)</title></rect>' % (
                               x0, y, max(1.0, x1 - x0), bar, COLOURS[yardstick_kind(rw)], escape(rw["figure"]),
                               fmt_ratio(v), escape(rw["epx"]), escape(rw["yardstick"])))
                out.append('<text x="%.1f" y="%d">%s</text>' % (max(x_of(v), x_of(1.0)) + 4, y + bar - 4,
                                                                fmt_ratio(v)))
            else:
                out.append('<text x="%.1f" y="%d" fill="#999">%s</text>' % (x_of(1.0) + 4, y + bar - 4,
                                                                           escape(rw["status"])))
            y += bar + gap
    out.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#222" stroke-width="1.5"/>' % (
        x_of(1.0), top, x_of(1.0), bottom))
    out.append("</svg>")
    return "\n".join(out) + "\n"


def readme_headline(text, rows):
    """README.md with its "Headline figures" rows (each names a figure id in an HTML comment)
    showing the figures just measured: the ratio, or "not measured"."""
    figures = {rw["id"]: rw for rw in rows}

    def cell(m):
        rw = figures.get(m.group(2))
        if rw is None:
            return m.group(0)
        shown = fmt_ratio(rw["ratio"]) if rw.get("status") == "ok" and rw.get("ratio") else "not measured"
        return "%s<!-- %s -->%s| %s |" % (m.group(1), m.group(2), m.group(3), shown)
    return re.sub(r"^(\|.*?)<!--\s*(\w+)\s*-->([^|]*)\|[^|]*\|[ \t]*$", cell, text, flags=re.M)


def replace_region(text, fragment):
    b, e = text.find(BEGIN), text.find(END)
    if b < 0 or e < b:
        raise SystemExit("BENCHMARKS.md has no %s ... %s region" % (BEGIN, END))
    return text[:b] + fragment + text[e + len(END):]


# ----------------------------------------------------------------------------------------
# main
# ----------------------------------------------------------------------------------------

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

    if a.out:
        out_dir = os.path.abspath(a.out)
        os.makedirs(out_dir, exist_ok=True)
        json_path, svg_path = os.path.join(out_dir, "benchmarks.json"), os.path.join(out_dir, "benchmarks.svg")
        sim_svg, sim_json = os.path.join(out_dir, "sim_published.svg"), os.path.join(out_dir, "sim_published.json")
    else:
        out_dir = None
        img = os.path.join(REPO, "docs", "img")
        os.makedirs(img, exist_ok=True)
        json_path, svg_path = os.path.join(img, "benchmarks.json"), os.path.join(img, "benchmarks.svg")
        sim_svg, sim_json = os.path.join(img, "sim_published.svg"), os.path.join(r.tmp, "sim_published.json")

    # SIGTERM ends the run like Ctrl-C: the finally blocks remove namespaces and temp files.
    signal.signal(signal.SIGTERM, interrupted)
    todo = [s for s in all_steps if selected(s[0], only)]
    t0 = time.monotonic()
    load0 = os.getloadavg()[0]
    print("benchmarks: %d step(s)%s, build %s, commit %s, %s; load %.2f%s" % (
        len(todo), " (--quick)" if a.quick else "", os.path.relpath(a.build, REPO), r.commit, r.machine, load0,
        "" if a.quick or load0 < 1.0 else " (busy: the ratios will be noisier)"), flush=True)
    new_rows, failed, sim = {}, [], None
    try:
        for i, (name, what, fn, ops) in enumerate(todo, 1):
            el = time.monotonic() - t0
            print("[%2d/%d %2d:%02d] %-15s %s ..." % (i, len(todo), el // 60, el % 60, name, what), end="", flush=True)
            s0 = time.monotonic()
            r.step_load = round(os.getloadavg()[0], 2)  # 1-min average: the previous step's ranks count too
            try:
                if name == "sim":
                    sim = step_sim(r, sim_svg, sim_json)
                    msg = "%d profiles, panels in %s" % (len(sim[0]), os.path.basename(sim_svg))
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
    except KeyboardInterrupt:
        print("\nbenchmarks: interrupted; nothing written", flush=True)
        cleanup(r, keep=a.keep_logs)
        return 130

    minutes = (time.monotonic() - t0) / 60
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
    invocation = "bash scripts/benchmarks.sh" + (" --quick" if a.quick else "") + (
        " --only " + a.only if a.only else "")
    meta = {"invocation": invocation,
            "summary": "%s, %d step(s) in %.1f min, load %.2f at the start, %s" % (
                "smoke-test sizes" if a.quick else "full run", len(todo), minutes, load0, now() + " UTC"),
            "chart_note": "%s; %s; commit %s%s" % (r.machine, now() + " UTC", r.commit,
                                                    "; --quick sizes" if a.quick else "")}
    doc = {"generated": now(), "invocation": invocation, "minutes": round(minutes, 2), "quick": a.quick,
           "load_at_start": load0, "machine": r.machine, "commit": r.commit, "ops": [op for op, _, _ in OPS],
           "rows": rows}
    if sim is not None:
        doc["sim_published"] = {"svg": os.path.basename(sim_svg), "argv": r.portable(sim[1])}  # numbers: docs/sim.md §9
    write(json_path, json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    write(svg_path, svg_chart(rows, meta))
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
    if sim is not None:
        table = sim_accuracy(sim[0], sim[1], r, "img/sim_published.svg")
        if out_dir:
            write(os.path.join(out_dir, "sim_accuracy.md"), table + "\n")
        else:
            path = os.path.join(REPO, "docs", "sim.md")
            with open(path) as f:
                text = f.read()
            b, e = text.find(SIM_BEGIN), text.find(SIM_END)
            if b < 0 or e < b:
                raise SystemExit("docs/sim.md has no %s ... %s region" % (SIM_BEGIN, SIM_END))
            write(path, text[:b] + table + text[e + len(SIM_END):])
    wrote = [json_path, svg_path] + ([os.path.join(out_dir, "figures.md"), os.path.join(out_dir, "BENCHMARKS.md")]
                                     if out_dir else [os.path.join(REPO, "BENCHMARKS.md")])
    if sim is not None:
        wrote += [sim_svg, os.path.join(out_dir, "sim_accuracy.md") if out_dir else os.path.join(REPO, "docs", "sim.md")]
    print("benchmarks: %.1f min; wrote %s%s" % (minutes, ", ".join(os.path.relpath(p) for p in wrote),
                                                "; FAILED: " + ", ".join(failed) if failed else ""), flush=True)
    cleanup(r, keep=a.keep_logs)
    return 1 if failed else 0


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
