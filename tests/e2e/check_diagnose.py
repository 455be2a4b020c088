#!/usr/bin/env python3
"""epx::Diagnose against real faults, through `epx bench --diagnose --json`:

  quiet       N quiet runs: nothing may be flagged (prints the false-positive rate)
  sigstop     one rank's process stopped and continued in bursts from outside (SIGSTOP /
              SIGCONT): that rank must be the only one flagged (its row or column)
  cgroup      one rank's process in a CPU cgroup of this test with a 5 % quota (cgroup v1
              cpu or v2 cpu.max): the same; SKIP when no cgroup can be made
  netem       4 network-namespace "machines", one rank each, the shmem transport (oshrun,
              --protocol tail), machine 1's veth slowed for packets to machine 2 only (a u32
              filter into an htb class of 256 kbit/s; --netem: into a netem delay, which this
              machine's kernel lacks): the flagged points must be between those two
              machines' ranks, nothing else; SKIP without root / ip / tc / oshrun / shmem
  netem-quiet the same 4 machines unshaped, 3 runs judged as `quiet` (single noise verdicts
              allowed, none repeated, at most a quarter flagged)

    check_diagnose.py --epx build/src/tools/epx [--only quiet,sigstop,...] [--quiet-runs N]

Everything this test makes (processes, the cgroup, namespaces, the bridge; the qdisc lives
in a namespace) is removed in `finally` blocks, also when a check fails; every run is under
a timeout. Exit 1 if any check failed.
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
# A small problem: ~1 ms per call on a loaded 2-core machine; every rank sends to every rank.
SHAPE = ["--tokens", "64", "--hidden", "1024", "--topk", "4", "--experts", "16", "--warmup", "3",
         "--counters-overhead", "0", "--no-counters", "--diagnose", "--timeout-ms", "30000"]
# Across the namespaces (UCX over TCP on a veth): smaller rows, so that a shaped link is slow, not stalled.
NETEM_SHAPE = [{"1024": "128", "64": "32"}.get(x, x) for x in SHAPE]
# The tail protocol: each peer's rows complete with their own ordered signal. (With the
# explicit protocol's one quiet before every signal, the slow link delays the sender's and
# the receiver's signals to every rank: their rows rise together, docs/diagnose.md.)
NETEM_EXTRA = os.environ.get("EPX_DIAG_NETEM_EXTRA", "--protocol tail --queues 4").split()
PID_LINE = re.compile(r"epx bench: diagnose: rank pids:(.*)")
failures = []


def fail(what):
    print("FAIL: " + what, flush=True)
    failures.append(what)


def flagged(diag):
    """{op: (rows, cols, points)} of a bench JSON's "diagnose"."""
    return {op: (diag[op]["abnormal_rows"], diag[op]["abnormal_cols"], [tuple(p[:2]) for p in diag[op]["abnormal_points"]])
            for op in ("dispatch", "combine")}


def describe(diag):
    return "; ".join(f"{op}: rows {r} cols {c} points {p}" for op, (r, c, p) in flagged(diag).items())


def run_bench(cmd, fault=None, limit=240):
    """Runs `cmd` (an epx bench with --json); `fault(pids)` runs in a thread once the ranks'
    pids are printed and until it returns. Returns (rc, json or None, stderr tail)."""
    work = tempfile.mkdtemp(prefix="epx_diag_")
    out = os.path.join(work, "bench.json")
    proc = subprocess.Popen(cmd + ["--json", out], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    tail, threads = [], []
    try:
        deadline = time.time() + limit
        for line in proc.stderr:
            tail = (tail + [line.rstrip()])[-20:]
            m = PID_LINE.search(line)
            if m and fault:
                pids = {int(k): int(v.split("@")[0]) for k, v in (x.split("=") for x in m.group(1).split())}
                t = threading.Thread(target=fault, args=(pids, proc), daemon=True)
                t.start()
                threads.append(t)
            if time.time() > deadline:
                break
        proc.wait(timeout=max(1, deadline - time.time()))
        for t in threads:
            t.join(timeout=30)
        data = json.load(open(out)) if os.path.exists(out) else None
        return proc.returncode, data, "\n".join(tail)
    except subprocess.TimeoutExpired:
        return -1, None, "timed out\n" + "\n".join(tail)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGCONT)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        shutil.rmtree(work, ignore_errors=True)


