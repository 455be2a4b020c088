#!/usr/bin/env python3
"""epx::Diagnose against real faults, through `epx bench --diagnose --json`:

  quiet       quiet runs at P = --quiet-ranks (8; 4 ranks per core here): nothing may be named;
              --load: with a second job running (another epx bench in a loop, 4 ranks)
  sigstop     one rank's process stopped and continued in bursts from outside (SIGSTOP X ms /
              SIGCONT X ms, X in --bursts): that rank must be named (its row or column), and
              nothing that does not involve it; the loop is sized in seconds (--stop-seconds,
              by a fault-free probe loop at each P)
  cgroup      one rank's process in a CPU cgroup of this test with a CPU quota (cgroup v1 cpu
              or v2 cpu.max): the same; SKIP when no cgroup can be made. The quota is a third
              of the CPU a rank uses (--starve; by the probe loop) unless --quota % is given
  netem       4 network-namespace "machines", one rank each, the shmem transport (oshrun,
              --protocol tail), machine 1's veth slowed for packets to machine 2 only (a u32
              filter into an htb class of --rates kbit/s; --netem: into a netem delay, which
              this machine's kernel lacks): a point between those two machines' ranks must
              be named, and nothing without a rank of those two machines in it
  netem-quiet the same 4 machines unshaped: nothing may be named

    check_diagnose.py --epx build/src/tools/epx [--only quiet,sigstop,...] [--runs N]
                      [--bursts 20,40,80] [--quota PCT] [--ranks 8] [--load] [--save DIR] [--confirm]
                      [--stop-seconds 5 | --stop-iters N]
                      [--intervals K] [--need N] [--verdict ranks|persistent|loop] [--bench-wait spin|sleep]

The diagnosed bench picks its ranks' waits itself: epx's sleep mode when they outnumber the
cores (8 on 2 here), as `epx bench --diagnose` does for anyone; --bench-wait sets EPX_WAIT for
it (spin: the yielding waits, with which a rank the scheduler leaves on the busier core is
named in quiet runs with a second job, docs/diagnose.md). The second job keeps this process's
EPX_WAIT (unset: epx's yielding waits, the harder neighbour). Each run's line ends with every
rank's CPU seconds over the run (/proc/PID/stat, sampled; saved with --save): a starved rank
shows as one with less CPU than its peers.

The verdict judged is the bench's persistent one per rank and link (--verdict ranks, the
default: "persistent_ranks"): the timed loop in --intervals K exchanges (the bench's default
without it); a rank is named when the verdicts of --need N of them name it as a row or column
of either op, a link when both ops name a point between its two ranks in N of them
(docs/diagnose.md, "Over intervals"). --verdict persistent judges the per-op persistent verdict
(each op's rows, columns and points counted apart); --verdict loop the one verdict of the
whole loop's matrices (DeepEP's, on one long interval).
Every check is strict: each run of a fault must name its victim and nothing else, each quiet
run must name nothing (the rule is made for it: docs/diagnose.md, "The verdict"). --runs N
repeats every check N times and prints "named in X of N" / "false names in Y of N runs";
--confirm K (3 when given bare) runs a failed check up to K more times and fails only
if every run fails and a wrong verdict of the first repeats in each (the same false name, or
the fault missed again): the test command (docs/diagnose.md gives the single-run rates and the
chance of a failure by chance).
Everything this test makes (processes, the second job, the cgroup, namespaces, the bridge;
the qdisc lives in a namespace) is removed in `finally` blocks, also when a check fails; every
run is under a timeout. Exit 1 if any check failed.
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.dont_write_bytecode = True  # no __pycache__ in the checkout
sys.path.insert(0, os.path.join(REPO, "tests", "multinode"))
import machines  # noqa: E402  (the namespace machines, shared with scripts/benchmarks.py)
from machines import sh  # noqa: E402
# A small problem: ~1-3 ms per iteration on a loaded 2-core machine; every rank sends to every
# rank. Enough iterations (800: a loop of ~5-15 s with sleeping waits at load 15-20) that a
# rank stopped in bursts of 80 ms is stopped many times inside each interval of the timed
# loop (the bench's barriers between calls absorb the stops that land outside a call, about
# two thirds: docs/diagnose.md; at 400 iterations the 80 ms stop was missed in 3 of 20 runs).
SHAPE = ["--tokens", "64", "--hidden", "1024", "--topk", "4", "--experts", "16", "--warmup", "3",
         "--counters-overhead", "0", "--no-counters", "--diagnose", "--timeout-ms", "60000"]
# Across the namespaces (UCX over TCP on a veth): smaller rows, so that a shaped link is slow, not stalled.
NETEM_SHAPE = [{"1024": "128", "64": "32"}.get(x, x) for x in SHAPE]
# The tail protocol: each peer's rows complete with their own ordered signal. (With the
# explicit protocol's one quiet before every signal, the slow link delays the sender's and
# the receiver's signals to every rank: their rows rise together, docs/diagnose.md.)
NETEM_EXTRA = os.environ.get("EPX_DIAG_NETEM_EXTRA", "--protocol tail --queues 4").split()
# The second job of the quiet runs: another bench, in a loop, until told to stop.
LOAD_SHAPE = ["--ranks", "4", "--tokens", "128", "--hidden", "2048", "--topk", "4", "--experts", "16", "--iters", "300",
              "--counters-overhead", "0", "--no-counters", "--no-progress"]
PID_LINE = re.compile(r"epx bench: diagnose: rank pids:(.*)")
# --intervals / --need / --verdict (main sets them): the bench's intervals and what is judged.
BENCH_DIAG = []
VERDICT = "ranks"
# --bench-wait: EPX_WAIT for the diagnosed benches only (the second job keeps this process's).
BENCH_WAIT = None
failures = []
table = []  # (check, runs, named or None for a quiet check, runs with a false name): the closing table
tallies = []  # every Tally made, in order (confirmed() compares two runs' wrong verdicts)


def fail(what):
    print("FAIL: " + what, flush=True)
    failures.append(what)


def confirmed(confirm, check, *args, **kwargs):
    """Runs one check; with confirm = K > 0, a check that failed runs up to K more times and
    fails only if every one of them fails too, each with a wrong verdict of the first run
    REPEATED: the same false name (a rank, or a row / column / point and its index) or the
    fault missed again (or the bench failing again). Chance names differ from run to run —
    on this 2-core machine a rank is at times slow for a whole interval, measured in
    docs/diagnose.md — while a rule that is wrong names the same thing or misses the same
    fault every time. A failure that does not repeat is still printed, marked as confirmed away."""
    before, t0 = len(failures), len(tallies)
    check(*args, **kwargs)
    if not confirm or len(failures) == before:
        return
    first = failures[before:]
    wrong = set().union(*(t.wrong for t in tallies[t0:]))
    del failures[before:]
    seen = list(first)
    for attempt in range(confirm):
        print(f"check_diagnose: {len(seen)} failure(s) above; confirming, run {attempt + 1} of at most {confirm}", flush=True)
        t1 = len(tallies)
        check(*args, **kwargs)
        if len(failures) == before:
            print("check_diagnose: not confirmed (a further run passed): " + "; ".join(seen), flush=True)
            return
        wrong &= set().union(*(t.wrong for t in tallies[t1:]))
        seen += failures[before:]
        del failures[before:]
        if not wrong:
            print("check_diagnose: not confirmed (the runs failed differently, nothing repeated): " + "; ".join(seen),
                  flush=True)
            return
    fail(f"confirmed: the same wrong verdict in {confirm + 1} runs: {sorted(wrong, key=str)}")


def flagged(diag, verdict=None):
    """{op: (rows, cols, points)} of a bench JSON's "diagnose": the persistent verdict per rank
    and link ("ranks": one pseudo-op "both", its ranks as rows, its links as points), per op
    ("persistent"), or the whole loop's one verdict ("loop")."""
    verdict = verdict or VERDICT
    if verdict == "ranks":
        v = diag["persistent_ranks"]
        return {"both": (v["ranks"], [], [tuple(p[:2]) for p in v["links"]])}
    v = diag["persistent"] if verdict == "persistent" else diag
    return {op: (v[op]["abnormal_rows"], v[op]["abnormal_cols"], [tuple(p[:2]) for p in v[op]["abnormal_points"]])
            for op in ("dispatch", "combine")}


