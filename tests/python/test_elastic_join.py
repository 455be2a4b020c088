"""Ranks joining a running group from Python (epx.heal.open_door / request_ranks / admit /
join; docs/reliability.md "Joins").

epx.launch(elastic=True), 4 ranks: rank 3 SIGKILLs itself inside a dispatch, the 3 survivors
rebuild (agree_and_rebuild) and go on, rank 0 asks for a replacement (request_ranks forks it;
it joins through the door), every member admits it and the 4 go on; then a second joiner
dies while joining (killed in the admission): admit returns None on every member and the
same 4-rank group and buffers go on. Every dispatch / combine before, between and after is
checked bit for bit against epx_ref's reference of the routing over the live ranks (each
group of n ranks routes to its n * L experts).

A torch.distributed group of 3 processes over a TCPStore that the test holds grows to 4: a
process the test starts later reads the door's name from the store and joins.

Nothing is left in /dev/shm, no process is left."""
import multiprocessing as mp
import os
import signal
import threading

import epx
import epx.heal as heal
from epx_cases import checked_pair, run_ranks, segments_left, shm_segments, wait_until_dead

L, H, K = 2, 128, 3
TOKENS = [6, 5, 7, 4]
TIMEOUT = 10
PAIRS = 2


def run_pair(ep, n, me, stage, j):
    """One dispatch / combine over a group of n ranks (this one: me), bit for bit against
    the reference of the routing over those n ranks; odd pairs in the expanded layout."""
    checked_pair(ep, n, me, L, K, H, TOKENS, 1000 * stage + j, j % 2 == 1)


def _buffer(group, n):
    ep = epx.EPBuffer(group, num_max_tokens_per_rank=max(TOKENS), hidden=H, num_topk=K, num_experts=n * L,
                      num_cpu_timeout_secs=TIMEOUT)
    if group is not None:
        ep.barrier()
    return ep


def _after_growth(group, ep, log):
    """Stage 2 on the grown group, the failed admission (a joiner killed while joining), stage 3
    on the same group and buffer: every member, the joiner included."""
    for j in range(PAIRS):
        run_pair(ep, 4, group.rank, 2, j)
        log.append((2, j))
    if group.rank == 0:
        group.dead = heal.request_ranks(group, 1, _dying_joiner, env={"EPX_FAULT_INJECT": "5:elastic admit:KILL"})
    again = heal.admit(group, joiners=1, tag=3)
    assert again is None, f"rank {group.rank}: an admission whose joiner died stood: {again}"
    for j in range(PAIRS):  # the old group and its buffer, untouched
        run_pair(ep, 4, group.rank, 3, j)
        log.append((3, j))
    ep.destroy()
    group.barrier("after the pairs")
    heal.close_door(group)
    return log


def _joiner(group, pid_dir):
    with open(os.path.join(pid_dir, "joiner"), "w") as f:
        f.write(str(os.getpid()))
    a = group.admission
    assert (a["tag"], a["old_num_ranks"], a["joined"], a["new_rank"]) == (2, 3, 1, 3), a
    assert group.rank == 3 and group.size == 4 and group.original_ranks == (0, 1, 2, 4), group
    return _after_growth(group, _buffer(group, 4), [])


def _dying_joiner(group):
    raise AssertionError(f"the joiner that was to die while joining was admitted: {group}")


