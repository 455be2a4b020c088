"""torchrun across two "machines" on this one (network namespaces from machines.py).

    with Cluster(2) as c:
        run = c.torchrun("tests/multinode/dist_smoke.py", ["--backend", "gloo"], nproc=2, timeout=120)
        assert run.ok, run.text()

or from a shell (root):

    python3 tests/multinode/torchrun.py [--nproc 2] [--timeout 120] [--tx BYTES]
        [--kill | --cut] [--when REGEX] [--env K=V ...] PROGRAM [ARGS...]

Each machine i runs Debian's `/usr/bin/python3 -m torch.distributed.run --nnodes 2
--nproc_per_node K --rdzv_backend c10d --rdzv_endpoint 10.201.0.1:PORT --rdzv_id ID PROGRAM
ARGS` (torch 1.13 spells the options with underscores) inside

    timeout -k 10 T ip netns exec NS unshare --uts --mount --ipc --pid --fork --mount-proc
        --kill-child --propagation private sh -c
        'hostname NS; mount -t tmpfs tmpfs /dev/shm; mount --bind HOSTS /etc/hosts; ...'

so that each machine has its own hostname, IPC namespace and /dev/shm (nothing crosses
through shared memory: epx's and UCX's shared-memory paths see only their own machine), its
own pid namespace and /proc (nothing crosses by cross-memory attach either: process_vm_readv
between two machines' ranks fails, as it does between real machines) and
an /etc/hosts naming both machines (torchrun hands its workers MASTER_ADDR = rank 0's
hostname, and gloo picks the interface its hostname resolves to, as on real machines).

A run collects both machines' exit codes, the agent's output and each worker's stdout /
stderr (files named by machine, local and global rank: the workers run through sh), the bytes sent on each machine's
eth1 during the run (tx_bytes), and whatever the run left in each machine's private /dev/shm.
Fault injection while the job runs (once every worker's output matched `when`): SIGKILL of
one worker on a machine ("kill"), or that machine's link cut (`ip -n NS link set eth1 down`,
"cut"). Cluster.close() (also on an exception or KeyboardInterrupt) kills whatever still
runs inside the namespaces and removes them (machines.Machines.remove).
"""
import glob
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import machines  # noqa: E402

