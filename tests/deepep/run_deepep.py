#!/usr/bin/env python3
"""Runs one of DeepEP's own test files against epx on CPU, and counts its checks.

    /usr/bin/python3 tests/deepep/run_deepep.py --deepep /work/.mirror/deepseek-ai+DeepEP/repo \\
        --test tests/legacy/test_intranode.py [--keep-going] [--timeout 900] -- <the test's own args>

DeepEP's sources are read (a bare git directory via `git show <rev>:<path>`, or a
checkout), never copied into this repository: into a fresh temporary directory (removed
at the end) go the test's folder and deep_ep/utils/*.py, under a package `deep_ep` made
here (shim/deep_ep_init.py: epx's objects under DeepEP's names; shim/_C.py for the CUDA
extension's names utils imports). Every `assert` of the test files becomes a counted check
(shim/rewrite.py, same line numbers). Each process the test starts gets the CPU device
shim (shim/cpu_device.py) from a sitecustomize on PYTHONPATH before it imports anything.

At the end: "rank R: N of M checks passed" per rank, the total, the first failures with
file:line and message. Exit status 0 only if every check passed, at least one ran, and
the test exited 0 (no rank died) within --timeout (a test file without asserts passes by
exiting 0); on a timeout the whole process group
is terminated (SIGTERM, then SIGKILL to what is still running 30 s later) so no rank is
left behind. See README.md.
"""
import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
SHIM = HERE / "shim"
sys.path.insert(0, str(SHIM))
import rewrite  # noqa: E402


class Source:
    """DeepEP's files from a bare git directory (or a work tree's .git) at `rev`, or a plain
    checkout directory."""

    def __init__(self, path, rev):
        self.path, self.rev = Path(path), rev
        self.git = None
        if (self.path / "HEAD").is_file() and (self.path / "objects").is_dir():
            self.git = self.path
        elif (self.path / ".git").exists() and rev != "WORKTREE":
            self.git = self.path / ".git"
        if self.git is None and not (self.path / "deep_ep").is_dir():
            raise SystemExit(f"--deepep {path}: neither a git directory nor a DeepEP checkout")

    def _git(self, *args):
        return subprocess.run(["git", f"--git-dir={self.git}", *args], check=True, capture_output=True).stdout

    def list_py(self, folder):
        if self.git is not None:
            out = self._git("ls-tree", "--name-only", f"{self.rev}:{folder}").decode().split()
            return [f"{folder}/{n}" for n in out if n.endswith(".py")]
        return [f"{folder}/{p.name}" for p in sorted((self.path / folder).glob("*.py"))]

    def read(self, rel):
        if self.git is not None:
            return self._git("show", f"{self.rev}:{rel}").decode()
        return (self.path / rel).read_text()

    def describe(self):
        if self.git is not None:
            return f"{self.git} at {self._git('rev-parse', self.rev).decode().strip()}"
        return str(self.path)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def apply_patches(text, rel, patches):
    """The test file's text with each `OLD=>NEW` replacement made; each OLD must occur exactly
    once, and neither side may hold a newline (DeepEP's line numbers stay)."""
    for p in patches:
        if "=>" not in p:
            raise SystemExit(f"--patch {p!r}: expected OLD=>NEW")
        old, new = p.split("=>", 1)
        if "\n" in old or "\n" in new:
            raise SystemExit(f"--patch {p!r}: one line only (the line numbers must stay DeepEP's)")
        n = text.count(old)
        if n != 1:
            raise SystemExit(f"--patch {p!r}: {old!r} occurs {n} times in {rel}, not once")
        text = text.replace(old, new)
    return text