def _member(rank, n, pid_dir):
    with open(os.path.join(pid_dir, f"pid{rank}"), "w") as f:
        f.write(str(os.getpid()))
    ep = _buffer(None, 4)
    door = heal.open_door(None, seats=4)
    assert door.startswith("/epx-") and door.endswith("door"), door
    log = []
    try:
        for j in range(PAIRS):
            if j == 1:
                if rank == 3:  # dies inside the dispatch, where it waits for the others' rows
                    threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGKILL)).start()
                else:
                    wait_until_dead(pid_dir, 3)
            run_pair(ep, 4, rank, 0, j)
            log.append((0, j))
        raise AssertionError(f"rank {rank}: the death of rank 3 went unnoticed")
    except epx.Error as e:
        assert e.is_peer_loss, f"rank {rank}: {e.code}: {e}"
    assert log == [(0, 0)]
    group = heal.agree_and_rebuild(None, buffers=[ep])
    assert group.size == 3 and group.rank == rank and group.lost == (3,)
    ep = _buffer(group, 3)
    for j in range(PAIRS):
        run_pair(ep, 3, rank, 1, j)
        log.append((1, j))
    joiners = heal.request_ranks(group, 1, _joiner, pid_dir) if rank == 0 else []
    bigger = heal.admit(group, joiners=1, tag=2)
    assert bigger is not None and bigger.size == 4 and bigger.rank == rank, bigger
    assert bigger.admission["joined"] == 1 and bigger.original_ranks == (0, 1, 2, 4), bigger
    heal._destroy_quietly(ep)  # a buffer of the retired group
    group = bigger
    _after_growth(group, _buffer(group, 4), log)
    if rank != 0:
        return log, None, None
    joined = joiners[0].result(timeout_secs=120)
    try:
        group.dead[0].result(timeout_secs=120)
        died = None
    except epx.Error as e:
        died = (e.code, str(e))
    return log, joined, died


def test_a_lost_rank_is_replaced_and_a_joiner_dying_leaves_the_group_as_it_was(tmp_path):
    before = shm_segments()
    out = epx.launch(_member, 4, str(tmp_path), start_method="fork", timeout_secs=120, elastic=True)
    assert out.lost == [3] and out[3] is None
    want = [(0, 0)] + [(s, j) for s in (1, 2, 3) for j in range(PAIRS)]
    for r in range(3):
        assert out[r][0] == want, out[r][0]
    joined, died = out[0][1], out[0][2]
    assert joined == [(s, j) for s in (2, 3) for j in range(PAIRS)]
    assert died is not None and died[0] == "peer_failed" and "SIGKILL" in died[1], died
    with open(tmp_path / "joiner") as f:
        pid = int(f.read())
    assert not os.path.exists(f"/proc/{pid}"), "the joiner's process is left"
    assert not segments_left(before), f"left in /dev/shm: {segments_left(before, 0)}"
    assert not mp.active_children()


# ---- a torch.distributed group over a TCPStore grows by a process started later ------------

def _store(port, master=False):
    import datetime
    import torch.distributed as dist
    return dist.TCPStore("127.0.0.1", port, is_master=master, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=60))


def _torch_member(rank, port):
    import datetime
    import torch.distributed as dist
    store = _store(port)
    dist.init_process_group("gloo", store=dist.PrefixStore("pg", store), rank=rank, world_size=3,
                            timeout=datetime.timedelta(seconds=60))
    ep = _buffer(None, 3)
    heal.open_door(None, store=store)  # the raw store: the joiner reads the name there
    run_pair(ep, 3, rank, 0, 0)
    if rank == 0:
        heal.request_ranks(None, 1)  # one is coming: admit waits for it
    group = heal.admit(None, joiners=1, tag=7)
    assert group is not None and group.size == 4 and group.rank == rank and group.original_ranks == (0, 1, 2, 3)
    heal._destroy_quietly(ep)
    ep = _buffer(group, 4)
    for j in range(PAIRS):
        run_pair(ep, 4, rank, 1, j)
    ep.destroy()
    group.barrier("end")
    heal.close_door(group)


def _torch_joiner(port):
    group = heal.join(store=_store(port), timeout_secs=60)
    assert group is not None and group.rank == 3 and group.size == 4 and group.admission["tag"] == 7, group
    assert group.original_ranks == (0, 1, 2, 3), group
    ep = _buffer(group, 4)
    for j in range(PAIRS):
        run_pair(ep, 4, 3, 1, j)
    ep.destroy()
    group.barrier("end")
    heal.close_door(group)


def test_a_torch_group_grows_by_a_process_started_later():
    before = shm_segments()
    master = _store(0, master=True)
    # the joiner is started while the group runs
    results, exits = run_ranks([(r, _torch_member, (r, master.port)) for r in range(3)], 4, 150,
                               later=[(3, _torch_joiner, (master.port,))], delay=0.5)
    assert sorted(results) == [0, 1, 2, 3], results
    assert all(ok for ok, _ in results.values()), results
    assert exits == [0] * 4
    assert not segments_left(before), f"left in /dev/shm: {segments_left(before, 0)}"
    assert not mp.active_children()