def every_name(diag):
    """Everything a verdict names, as (op, "row" / "col" / "point", index): a quiet run's false names."""
    return [(op, kind, x) for op, (r, c, p) in flagged(diag).items()
            for kind, xs in (("row", r), ("col", c), ("point", p)) for x in xs]


def describe(diag):
    """The judged verdict, and each interval's in short (rows R, cols C, points P of either op)."""
    if VERDICT == "ranks":
        (r, _, p), = flagged(diag).values()
        text = f"ranks {r} links {p}"
    else:
        text = "; ".join(f"{op}: rows {r} cols {c} points {p}" for op, (r, c, p) in flagged(diag).items())
    if VERDICT != "loop":
        each = []
        for i in diag.get("intervals", []):
            named = [f"{op[0]}{k}{x}" for op, (r, c, p) in flagged(i, "loop").items()
                     for k, xs in (("r", r), ("c", c), ("p", p)) for x in xs]
            each.append(",".join(named) or "-")
        text += f" [intervals: {' | '.join(each)}]"
    return text


def cpu_seconds(pid):
    """A process's CPU time so far (user + system, /proc/PID/stat), None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def sample_cpu(pids, proc, into, period=0.25):
    """Each rank's CPU seconds from the first sample to its last one while the bench runs:
    a rank the scheduler starves shows as one with less CPU than its peers."""
    first = {}
    while proc.poll() is None:
        for r, pid in pids.items():
            now = cpu_seconds(pid)
            if now is not None:
                first.setdefault(r, now)
                into[r] = round(now - first[r], 3)
        time.sleep(period)


def run_bench(cmd, fault=None, limit=240):
    """Runs `cmd` (an epx bench with --json, its progress on: the ranks' pids); `fault(pids)`
    runs in a thread once the pids are printed and until it returns. Returns (rc, json or
    None, stderr tail); the json gets "rank_cpu_s": each rank's CPU seconds over the run."""
    work = tempfile.mkdtemp(prefix="epx_diag_")
    out = os.path.join(work, "bench.json")
    env = dict(os.environ, **({"EPX_WAIT": BENCH_WAIT} if BENCH_WAIT else {}))
    proc = subprocess.Popen(cmd + ["--json", out], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env=env)
    tail, threads, cpu = [], [], {}
    try:
        deadline = time.time() + limit
        for line in proc.stderr:
            tail = (tail + [line.rstrip()])[-20:]
            m = PID_LINE.search(line)
            if m:
                pids = {int(k): int(v.split("@")[0]) for k, v in (x.split("=") for x in m.group(1).split())}
                for target, args in ((fault, (pids, proc)), (sample_cpu, (pids, proc, cpu))):
                    if target:
                        threads.append(threading.Thread(target=target, args=args, daemon=True))
                        threads[-1].start()
            if time.time() > deadline:
                break
        proc.wait(timeout=max(1, deadline - time.time()))
        for t in threads:
            t.join(timeout=30)
        data = json.load(open(out)) if os.path.exists(out) else None
        if data is not None:
            data["rank_cpu_s"] = {str(r): s for r, s in sorted(cpu.items())}
        return proc.returncode, data, "\n".join(tail)
    except subprocess.TimeoutExpired:
        return -1, None, "timed out\n" + "\n".join(tail)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGCONT)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        shutil.rmtree(work, ignore_errors=True)


