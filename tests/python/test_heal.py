"""Going on without a lost rank from Python (epx.agree_and_rebuild, docs/reliability.md "Elastic"):
4 ranks with an EPBuffer and a BucketBuffer on one group; rank 2 SIGKILLs itself inside a
dispatch; the 3 survivors get an epx.Error with is_peer_loss, agree, rebuild both buffers on
the new group and go on — dispatch / combine bit for bit against the numpy reference of the
routing over the live ranks (the lost rank's experts served by their redundant slots, or
dropped and counted, checked against a plain loop here), all_reduce against a float32 sum
over the survivors — then rank 1 dies too (3 -> 2). A buffer of the old group raises
bad_handle; a bad input is not a peer loss. Once with epx.launch(elastic=True), once with 4
processes of a torch.distributed group (file:// store) the test starts itself; a PPBuffer and
an EngramBuffer on the last group; a stopped rank left out after the timeout. Nothing is left in /dev/shm, no
process is left."""
import multiprocessing as mp
import os
import signal
import threading

import numpy as np
import pytest

import epx
from epx_cases import inputs, make_case, masked_pair, run_ranks, segments_left, shm_segments, wait_until_dead

P0, L, B, H, K = 4, 2, 2, 128, 3
E_LOG = P0 * L
# Rank d's redundant slots hold logical experts MAPPING[d] (-1 unused). Expert e's home is
# rank e // L. Rank 2 (home of 4, 5) dies first: 4 has replicas on ranks 0 and 3, 5 has none
# (dropped); rank 1 (home of 2, 3) dies next: 2 has a replica on rank 3, 3 none.
MAPPING = [[4, 6], [0, -1], [1, 7], [2, 4]]
TOKENS = [6, 5, 7, 4]
FAULTS = [2, 1]  # the victim of each stage, by its rank in the first group
PAIRS, KILL_PAIR = 3, 1
TIMEOUT = 10
NVALS = 1000


def values(orig, stage, pair):
    rng = np.random.default_rng(7919 * orig + 101 * stage + pair)
    return (rng.choice([-1.0, 1.0], NVALS) * np.ldexp(1.0 + rng.random(NVALS), rng.integers(-8, 9, NVALS))).astype(np.float32)


def _f32(bucket):
    s = bucket.storage
    return s[:4 * NVALS].view(np.float32) if isinstance(s, np.ndarray) else s[:4 * NVALS].view(__import__("torch").float32)


def run_pair(ep, bucket, group, stage, j, lost, orig):
    """One dispatch / combine of stage `stage`'s pair j and one all_reduce, checked bit for bit."""
    survivors = [r for r in range(P0) if r not in lost]
    logical = make_case(P0, E_LOG, K, H, TOKENS, seed=1000 * stage + j)
    masks, pairs, tokens = masked_pair(ep, group, logical, lost, orig, MAPPING, L, j % 2 == 1)
    if group is not None:  # the group's dropped totals (a collective: after the pair, so a kill lands in the dispatch)
        assert group.sum([pairs, tokens]) == [sum(m[1] for m in masks), sum(m[2] for m in masks)]
    v = _f32(bucket)
    v[:] = __import__("torch").from_numpy(values(orig, stage, j)) if not isinstance(v, np.ndarray) else values(orig, stage, j)
    out = bucket.all_reduce(v).wait()
    want = values(survivors[0], stage, j)
    for r in survivors[1:]:
        want = (want + values(r, stage, j)).astype(np.float32)
    assert np.array_equal(np.asarray(out), want), f"rank {orig}: all_reduce differs after losing {lost}"
    return sum(m[1] for m in masks)


def _make_buffers(group, size):
    ep = epx.EPBuffer(group, num_max_tokens_per_rank=max(TOKENS), hidden=H, num_topk=K,
                      num_experts=size * (L + B), num_cpu_timeout_secs=TIMEOUT)
    if group is None:
        bucket = epx.BucketBuffer(None, 1 << 16, num_cpu_timeout_secs=TIMEOUT)
    else:  # a rebuilt group is its own transport group; its barrier is the group's own
        bucket = epx.BucketBuffer(group, 1 << 16)
        ep.barrier()
    return ep, bucket