def build_tree(src, test, tmp, patches=()):
    """The temporary tree: site/ (PYTHONPATH: sitecustomize, epx_deepep_shim, deep_ep) and the
    test's folder with its asserts rewritten. Returns (the test file's path there, its number
    of asserts)."""
    site = tmp / "site"
    pkg = site / "deep_ep"
    (pkg / "utils").mkdir(parents=True)
    shim_pkg = site / "epx_deepep_shim"
    shim_pkg.mkdir()
    for name in ("cpu_device.py", "checks.py", "fp8.py", "timing.py"):
        shutil.copy(SHIM / name, shim_pkg / name)
    (shim_pkg / "__init__.py").write_text("")
    shutil.copy(SHIM / "sitecustomize.py", site / "sitecustomize.py")
    shutil.copy(SHIM / "deep_ep_init.py", pkg / "__init__.py")
    shutil.copy(SHIM / "_C.py", pkg / "_C.py")
    for rel in src.list_py("deep_ep/utils"):
        (pkg / "utils" / Path(rel).name).write_text(src.read(rel))
    folder = str(Path(test).parent)
    n_asserts = 0
    for rel in src.list_py(folder):
        text = src.read(rel)
        if rel == test and patches:
            text = apply_patches(text, rel, patches)
        out, n = rewrite.rewrite(text, rel)
        if rel == test:
            n_asserts = n
        dst = tmp / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_text(out)
    path = tmp / test
    if not path.is_file():
        raise SystemExit(f"--test {test}: not in {src.describe()}")
    return path, n_asserts


def shm_entries():
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


def run(cmd, env, cwd, timeout):
    """(exit code or None on timeout, seconds)."""
    t0 = time.time()
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, start_new_session=True)
    try:
        return proc.wait(timeout=timeout), time.time() - t0
    except KeyboardInterrupt:
        _kill_group(proc)
        raise
    except subprocess.TimeoutExpired:
        print(f"[run_deepep] timeout after {timeout} s: terminating the test's process group", flush=True)
        _kill_group(proc)
        return None, time.time() - t0


