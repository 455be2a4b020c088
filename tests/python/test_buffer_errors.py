"""EPBuffer errors: raised on every rank naming the rank at fault (bad routing caught by
the engine, bad dtype / strides / device caught by the binding, foreign and stale
handles), a killed peer, Ctrl-C in a hung wait, destroy() and the size hint."""
import os
import signal
import threading
import time

import numpy as np
import pytest

import epx
from epx_cases import inputs, make_case

P = 4


def launch(fn, *args):
    return epx.launch(fn, P, *args, start_method="fork", timeout_secs=60)


def _bad_input(rank, n, what, culprit):
    import torch
    case = make_case(n, 8, 2, 128, [4, 4, 4, 4], seed=71)
    x, idx, w = inputs(case, rank, "torch")
    with epx.EPBuffer(None, num_max_tokens_per_rank=4, hidden=128, num_topk=2, num_experts=8) as buf:
        if rank == culprit:
            if what == "expert_out_of_range":
                idx = idx.clone()
                idx[2, 1] = 8
            elif what == "dtype":
                x = x.to(torch.float16)
            elif what == "strides":
                idx = idx.t().contiguous().t()
            elif what == "too_many_tokens":
                x, idx, w = torch.cat([x, x]), torch.cat([idx, idx]), torch.cat([w, w])
        try:
            buf.dispatch(x, idx, w)
        except epx.Error as e:
            # the buffer stays usable after a collective input error
            out = buf.dispatch(*inputs(case, rank, "torch"))
            return (e.code, e.origin_rank, str(e), out[0].shape[0] >= 0)
    return None


@pytest.mark.parametrize("what,code,words", [
    ("expert_out_of_range", "invalid_argument", "topk_idx[2, 1] = 8"),
    ("dtype", "dtype_mismatch", "x: expected bf16"),
    ("strides", "shape_mismatch", "topk_idx: expected a C-contiguous tensor"),
    ("too_many_tokens", "capacity_exceeded", "num_max_tokens_per_rank"),
])
def test_bad_input_fails_every_rank(what, code, words):
    culprit = 2
    got = launch(_bad_input, what, culprit)
    for r, g in enumerate(got):
        assert g is not None, f"rank {r} did not fail"
        assert g[1] == culprit, (r, g)
        if r == culprit:
            assert g[0] == code and words in g[2], g
        else:
            assert f"rank {culprit}" in g[2], g
        assert g[3]


def _handles(rank, n):
    case = make_case(n, 8, 2, 128, [3, 3, 3, 3], seed=72)
    x, idx, w = inputs(case, rank, "torch")
    seen = []
    with epx.EPBuffer(None, num_max_tokens_per_rank=3, hidden=128, num_topk=2, num_experts=8) as a, epx.EPBuffer(None, num_max_tokens_per_rank=3, hidden=128, num_topk=2, num_experts=8) as b:
        recv_x, _, _, ha, _ = a.dispatch(x, idx, w)
        for call in (lambda: b.combine(recv_x, ha), lambda: b.dispatch(x, handle=ha)):
            try:
                call()
                seen.append(None)
            except epx.Error as e:
                seen.append((e.code, e.origin_rank))
        if rank == 0:
            idx.add_(0)  # in place: torch bumps the version counter; rank 0's handle is now stale
        try:
            a.dispatch(x, handle=ha)
            seen.append(None)
        except epx.Error as e:
            seen.append((e.code, e.origin_rank, "modified in place" in str(e) if rank == 0 else "rank 0" in str(e)))
    return seen


def test_foreign_and_stale_handles():
    got = launch(_handles)
    for r, seen in enumerate(got):
        assert seen[0] is not None and seen[0][0] == "bad_handle", (r, seen)
        assert seen[1] is not None and seen[1][0] == "bad_handle", (r, seen)
        assert seen[2] is not None and seen[2][1] == 0 and seen[2][2], (r, seen)
        assert r != 0 or seen[2][0] == "bad_handle", seen


def _destroy(rank, n):
    case = make_case(n, 8, 2, 128, [2, 2, 2, 2], seed=73)
    x, idx, w = inputs(case, rank, "numpy")
    buf = epx.EPBuffer(None, num_max_tokens_per_rank=2, hidden=128, num_topk=2, num_experts=8, explicitly_destroy=True)
    buf.dispatch(x, idx, w)
    buf.destroy()
    buf.destroy()  # idempotent
    try:
        buf.dispatch(x, idx, w)
    except epx.Error as e:
        return e.code, "destroyed" in str(e)
    return None


