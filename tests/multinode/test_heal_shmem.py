# Healing from Python on the OpenSHMEM transport: 2 network-namespace "machines"
# (tests/multinode/machines.py) x 2 PEs started by oshrun with Open MPI told to let survivors
# live (--mca orte_abort_on_non_zero_status 0), each PE a Python process running
# tests/multinode/heal_shmem_rank.py: its EPBuffer and BucketBuffer on the default
# torch.distributed group take the "auto" transport, OpenSHMEM; rank 3 (machine 1) SIGKILLs
# itself between a dispatch and its combine; the 3 survivors get a peer loss, epx.agree_and_rebuild
# rebuilds the group over the shmem transport, and they go on bit for bit (live replicas of
# a redundant-slot mapping against epx_ref, all_reduce against a float32 sum, Group.sum).
# Then every survivor's interpreter exits normally and that ends the job: oshrun returns by
# itself with the killed rank's status (137), no survivor timed out in the exit's last
# barrier, no process is left in either namespace, neither machine's /dev/shm keeps an
# entry, no namespace is left.
#
#   /usr/bin/python3 -m pytest -q tests/multinode/test_heal_shmem.py      (root; ~30-60 s)
#
# The epx package comes from build/python, or from EPX_TORCHRUN_PYTHONPATH (another build
# directory's python/), as in test_elastic_ucx.py. Skips only when namespaces cannot be made
# (not root, no ip / unshare), oshrun is missing or the build has no OpenSHMEM transport.
# A second test (no root) checks the refusal of a transport that cannot heal.
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
PYTHON = "/usr/bin/python3"
PORT = 29533        # the TCPStore of rank 0, on machine 0 (10.201.0.1)
P0, VICTIM = 4, 3
# The group's timeout (s): above UCX's keepalive (1 s; a shmem_quiet with puts to the dead
# PE returns once UCX declares that endpoint dead), as tests/multinode/run.sh's heal cases.
TIMEOUT = 8
LIMIT = 180         # the whole job, seconds


def _pythonpath():
    return os.environ.get("EPX_TORCHRUN_PYTHONPATH") or os.path.join(REPO, "build", "python")