def body(orig, pid_dir):
    """Every rank: the stages of FAULTS; returns (dropped pairs per stage, sums of the last
    pair, errors seen)."""
    with open(os.path.join(pid_dir, f"pid{orig}"), "w") as f:
        f.write(str(os.getpid()))
    group, lost, dropped, seen = None, [], [], []
    ep, bucket = _make_buffers(None, P0)
    for stage in range(len(FAULTS) + 1):
        victim = FAULTS[stage] if stage < len(FAULTS) else None
        survivors = [r for r in range(P0) if r not in lost]
        assert ep.group_size == len(survivors) and ep.rank == survivors.index(orig)
        completed, total = 0, 0
        try:
            for j in range(PAIRS):
                if victim is not None and j == KILL_PAIR:
                    if orig == victim:  # dies inside the dispatch, where it waits for the others' rows
                        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGKILL)).start()
                    else:  # which they send once it is dead: no race on where it dies
                        wait_until_dead(pid_dir, victim)
                total += run_pair(ep, bucket, group, stage, j, lost, orig)
                completed += 1
            assert victim is None, f"rank {orig}: every pair of stage {stage} completed: the death went unnoticed"
        except epx.Error as e:
            if victim is None or orig == victim:
                raise
            assert e.is_peer_loss, f"rank {orig}: not a peer loss: {e.code}: {e}"
            assert completed == KILL_PAIR, f"rank {orig}: failed after {completed} pairs: {e}"
            seen.append((e.code, str(e)))
            old_ep, old_group = ep, group
            group = epx.agree_and_rebuild(group, buffers=[bucket])
            vic = survivors.index(victim)
            assert group.lost == (vic,) and group.survivors == tuple(i for i in range(len(survivors)) if i != vic)
            assert group.round == 1 and group.size == len(survivors) - 1
            assert group.rank == survivors.index(orig) - (survivors.index(orig) > vic)
            assert group.original_lost == tuple(sorted(lost + [victim]))
            assert group.original_ranks == tuple(r for r in survivors if r != victim)
            # a buffer of the retired group: a clear error at once, no wait on the moved-on ranks
            x, idx, w = inputs(make_case(P0, E_LOG, K, H, TOKENS, seed=1), orig, "torch")
            with pytest.raises(epx.Error) as info:
                old_ep.dispatch(x, idx, w)
            assert info.value.code == "bad_handle" and "rebuilt" in str(info.value), str(info.value)
            assert not info.value.is_peer_loss
            old_ep.destroy()
            with pytest.raises(epx.Error) as info:  # nor can a new buffer be built on the old group
                _make_buffers(old_group, len(survivors))
            assert info.value.code == "bad_handle", str(info.value)
            assert not bucket._is_live()  # destroyed by agree_and_rebuild (passed in buffers=)
            lost.append(victim)
            ep, bucket = _make_buffers(group, group.size)
        dropped.append(total)
    # a bad input on the last group fails every rank alike, and is not a peer loss
    x, idx, w = inputs(make_case(P0, E_LOG, K, H, TOKENS, seed=5), orig, "torch")
    idx = idx.clone()
    idx.fill_(-1)
    if group.rank == 0:
        idx[0, 0] = group.size * (L + B)  # one past the last expert
    with pytest.raises(epx.Error) as info:
        ep.dispatch(x, idx, w)
    assert info.value.code == "invalid_argument" and not info.value.is_peer_loss, str(info.value)
    total = run_pair(ep, bucket, group, len(FAULTS), PAIRS, lost, orig)  # the group goes on
    ep.destroy()
    bucket.destroy()
    # a PPBuffer on the survivors' group: each rank sends its neighbour a message
    with epx.PPBuffer(group, 4096, 1) as pp:
        peer = (group.rank + 1) % group.size
        src = (group.rank - 1) % group.size
        pp.send(np.random.default_rng([orig, 9]).integers(0, 256, 1000, dtype=np.uint8), peer)
        got = pp.recv(np.empty(1000, np.uint8), src)
        want = np.random.default_rng([group.original_ranks[src], 9]).integers(0, 256, 1000, dtype=np.uint8)
        assert np.array_equal(got, want), f"rank {orig}: the PPBuffer message from rank {src} differs"
    # an EngramBuffer on it: rows gathered from the survivors' table shards
    import torch
    n, h = 16, 8
    nb, ns = epx.EngramBuffer.get_storage_size_hint(group, [n], h, 5, 2, torch.bfloat16)
    with epx.EngramBuffer(group, nb, ns) as engram:
        engram.set_config([n], h, 5, 2, torch.bfloat16)
        shard = lambda r: np.random.default_rng([r, 11]).integers(0, 1 << 16, (n, h), dtype=np.uint16)  # noqa: E731
        engram.write([torch.from_numpy(shard(orig).view(np.int16)).view(torch.bfloat16)])
        table = np.concatenate([shard(r) for r in group.original_ranks])
        idx = np.random.default_rng([orig, 12]).integers(-1, group.size * n, (1, 5, 2)).astype(np.int32)
        got = engram.fetch(torch.from_numpy(idx))[0]().view(torch.int16).numpy().view(np.uint16)
        want = np.where((idx[0] >= 0)[..., None], table[np.maximum(idx[0], 0)], 0).reshape(5, 2 * h)
        assert np.array_equal(got.reshape(5, 2 * h), want), f"rank {orig}: the EngramBuffer rows differ"
    return dropped, total, seen