def test_destroyed_buffer_is_an_error():
    assert launch(_destroy) == [("bad_handle", True)] * P


def _destroy_while_pending(rank, n, mode):
    case = make_case(n, 8, 2, 128, [2, 2, 2, 2], seed=76)
    x, idx, w = inputs(case, rank, "torch")
    buf = epx.EPBuffer(None, num_max_tokens_per_rank=2, hidden=128, num_topk=2, num_experts=8)
    r = buf.dispatch(x, idx, w, **{mode: True})
    ev = r if mode == "defer_epilogue" else r[4]
    buf.destroy()  # waits for the call's thread; its back half (if still due) never runs
    try:
        ev.wait()
    except epx.Error as e:
        # This rank's own destroy, or (its call's thread still waiting when a peer destroyed
        # its buffer) that peer, named: either way the wait fails.
        if e.code == "bad_handle":
            return "destroyed" in str(e)
        return e.code == "peer_failed" and e.origin_rank != rank
    return False


@pytest.mark.parametrize("mode", ["async_with_compute_stream", "defer_epilogue"])
def test_destroy_while_pending_fails_the_wait(mode):
    assert launch(_destroy_while_pending, mode) == [True] * P


def _size_hint(rank, n, shape):
    S, H, K, E = shape
    hint = epx.EPBuffer.get_buffer_size_hint(None, S, H, K, num_experts=E)
    with epx.EPBuffer(None, num_max_tokens_per_rank=S, hidden=H, num_topk=K, num_experts=E) as buf:
        return hint, buf.window_bytes


@pytest.mark.parametrize("shape", [(16, 256, 4, 8), (300, 1024, 8, 32)])
def test_size_hint_is_what_the_constructor_allocates(shape):
    for hint, window in launch(_size_hint, shape):
        assert hint % (2 << 20) == 0 and hint >= window > hint - (2 << 20), (hint, window)


def _killed_peer(rank, n):
    case = make_case(n, 8, 2, 128, [4, 4, 4, 4], seed=74)
    x, idx, w = inputs(case, rank, "torch")
    buf = epx.EPBuffer(None, num_max_tokens_per_rank=4, hidden=128, num_topk=2, num_experts=8, num_cpu_timeout_secs=60)
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    t = time.monotonic()
    try:
        buf.dispatch(x, idx, w)
    except epx.Error as e:
        assert "rank 1" in str(e) and "phase '" in str(e), str(e)
        return e.code, e.origin_rank, time.monotonic() - t
    return None


def test_killed_peer_fails_the_others_naming_it():
    with pytest.raises(epx.Error) as info:
        launch(_killed_peer)
    e = info.value
    assert e.origin_rank == 1 and e.code == "peer_failed", e  # launch names the dead rank
    assert sorted(e.values) == [0, 2, 3], (e.values, e.errors)
    for r, (code, origin, took) in e.values.items():  # each survivor failed by itself, quickly
        assert code == "peer_failed" and origin == 1 and took < 5, (r, code, origin, took)


def _interrupt(rank, n, background=False):
    case = make_case(n, 8, 2, 128, [2, 2], seed=75)
    x, idx, w = inputs(case, rank, "torch")
    buf = epx.EPBuffer(None, num_max_tokens_per_rank=2, hidden=128, num_topk=2, num_experts=8, num_cpu_timeout_secs=60)
    if rank == 1:
        time.sleep(3)  # rank 0 hangs in dispatch meanwhile
        try:
            buf.dispatch(x, idx, w)
        except epx.Error as e:
            return ("rank 1", e.code, e.origin_rank)
        return ("rank 1", None)
    threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    t = time.monotonic()
    try:
        if background:
            ev = buf.dispatch(x, idx, w, async_with_compute_stream=True)
            ev.wait()
        else:
            buf.dispatch(x, idx, w)
    except KeyboardInterrupt:
        took = time.monotonic() - t
        buf.destroy()  # rank 1 then fails at once ("finished without answering")
        return ("rank 0", "KeyboardInterrupt", took < 2.0)
    return ("rank 0", None)


@pytest.mark.parametrize("background", [False, True], ids=["sync", "async"])
def test_ctrl_c_ends_a_hung_wait(background):
    got = epx.launch(_interrupt, 2, background, start_method="fork", timeout_secs=60)
    assert got[0] == ("rank 0", "KeyboardInterrupt", True), got
    assert got[1] == ("rank 1", "peer_failed", 0), got
