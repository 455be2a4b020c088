"""epx.PPBuffer from Python (torch and numpy): seeded random send/recv programs over random
peers with at most the in-flight bound outstanding, every byte checked against numpy; the
errors; the 1F1B pipeline example against its one-process run."""
import os
import subprocess
import sys

import numpy as np
import pytest

import epx

P = 4
REPO = os.path.join(os.path.dirname(__file__), "..", "..")


def launch(fn, *args):
    return epx.launch(fn, P, *args, start_method="fork", timeout_secs=120)


def message(src, dst, seq, n):
    """The bytes of message `seq` from src to dst: numpy's generator seeded by the triple."""
    return np.random.default_rng([src, dst, seq]).integers(0, 256, n, dtype=np.uint8)


def program(seed, inflight, max_bytes, events):
    """One global order of events over P ranks (per rank: its subsequence), at most
    `inflight` messages outstanding per ordered pair in every prefix: blocking sends and
    receives in each rank's order cannot deadlock."""
    rng = np.random.default_rng(seed)
    per_rank = [[] for _ in range(P)]
    queue, sent, got = {}, {}, {}
    for _ in range(events):
        s, d = (int(v) for v in rng.integers(0, P, 2))
        q = queue.setdefault((s, d), [])
        if not q or (len(q) < inflight and rng.random() < 0.5):
            n = int(rng.integers(0, max_bytes + 1))
            seq = sent.get((s, d), 0)
            sent[(s, d)] = seq + 1
            q.append(n)
            per_rank[s].append(("send", d, seq, n))
        else:
            seq = got.get((s, d), 0)
            got[(s, d)] = seq + 1
            per_rank[d].append(("recv", s, seq, q.pop(0)))
    for (s, d), q in queue.items():
        while q:
            seq = got.get((s, d), 0)
            got[(s, d)] = seq + 1
            per_rank[d].append(("recv", s, seq, q.pop(0)))
    return per_rank


def _run_program(rank, size, flavor, seed):
    import torch
    inflight, max_bytes = 2, 4096
    # numpy: chunks of 128 bytes, so messages of >= 512 bytes stream when their receiver waits
    pp = epx.PPBuffer(None, num_max_tensor_bytes=max_bytes, num_max_inflight_tensors=inflight,
                      chunk_bytes=128 if flavor == "numpy" else 0)
    checked = 0
    for k, (op, peer, seq, n) in enumerate(program(seed, inflight, max_bytes, 200)[rank]):
        want = message(rank if op == "send" else peer, peer if op == "send" else rank, seq, n)
        if op == "send":
            pp.send(torch.from_numpy(want.copy()) if flavor == "torch" else want, peer)
        elif k % 3 == 0:  # some through slot views
            with pp.recv_view(peer, dtype=torch.uint8 if flavor == "torch" else np.uint8, shape=(n,)) as v:
                got = v.tensor.numpy() if flavor == "torch" else v.tensor
                assert np.array_equal(got, want), f"rank {rank}: message {seq} from {peer} differs"
        else:
            got = torch.empty(n, dtype=torch.uint8) if flavor == "torch" else np.empty(n, np.uint8)
            pp.recv(got, peer)
            got = got.numpy() if flavor == "torch" else got
            assert np.array_equal(got, want), f"rank {rank}: message {seq} from {peer} differs"
        checked += op == "recv"
    stats = [pp.stats(q)["received"] for q in range(size)]
    pp.destroy()
    return checked, sum(stats)


@pytest.mark.parametrize("flavor", ["torch", "numpy"])
def test_random_programs_every_byte(flavor):
    for seed in (3, 4):
        res = launch(_run_program, flavor, seed)
        assert sum(c for c, _ in res) > 50
        assert all(c == s for c, s in res)