def judge_quiet(name, diags, what):
    """Quiet runs (a list of bench JSONs' "diagnose"): the false-positive rate is reported. With
    4 ranks on this machine's 2 cores a rank descheduled for a slice now and then lifts one entry
    of one run's matrix past 5x the mean of tens of microseconds (measured: 1-2 of 8 verdicts on an
    idle machine; the 4 namespace machines over TCP: one point in 1 of 2 verdicts of a run), so
    what must not happen is a systematic one: the same row, column or point of an op flagged in
    two runs, or more than a quarter of the verdicts flagged."""
    bad = 0
    seen = {}
    for i, diag in enumerate(diags):
        f = flagged(diag)
        n = sum(1 for r, c, p in f.values() if r or c or p)
        bad += n
        for op, (rows, cols, points) in f.items():
            for x in [("row", x) for x in rows] + [("col", x) for x in cols] + [("point", tuple(x)) for x in points]:
                seen.setdefault((op,) + x, []).append(i)
        if n:
            print(f"  {name} run {i}: flagged {describe(diag)}", flush=True)
    runs = len(diags)
    rate = bad / (2 * runs)
    print(f"{name}: {bad} of {2 * runs} verdicts (dispatch + combine of {runs} runs, {what}) flagged "
          f"something: false-positive rate {100 * rate:.1f} %", flush=True)
    repeated = {k: v for k, v in seen.items() if len(v) > 1}
    if repeated:
        fail(f"{name}: the same verdict in several quiet runs (systematic, not noise): {repeated}")
    elif rate > 0.25:
        fail(f"{name}: {bad} false positives in {2 * runs} verdicts (more than a quarter)")
    else:
        print(f"PASS: {name}" + (f" (noise: {bad} single verdicts, none repeated)" if bad else ""), flush=True)


def check_quiet(epx, runs, iters, ranks):
    diags = []
    for i in range(runs):
        rc, data, tail = run_bench([epx, "bench", "--ranks", str(ranks), "--iters", str(iters), "--no-progress"] + SHAPE)
        if rc != 0 or data is None or "diagnose" not in data:
            fail(f"quiet run {i}: exit {rc}\n{tail}")
            return
        diags.append(data["diagnose"])
    judge_quiet("quiet", diags, f"{iters} iterations, P = {ranks}")


def check_victim(name, data, victim):
    """The victim must be flagged (its row or column in some op), and nothing that does not
    involve it: a point of its column is its own (a stop inside one of its waits is charged
    to the peer it waited for)."""
    if data is None or "diagnose" not in data:
        fail(f"{name}: no diagnose in the JSON")
        return
    pid_of = {r["rank"]: r["pid"] for r in data["ranks"]}
    f = flagged(data["diagnose"])
    named = any(victim in r or victim in c for r, c, _ in f.values())
    others = [(op, x) for op, (r, c, p) in f.items() for x in list(r) + list(c) if x != victim]
    others += [(op, x) for op, (_, _, p) in f.items() for x in p if victim not in x]
    if not named or others:
        fail(f"{name}: rank {victim} (pid {pid_of.get(victim)}) was slowed; verdict: {describe(data['diagnose'])}")
    else:
        print(f"PASS: {name}: rank {victim} (pid {pid_of[victim]}) named alone: {describe(data['diagnose'])}", flush=True)


def sigstop_bursts(victim, stop_s=0.02, run_s=0.01):
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


def check_sigstop(epx, iters, ranks, victim=2):
    rc, data, tail = run_bench([epx, "bench", "--ranks", str(ranks), "--iters", str(iters)] + SHAPE, sigstop_bursts(victim))
    if rc != 0:
        fail(f"sigstop: exit {rc}\n{tail}")
        return
    check_victim("sigstop (SIGSTOP 20 ms / SIGCONT 10 ms bursts)", data, victim)


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


def check_cgroup(epx, iters, ranks, victim=1):
    try:
        cg = CpuCgroup(5)
    except OSError as e:
        print(f"SKIP: cgroup: {e}", flush=True)
        return
    try:
        def fault(pids, proc):
            cg.add(pids[victim])
        rc, data, tail = run_bench([epx, "bench", "--ranks", str(ranks), "--iters", str(iters)] + SHAPE, fault)
        if rc != 0:
            fail(f"cgroup: exit {rc}\n{tail}")
            return
        check_victim("cgroup (5 % CPU quota)", data, victim)
    finally:
        cg.remove()


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
    agent = os.path.join(REPO, "tests", "multinode", "agent.sh")
    return ["ip", "netns", "exec", m.ns[0], "oshrun", "--allow-run-as-root", "--oversubscribe", "--hostfile", hostfile,
            "-np", str(np), "--mca", "spml", "ucx", "--mca", "osc", "ucx", "--mca", "pml", "ucx",
            "--mca", "opal_common_ucx_tls", "any", "--mca", "opal_common_ucx_devices", "any",
            "--mca", "plm_rsh_agent", agent, "--mca", "oob_tcp_if_include", "10.201.0.0/24",
            "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "10.201.0.0/24",
            "-x", "UCX_TLS=tcp,sysv,posix,self", "-x", "UCX_NET_DEVICES=eth1"]