class Tally:
    """Runs of one check: how many named the fault (or, quiet, named nothing) and how many named
    something else; every run must do what it should, or the check fails."""

    def __init__(self, name, quiet=False):
        self.name, self.quiet = name, quiet
        self.runs = self.named = self.false = 0
        self.errors = []
        self.wrong = set()  # what the runs got wrong: false names, ("missed",), ("failed",)
        self.cpu = {}  # the last run's CPU seconds per rank (run_bench's "rank_cpu_s")
        tallies.append(self)

    def add(self, i, named, false, diag):
        self.runs += 1
        self.named += bool(named)
        self.false += bool(false)
        ok = not false and (self.quiet or named)
        # (kind, index), in either op: a rank named in dispatch once and combine once repeats.
        self.wrong |= {tuple(tuple(y) if isinstance(y, list) else y for y in x[1:]) for x in false}
        if not self.quiet and not named:
            self.wrong.add(("missed",))
        cpu = [self.cpu[r] for r in sorted(self.cpu, key=int)]
        spread = f"; CPU s per rank {cpu} (max / min {max(cpu) / max(min(cpu), 1e-3):.1f}x)" if cpu else ""
        print(f"  {self.name} run {i}: {'ok' if ok else 'WRONG'}: {describe(diag)}"
              + (f"; false names: {false}" if false else "") + spread, flush=True)

    def error(self, what):
        self.errors.append(what)
        self.wrong.add(("failed",))
        fail(f"{self.name}: {what}")

    def verdict(self, i, run, save_dir):
        """Run i's "diagnose" (its JSON saved into save_dir); None, and an error of the check,
        when the bench failed or printed none. run: run_bench's (rc, data, tail)."""
        rc, data, tail = run
        if rc != 0 or data is None or "diagnose" not in data:
            self.error(f"run {i}: exit {rc}\n{tail}")
            return None
        self.cpu = data.get("rank_cpu_s") or {}
        save(save_dir, self.name, i, data)
        if VERDICT == "ranks" and "persistent_ranks" not in data["diagnose"]:
            self.error(f"run {i}: the bench's JSON has no diagnose.persistent_ranks (an epx built before the "
                       f"per-rank verdict?); --verdict persistent or loop judge such a build")
            return None
        return data["diagnose"]

    def finish(self):
        runs = self.runs + len(self.errors)
        table.append((self.name, runs, None if self.quiet else self.named, self.false))
        if self.quiet:
            line = f"{self.name}: false names in {self.false} of {runs} quiet runs"
        else:
            line = f"{self.name}: named in {self.named} of {runs} runs, false names in {self.false} of {runs}"
        if self.errors or self.false or (not self.quiet and self.named < self.runs):
            fail(line)
        else:
            print("PASS: " + line, flush=True)


