"""epx.BucketBuffer / epx.BufferAllocator from Python (docs/spec.md §8), in DeepEP's test style: many
sizes, 1-8 tensors per call, several groups on one buffer, scales {1, 0, 0.25, -0.5, 2},
guard bytes that must stay untouched, sessions, torch and numpy, errors on every rank, an
EPBuffer interleaved on the same ranks; results bit for bit against a numpy reference (a
float32 left fold in member order, written here from docs/spec.md §8)."""
import numpy as np
import pytest

import epx
import epx_ref
from epx_cases import check_dispatch, expert_y, inputs, make_case, same

P = 4
SCALES = [1.0, 0.0, 0.25, -0.5, 2.0]
SIZES = [[8], [1, 7, 16], [1000], [4100, 16, 4, 160], [24000, 8, 4096, 4, 96, 512, 10000, 64]]


def values(rank, t, n, seed):
    rng = np.random.default_rng(seed * 1000003 + rank * 977 + t)
    return (rng.choice([-1.0, 1.0], n) * np.ldexp(1.0 + rng.random(n), rng.integers(-12, 13, n))).astype(np.float32)


def ref_sum(parts, scale, bf16=False):
    """docs/spec.md §8: acc = v_0; acc = acc + v_1; ... (float32), times scale unless 1."""
    r = (lambda v: epx_ref.bf16_to_f32(epx_ref.f32_to_bf16(v))) if bf16 else (lambda v: v)
    acc = r(parts[0]).astype(np.float32)
    for p in parts[1:]:
        acc = (acc + r(p).astype(np.float32)).astype(np.float32)
    return acc if scale == 1.0 else (acc * np.float32(scale)).astype(np.float32)