def check_netem(epx, iters, delay_ms=15, rate_kbit=256, shape=True, netem=False, quiet_runs=3):
    """Shaped: one run, the slow link named as its points only. Unshaped (quiet): `quiet_runs`
    runs on the same machines, judged as the quiet runs are (noise allowed, nothing systematic)."""
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc") or not shutil.which("oshrun"):
        print("SKIP: netem: needs root, ip, tc and oshrun", flush=True)
        return
    if not os.path.exists(os.path.join(os.path.dirname(epx), "..", "..", "tests", "epx_multinode_rank")):
        print("SKIP: netem: the build has no shmem transport", flush=True)
        return
    m = None
    work = tempfile.mkdtemp(prefix="epx_diag_netem_")
    try:
        try:
            m = Machines(4)
            how = m.slow_link(1, 2, delay_ms, rate_kbit, netem) if shape else "nothing (quiet)"
        except OSError as e:
            print(f"SKIP: netem: cannot make the namespaces or the qdisc: {e}", flush=True)
            return
        hosts = os.path.join(work, "hosts")
        with open(hosts, "w") as f:
            f.writelines(f"{ns} slots=1\n" for ns in m.ns)
        cmd = oshrun_cmd(m, hosts, 4) + [epx, "bench", "--transport", "shmem", "--iters", str(iters), "--no-progress"]
        diags = []
        for i in range(1 if shape else quiet_runs):
            rc, data, tail = run_bench(cmd + NETEM_SHAPE + NETEM_EXTRA, limit=180)
            if rc != 0 or data is None:
                fail(f"netem: exit {rc}\n{tail}")
                return
            print("  matrices (us): " + json.dumps({op: data["diagnose"][op]["matrix_us"] for op in ("dispatch", "combine")}),
                  flush=True)
            diags.append(data["diagnose"])
        if not shape:
            judge_quiet("netem-quiet", diags, f"4 namespace machines, {iters} iterations")
            return
        node = {r["rank"]: r["node"] for r in data["ranks"]}
        a = [r for r, n in node.items() if n == m.ns[0]]
        b = [r for r, n in node.items() if n == m.ns[1]]
        between = {(s, d) for s in a for d in b} | {(s, d) for s in b for d in a}
        f = flagged(data["diagnose"])
        points = {p for _, _, ps in f.values() for p in ps}
        rows_cols = [x for r, c, _ in f.values() for x in list(r) + list(c)]
        if not (points and points <= between and not rows_cols):
            fail(f"netem: {how} from {m.ns[0]} (ranks {a}) to {m.ns[1]} (ranks {b}); verdict: {describe(data['diagnose'])}")
        else:
            print(f"PASS: netem: {how} from {m.ns[0]} to {m.ns[1]}: points {sorted(points)} "
                  f"({describe(data['diagnose'])})", flush=True)
    finally:
        if m:
            m.remove()
        shutil.rmtree(work, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epx", required=True)
    ap.add_argument("--only", default="quiet,sigstop,cgroup,netem", help="also: netem-quiet (4 machines, no shaping)")
    ap.add_argument("--quiet-runs", type=int, default=4)
    ap.add_argument("--iters", type=int, default=150)
    ap.add_argument("--netem-iters", type=int, default=20)
    ap.add_argument("--netem", action="store_true", help="slow the link with sch_netem (a delay) instead of htb (a rate)")
    ap.add_argument("--ranks", type=int, default=8, help="P of the slow-rank runs (at P = 4 a stopped rank's row "
                    "can reach only 3x, docs/diagnose.md)")
    ap.add_argument("--quiet-ranks", type=int, default=4, help="P of the quiet runs (netem: 4 machines x 1 rank)")
    a = ap.parse_args()
    epx = os.path.abspath(a.epx)
    only = a.only.split(",")
    t0 = time.time()
    if "quiet" in only:
        check_quiet(epx, a.quiet_runs, a.iters, a.quiet_ranks)
    if "sigstop" in only:
        check_sigstop(epx, a.iters, a.ranks)
    if "cgroup" in only:
        check_cgroup(epx, a.iters, a.ranks)
    if "netem" in only:
        check_netem(epx, a.netem_iters, netem=a.netem)
    if "netem-quiet" in only:
        check_netem(epx, a.netem_iters, shape=False)
    print(f"check_diagnose: {time.time() - t0:.0f} s", flush=True)
    if failures:
        print(f"FAIL: check_diagnose: {len(failures)} check(s) failed", flush=True)
        return 1
    print("PASS: check_diagnose", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