def save(dir_, name, i, data, extra=None):
    if not dir_ or data is None:
        return
    os.makedirs(dir_, exist_ok=True)
    with open(os.path.join(dir_, f"{re.sub(r'[^A-Za-z0-9]+', '_', name).strip('_')}-{i}-{int(time.time() * 1000)}.json"), "w") as f:
        json.dump({"check": name, "run": i, "load": os.getloadavg(), "diagnose": data.get("diagnose"),
                   "ranks": data.get("ranks"), "rank_cpu_s": data.get("rank_cpu_s"), "wait": BENCH_WAIT,
                   **(extra or {})}, f)


class SecondJob:
    """Another epx bench in a loop (LOAD_SHAPE) while the quiet runs run; stop() lets its
    current run end (its ranks clean up after themselves), killing it only after a minute."""

    def __init__(self, epx):
        self.work = tempfile.mkdtemp(prefix="epx_diag_load_")
        self.stop_file = os.path.join(self.work, "stop")
        bench = " ".join([epx, "bench"] + LOAD_SHAPE)
        self.proc = subprocess.Popen(["/bin/sh", "-c", f'while [ ! -e "{self.stop_file}" ]; do {bench} >/dev/null 2>&1; done'],
                                     start_new_session=True)

    def stop(self):
        open(self.stop_file, "w").close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        shutil.rmtree(self.work, ignore_errors=True)


def check_quiet(epx, runs, iters, ranks, load=True, save_dir=None):
    t = Tally(f"quiet (P = {ranks}{', a second job running' if load else ''})", quiet=True)
    job = SecondJob(epx) if load else None
    try:
        if job:
            time.sleep(1)  # its ranks are up
        for i in range(runs):
            diag = t.verdict(i, run_bench([epx, "bench", "--ranks", str(ranks), "--iters", str(iters)] + SHAPE + BENCH_DIAG),
                             save_dir)
            if diag is not None:
                t.add(i, False, every_name(diag), diag)
    finally:
        if job:
            job.stop()
    t.finish()


def victim_verdict(diag, victim):
    """(named, false names): the victim is named by its row or column in some op; a point of
    its own row or column is its own too (a stop inside one of its waits is charged to the
    peer it waited for); anything else is a false name."""
    f = flagged(diag)
    named = any(victim in r or victim in c for r, c, _ in f.values())
    false = [(op, "row", x) for op, (r, _, _) in f.items() for x in r if x != victim]
    false += [(op, "col", x) for op, (_, c, _) in f.items() for x in c if x != victim]
    false += [(op, "point", x) for op, (_, _, p) in f.items() for x in p if victim not in x]
    return named, false


def sigstop_bursts(victim, stop_s, run_s):
    def fault(pids, proc):
        pid = pids[victim]
        try:
            while proc.poll() is None:
                os.kill(pid, signal.SIGSTOP)
                time.sleep(stop_s)
                os.kill(pid, signal.SIGCONT)
                time.sleep(run_s)
        except ProcessLookupError:
            pass
        finally:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    return fault