def _launched(rank, n, pid_dir):
    return body(rank, pid_dir)


def check_results(results):
    survivors = [r for r in range(P0) if r not in FAULTS]
    for r in survivors:
        dropped, _, seen = results[r]
        assert len(seen) == len(FAULTS)
        # the stages after each loss dropped pairs (experts 5, then 3 have no live replica)
        assert dropped[0] == 0 and dropped[1] > 0 and dropped[2] > 0, dropped
        for code, text in seen:
            assert code in ("peer_failed", "timeout"), text
    first = results[survivors[0]][1]
    assert all(results[r][1] == first for r in survivors)


def test_launch_elastic_survivors_rebuild_and_go_on(tmp_path):
    before = shm_segments()
    out = epx.launch(_launched, P0, str(tmp_path), start_method="fork", timeout_secs=120, elastic=True)
    assert out.lost == sorted(FAULTS)
    assert all(out[r] is None for r in FAULTS)
    check_results(out)
    assert not segments_left(before), f"left in /dev/shm: {segments_left(before, 0)}"
    assert not mp.active_children()


def _torch_rank(rank, store, pid_dir):
    import datetime
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=P0,
                            timeout=datetime.timedelta(seconds=60))
    return body(rank, pid_dir)  # then run_ranks ends the process: the torch group is broken (a rank died)


def test_torch_distributed_group_survivors_rebuild_and_go_on(tmp_path):
    before = shm_segments()
    survivors = [r for r in range(P0) if r not in FAULTS]
    results, exits = run_ranks([(r, _torch_rank, (r, str(tmp_path / "store"), str(tmp_path))) for r in range(P0)],
                               len(survivors), 180)
    assert all(ok for ok, _ in results.values()), results
    assert sorted(results) == survivors, results
    assert [exits[r] for r in FAULTS] == [-signal.SIGKILL] * len(FAULTS)
    check_results({r: value for r, (_, value) in results.items()})
    assert not segments_left(before), f"left in /dev/shm: {segments_left(before, 0)}"
    assert not mp.active_children()


def _stopped_rank(rank, n):
    """Rank 1 stops (SIGSTOP) before an all_reduce: the others time out, agree without it
    after the timeout (it is neither dead nor arriving), rebuild and all_reduce over the two."""
    bucket = epx.BucketBuffer(None, 1 << 16, num_cpu_timeout_secs=2)
    v = _f32(bucket)
    if rank == 1:  # between calls: its rows never come (inside one, they may all be out already)
        os.kill(os.getpid(), signal.SIGSTOP)
    v[:] = __import__("torch").from_numpy(values(rank, 9, 0))
    with pytest.raises(epx.Error) as info:
        bucket.all_reduce(v).wait()
    assert info.value.is_peer_loss, str(info.value)
    group = epx.agree_and_rebuild(None, buffers=[bucket])
    assert group.lost == (1,) and group.original_ranks == (0, 2) and group.rank == rank // 2
    bucket = epx.BucketBuffer(group, 1 << 16, transport_group=group)
    v = _f32(bucket)
    v[:] = __import__("torch").from_numpy(values(rank, 9, 1))
    out = np.asarray(bucket.all_reduce(v).wait())
    assert np.array_equal(out, (values(0, 9, 1) + values(2, 9, 1)).astype(np.float32))
    bucket.destroy()
    return info.value.code


def test_a_stopped_rank_is_left_out_after_the_timeout():
    before = shm_segments()
    out = epx.launch(_stopped_rank, 3, start_method="fork", timeout_secs=60, elastic=True)
    assert out.lost == [1] and out[1] is None
    assert out[0] in ("timeout", "peer_failed") and out[2] in ("timeout", "peer_failed")
    assert not segments_left(before), f"left in /dev/shm: {segments_left(before, 0)}"
    assert not mp.active_children()


def _not_shm(rank, n):
    import torch.distributed as dist
    # no epx buffer on the group: nothing to rebuild, said at once
    with pytest.raises(epx.Error) as info:
        epx.agree_and_rebuild(None)
    assert info.value.code == "invalid_argument"
    assert dist.is_initialized()
    return True


def test_nothing_to_rebuild_is_a_clear_error():
    assert epx.launch(_not_shm, 2, start_method="fork", timeout_secs=60) == [True, True]


def test_is_peer_loss_follows_the_code():
    assert epx.Error("x", "peer_failed").is_peer_loss and epx.Error("x", "timeout").is_peer_loss
    assert not epx.Error("x", "invalid_argument").is_peer_loss and not epx.Error("x", "bad_handle").is_peer_loss
