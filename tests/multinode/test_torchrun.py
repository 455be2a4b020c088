# torchrun across two network-namespace "machines" (tests/multinode/torchrun.py), 2 x 2 ranks,
# the epx backend with its UCX transport between the machines, five torchrun jobs:
#   * dist_smoke.py: every result checked against the program's own reference, then rounds of
#     all_to_all_single each followed by a gloo barrier (a rank waiting outside epx must not
#     leave a peer unable to complete its puts to it), bytes seen crossing the veth;
#   * buffers_smoke.py: EPBuffer, BucketBuffer, PPBuffer and EngramBuffer on the job's default
#     group, every call checked against the program's own reference, bytes seen crossing;
#   * the end-to-end programs of tests/python/dist_programs/ in one job (all_programs.py): DDP
#     against gloo, a Megatron-style MoE layer forward and backward against one process, a
#     2-stage pipeline's send/recv against the unsplit model;
#   * a rank killed on the other machine, and the link cut, mid-run: every survivor exits
#     non-zero within the group's timeout naming a peer and its machine.
# The same programs on gloo, one machine, are tests/python/test_distributed_e2e.py's.
#
#   /usr/bin/python3 -m pytest -q tests/multinode/test_torchrun.py      (root; 2-4 min on a
#   loaded 2-core box, most of it torch starting on 4 ranks per job)
#
# Needs root, ip and unshare: without them it fails (it never skips). The epx package comes
# from build/python, or from EPX_TORCHRUN_PYTHONPATH (another build directory's python/).
import os
import re

import pytest

import torchrun

HERE = os.path.dirname(os.path.abspath(__file__))
SMOKE = os.path.join(HERE, "dist_smoke.py")
PROGRAMS = os.path.join(HERE, "..", "python", "dist_programs")
NPROC = 2
ELEMENTS = 1 << 18  # all_reduce of 1 MiB: at least that many bytes must cross each way
GROUP_TIMEOUT = 15  # the process group's timeout in the fault runs, seconds
# Rounds of the mixed pattern: each moves 5-20 MB per pair of ranks, 59 MB out of each machine
# (the rows of dist_smoke's mixed(): 12 x 300 rows of 4096 float32 cross each way), which on a
# loaded 2-core box crosses the veth at 10-25 MB/s.
MIXED = 6
MIXED_BYTES = MIXED * 12 * 300 * 4096 * 4


def test_can_make_machines():
    """The reasons the tests below cannot run are a failure here, not a skip."""
    assert torchrun.available() is None, torchrun.available()


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


def test_epx_smoke_and_mixed_rounds_across_machines(cluster):
    run = cluster.torchrun(SMOKE, ["--backend", "epx", "--elements", ELEMENTS, "--mixed", MIXED, "--timeout", 60],
                           nproc=NPROC, timeout=240, env=_env())
    assert run.ok, run.text()
    assert sorted(w.rank for w in run.workers) == list(range(2 * NPROC)), run.text()
    for w in run.workers:
        assert w.rc == 0, run.text()
        assert f"rank {w.rank}: {MIXED} rounds of all_to_all_single then a gloo barrier ok" in w.stdout, run.text()
        # the two machines' ranks are connected by UCX
        want = f"rank {w.rank} of {2 * NPROC} on {run.names[w.machine]}: 6 checks passed (backend epx, transport ucx)"
        assert want in w.stdout, run.text()
    for i in range(2):  # each machine holds NPROC ranks, and the rounds' bytes crossed each way
        assert sum(w.machine == i for w in run.workers) == NPROC, run.text()
        assert run.tx[i] >= MIXED_BYTES, run.text()
        assert run.shm_left[i] == [], run.text()


BUFFERS = os.path.join(HERE, "buffers_smoke.py")
# buffers_smoke.py's PPBuffer messages (float32 elements) that go to the other machine: from
# each machine one rank's ring send and both ranks' sends P/2 away, at least these bytes each way.
PP_SIZES = (5, 4096, 70001)
PP_CROSS_BYTES = 3 * 4 * sum(PP_SIZES)


def test_four_buffer_kinds_across_machines(cluster):
    """EPBuffer, BucketBuffer, PPBuffer and EngramBuffer built on torchrun's default group
    (backend epx), their ranks on two machines: every call checked against the program's own
    reference on every rank, over UCX, remote Engram rows read by one-sided gets."""
    run = cluster.torchrun(BUFFERS, ["--backend", "epx", "--timeout", 60], nproc=NPROC, timeout=240, env=_env())
    assert run.ok, run.text()
    assert sorted(w.rank for w in run.workers) == list(range(2 * NPROC)), run.text()
    for w in run.workers:
        assert w.rc == 0, run.text()
        # ep: compact and expanded; bucket: 3 calls on the world and on the pair across machines;
        # pp: 3 messages around the ring and 3 to the other machine; engram: 2 layers and the stats
        want = (f"buffers_smoke: OK rank {w.rank} of {2 * NPROC} on {run.names[w.machine]}: 17 checks "
                f"(ep 2, bucket 6, pp 6, engram 3; transport ucx, engram path get)")
        assert want in w.stdout, run.text()
        assert f"rank {w.rank}: bucket all_reduce ranks [{w.rank % NPROC}, {w.rank % NPROC + NPROC}] (scale 0.5) ok" \
            in w.stdout, run.text()
    for i in range(2):
        assert sum(w.machine == i for w in run.workers) == NPROC, run.text()
        assert run.tx[i] >= PP_CROSS_BYTES, run.text()
        assert run.shm_left[i] == [], run.text()


def test_e2e_programs_on_epx_across_machines(cluster):
    run = cluster.torchrun(os.path.join(PROGRAMS, "all_programs.py"), ["--backend", "epx", "--timeout", 60],
                           nproc=NPROC, timeout=240, env=_env())
    assert run.ok, run.text()
    assert len(run.workers) == 2 * NPROC and all(w.rc == 0 for w in run.workers), run.text()
    out = run.worker(0).stdout
    for line in (f"ddp_train: OK 28 checks; backend epx, {2 * NPROC} ranks, 8 DDP steps",
                 f"moe_layer: OK 24 checks; backend epx, {2 * NPROC} ranks, {4 * NPROC} experts top-2",
                 f"pipeline: OK 8 checks; backend epx, {2 * NPROC} ranks = {NPROC} pipelines x 2 stages"):
        assert line in out, run.text()
    assert all(t > 1 << 20 for t in run.tx), run.text()
    assert run.shm_left == [[], []], run.text()


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