def _group_members(pgid):
    """(pid, command line) of the live processes of process group `pgid` (from /proc)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[2]) != pgid or fields[0] == "Z":
                continue
            cmd = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            out.append((int(d), cmd))
        except (OSError, ValueError, IndexError):
            continue
    return out


def _kill_group(proc):
    """SIGTERM to the test's process group (its ranks included), then SIGKILL to what is left
    after a grace period. The grace lets the helpers that clean up after the ranks finish:
    multiprocessing's resource tracker (unlinks the ranks' semaphores) and epx's janitors
    (unlink /dev/shm segments) ignore SIGTERM and exit once the ranks are gone."""
    pgid = proc.pid  # start_new_session: the group is the test process's own
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.time() + 30
    while time.time() < deadline and _group_members(pgid):
        time.sleep(0.2)
    left = _group_members(pgid)
    if left:
        print("[run_deepep] still running 30 s after SIGTERM, killed: "
              + "; ".join(f"{pid} {cmd[:100]}" for pid, cmd in left), flush=True)
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def summarize(checks_dir, test, num_failures_shown):
    per_rank, failures = {}, []
    for f in sorted(checks_dir.glob("*.jsonl")):
        for line in f.read_text().splitlines():
            try:
                e = json.loads(line)
            except json.JSONDecodeError:
                continue
            r = per_rank.setdefault(str(e["rank"]), [0, 0])
            r[1] += 1
            if e["ok"]:
                r[0] += 1
            else:
                failures.append(e)
    key = lambda r: (0, int(r)) if r.isdigit() else (1, r)  # noqa: E731
    for r in sorted(per_rank, key=key):
        ok, total = per_rank[r]
        print(f"[run_deepep] rank {r}: {ok} of {total} checks passed")
    ok = sum(v[0] for v in per_rank.values())
    total = sum(v[1] for v in per_rank.values())
    print(f"[run_deepep] {test}: {ok} of {total} checks passed")
    if failures:
        where = Counter(e["where"] for e in failures)
        print("[run_deepep] failed checks by place: " + ", ".join(f"{w} x{n}" for w, n in where.most_common()))
        seen = set()
        shown = 0
        for e in failures:
            if e["where"] in seen:
                continue
            seen.add(e["where"])
            msg = " ".join(str(e.get("message") or "").split())
            msg = msg if len(msg) <= 300 else msg[:300] + " ..."
            print(f"[run_deepep]   {e['where']} (rank {e['rank']}): assert {e.get('source', '')}"
                  + (f" -- {msg}" if msg else ""))
            shown += 1
            if shown >= num_failures_shown:
                break
    return ok, total


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    test_args = []
    if "--" in argv:
        i = argv.index("--")
        argv, test_args = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--deepep", required=True, help="DeepEP: a bare git directory (or a work tree), or a checkout")
    ap.add_argument("--rev", default="HEAD", help="git revision to read (default HEAD)")
    ap.add_argument("--test", required=True, help="the test file, relative to DeepEP's root")
    ap.add_argument("--keep-going", action="store_true", help="record failed checks and go on")
    ap.add_argument("--timeout", type=float, default=900, help="seconds before the whole run is killed")
    ap.add_argument("--epx-path", default=str(REPO / "build" / "python"), help="where `import epx` comes from")
    ap.add_argument("--show-failures", type=int, default=8, help="how many distinct failed checks to print")
    ap.add_argument("--patch", action="append", default=[], metavar="OLD=>NEW",
                    help="replace text of the test file (once, one line) before it runs: only for sizes the test "
                         "hard-codes (test_agrs.py's); printed with the results")
    ap.add_argument("--keep-tmp", action="store_true", help="leave the temporary directory (prints its path)")
    args = ap.parse_args(argv)

    src = Source(args.deepep, args.rev)
    shm_before = shm_entries()
    tmp = Path(tempfile.mkdtemp(prefix="epx-deepep-"))
    try:
        test_path, n_asserts = build_tree(src, args.test, tmp, args.patch)
        checks_dir = tmp / "checks"
        checks_dir.mkdir()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tmp / "site"), args.epx_path, env.get("PYTHONPATH"))
                                            if p)
        env.update({"EPX_DEEPEP_SHIM": "1", "EPX_DEEPEP_CHECKS_DIR": str(checks_dir),
                    "EPX_DEEPEP_KEEP_GOING": "1" if args.keep_going else "0",
                    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
                    "PYTHONDONTWRITEBYTECODE": "1"})
        env.setdefault("OMP_NUM_THREADS", "1")
        env.pop("WORLD_SIZE", None)
        env.pop("RANK", None)
        print(f"[run_deepep] {args.test} from {src.describe()} ({n_asserts} asserts in it counted), "
              f"args: {' '.join(test_args) or '(defaults)'}", flush=True)
        for p in args.patch:
            print(f"[run_deepep] patched in {args.test}: {p}", flush=True)
        code, secs = run([sys.executable, str(test_path), *test_args], env, str(test_path.parent), args.timeout)
        print("[run_deepep] the test " + ("timed out" if code is None else f"exited with {code}")
              + f" after {secs:.0f} s", flush=True)
        ok, total = summarize(checks_dir, args.test, args.show_failures)
    finally:
        if args.keep_tmp:
            print(f"[run_deepep] kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    time.sleep(0.5)  # epx's janitors unlink a killed rank's segments as it exits
    left = sorted(n for n in shm_entries() - shm_before if n.startswith(("epx", "sem.mp-")))
    if left:
        print(f"[run_deepep] warning: /dev/shm entries new since the start (this run's, or another job's): {left}")
    # a test without asserts (test_barrier.py) passes by exiting 0; one with asserts must run some
    failed = code != 0 or ok != total or (total == 0 and n_asserts > 0)
    patched = f" ({len(args.patch)} patch{'es' if len(args.patch) > 1 else ''} to the test)" if args.patch else ""
    print(f"[run_deepep] {'FAILED' if failed else 'PASSED'}: {ok} of {total} checks passed, "
          + ("timeout" if code is None else f"exit code {code}") + patched, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