PYTHON = "/usr/bin/python3"
REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def available():
    """None when this process can make the machines, else why not (the only reasons to skip)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    for tool in ("ip", "unshare", "timeout", "mount", "hostname"):
        if subprocess.run(["sh", "-c", f"command -v {tool}"], stdout=subprocess.DEVNULL).returncode != 0:
            return f"no {tool} (apt-get install iproute2 util-linux coreutils)"
    return None


# Inside a machine: its hostname, a private /dev/shm and /etc/hosts, the command as a child
# (SIGTERM / SIGINT forwarded: `timeout` reaches it), then what is left in /dev/shm listed.
_INSIDE = r'''
host=$1 hosts=$2 shmlog=$3; shift 3
hostname "$host" && mount -t tmpfs -o size=2g,mode=1777 tmpfs /dev/shm && mount --bind "$hosts" /etc/hosts || exit 97
"$@" &
child=$!
trap 'kill -TERM $child 2>/dev/null' TERM INT
while :; do
  wait $child; rc=$?
  kill -0 $child 2>/dev/null || break
done
ls -A /dev/shm > "$shmlog" 2>&1
exit $rc
'''


# A worker (torchrun --no_python runs it with RANK / LOCAL_RANK set): the program under
# Python, its stdout and stderr into files named by machine, local and global rank, and
# its exit code with the time it ended (SIGTERM from torchrun forwarded to it).
_WORKER = r'''
dir=$1 py=$2; shift 2
f="$dir/$(hostname)-$LOCAL_RANK-$RANK"
"$py" -u "$@" > "$f.out" 2> "$f.err" &
child=$!
trap 'kill -TERM $child 2>/dev/null' TERM INT
while :; do
  wait $child; rc=$?
  kill -0 $child 2>/dev/null || break
done
echo "$rc $(date +%s.%N)" > "$f.rc"
exit $rc
'''


class Fault:
    """kind "kill" (SIGKILL one worker on `machine`: the one with the highest global rank, or
    `rank`) or "cut" (`machine`'s eth1 down), once every worker's stdout matched `when`
    (a regex; None: `after` seconds after the start)."""

    def __init__(self, kind, machine=1, when=None, after=None, rank=None):
        assert kind in ("kill", "cut"), kind
        self.kind, self.machine, self.when, self.after, self.rank = kind, machine, when, after, rank
        self.done_at = None  # seconds after the start
        self.victim = None  # the killed worker's global rank
        self.note = ""


class Worker:
    """One torchrun worker's output (from its files: rank R on machine i, local rank lr)."""

    def __init__(self, machine, local_rank, rank, stdout, stderr, rc=None, ended=None):
        self.machine, self.local_rank, self.rank = machine, local_rank, rank
        self.stdout, self.stderr = stdout, stderr
        self.rc = rc  # None: it never ended by itself (killed with its wrapper)
        self.ended = ended  # seconds after the job started

    @property
    def output(self):
        return self.stdout + self.stderr


class Run:
    """One torchrun job on every machine: .rc[i], .agent[i] (torchrun's own output),
    .workers (Worker: machine, local_rank, rank, stdout, stderr), .tx[i] (bytes sent on
    machine i's eth1 during the run), .shm_left[i], .elapsed, .timed_out, .fault."""

    def __init__(self, names):
        self.names = names
        self.rc, self.agent, self.tx, self.shm_left = [], [], [], []
        self.workers = []
        self.elapsed = 0.0
        self.timed_out = False
        self.agents_stopped = []
        self.fault = None
        self.cmd = []
        self.snapshot = ""  # Cluster.snapshot() taken while the run went on (snapshot_after)
        self.tcp_counters = []  # [i]: machine i's TCP counters that moved (nstat), for a failure's text

    @property
    def ok(self):
        return all(rc == 0 for rc in self.rc) and not self.timed_out and not self.agents_stopped

    def worker(self, rank):
        for w in self.workers:
            if w.rank == rank:
                return w
        return None

    def text(self, limit=6000):
        """Everything, for an assertion message."""
        out = [f"elapsed {self.elapsed:.1f} s, exit codes {self.rc}, timed out {self.timed_out}, tx bytes {self.tx}"
               + (f", agents stopped after their workers ended: {self.agents_stopped}" if self.agents_stopped else "")]
        if self.fault:
            out.append(f"fault {self.fault.kind} on {self.names[self.fault.machine]}: {self.fault.note}")
        if self.snapshot:
            out.append(f"== snapshot {self.snapshot}")
        for i, counters in enumerate(self.tcp_counters):
            out.append(f"== {self.names[i]}'s TCP counters: {counters}")
        for i, name in enumerate(self.names):
            out.append(f"== {name}: {' '.join(shlex.quote(a) for a in self.cmd[i][-8:])} -> rc {self.rc[i]}")
            out.append(_tail(self.agent[i], limit))
            for w in self.workers:
                if w.machine == i:
                    ended = f"{w.ended:.1f} s" if w.ended is not None else "?"
                    out.append(f"-- {name} local rank {w.local_rank} (rank {w.rank}): exit {w.rc} at {ended}; stdout:\n"
                               f"{_tail(w.stdout, limit)}")
                    out.append(f"-- {name} local rank {w.local_rank} (rank {w.rank}) stderr:\n{_tail(w.stderr, limit)}")
        return "\n".join(out)


def _tail(s, limit):
    return s if len(s) <= limit else "...\n" + s[-limit:]


def _rc(path, t_wall):
    """(exit code, seconds after t_wall) from a worker's .rc file, or (None, None)."""
    try:
        rc, t = machines.read_text(path).split()
        return int(rc), float(t) - t_wall
    except ValueError:
        return None, None


class Cluster:
    """n machines (namespaces 10.201.0.1 ... .n on one bridge); a context manager."""

    def __init__(self, n=2, keep=False):
        self.dir = tempfile.mkdtemp(prefix="epx-torchrun-")
        self.keep = keep
        self.m = None
        self.runs = 0
        try:
            self.m = machines.Machines(n)
        except BaseException:
            self.close()
            raise
        self.names = list(self.m.ns)
        self.addr = [f"10.201.0.{i}" for i in range(1, n + 1)]
        self.hosts = os.path.join(self.dir, "hosts")
        with open(self.hosts, "w") as f:
            f.write("127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n")
            for a, name in zip(self.addr, self.names):
                f.write(f"{a} {name}\n")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def close(self):
        """Kill what runs in the machines, remove them and this cluster's directory."""
        if self.m is not None:
            self.m.remove()
            self.m = None
        if not self.keep and os.path.isdir(self.dir):
            subprocess.run(["rm", "-rf", self.dir])

    # -- inside a machine -------------------------------------------------------------
    def wrap(self, i, argv, timeout, shmlog):
        """argv run on machine i, under `timeout`."""
        ns = self.names[i]
        return ["timeout", "-k", "10", str(int(timeout)), "ip", "netns", "exec", ns, "unshare", "--uts", "--mount",
                "--ipc", "--pid", "--fork", "--mount-proc", "--kill-child", "--propagation", "private", "/bin/sh", "-c",
                _INSIDE, "inside", ns, self.hosts, shmlog] + list(argv)

    def tx_bytes(self, i):
        r = machines.sh("ip", "-j", "-s", "-n", self.names[i], "link", "show", "eth1")
        return int(json.loads(r.stdout)[0]["stats64"]["tx"]["bytes"])

    def cut(self, i):
        machines.sh("ip", "-n", self.names[i], "link", "set", "eth1", "down")

    def heal(self, i):
        machines.sh("ip", "-n", self.names[i], "link", "set", "eth1", "up")

    def worker_pids(self, i):
        """{global rank: pid} of torchrun's workers running on machine i."""
        return {r: pid for r, (pid, _) in self.workers_running(i).items()}

    def workers_running(self, i):
        """{global rank: (pid, local rank)} of torchrun's workers running on machine i: the
        innermost process whose environment has RANK, LOCAL_RANK and TORCHELASTIC_RUN_ID (the
        program, not its sh wrapper; the agent has no RANK)."""
        found = {}  # pid: (rank, local rank, parent pid)
        for p in machines.sh("ip", "netns", "pids", self.names[i], check=False).stdout.split():
            try:
                with open(f"/proc/{p}/environ", "rb") as f:
                    env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
                with open(f"/proc/{p}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if b"TORCHELASTIC_RUN_ID" in env and b"RANK" in env and b"LOCAL_RANK" in env:
                found[int(p)] = (int(env[b"RANK"]), int(env[b"LOCAL_RANK"]), ppid)
        out = {}
        for pid, (rank, lr, ppid) in found.items():
            if not any(q != pid and found[q][2] == pid for q in found):  # no child of its own among them
                out[rank] = (pid, lr)
        return out

    # -- a job ------------------------------------------------------------------------
    def torchrun(self, program, args=(), nproc=2, timeout=120, env=None, fault=None, port=29400,
                 monitor_interval=1, agent_grace=30, python=PYTHON, snapshot_after=None):
        """Run `program args` with torchrun on every machine (nproc workers each); returns a
        Run. `timeout` bounds each machine's torchrun; once every worker has ended, an agent
        still running after `agent_grace` seconds is stopped (run.agents_stopped).
        `snapshot_after` seconds (default: EPX_TORCHRUN_SNAPSHOT, else none) with workers still
        running: run.snapshot gets each machine's TCP sockets and every worker's threads'
        stacks (snapshot()), the evidence of a stalled run."""
        if snapshot_after is None and os.environ.get("EPX_TORCHRUN_SNAPSHOT"):
            snapshot_after = float(os.environ["EPX_TORCHRUN_SNAPSHOT"])
        self.runs += 1
        n = len(self.names)
        rdir = os.path.join(self.dir, f"run{self.runs}")
        os.makedirs(rdir)
        run = Run(self.names)
        run.fault = fault
        environ = dict(os.environ)
        environ.setdefault("PYTHONPATH", os.path.join(REPO, "build", "python"))
        environ["PYTHONUNBUFFERED"] = "1"
        environ["LOGLEVEL"] = environ.get("LOGLEVEL", "WARNING")
        environ.update(env or {})
        procs, files = [], []
        tx0 = [self.tx_bytes(i) for i in range(n)]
        t0, t_wall = time.monotonic(), time.time()
        try:
            wdir = os.path.join(rdir, "workers")
            os.makedirs(wdir)
            for i in range(n):
                cmd = [python, "-m", "torch.distributed.run", "--nnodes", str(n), "--nproc_per_node", str(nproc),
                       "--rdzv_backend", "c10d", "--rdzv_endpoint", f"{self.addr[0]}:{port}",
                       "--rdzv_id", f"epx-{os.getpid()}-{self.runs}", "--max_restarts", "0",
                       "--monitor_interval", str(monitor_interval),
                       # Debian's torch 1.13 on Python 3.11 parses --redirects / --tee "0" to None
                       # (and fails): "1" parses; the worker's own redirections come first anyway
                       "--redirects", "1", "--tee", "1", "--log_dir", os.path.join(rdir, f"elastic{i}"), "--no_python", "/bin/sh", "-c", _WORKER, "worker",
                       wdir, python, program] + [str(a) for a in args]
                run.cmd.append(cmd)
                f = open(os.path.join(rdir, f"agent{i}.txt"), "w+")
                files.append(f)
                procs.append(subprocess.Popen(self.wrap(i, cmd, timeout, os.path.join(rdir, f"shm{i}.txt")),
                                              stdout=f, stderr=subprocess.STDOUT, env=environ, start_new_session=True))
            deadline = t0 + timeout + 20
            ends, all_done = [None] * n, None
            while any(e is None for e in ends):
                now = time.monotonic()
                for i, p in enumerate(procs):
                    if ends[i] is None and p.poll() is not None:
                        ends[i] = now - t0
                if now > deadline:  # `timeout` failed to end it: the harness's own deadline
                    run.timed_out = True
                    break
                if fault and fault.done_at is None:
                    self._maybe_fault(fault, rdir, nproc, t0)
                if snapshot_after is not None and not run.snapshot and now - t0 > snapshot_after:
                    run.snapshot = f"at {now - t0:.1f} s:\n" + self.snapshot()
                if all_done is None and len(glob.glob(os.path.join(wdir, "*.rc"))) == n * nproc:
                    all_done = now
                if all_done is not None and now - all_done > agent_grace and (not fault or fault.done_at is not None):
                    # every worker ended, an agent did not: torchrun's agent waits on the
                    # rendezvous store when it cannot reach it (a cut link) until its own timeout
                    run.agents_stopped = [self.names[i] for i in range(n) if ends[i] is None]
                    break
                time.sleep(0.2)
        except BaseException:
            self._stop(procs)
            raise
        finally:
            run.elapsed = time.monotonic() - t0
        self._stop(procs)
        for i, p in enumerate(procs):
            rc = p.returncode
            run.rc.append(rc)
            if ends[i] is not None and ends[i] >= timeout - 1:  # `timeout` ended it
                run.timed_out = True
            files[i].seek(0)
            run.agent.append(files[i].read())
            files[i].close()
            try:
                run.tx.append(self.tx_bytes(i) - tx0[i])
            except OSError:
                run.tx.append(None)
            run.shm_left.append(machines.read_text(os.path.join(rdir, f"shm{i}.txt")).split())
            run.tcp_counters.append(self.tcp_counters(i))
        for path in sorted(glob.glob(os.path.join(rdir, "workers", "*.out"))):
            host, lr, r = os.path.basename(path)[:-4].rsplit("-", 2)
            i = self.names.index(host) if host in self.names else -1
            rc, ended = _rc(path[:-4] + ".rc", t_wall)
            run.workers.append(Worker(i, int(lr), int(r), machines.read_text(path), machines.read_text(path[:-4] + ".err"), rc, ended))
        run.workers.sort(key=lambda w: w.rank)
        return run

    def tcp_counters(self, i):
        """Machine i's TCP counters of trouble since it was made (retransmissions, timeouts,
        zero windows, drops): the ones that are not 0, as text."""
        keep = ("RetransSegs", "Timeouts", "LossProbes", "ZeroWindow", "Prune", "Drop", "Collapsed", "Backlog",
                "MemoryPressures", "SpuriousRTOs", "Abort")
        r = machines.sh("ip", "netns", "exec", self.names[i], "nstat", "-az", check=False)
        out = []
        for line in r.stdout.splitlines():
            f = line.split()
            if len(f) >= 2 and f[1] != "0" and any(k in f[0] for k in keep):
                out.append(f"{f[0]} {f[1]}")
        return ", ".join(out) or "(none)"

    def snapshot(self):
        """What every machine's TCP sockets hold (ss: queues, retransmissions, timers) and where
        every worker's threads are (gdb, UCX's and epx's frames), as text."""
        out = []
        for i, ns in enumerate(self.names):
            r = machines.sh("ip", "netns", "exec", ns, "ss", "-tnpioe", check=False)
            out.append(f"-- {ns}: ss -tnpioe\n" + "\n".join(ln for ln in r.stdout.splitlines() if "cgroup2" not in ln))
        for i, ns in enumerate(self.names):
            for rank, (pid, _) in sorted(self.workers_running(i).items()):
                cmd = ["gdb", "-p", str(pid), "-batch", "-nx", "-iex", "set auto-solib-add off"]
                for lib in ("libucp", "libuct", "libucs", "_epx", "libc.so"):  # not torch's: minutes to load
                    cmd += ["-ex", f"sharedlibrary {lib}"]
                cmd += ["-ex", "thread apply all bt 20"]
                try:
                    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=90)
                    text = "\n".join(ln for ln in r.stdout.splitlines() if ln.startswith(("#", "Thread")))
                except (OSError, subprocess.TimeoutExpired) as e:
                    text = f"(no stacks: {e})"
                out.append(f"-- rank {rank} (pid {pid}) on {ns}:\n{text}")
        return "\n".join(out)

    def _stop(self, procs):
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for p in procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()

    def _stdouts(self, rdir):
        return [machines.read_text(f) for f in glob.glob(os.path.join(rdir, "workers", "*.out"))]

    def _maybe_fault(self, fault, rdir, nproc, t0):
        now = time.monotonic() - t0
        if fault.when is not None:
            outs = self._stdouts(rdir)
            if len(outs) < nproc * len(self.names) or not all(re.search(fault.when, o) for o in outs):
                return
        elif now < (fault.after or 0):
            return
        i = fault.machine
        if fault.kind == "cut":
            self.cut(i)
            fault.note = f"eth1 of {self.names[i]} down at {now:.1f} s"
        else:
            pids = self.worker_pids(i)
            if not pids:
                return
            victim = fault.rank if fault.rank is not None else max(pids)
            os.kill(pids[victim], signal.SIGKILL)
            fault.victim = victim
            fault.note = f"SIGKILL of rank {victim} (pid {pids[victim]}) at {now:.1f} s"
        fault.done_at = now


def main():
    import argparse
    ap = argparse.ArgumentParser(description="torchrun across two namespace machines (root)")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--tx", type=int, default=0, help="fail unless each machine's eth1 sent at least this many bytes")
    ap.add_argument("--kill", action="store_true", help="SIGKILL a worker on the second machine once --when matched")
    ap.add_argument("--cut", action="store_true", help="cut the second machine's link once --when matched")
    ap.add_argument("--when", default=r"iteration 3\b")
    ap.add_argument("--env", action="append", default=[], help="K=V for every worker")
    ap.add_argument("--keep", action="store_true", help="keep the run's directory (logs)")
    ap.add_argument("program")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    why = available()
    if why:
        print(f"torchrun.py: cannot run: {why}", file=sys.stderr)
        return 2
    fault = Fault("kill" if a.kill else "cut", 1, a.when) if (a.kill or a.cut) else None
    env = dict(kv.split("=", 1) for kv in a.env)
    with Cluster(2, keep=a.keep) as c:
        run = c.torchrun(a.program, a.args, nproc=a.nproc, timeout=a.timeout, env=env, fault=fault)
        print(run.text(limit=20000))
        if a.keep:
            print(f"logs kept in {c.dir}")
    bad = not run.ok or (a.tx and any(t is None or t < a.tx for t in run.tx))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