def check_sigstop(epx, runs, iters, ranks, burst_ms, victim=2, save_dir=None):
    t = Tally(f"sigstop (rank {victim} of {ranks}, SIGSTOP {burst_ms} ms / SIGCONT {burst_ms} ms)")
    for i in range(runs):
        diag = t.verdict(i, run_bench([epx, "bench", "--ranks", str(ranks), "--iters", str(iters)] + SHAPE + BENCH_DIAG,
                                      sigstop_bursts(victim, burst_ms / 1000, burst_ms / 1000)), save_dir)
        if diag is not None:
            t.add(i, *victim_verdict(diag, victim), diag)
    t.finish()


class CpuCgroup:
    """A cgroup of this test with a CPU quota (v1 cpu controller, else v2 cpu.max); removed on exit."""

    def __init__(self, quota_pct):
        self.path, self.v2 = None, False
        name = f"epx-diag-{os.getpid()}"
        v1 = "/sys/fs/cgroup/cpu"
        v2root = "/sys/fs/cgroup"
        if os.path.isfile(os.path.join(v1, "cgroup.procs")):
            self.path = os.path.join(v1, name)
            os.mkdir(self.path)
            self._write("cpu.cfs_period_us", "100000")
            self._write("cpu.cfs_quota_us", str(1000 * quota_pct))
        elif "cpu" in open(os.path.join(v2root, "cgroup.subtree_control")).read().split():
            self.path, self.v2 = os.path.join(v2root, name), True
            os.mkdir(self.path)
            self._write("cpu.max", f"{1000 * quota_pct} 100000")
        else:
            raise OSError("no cgroup v1 cpu controller, and cpu is not enabled for cgroup v2 children")

    def _write(self, f, value):
        with open(os.path.join(self.path, f), "w") as fh:
            fh.write(value)

    def add(self, pid):
        self.home = open(f"/proc/{pid}/cgroup").read()
        self._write("cgroup.procs", str(pid))

    def remove(self):
        if not self.path:
            return
        parent = os.path.dirname(self.path)
        try:
            for pid in open(os.path.join(self.path, "cgroup.procs")).read().split():
                try:
                    with open(os.path.join(parent, "cgroup.procs"), "w") as fh:
                        fh.write(pid)
                except OSError:
                    pass
        except OSError:
            pass
        for _ in range(50):
            try:
                os.rmdir(self.path)
                return
            except OSError:
                time.sleep(0.1)
        fail(f"cgroup: could not remove {self.path}")


def check_cgroup(epx, runs, iters, ranks, quota_pct, victim=1, save_dir=None):
    t = Tally(f"cgroup (rank {victim} of {ranks}, {quota_pct} % CPU quota)")
    for i in range(runs):
        try:
            cg = CpuCgroup(quota_pct)
        except OSError as e:
            print(f"SKIP: cgroup: {e}", flush=True)
            return
        try:
            def fault(pids, proc):
                cg.add(pids[victim])
            run = run_bench([epx, "bench", "--ranks", str(ranks), "--iters", str(iters)] + SHAPE + BENCH_DIAG, fault)
        finally:
            cg.remove()
        diag = t.verdict(i, run, save_dir)
        if diag is not None:
            t.add(i, *victim_verdict(diag, victim), diag)
    t.finish()


# ---- netem: 4 namespace machines --------------------------------------------------------------

class Machines(machines.Machines):
    """The shared namespace machines, and a slow link between two of them."""

    def slow_link(self, src, dst, delay_ms, rate_kbit, netem):
        """Machine src's eth1 slows its packets to machine dst only (1-based): a u32 filter
        into an htb class of rate_kbit (the default: this machine's kernel has no sch_netem),
        or with `netem` into a netem delay of delay_ms. Returns what it did, in words."""
        ns = self.ns[src - 1]
        tc = ["ip", "netns", "exec", ns, "tc"]
        to_dst = ["u32", "match", "ip", "dst", f"10.201.0.{dst}/32"]
        if netem:
            sh(*tc, "qdisc", "add", "dev", "eth1", "root", "handle", "1:", "prio")
            sh(*tc, "qdisc", "add", "dev", "eth1", "parent", "1:3", "handle", "30:", "netem", "delay", f"{delay_ms}ms")
            sh(*tc, "filter", "add", "dev", "eth1", "protocol", "ip", "parent", "1:0", "prio", "3", *to_dst, "flowid", "1:3")
            return f"netem delay {delay_ms} ms"
        sh(*tc, "qdisc", "add", "dev", "eth1", "root", "handle", "1:", "htb", "default", "10")
        sh(*tc, "class", "add", "dev", "eth1", "parent", "1:", "classid", "1:10", "htb", "rate", "10gbit")
        sh(*tc, "class", "add", "dev", "eth1", "parent", "1:", "classid", "1:20", "htb", "rate", f"{rate_kbit}kbit",
           "ceil", f"{rate_kbit}kbit", "burst", "1600", "cburst", "1600")
        sh(*tc, "filter", "add", "dev", "eth1", "protocol", "ip", "parent", "1:", "prio", "1", *to_dst, "flowid", "1:20")
        return f"htb rate {rate_kbit} kbit/s"


