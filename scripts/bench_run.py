"""What every step of scripts/benchmarks.py shares: the figures it writes (OPS), the run
(options, tools, temp dir, machine, commit; running a command and reading its JSON), and a
figure's row in the JSON with the numbers as the tables show them."""

import datetime
import json
import math
import os
import platform
import shlex
import signal
import statistics
import subprocess
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
                                "include", "python", "baselines", "CMakeLists.txt"], capture_output=True,
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


def median_member(xs):
    """The element of xs nearest to their median (the round whose other numbers are shown)."""
    m = median(xs)
    return min(xs, key=lambda x: abs(x - m)) if m is not None else xs[0]


def fmt_ratio(x):
    if x is None:
        return "-"
    return "%.2fx" % x if x < 10 else "%.1fx" % x