def _why_not():
    """None when the job can run, else why not (the only reasons to skip)."""
    sys.path.insert(0, HERE)
    import torchrun
    why = torchrun.available()
    if why:
        return why
    if shutil.which("oshrun") is None:
        return "no oshrun (apt-get install openmpi-bin libopenmpi-dev)"
    libs = glob.glob(os.path.join(_pythonpath(), "epx", "_epx*.so"))
    assert libs, f"no epx module in {_pythonpath()} (build the _epx target)"
    ldd = subprocess.run(["ldd", libs[0]], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    if "liboshmem" not in ldd.stdout:
        return f"{libs[0]} has no OpenSHMEM transport (not linked to liboshmem)"
    return None


def _flags(out_dir):
    """tests/multinode/run.sh's `heal_flags` on this file's machines (10.201.0.0/24)."""
    net = "10.201.0.0/24"
    return ["--allow-run-as-root", "--oversubscribe",
            "--mca", "spml", "ucx", "--mca", "osc", "ucx", "--mca", "pml", "ucx",
            "--mca", "opal_common_ucx_tls", "any", "--mca", "opal_common_ucx_devices", "any",
            "--mca", "plm_rsh_agent", os.path.join(HERE, "agent.sh"), "--mca", "oob_tcp_if_include", net,
            "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", net,
            "--mca", "oob_tcp_keepalive_time", "3", "--mca", "oob_tcp_keepalive_intvl", "1",
            "--mca", "oob_tcp_keepalive_probes", "2",
            "-x", "UCX_TLS=tcp,sysv,posix,self", "-x", "UCX_NET_DEVICES=eth1", "-x", "UCX_KEEPALIVE_INTERVAL=1s",
            "-x", "UCX_TCP_KEEPIDLE=1s", "-x", "UCX_TCP_KEEPINTVL=1s", "-x", "UCX_TCP_KEEPCNT=2",
            "--mca", "orte_abort_on_non_zero_status", "0", "-x", "EPX_SHMEM_ELASTIC_RESERVE=4M",
            "-x", f"EPX_MN_LOG={out_dir}", "-x", f"PYTHONPATH={_pythonpath()}", "-x", "PYTHONUNBUFFERED=1",
            "-x", "GLOO_SOCKET_IFNAME=eth1", "-x", f"EPX_HS_STORE=10.201.0.1:{PORT}", "-x", f"EPX_HS_OUT={out_dir}",
            "-x", f"EPX_HS_TIMEOUT={TIMEOUT}"]


def _epx_processes(names):
    """pid: command line of every process left in the machines."""
    import machines
    left = {}
    for ns in names:
        for p in machines.sh("ip", "netns", "pids", ns, check=False).stdout.split():
            left[p] = machines.read_text(f"/proc/{p}/cmdline").replace("\0", " ")
    return left


def run_job(m, out_dir):
    """oshrun over the two machines (from machine 0); (exit code, seconds, oshrun's output,
    the processes left in the machines just after it returned)."""
    hosts = os.path.join(out_dir, "hosts")
    with open(hosts, "w") as f:
        f.write("".join(f"{ns} slots=2\n" for ns in m.ns))
    cmd = ["timeout", "-k", "5", str(LIMIT), "ip", "netns", "exec", m.ns[0], "oshrun"] + _flags(out_dir) + [
        "--hostfile", hosts, "-np", str(P0), PYTHON, "-u", os.path.join(HERE, "heal_shmem_rank.py")]
    t0 = time.monotonic()
    with open(os.path.join(out_dir, "oshrun.txt"), "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True).returncode
    took = time.monotonic() - t0
    time.sleep(1)  # the daemons' last exits
    import machines
    return rc, took, machines.read_text(os.path.join(out_dir, "oshrun.txt")), _epx_processes(m.ns)


def check(rc, took, left, outs, shm, text):
    """Every assertion on one job."""
    assert rc != 124 and took < LIMIT - 1, f"the job did not end by itself ({took:.0f} s)\n{text}"
    # the survivors exit 0 and rank 0 ends the job; oshrun reports the killed rank's status
    assert rc == 128 + signal.SIGKILL, f"oshrun exited {rc}, not {128 + signal.SIGKILL} (the killed rank's)\n{text}"
    # every survivor reached the end: none timed out in the exit's last barrier
    assert "at exit the survivors' last barrier timed out" not in text, text
    assert not left, f"processes left in the machines: {left}\n{text}"
    assert not shm, f"left in the machines' /dev/shm: {shm}\n{text}"

    def find(r, key):
        return [d for d in outs[r] if key in d]

    for r in range(P0):
        assert find(r, "transport") and find(r, "transport")[0]["transport"] == "shmem", text
    assert [(d["stage"], d["pair"]) for d in find(VICTIM, "stage")] == [(0, 0)], text
    assert not find(VICTIM, "loss"), text
    named = 0
    totals = []
    for r in (0, 1, 2):
        assert [(d["stage"], d["pair"]) for d in find(r, "stage")] == [(0, 0), (1, 0), (1, 1)], text
        loss = find(r, "loss")
        assert len(loss) == 1, text
        # a peer loss naming the victim — or a survivor it waited for, which had left the call
        # on the victim's death (a timeout naming that survivor)
        assert loss[0]["loss"] in ("peer_failed", "timeout"), text
        assert loss[0]["origin"] in (0, 1, 2, VICTIM) and loss[0]["origin"] != r, text
        assert f"rank {loss[0]['origin']} " in loss[0]["message"], text
        named += loss[0]["origin"] == VICTIM
        rb = find(r, "rebuilt")
        assert rb, text
        rb = rb[0]
        assert (rb["rank"], rb["size"], rb["survivors"], rb["lost"], rb["original_lost"], rb["original_ranks"],
                rb["round"]) == (r, 3, [0, 1, 2], [VICTIM], [VICTIM], [0, 1, 2], 1), text
        # a survivor may wait for one still in a shmem_quiet towards the victim (its watchdog
        # allows that 2 x the timeout)
        assert rb["rebuilt"] < 2 * TIMEOUT, f"rank {r}: the agreement and rebuild took {rb['rebuilt']} s\n{text}"
        totals.append([d["dropped"] for d in find(r, "stage") if d["stage"] == 1])
        assert find(r, "exiting"), text
    assert named >= 1, f"no survivor named rank {VICTIM}\n{text}"
    # expert 7 (the victim's) has no replica: its pairs were dropped and counted alike everywhere
    assert totals[0] == totals[1] == totals[2] and all(t[0] > 0 for t in totals[0]), (totals, text)


def test_shmem_group_heals_from_python_and_the_job_ends_by_itself():
    why = _why_not()
    if why:
        pytest.skip(why)
    import machines
    out_dir = tempfile.mkdtemp(prefix="epx-heal-shmem-")
    m = machines.Machines(2)
    try:
        rc, took, log, left = run_job(m, out_dir)
        outs = {r: machines.json_lines(os.path.join(out_dir, f"rank{r}.jsonl")) for r in range(P0)}
        shm = {os.path.basename(p): machines.read_text(p).split() for p in glob.glob(os.path.join(out_dir, "shm-*"))}
        shm = {k: v for k, v in shm.items() if v}
        log = "\n".join(ln for ln in log.splitlines() if "flush.c" not in ln)  # UCX's noise about the dead PE
        text = (f"oshrun exit {rc} after {took:.1f} s\n== oshrun:\n{log[-6000:]}\n"
                + "".join(f"== rank {r}:\n{json.dumps(outs[r])[-3000:]}\n" for r in range(P0)))
        check(rc, took, left, outs, shm, text)
        losses = [(d["loss"], d["origin"]) for r in (0, 1, 2) for d in outs[r] if "loss" in d]
        rebuilt = [d["rebuilt"] for r in (0, 1, 2) for d in outs[r] if "rebuilt" in d]
        print(f"oshrun exit {rc} after {took:.1f} s; losses {losses}; agreement + rebuild (s) {rebuilt}")
    finally:
        for p in _epx_processes(m.ns):  # only what runs inside this test's machines
            try:
                os.kill(int(p), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        names = list(m.ns)
        m.remove()
        shutil.rmtree(out_dir, ignore_errors=True)
    netns = machines.sh("ip", "netns", "list").stdout.split()
    assert not [ns for ns in names if ns in netns], "namespaces left"


def test_agree_and_rebuild_refuses_a_transport_that_cannot_heal(monkeypatch):
    # Python makes no threads or sim transport itself; a group over one is refused by name
    # before anything waits (here a stand-in with the transport's name and place).
    monkeypatch.syspath_prepend(_pythonpath())
    import epx
    from epx.heal import Group

    class Threads:
        name, rank, num_ranks = "threads", 1, 2

    group = Group._of(Threads(), [0, 1], [], 1, 2, [0, 1], [])
    with pytest.raises(epx.Error) as e:
        epx.agree_and_rebuild(group)
    assert e.value.code == "unsupported" and e.value.origin_rank == 1, e.value
    assert "rank 1: agree_and_rebuild: the threads transport cannot heal" in str(e.value), e.value