def oshrun_cmd(m, hostfile, np):
    """oshrun on the last machine, which runs no rank: each rank's machine then holds one
    rank and one Open MPI daemon alike (launched from machine 1, rank 0 shared its machine
    with the launcher). Rank 0 is still the slowest source of unshaped runs (docs/diagnose.md)."""
    agent = os.path.join(REPO, "tests", "multinode", "agent.sh")
    return ["ip", "netns", "exec", m.ns[-1], "oshrun", "--allow-run-as-root", "--oversubscribe", "--hostfile", hostfile,
            "-np", str(np), "--mca", "spml", "ucx", "--mca", "osc", "ucx", "--mca", "pml", "ucx",
            "--mca", "opal_common_ucx_tls", "any", "--mca", "opal_common_ucx_devices", "any",
            "--mca", "plm_rsh_agent", agent, "--mca", "oob_tcp_if_include", "10.201.0.0/24",
            "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "10.201.0.0/24",
            "-x", "UCX_TLS=tcp,sysv,posix,self", "-x", "UCX_NET_DEVICES=eth1"]


def check_netem(epx, runs, iters, rate_kbit=256, delay_ms=15, shape=True, netem=False, save_dir=None):
    """Shaped: the slow link named as points between the two machines' ranks, nothing else.
    Unshaped (netem-quiet): nothing named."""
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc") or not shutil.which("oshrun"):
        print("SKIP: netem: needs root, ip, tc and oshrun", flush=True)
        return
    cache = os.path.join(os.path.dirname(epx), "..", "..", "CMakeCache.txt")
    if not os.path.exists(cache) or "EPX_WITH_SHMEM:BOOL=ON" not in open(cache).read():
        print("SKIP: netem: the build has no shmem transport", flush=True)
        return
    m = None
    work = tempfile.mkdtemp(prefix="epx_diag_netem_")
    try:
        try:
            m = Machines(5)  # 4 with a rank each, and the launcher's
            how = m.slow_link(1, 2, delay_ms, rate_kbit, netem) if shape else None
        except OSError as e:
            print(f"SKIP: netem: cannot make the namespaces or the qdisc: {e}", flush=True)
            return
        t = Tally(f"netem ({how} from machine 1 to machine 2)" if shape else "netem-quiet (4 machines, unshaped)",
                  quiet=not shape)
        hosts = os.path.join(work, "hosts")
        with open(hosts, "w") as f:
            f.writelines(f"{ns} slots=1\n" for ns in m.ns[:4])
        cmd = oshrun_cmd(m, hosts, 4) + [epx, "bench", "--transport", "shmem", "--iters", str(iters), "--no-progress"]
        for i in range(runs):
            run = run_bench(cmd + NETEM_SHAPE + NETEM_EXTRA + BENCH_DIAG, limit=180)
            diag = t.verdict(i, run, save_dir)
            if diag is None:
                continue
            if not shape:
                t.add(i, False, every_name(diag), diag)
                continue
            data, f = run[1], flagged(diag)
            # The link is named when one of its points is. Its two machines' ranks may be
            # named too: the link holds its sender (OpenSHMEM's one quiet waits for every
            # peer), which is then late for everyone (docs/diagnose.md). Anything named
            # without a rank of those two machines in it is a false name.
            node = {r["rank"]: r["node"] for r in data["ranks"]}
            ab = {r for r, n in node.items() if n in (m.ns[0], m.ns[1])}
            between = {(s, d) for s in ab for d in ab if node[s] != node[d]}
            named = any(tuple(x) in between for _, _, p in f.values() for x in p)
            false = [(op, "row", x) for op, (r, _, _) in f.items() for x in r if x not in ab]
            false += [(op, "col", x) for op, (_, c, _) in f.items() for x in c if x not in ab]
            false += [(op, "point", x) for op, (_, _, p) in f.items() for x in p if not set(x) & ab]
            t.add(i, named, false, diag)
        t.finish()
    finally:
        if m:
            m.remove()
        shutil.rmtree(work, ignore_errors=True)


