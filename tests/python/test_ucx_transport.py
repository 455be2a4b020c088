"""The UCX transport from Python (docs/transport.md, "UCX"): buffers of a torch.distributed
group built with transport="ucx" (EPBuffer dispatch/combine and BucketBuffer all_reduce, bit
for bit against the numpy reference), and a transport made as epx.distributed makes its
group's, over a c10d TCPStore all-gather, with kind "ucx". One machine, 4 ranks."""
import socket

import numpy as np

import epx
import epx_ref
from epx.group import transport_of
from epx_cases import check_dispatch, expert_y, inputs, make_case, same

P = 4
TOKENS = [9, 0, 14, 5]


def _ref_sum(parts, scale):
    """docs/spec.md §8: a float32 left fold in member order, times scale unless 1."""
    acc = parts[0].astype(np.float32)
    for p in parts[1:]:
        acc = (acc + p).astype(np.float32)
    return acc if scale == 1.0 else (acc * np.float32(scale)).astype(np.float32)


def _values(rank, n, seed):
    rng = np.random.default_rng(seed * 1000003 + rank * 977)
    return (rng.choice([-1.0, 1.0], n) * np.ldexp(1.0 + rng.random(n), rng.integers(-12, 13, n))).astype(np.float32)


def _buffers_over_ucx(rank, n):
    assert transport_of(None, "ucx").name == "ucx"
    for expanded, seed in ((False, 71), (True, 72)):
        case = make_case(n, 16, 4, 256, TOKENS, seed=seed)
        res = epx_ref.compute(case, layout="expanded" if expanded else "compact", alignment=4 if expanded else 1,
                              deterministic=True, zero_padding=True)
        buf = epx.EPBuffer(None, num_max_tokens_per_rank=max(TOKENS), hidden=256, num_topk=4, num_experts=16, transport="ucx")
        x, idx, w = inputs(case, rank, "torch")
        out = buf.dispatch(x, idx, w, do_expand=expanded, expert_alignment=4 if expanded else 1, deterministic=True,
                           do_zero_padding=True)
        check_dispatch(case, res, rank, out[:4], expanded, False)
        combined, _, _ = buf.combine(expert_y(case, out[0], out[1], out[3], expanded), out[3])
        same("combined_x", combined, res.ranks[rank]["combined_x"], rank)
        buf.destroy()
    groups = [list(range(n)), [0, 1], [2, 3]]
    bucket = epx.BucketBuffer(groups, 4 << 20, transport="ucx")
    storage = np.asarray(bucket.storage.numpy() if hasattr(bucket.storage, "numpy") else bucket.storage)
    for g, members in enumerate(groups):
        for k, (size, scale) in enumerate(((8, 1.0), (1000, 0.25), (24000, -0.5))):
            if rank not in members:
                continue
            x = bucket._view(64, np.empty(size, np.float32))
            x[:] = _values(rank, size, 10 * g + k)
            got = bucket.all_reduce(x, scale=scale, group=g).wait()
            want = _ref_sum([_values(j, size, 10 * g + k) for j in members], scale)
            assert np.array_equal(np.asarray(got), want), f"rank {rank} group {g} all_reduce of {size} differs"
    del storage
    bucket.destroy()
    return True


def test_buffers_over_ucx_match_the_reference():
    assert epx.launch(_buffers_over_ucx, P, start_method="fork", timeout_secs=120) == [True] * P


def _store_transport(rank, n, port):
    import torch.distributed as dist
    from epx import _epx
    from epx.distributed import _store_allgather
    store = dist.TCPStore("127.0.0.1", port, n, rank == 0, timeout=__import__("datetime").timedelta(seconds=60))
    t = _epx.Transport(rank, n, _store_allgather(store, rank, n, "ucx-test"), "ucx", 30.0)
    assert (t.name, t.rank, t.num_ranks) == ("ucx", rank, n)
    t.barrier("store transport")
    del t
    return True


def test_transport_over_a_store_allgather():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert epx.launch(_store_transport, P, port, start_method="fork", timeout_secs=120) == [True] * P
