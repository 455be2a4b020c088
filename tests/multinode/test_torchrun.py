# torchrun across two network-namespace "machines" (tests/multinode/torchrun.py), 2 x 2 ranks:
# dist_smoke.py on gloo and on epx (its UCX transport between the machines: every result
# checked against the program's own reference, bytes seen crossing the veth), a rank killed
# on the other machine and the link cut mid-run (every survivor exits non-zero within the
# group's timeout naming a peer and its machine), and the end-to-end programs of
# tests/python/dist_programs/ on epx when they exist.
#
#   /usr/bin/python3 -m pytest -q tests/multinode/test_torchrun.py      (root; 5-8 min on a loaded
#   2-core box: each test is a torchrun job of its own, ~30 s of it starting torch on 4 ranks)
#
# Skips only without root or ip / unshare. The epx package comes from build/python, or from
# EPX_TORCHRUN_PYTHONPATH (another build directory's python/).
import os
import re

import pytest

import torchrun

HERE = os.path.dirname(os.path.abspath(__file__))
SMOKE = os.path.join(HERE, "dist_smoke.py")
PROGRAMS = os.path.join(HERE, "..", "python", "dist_programs")
E2E = ["ddp_train.py", "moe_layer.py", "pipeline.py"]
NPROC = 2
ELEMENTS = 1 << 18  # all_reduce of 1 MiB: at least that many bytes must cross each way
GROUP_TIMEOUT = 15  # the process group's timeout in the fault runs, seconds
# Rounds of the mixed runs: each moves 5-20 MB per pair of ranks (about 50 MB out of each
# machine), which on a loaded 2-core box crosses the veth at 10-25 MB/s (the receiving ranks
# get little CPU): 30 rounds took over 120 s there, and one 4 MiB message over 20 s.
MIXED = 8

why = torchrun.available()
pytestmark = pytest.mark.skipif(why is not None, reason=why or "")


def _env():
    path = os.environ.get("EPX_TORCHRUN_PYTHONPATH") or os.path.join(torchrun.REPO, "build", "python")
    return {"PYTHONPATH": path}


@pytest.fixture
def cluster():
    # Nothing of a run can reach the host's /dev/shm (each machine mounts its own tmpfs there,
    # or the run fails); what a run leaves in a machine's is run.shm_left.
    with torchrun.Cluster(2) as c:
        yield c
    netns = torchrun.machines.sh("ip", "netns", "list").stdout.split()
    assert not [ns for ns in c.names if ns in netns], "namespaces left"
    assert not os.path.exists(c.dir), "the run's directory left"


def _smoke_ok(run, backend):
    assert run.ok, run.text()
    assert sorted(w.rank for w in run.workers) == list(range(2 * NPROC)), run.text()
    for w in run.workers:
        assert w.rc == 0, run.text()
        want = f"rank {w.rank} of {2 * NPROC} on {run.names[w.machine]}: 5 checks passed (backend {backend}"
        assert want in w.stdout, run.text()
        if backend == "epx":  # the two machines' ranks are connected by UCX
            assert "transport ucx)" in w.stdout, run.text()
    for i in range(2):  # each machine holds NPROC ranks, and an all_reduce's worth crossed each way
        assert sum(w.machine == i for w in run.workers) == NPROC, run.text()
        assert run.tx[i] >= ELEMENTS * 4, run.text()
        assert run.shm_left[i] == [], run.text()


def test_gloo_smoke_across_machines(cluster):
    run = cluster.torchrun(SMOKE, ["--backend", "gloo", "--elements", ELEMENTS], nproc=NPROC, timeout=120,
                           env=_env())
    _smoke_ok(run, "gloo")


def test_epx_smoke_across_machines(cluster):
    run = cluster.torchrun(SMOKE, ["--backend", "epx", "--elements", ELEMENTS], nproc=NPROC, timeout=120,
                           env=_env())
    _smoke_ok(run, "epx")


def test_gloo_mixed_across_machines(cluster):
    """The reference for the next test: the same rounds with gloo underneath."""
    run = cluster.torchrun(SMOKE, ["--backend", "gloo", "--mixed", MIXED, "--timeout", 60], nproc=NPROC, timeout=150,
                           env=_env())
    assert run.ok, run.text()
    assert all(f"{MIXED} rounds of all_to_all_single then a gloo barrier ok" in w.stdout for w in run.workers), run.text()