def print_table():
    """Every check's runs (a confirming run included) as a table: named in X of N, false names in Y of N."""
    if not table:
        return
    print("\n| check | named | false names |\n|---|---|---|")
    for name, runs, named, false in table:
        print(f"| {name} | {'—' if named is None else f'{named} of {runs}'} | {false} of {runs} |")
    print(flush=True)


# A fault is seen only in the time it leaves inside calls, so each interval of the loop must
# last long enough to hold several stops (80 ms / 80 ms: a period of 160 ms) or quota periods
# (100 ms): what counts is the loop's length in seconds, not its iterations. An iteration's
# time depends on P (on 2 cores ~1 ms at P = 4, ~3 ms at P = 8, ~12 ms at P = 16) and on epx's
# speed (the bench's barrier sleeping instead of yielding made the P = 8 loop 1.6x shorter,
# and the 80 ms stops fell from 20 to 18 of 20 named). And a quota starves a rank only below
# the CPU it uses: since the barrier sleeps, a rank of P = 8 uses ~9 % of a CPU, and a 10 %
# quota named it in 13 of 20 (its loop 1.3 s instead of 19 s). So a fault-free probe loop of
# 3200 / P iterations at each P, timed by the bench, with its ranks' CPU sampled, sizes both:
# the stops' loop for a fault-free --stop-seconds (5 s; the stops about double it), the
# quota as the ranks' CPU share / --starve (3: the victim at a third of its pace), and the
# quota's loop for a fault-free --quota-seconds (2 s; the throttled rank about triples it).
PROBES = {}