def groups_of(n):
    return [list(range(n)), list(range(n // 2)), list(range(n // 2, n)), [0, 2], [1, 3], [1]]


def _np(t):
    return t.numpy() if hasattr(t, "numpy") and not isinstance(t, np.ndarray) else np.asarray(t)


def _collectives(rank, n, flavor):
    import torch
    groups = groups_of(n)
    buf = epx.BucketBuffer(groups, 4 << 20)
    storage = _np(buf.storage)
    k = 0
    for g, members in enumerate(groups):
        if rank not in members:
            continue
        m, me = len(members), members.index(rank)
        for sizes in SIZES:
            k += 1
            scale, bf16 = SCALES[k % 5], k % 2 == 1
            storage[:] = 0xA5
            before = storage.copy()
            # reductions: tensors at 64-byte steps with guard gaps; reduce_scatter sizes rounded for m
            offs, xs, want = 64, [], []
            for t, sz in enumerate(sizes):
                sz = (sz + m - 1) // m * m
                x = buf._view(offs, torch.empty(sz, dtype=torch.float32) if flavor == "torch" else np.empty(sz, np.float32))
                _np(x)[:] = values(rank, t, sz, k)
                xs.append(x)
                offs += (sz * 4 + 63) // 64 * 64 + 64
            snap = storage.copy()
            op = ("all_reduce", "reduce_scatter")[k % 2]
            if op == "all_reduce":
                got = buf.all_reduce(xs if len(xs) > 1 else xs[0], scale=scale, group=g).wait()
            else:
                got = buf.reduce_scatter(xs if len(xs) > 1 else xs[0], comm_precision="bf16" if bf16 else "fp32",
                                         scale=scale, group=g).wait()
            got = got if isinstance(got, list) else [got]
            expect = snap.copy()
            for t, x in enumerate(xs):
                sz = _np(x).size
                full = ref_sum([values(j, t, sz, k) for j in members], scale, bf16 and op == "reduce_scatter")
                off = (_np(x).__array_interface__["data"][0] - storage.__array_interface__["data"][0])
                if op == "all_reduce":
                    expect[off:off + sz * 4] = full.view(np.uint8)
                    assert got[t] is x
                else:
                    shard = full[me * sz // m:(me + 1) * sz // m]
                    expect[off + me * sz // m * 4:off + (me + 1) * sz // m * 4] = shard.view(np.uint8)
                    assert _np(got[t]).size == sz // m
            assert np.array_equal(storage, expect), f"rank {rank} group {g} {op} sizes {sizes}: storage differs"
            # all_gather in place (bytes of any dtype: int16 here)
            storage[:] = before
            offs, srcs, outs = 64, [], []
            for t, sz in enumerate(sizes):
                base = offs
                src = buf._view(base + me * sz * 2, torch.empty(sz, dtype=torch.int16) if flavor == "torch" else np.empty(sz, np.int16))
                _np(src)[:] = values(rank, t, sz, k).view(np.int32).astype(np.int16)
                srcs.append(src)
                outs.append((base, sz))
                offs += (m * sz * 2 + 63) // 64 * 64 + 64
            snap = storage.copy()
            got = buf.all_gather(srcs if len(srcs) > 1 else srcs[0], group=g).wait()
            got = got if isinstance(got, list) else [got]
            expect = snap.copy()
            for t, (base, sz) in enumerate(outs):
                full = np.concatenate([values(j, t, sz, k).view(np.int32).astype(np.int16) for j in members])
                expect[base:base + m * sz * 2] = full.view(np.uint8)
                assert np.array_equal(_np(got[t]), full)
            assert np.array_equal(storage, expect), f"rank {rank} group {g} all_gather sizes {sizes}: storage differs"
    buf.destroy()
    return True


@pytest.mark.parametrize("flavor", ["torch", "numpy"])
def test_collectives_bit_exact_on_every_group(flavor):
    assert epx.launch(_collectives, P, flavor, start_method="fork", timeout_secs=120) == [True] * P


def _plan_and_session(rank, n):
    import torch
    plan = epx.BufferAllocator()
    grads = plan.allocate((3, 1000), torch.float32)
    ids = plan.allocate((17,), np.int64)
    assert plan.num_bytes == 4 << 20 and grads.numel() == 3000
    buf = epx.BucketBuffer(None, plan, session_bytes=1 << 20)
    assert grads.data_ptr() == buf.runtime.storage_ptr and np.asarray(ids).ctypes.data == buf.runtime.storage_ptr + (2 << 20)
    grads.copy_(torch.from_numpy(values(rank, 0, 3000, 5).reshape(3, 1000)))
    out = buf.all_reduce(grads, scale=0.25).wait()
    assert out is grads
    want = ref_sum([values(j, 0, 3000, 5) for j in range(n)], 0.25).reshape(3, 1000)
    assert np.array_equal(grads.numpy(), want)
    # A session: tensors outside the storage are staged (past the plan) and copied back.
    ext = [torch.from_numpy(values(rank, t, 4 * (t + 1) * n, 6)) for t in range(3)]
    with buf.session() as s:
        staged = s.allocate((n * 8,), torch.float32)
        staged.copy_(torch.from_numpy(values(rank, 9, n * 8, 6)))
        outs = buf.reduce_scatter(ext + [staged], scale=2.0).wait()
        for t, e in enumerate(ext):
            full = ref_sum([values(j, t, e.numel(), 6) for j in range(n)], 2.0)
            sz = e.numel() // n
            assert np.array_equal(outs[t].numpy(), full[rank * sz:(rank + 1) * sz])
            assert outs[t].data_ptr() == e.data_ptr() + rank * sz * 4  # the caller's own shard
        gathered = torch.empty(n * 5, dtype=torch.float32)
        mine = torch.from_numpy(values(rank, 3, 5, 7))
        g = buf.all_gather(mine, dsts=gathered).wait()
        assert g is gathered and np.array_equal(g.numpy(), np.concatenate([values(j, 3, 5, 7) for j in range(n)]))
        # out of staging space: an epx.Error on every rank, nothing overwritten
        with pytest.raises(epx.Error, match="out of session staging storage"):
            buf.all_reduce(torch.zeros(1 << 20, dtype=torch.float32)).wait()
    assert np.array_equal(grads.numpy(), want)  # the plan's tensors were never staging space
    buf.destroy()
    buf.destroy()
    with pytest.raises(epx.Error, match="destroyed"):
        buf.all_reduce(grads)
    return True


def test_allocator_plan_and_sessions():
    assert epx.launch(_plan_and_session, P, start_method="fork", timeout_secs=120) == [True] * P


def _errors(rank, n):
    import torch
    buf = epx.BucketBuffer([list(range(n)), [0, 1]], 1 << 20)
    x = buf._view(0, torch.empty(64, dtype=torch.float32))
    cases = [
        ("sizes differ", lambda: buf.all_reduce(buf._view(0, torch.empty(64 if rank != 2 else 32, dtype=torch.float32)),
                                                group=0), "srcs[0]: 128 bytes", 2),
        ("not float32", lambda: buf.all_reduce(x if rank != 1 else buf._view(0, torch.empty(64, dtype=torch.float16)),
                                               group=0), "reduces float32", 1),
        ("outside", lambda: buf.reduce_scatter(x if rank != 3 else torch.zeros(64), group=0), "outside the buffer's storage", 3),
        ("not contiguous", lambda: buf.all_reduce(x if rank != 0 else buf._view(0, torch.empty(64, dtype=torch.float32)).view(8, 8).t(),
                                                  group=0), "not contiguous", 0),
    ]
    seen = []
    for name, call, words, origin in cases:
        try:
            call().wait()
        except epx.Error as e:
            assert words in str(e) and e.origin_rank == origin and f"rank {origin}" in str(e), (name, str(e))
            seen.append(name)
    # a group the buffer was not built with, named by its members: "every rank" of them fails
    if rank < 3:
        try:
            buf.all_reduce(x, group=[0, 1, 2]).wait()
        except epx.Error as e:
            assert str(e).startswith("every rank: all_reduce: group: not one of") and e.origin_rank == -1, str(e)
            seen.append("unknown group")
    else:
        seen.append("unknown group")
    # the buffer works after every error
    x.numpy()[:] = rank
    buf.all_reduce(x, group=0).wait()
    assert (x.numpy() == n * (n - 1) / 2).all()
    buf.destroy()
    return seen


def test_errors_fail_every_rank_naming_it():
    got = epx.launch(_errors, P, start_method="fork", timeout_secs=120)
    assert all(len(s) == 5 for s in got), got


def _with_ep(rank, n):
    """An EPBuffer and a BucketBuffer on the same ranks, calls interleaved, both bit-exact."""
    import torch
    case = make_case(n, 8, 2, 128, [5, 3, 0, 7][:n], seed=41)
    res = epx_ref.compute(case, layout="compact", alignment=1, deterministic=True, zero_padding=True)
    ep = epx.EPBuffer(None, num_max_tokens_per_rank=7, hidden=128, num_topk=2, num_experts=8)
    bucket = epx.BucketBuffer(None, 1 << 20)
    x = bucket._view(0, torch.empty(1000, dtype=torch.float32))
    for it in range(3):
        xin, idx, w = inputs(case, rank, "torch")
        out = ep.dispatch(xin, idx, w, deterministic=True, do_zero_padding=True)
        recv_x, recv_idx, recv_w, handle, _ = out
        check_dispatch(case, res, rank, (recv_x, recv_idx, recv_w, handle), False, False)
        x.numpy()[:] = values(rank, it, 1000, 8)
        ev = bucket.all_reduce(x, scale=0.5)  # in flight while the combine runs
        y = expert_y(case, recv_x, recv_idx, handle, False)
        combined, _, _ = ep.combine(y, handle)
        same("combined_x", combined, res.ranks[rank]["combined_x"], rank)
        ev.wait()
        assert np.array_equal(x.numpy(), ref_sum([values(j, it, 1000, 8) for j in range(n)], 0.5))
    ep.destroy()
    bucket.destroy()
    return True


def test_ep_and_bucket_buffers_interleaved():
    assert epx.launch(_with_ep, P, start_method="fork", timeout_secs=120) == [True] * P