def _errors(rank, size):
    import torch
    pp = epx.PPBuffer(None, 64, 1, links=[(0, 1), (2, 3)])
    peer = rank ^ 1
    if rank % 2 == 0:
        pp.send(torch.arange(10, dtype=torch.float32), peer)  # 40 bytes
        with pytest.raises(epx.Error) as e:
            pp.send(np.zeros(65, np.uint8), peer)
        assert e.value.code == "capacity_exceeded" and "at most 64" in str(e.value)
        with pytest.raises(epx.Error) as e:
            pp.send(np.zeros(4, np.uint8), (rank + 2) % size)
        assert "not linked" in str(e.value)
        with pytest.raises(epx.Error) as e:
            pp.send(torch.zeros(8)[::2], peer)
        assert "contiguous" in str(e.value)
    else:
        with pytest.raises(epx.Error) as e:
            pp.recv(torch.empty(9), peer)
        assert e.value.code == "shape_mismatch" and "40 bytes" in str(e.value) and "has 36" in str(e.value)
        assert f"rank {peer}" in str(e.value) and "message 0" in str(e.value)
        with pytest.raises(epx.Error):
            pp.recv_view(peer, dtype=np.float32, shape=(9,))
        with pp.recv_view(peer, dtype=torch.float32, shape=(2, 5)) as v:
            assert torch.equal(v.tensor, torch.arange(10, dtype=torch.float32).reshape(2, 5))
        with pytest.raises(epx.Error) as e:
            pp.recv(np.zeros(4, np.uint8)[::-1], peer)
    pp.destroy()
    return True


def test_errors_name_counts_peers_and_links():
    assert launch(_errors) == [True] * P


def _planned(rank, size, flavor, seed):
    """Random programs whose tensor receives go into a tensor planned into the buffer
    (epx.BufferAllocator -> allocation_plan): every byte checked, the planned tensor's bytes
    past the message untouched."""
    import torch
    inflight, max_bytes = 2, 4096
    plan = epx.BufferAllocator()
    if flavor == "torch":
        act = plan.allocate((max_bytes + 64,), torch.uint8, name="act")
    else:
        act = plan.allocate((max_bytes + 64,), np.uint8, name="act")
    pp = epx.PPBuffer(None, num_max_tensor_bytes=max_bytes, num_max_inflight_tensors=inflight,
                      chunk_bytes=128, allocation_plan=plan)
    target = act if flavor == "torch" else act.array
    whole = act.numpy() if flavor == "torch" else act.array
    checked = 0
    for op, peer, seq, n in program(seed, inflight, max_bytes, 200)[rank]:
        want = message(rank if op == "send" else peer, peer if op == "send" else rank, seq, n)
        if op == "send":
            pp.send(want, peer)
            continue
        whole[:] = 0xEE
        off = (seq * 7) % 64
        pp.recv(target[off:off + n], peer)
        assert np.array_equal(whole[off:off + n], want), f"rank {rank}: message {seq} from {peer} differs"
        assert (whole[:off] == 0xEE).all() and (whole[off + n:] == 0xEE).all(), f"rank {rank}: bytes outside written"
        checked += 1
    direct = sum(pp.stats(q)["direct"] for q in range(size))
    storage = pp.storage  # torch once torch is imported (as BucketBuffer.storage), else numpy
    end = (storage.data_ptr() if hasattr(storage, "data_ptr") else storage.ctypes.data) + storage.shape[0]
    with pytest.raises(epx.Error) as e:  # starts in the planned storage, ends past it (raw: no tensor can)
        pp._runtime.recv(end - 8, 16, (rank + 1) % size)
    assert e.value.code == "invalid_argument" and f"rank {rank}" in str(e.value) and "ends past" in str(e.value)
    pp.destroy()
    return checked, direct


@pytest.mark.parametrize("flavor", ["torch", "numpy"])
def test_planned_receives_every_byte(flavor):
    res = launch(_planned, flavor, 5)
    assert sum(c for c, _ in res) > 50
    # ranks wait for most messages here: some are written straight into the planned tensor
    assert sum(d for _, d in res) > 0


def _config_differs(rank, size):
    try:
        epx.PPBuffer(None, 64, 2 if rank != 3 else 3)
    except epx.Error as e:
        return e.origin_rank, "num_max_inflight_tensors" in str(e)
    return None


def test_config_that_differs_fails_every_rank():
    assert launch(_config_differs) == [(3, True)] * P


def test_pipeline_1f1b_example_equals_one_process():
    r = subprocess.run([sys.executable, os.path.join(REPO, "examples", "pipeline_1f1b.py")], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("bitwise equal to the one-process run") == 4