def probe(epx, ranks):
    """(iterations per second, the median rank's share of a CPU) of a fault-free loop at P."""
    if ranks in PROBES:
        return PROBES[ranks]
    n = max(100, 3200 // ranks)
    rc, data, tail = run_bench([epx, "bench", "--ranks", str(ranks), "--iters", str(n)] + SHAPE + BENCH_DIAG)
    took = ((data or {}).get("diagnose") or {}).get("seconds")
    cpu = sorted((data or {}).get("rank_cpu_s", {}).values())
    if rc != 0 or not took or not cpu:
        fail(f"the probe loop at P = {ranks} did not run (exit {rc}): {tail}")
        return None
    PROBES[ranks] = (n / took, cpu[len(cpu) // 2] / took)
    print(f"  P = {ranks}: a fault-free loop of {n} iterations took {took:.2f} s, a rank {100 * PROBES[ranks][1]:.1f} % "
          f"of a CPU", flush=True)
    return PROBES[ranks]


def stop_iters(epx, ranks, a):
    if a.stop_iters:
        return a.stop_iters
    p = probe(epx, ranks)
    return p and max(100, int(p[0] * a.stop_seconds))


def quota_plan(epx, ranks, a):
    """[(quota %, iterations)]: --quota's (with --cgroup-iters or the probe's loop), else one
    quota of the probe's share / --starve."""
    probed = not (a.quota and a.cgroup_iters)
    p = probe(epx, ranks) if probed else None
    if probed and p is None:
        return []
    iters = a.cgroup_iters or max(50, int(p[0] * a.quota_seconds))
    quotas = ints(a.quota) if a.quota else [max(1, round(100 * p[1] / a.starve))]
    return [(q, iters) for q in quotas]


def ints(text):
    return [int(x) for x in text.split(",") if x]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epx", required=True)
    ap.add_argument("--only", default="quiet,sigstop,cgroup,netem,netem-quiet")
    ap.add_argument("--runs", type=int, default=1, help="runs of each fault check (each burst length, quota, rate, P)")
    ap.add_argument("--quiet-runs", type=int, default=3)
    ap.add_argument("--iters", type=int, default=800, help="the quiet runs' iterations")
    ap.add_argument("--stop-seconds", type=float, default=5.0,
                    help="the stops' loop: iterations for a fault-free loop of this many seconds (a probe loop times "
                         "them at each P); the stops about double it")
    ap.add_argument("--stop-iters", type=int, help="the stops' iterations, instead of --stop-seconds' probe")
    ap.add_argument("--cgroup-iters", type=int,
                    help="the quota runs' iterations (default: a fault-free loop of --quota-seconds, by the probe)")
    ap.add_argument("--quota-seconds", type=float, default=2.0,
                    help="the quota runs' loop: iterations for a fault-free loop of this many seconds")
    ap.add_argument("--starve", type=float, default=3.0,
                    help="without --quota: the quota is the probe's CPU share per rank / this")
    ap.add_argument("--netem-iters", type=int, default=20, help="shaped: a call takes ~0.25 s at 256 kbit/s")
    ap.add_argument("--netem-quiet-iters", type=int, default=300,
                    help="unshaped: enough calls that one stall (a descheduled rank, a TCP retransmit) averages out")
    ap.add_argument("--bursts", default="20,40,80", help="SIGSTOP / SIGCONT burst lengths, ms")
    ap.add_argument("--quota", help="cgroup CPU quotas, %% of one CPU (default: the probe's share per rank / --starve)")
    ap.add_argument("--rates", default="256", help="netem: rates of the slow link, kbit/s")
    ap.add_argument("--netem", action="store_true", help="slow the link with sch_netem (a delay) instead of htb (a rate)")
    ap.add_argument("--ranks", default="8", help="P of the slow-rank runs (comma-separated: each)")
    ap.add_argument("--quiet-ranks", type=int, default=8, help="P of the quiet runs")
    ap.add_argument("--load", action="store_true",
                    help="quiet runs with a second job (another 4-rank bench in a loop): 12 ranks on 2 cores")
    ap.add_argument("--confirm", type=int, nargs="?", const=3, default=0, metavar="K",
                    help="a failed check runs up to K (3) more times and fails only if each fails with a wrong verdict "
                         "of the first repeated (the test command's mode)")
    ap.add_argument("--bench-wait", choices=("spin", "sleep"),
                    help="EPX_WAIT for the diagnosed benches (default: the bench's own choice, sleep when ranks "
                         "outnumber the cores); the second job keeps this process's EPX_WAIT")
    ap.add_argument("--save", help="write each run's verdict and matrices (JSON) into this directory")
    ap.add_argument("--intervals", type=int, help="the bench's --diagnose-intervals (default: the bench's)")
    ap.add_argument("--need", type=int, help="the bench's --diagnose-need (default: the bench's)")
    ap.add_argument("--verdict", choices=("ranks", "persistent", "loop"), default="ranks",
                    help="judge the persistent verdict per rank and link (ranks), per op (persistent), or the whole "
                         "loop's one verdict (loop)")
    a = ap.parse_args()
    global VERDICT, BENCH_WAIT
    VERDICT, BENCH_WAIT = a.verdict, a.bench_wait
    if a.intervals:
        BENCH_DIAG.extend(["--diagnose-intervals", str(a.intervals)])
    if a.need:
        BENCH_DIAG.extend(["--diagnose-need", str(a.need)])
    epx = os.path.abspath(a.epx)
    only = a.only.split(",")
    t0 = time.time()
    print(f"check_diagnose: load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", flush=True)
    c = a.confirm
    if "quiet" in only:
        confirmed(c, check_quiet, epx, a.quiet_runs, a.iters, a.quiet_ranks, load=a.load, save_dir=a.save)
    for ranks in ints(a.ranks):
        iters = stop_iters(epx, ranks, a) if "sigstop" in only else None
        if iters:
            for ms in ints(a.bursts):
                confirmed(c, check_sigstop, epx, a.runs, iters, ranks, ms, save_dir=a.save)
        if "cgroup" in only:
            for q, n in quota_plan(epx, ranks, a):
                confirmed(c, check_cgroup, epx, a.runs, n, ranks, q, save_dir=a.save)
    if "netem" in only:
        for rate in ints(a.rates):
            confirmed(c, check_netem, epx, a.runs, a.netem_iters, rate_kbit=rate, netem=a.netem, save_dir=a.save)
    if "netem-quiet" in only:
        confirmed(c, check_netem, epx, a.quiet_runs, a.netem_quiet_iters, shape=False, save_dir=a.save)
    print(f"check_diagnose: {time.time() - t0:.0f} s, load average {os.getloadavg()[0]:.1f}", flush=True)
    print_table()
    if failures:
        print(f"FAIL: check_diagnose: {len(failures)} check(s) failed", flush=True)
        return 1
    print("PASS: check_diagnose", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
