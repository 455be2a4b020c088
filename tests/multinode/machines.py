"""Several "machines" on this one: network namespaces on a bridge, 10.201.0.i on eth1 inside
namespace i only (tests/multinode/run.sh's layout; ranks enter them through agent.sh with
their own UTS / mount / IPC namespaces and /dev/shm). Shared by tests/e2e/check_diagnose.py
and scripts/benchmarks.py. Needs root (CAP_NET_ADMIN)."""
import json
import os
import signal
import subprocess


def read_text(path):
    """A file a job on the machines wrote (an output, a list of what it left), or "" when the
    job never wrote it."""
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def json_lines(path):
    """The JSON objects of a rank's log (its lines that start with "{"); [] when never written."""
    return [json.loads(ln) for ln in read_text(path).splitlines() if ln.startswith("{")]


def sh(*cmd, check=True):
    r = subprocess.run(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    if check and r.returncode != 0:
        raise OSError(f"{' '.join(cmd)}: {r.stdout.strip()}")
    return r


class Machines:
    """N namespaces named after this process; a failure while making them removes what was
    made and raises OSError. remove() kills what runs inside them and deletes everything."""

    made_here = 0  # Machines made by this process: each set gets its own names

    def __init__(self, n):
        # The kernel tears a deleted namespace down asynchronously (its veth lingers on the
        # host for seconds), so a second set in this process must not reuse the first's names
        # (interface names <= 15 characters: pid <= 7 digits + the set's digit).
        Machines.made_here += 1
        self.id = f"{os.getpid()}{Machines.made_here % 10}"
        self.ns = [f"epx-{self.id}-d{i}" for i in range(1, n + 1)]
        self.br = f"epxd{self.id}"
        self.made = []
        self.veths = []
        try:
            self._make()
        except BaseException:
            self.remove()  # what was made before the failure
            raise

    def _make(self):
        sh("ip", "link", "add", self.br, "type", "bridge")
        self.made.append("bridge")
        sh("ip", "link", "set", self.br, "up")
        for i, ns in enumerate(self.ns, 1):
            sh("ip", "netns", "add", ns)
            self.made.append(ns)
            v, t = f"epxdv{self.id}x{i}", f"epxdt{self.id}x{i}"
            sh("ip", "link", "add", v, "type", "veth", "peer", "name", t)
            self.veths.append(v)
            sh("ip", "link", "set", t, "netns", ns)
            sh("ip", "-n", ns, "link", "set", t, "name", "eth1")
            sh("ip", "link", "set", v, "master", self.br, "up")
            sh("ip", "-n", ns, "addr", "add", f"10.201.0.{i}/24", "dev", "eth1")
            sh("ip", "-n", ns, "link", "set", "eth1", "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")

    def remove(self):
        for ns in self.ns:
            if ns in self.made:
                for p in sh("ip", "netns", "pids", ns, check=False).stdout.split():
                    try:
                        os.kill(int(p), signal.SIGKILL)
                    except (ProcessLookupError, ValueError):
                        pass
        for v in self.veths:  # the pair goes at once (a deleted namespace's goes later)
            sh("ip", "link", "del", v, check=False)
        for ns in self.ns:
            if ns in self.made:
                sh("ip", "netns", "del", ns, check=False)
        if "bridge" in self.made:
            sh("ip", "link", "del", self.br, check=False)
        self.made, self.veths = [], []
