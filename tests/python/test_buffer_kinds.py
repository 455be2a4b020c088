"""Every buffer kind of the Python package, ElasticBuffer included, has the one life cycle of
docs/python.md, "Names": `with` destroys at the end of the block, destroy() may be called again,
a buffer dropped without destroy() goes with its object (the group goes on: the next buffer's
call is right) and nothing is left in /dev/shm; the names of the naming table are the
classes they name."""
import gc
import os

import pytest
import torch

import epx

P, S, H, K, E = 2, 4, 128, 2, 8
KINDS = ["EPBuffer", "ElasticBuffer", "BucketBuffer", "PPBuffer", "EngramBuffer", "Buffer"]


def _segments():
    return {n for n in os.listdir("/dev/shm") if n.startswith("epx")}


def _inputs(rank):
    g = torch.Generator().manual_seed(5 + rank)
    x = torch.randn(S, H, generator=g).bfloat16()
    idx = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(S)])
    return x, idx, torch.rand(S, K, generator=g)


def _make(kind, n):
    if kind == "EPBuffer":
        return epx.EPBuffer(None, num_max_tokens_per_rank=S, hidden=H, num_topk=K, num_experts=E)
    if kind == "ElasticBuffer":
        return epx.ElasticBuffer(None, num_max_tokens_per_rank=S, hidden=H, num_topk=K, num_experts=E)
    if kind == "BucketBuffer":
        return epx.BucketBuffer(list(range(n)), 1 << 12)
    if kind == "PPBuffer":
        return epx.PPBuffer(None, 64, 1)
    if kind == "EngramBuffer":
        return epx.EngramBuffer(None, *epx.EngramBuffer.get_storage_size_hint(None, [3], H, 2, 1))
    return epx.Buffer(None)


def _want_recv_x(rank, n):
    """The rows rank `rank` receives, in (source rank, token) order: every other rank's
    inputs recomputed here, the tokens routed to one of this rank's experts kept."""
    local = range(rank * E // n, (rank + 1) * E // n)
    rows = []
    for s in range(n):
        x, idx, _ = _inputs(s)
        rows += [x[t] for t in range(S) if any(int(e) in local for e in idx[t])]
    return torch.stack(rows) if rows else torch.empty(0, H, dtype=torch.bfloat16)


def _call(kind, b, rank, n):
    """One collective call, its result checked against a value computed here."""
    x, idx, w = _inputs(rank)
    if kind in ("EPBuffer", "ElasticBuffer"):
        recv_x = b.dispatch(x, topk_idx=idx, topk_weights=w, num_experts=E)[0]
        return torch.equal(recv_x, _want_recv_x(rank, n))
    if kind == "Buffer":
        layout = b.get_dispatch_layout(idx, E)
        recv_x = b.dispatch(x, topk_idx=idx, topk_weights=w, num_tokens_per_rank=layout[0],
                            num_tokens_per_expert=layout[2], is_token_in_rank=layout[3])[0]
        return torch.equal(recv_x, _want_recv_x(rank, n))
    if kind == "BucketBuffer":
        v = b._view(0, torch.empty(16))
        v[:] = float(rank + 1)
        b.all_reduce([v]).wait()
        return bool((v == float(n * (n + 1) // 2)).all())
    if kind == "PPBuffer":
        peer = (rank + 1) % n
        b.send(torch.full((4,), float(rank)), peer)
        return bool((b.recv(torch.empty(4), (rank - 1) % n) == float((rank - 1) % n)).all())
    table = torch.arange(3 * H, dtype=torch.float32).reshape(3, H).bfloat16() + rank
    b.set_config([3], H, 2, 1)
    b.write([table])
    out = b.fetch(torch.tensor([[[3], [1]]], dtype=torch.int32))  # rank 1's row 0, rank 0's row 1
    got = out[0]() if callable(out[0]) else out[0]
    got = got[0] if isinstance(got, (tuple, list)) else got
    want = torch.stack([torch.arange(H, dtype=torch.float32).bfloat16() + 1,
                        torch.arange(H, 2 * H, dtype=torch.float32).bfloat16()])
    return bool((got.reshape(2, H) == want).all())


def _life(rank, n, kind):
    seen = {}
    with _make(kind, n) as b:
        seen["with"] = _call(kind, b, rank, n) and b._is_live()
    seen["closed"] = not b._is_live()
    b.destroy()
    b.destroy()  # idempotent, also after the block's
    seen["destroy twice"] = not b._is_live()
    dropped = _make(kind, n)
    seen["dropped"] = _call(kind, dropped, rank, n)
    del dropped, b  # no destroy(): the object's own end releases it
    gc.collect()
    after = _make(kind, n)  # the group goes on with a new buffer of the kind
    seen["after"] = _call(kind, after, rank, n)
    after.destroy()
    return seen


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_with_destroy_twice_and_drop_leave_nothing(kind):
    before = _segments()
    got = epx.launch(_life, P, kind, start_method="fork", timeout_secs=120)
    assert got == [{"with": True, "closed": True, "destroy twice": True, "dropped": True, "after": True}] * P
    assert _segments() - before == set()


def test_every_kind_shares_the_life_cycle():
    for kind in KINDS:
        cls = getattr(epx, kind)
        assert issubclass(cls, epx._lifecycle.BufferLifecycle), kind
        for name in ("__enter__", "__exit__", "__del__", "destroy"):
            assert callable(getattr(cls, name)), (kind, name)


def test_the_names_of_the_table():
    # One class per concept; DeepEP's names are the same objects (docs/deepep.md).
    assert epx.LegacyBuffer is epx.Buffer  # DeepEP V1's Buffer (deep_ep.Buffer)
    assert epx.LegacyConfig is epx.Config
    assert issubclass(epx.ElasticBuffer, epx.EPBuffer)
    assert not issubclass(epx.Buffer, epx.EPBuffer)  # V1's API is another class, not an EP alias
    for name in ("EPBuffer", "ElasticBuffer", "BucketBuffer", "PPBuffer", "EngramBuffer", "Buffer", "LegacyBuffer",
                 "Config", "LegacyConfig"):
        assert name in epx.__all__, name