# A rank that returned from an epx call and then waits in gloo (or the application) must not
# leave a peer unable to complete its puts to it: the ucx transport progresses in the background.
def test_epx_then_gloo_barrier_across_machines(cluster):
    run = cluster.torchrun(SMOKE, ["--backend", "epx", "--mixed", MIXED, "--timeout", 60], nproc=NPROC, timeout=150,
                           env=_env())
    assert run.ok, run.text()
    assert all(f"{MIXED} rounds of all_to_all_single then a gloo barrier ok" in w.stdout for w in run.workers), run.text()


def _fault_run(cluster, kind):
    fault = torchrun.Fault(kind, machine=1, when=r"iteration 3\b")
    # The agents check their workers every 30 s: a survivor on the victim's machine must fail
    # by itself (epx's error), not be stopped by its agent first.
    run = cluster.torchrun(SMOKE, ["--backend", "epx", "--elements", 1 << 14, "--loop", 60, "--timeout", GROUP_TIMEOUT],
                           nproc=NPROC, timeout=120, env=_env(), fault=fault, monitor_interval=30, agent_grace=5)
    assert fault.done_at is not None, run.text()
    assert not run.timed_out, run.text()
    assert all(rc != 0 for rc in run.rc), run.text()  # torchrun fails on both machines
    return run, fault


def _names_peer(w, run, gone):
    """w's failure line names a rank it lost and that rank's machine ('NAME' after it): one of
    `gone` (the victim, or the other machine's ranks on a cut link) or a rank that had already
    ended before w (a survivor may first meet a peer that failed before it)."""
    lines = [ln for ln in w.stderr.splitlines() if ln.startswith(f"dist_smoke: rank {w.rank} on ") and "FAILED" in ln]
    assert lines, f"rank {w.rank} printed no failure\n{run.text()}"
    line = lines[0].split("FAILED", 1)[1]
    earlier = {v.rank for v in run.workers if v.ended is not None and v.ended < w.ended}
    named = [(int(r), m) for r, m in re.findall(r"(?=\brank (\d+)\b[^'\n]{0,40}'([^']+)')", line)]
    good = [(r, m) for r, m in named if (r in gone or r in earlier) and run.worker(r) is not None
            and m == run.names[run.worker(r).machine]]
    assert good, f"rank {w.rank} names no lost peer with its machine (lost: {sorted(gone)}, ended before it: " \
                 f"{sorted(earlier)}): {lines[0]}"


def test_epx_killed_rank_on_the_other_machine(cluster):
    run, fault = _fault_run(cluster, "kill")
    victim = fault.victim
    assert run.worker(victim).machine == 1, run.text()
    assert run.worker(victim).rc != 0, run.text()
    survivors = [w for w in run.workers if w.rank != victim]
    assert len(survivors) == 2 * NPROC - 1, run.text()
    for w in survivors:
        assert w.rc not in (0, None), run.text()
        assert w.ended < fault.done_at + GROUP_TIMEOUT + 10, f"rank {w.rank} ended at {w.ended:.1f} s\n{run.text()}"
        _names_peer(w, run, {victim})


def test_epx_cut_link(cluster):
    run, fault = _fault_run(cluster, "cut")
    assert len(run.workers) == 2 * NPROC, run.text()
    for w in run.workers:
        other = 1 - w.machine
        assert w.rc not in (0, None), run.text()
        assert w.ended < fault.done_at + GROUP_TIMEOUT + 10, f"rank {w.rank} ended at {w.ended:.1f} s\n{run.text()}"
        _names_peer(w, run, {v.rank for v in run.workers if v.machine == other})


_PRESENT = [p for p in E2E if os.path.exists(os.path.join(PROGRAMS, p))]
if _PRESENT:  # only the programs that exist (no test, rather than a skip, for the others)
    @pytest.mark.parametrize("program", _PRESENT)
    def test_e2e_program_on_epx_across_machines(cluster, program):
        run = cluster.torchrun(os.path.join(PROGRAMS, program), ["--backend", "epx", "--timeout", 60], nproc=NPROC,
                               timeout=240, env=_env())
        assert run.ok, run.text()
        assert len(run.workers) == 2 * NPROC and all(w.rc == 0 for w in run.workers), run.text()
        assert all(t > 64 << 10 for t in run.tx), run.text()
        assert run.shm_left == [[], []], run.text()
