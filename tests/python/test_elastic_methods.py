"""ElasticBuffer's AG/RS, PP and Engram methods (DeepEP 2.1.0's names: python/epx/_elastic_*.py)
on 4 ranks, each result against a reference made here from what every rank holds (torch.stack
of the ranks' tensors, the concatenated tables, the sent bytes); and BucketBuffer with each
rank's own data- / tensor-parallel groups. The mixins are tried on a minimal class that sets
the attributes ElasticBuffer.__init__ promises them, and on epx.ElasticBuffer once it has them."""
import random

import numpy as np
import pytest

import epx
from epx._elastic_agrs import AgrsMixin
from epx._elastic_engram import EngramMixin
from epx._elastic_pp import PPMixin

P = 4
MB2 = 2 << 20


def launch(fn, *args):
    return epx.launch(fn, P, *args, start_method="fork", timeout_secs=120)


class Mixed(AgrsMixin, PPMixin, EngramMixin):
    """The contract attributes, nothing else."""

    def __init__(self, group, num_bytes, num_cpu_bytes=0):
        import torch.distributed as dist
        self.group = group
        self.rank_idx, self.num_ranks = dist.get_rank(group), dist.get_world_size(group)
        self.num_bytes, self.num_cpu_bytes = num_bytes, num_cpu_bytes
        self.num_cpu_timeout_secs, self.transport_kind = 60, "auto"

    def destroy(self):
        self._destroy_agrs()
        self._destroy_pp()
        self._destroy_engram()


def make(kind, group, num_bytes, num_cpu_bytes=0):
    if kind == "ElasticBuffer":
        return epx.ElasticBuffer(group, num_bytes=num_bytes, num_cpu_bytes=num_cpu_bytes, explicitly_destroy=True)
    return Mixed(group, num_bytes, num_cpu_bytes)


KINDS = ["mixins", "ElasticBuffer"]


def _expect_error(code, fn, *words):
    try:
        fn()
    except epx.Error as e:
        assert e.code == code, (e.code, str(e))
        for w in words:
            assert w in str(e), (w, str(e))
        return str(e)
    raise AssertionError(f"no epx.Error ({code}) raised")


# -- static sizes ----------------------------------------------------------------------------
def test_size_hints_are_deepeps_formulas():
    import torch
    bf16 = torch.bfloat16
    # per gather: align(ranks * numel * item, 32)
    assert Mixed.get_agrs_num_max_session_bytes(4, (3, 5), bf16) == 128
    assert Mixed.get_agrs_num_max_session_bytes(4, [(3, 5), (7,)], bf16) == 128 + 64
    assert Mixed.get_agrs_num_max_session_bytes(8, [torch.Size([2, 2])], torch.float32) == 128
    assert Mixed.get_agrs_buffer_size_hint(None, 1) == MB2
    assert Mixed.get_agrs_buffer_size_hint(None, MB2 + 1) == 2 * MB2
    # 4 sides (send/recv x prev/next) of in-flight tensors, each rounded to 32 bytes
    assert Mixed.get_pp_buffer_size_hint(100, 3) == MB2
    assert Mixed.get_pp_buffer_size_hint(1 << 20, 2) == 4 * MB2
    assert Mixed.get_pp_buffer_size_hint((1 << 20) + 1, 1) == 3 * MB2
    # rows rounded to 32 bytes: (fetch area, storage)
    assert Mixed.get_engram_storage_size_hint(1000, 100, 10) == (MB2, MB2)
    assert Mixed.get_engram_storage_size_hint(10000, 128, 10, torch.uint8) == (MB2, MB2)
    assert Mixed.get_engram_storage_size_hint(65536, 24, 1, bf16) == (MB2, 2 * MB2)  # 48 -> 64 bytes a row


# -- all-gather ------------------------------------------------------------------------------
DTYPES = ["bfloat16", "float32", "int64", "uint8"]


def _tensor(rank, key, shape, dtype):
    import torch
    g = torch.Generator().manual_seed(hash((rank, key)) % (1 << 31))
    return torch.randint(-100, 100, shape, generator=g).to(getattr(torch, dtype)) if dtype != "uint8" else \
        torch.randint(0, 256, shape, generator=g).to(torch.uint8)


def _agrs(rank, n, kind, seed, sub):
    import torch
    import torch.distributed as dist
    group = None
    if sub:  # ranks 1..3 only; rank 0 takes no part
        group = dist.new_group([1, 2, 3])
        if rank == 0:
            return True
    me, m = dist.get_rank(group), dist.get_world_size(group)
    rng = random.Random(seed)  # the same program on every rank
    max_gathers, session_bytes = 5, 48 << 10
    buf = make(kind, group, Mixed.get_agrs_buffer_size_hint(group, session_bytes))
    _expect_error("invalid_argument", lambda: buf.agrs_get_inplace_tensor((4,), torch.float32), "agrs_set_config")
    buf.agrs_set_config(session_bytes, max_gathers)
    _expect_error("invalid_argument", lambda: buf.all_gather(torch.zeros(4)), "no AGRS session")
    checked = 0
    for s in range(12):
        with buf.agrs_new_session():
            pending, used, gathers = [], 0, 0
            while gathers < max_gathers:
                k = rng.randint(1, 3)
                shapes = [tuple(rng.choice([1, 2, 3, 7, 16, 33]) for _ in range(rng.randint(1, 3))) for _ in range(k)]
                dtype = rng.choice(DTYPES)
                item = torch.empty(0, dtype=getattr(torch, dtype)).element_size()
                need = sum((m * int(np.prod(sh)) * item + 31) // 32 * 32 for sh in shapes)
                if used + need > session_bytes:
                    break
                used, gathers = used + need, gathers + 1
                key = (seed, s, gathers)
                mine = [_tensor(me, key + (i,), sh, dtype) for i, sh in enumerate(shapes)]
                mode = rng.choice(["inplace", "outofplace", "mixed"])
                batched = k > 1 or rng.random() < 0.5
                if mode == "outofplace":
                    srcs = mine
                else:
                    slots = buf.agrs_get_inplace_tensor([tuple(sh) for sh in shapes] if batched else shapes[0],
                                                        getattr(torch, dtype))
                    slots = list(slots) if batched else [slots]
                    for i, (x, y) in enumerate(zip(slots, mine)):
                        if mode == "inplace" or i % 2 == 0:
                            x.copy_(y)
                        else:
                            slots[i] = y.clone()
                    srcs = slots
                if batched:
                    *outs, handle = buf.all_gather(srcs)
                else:
                    out, handle = buf.all_gather(srcs[0])
                    outs = [out]
                pending.append((key, shapes, dtype, outs, handle))
                if rng.random() < 0.4:  # wait some now, in any order, the rest later
                    rng.shuffle(pending)
                    key, shapes_, dtype_, outs_, h = pending.pop()
                    h()
                    checked += _check_gathered(key, shapes_, dtype_, outs_, m)
            rng.shuffle(pending)
            for key, shapes_, dtype_, outs_, h in pending:
                h()
                checked += _check_gathered(key, shapes_, dtype_, outs_, m)
            last = pending[-1][4] if pending else None
        if last is not None:  # a handle outlives its session
            _expect_error("bad_handle", last, "after its session ended")
    assert checked > 20
    # the limits, on every rank alike (local errors, no collective entered)
    with buf.agrs_new_session():
        for _ in range(max_gathers):
            buf.all_gather(torch.ones(2))[1]()
        _expect_error("capacity_exceeded", lambda: buf.all_gather(torch.ones(2)), "num_max_all_gathers_per_session")
        _expect_error("capacity_exceeded", lambda: buf.agrs_get_inplace_tensor((2,), torch.float32), "session is full")
    with buf.agrs_new_session():
        _expect_error("capacity_exceeded", lambda: buf.all_gather(torch.ones(session_bytes // m // 4 + 1)),
                      f"of {session_bytes}")
        a, b = buf.agrs_get_inplace_tensor([(8,), (8,)], torch.float32)
        _expect_error("invalid_argument", lambda: buf.all_gather(b), "slot for rank")  # b is the 2nd gather's slot
        a.fill_(me)
        b.fill_(-me)
        *g, h = buf.all_gather([a, b])
        h()
        assert torch.equal(g[0], torch.arange(m, dtype=torch.float32)[:, None].expand(m, 8))
        assert torch.equal(g[1], -torch.arange(m, dtype=torch.float32)[:, None].expand(m, 8))
        _expect_error("invalid_argument", buf.create_agrs_session, "open already")
    _expect_error("invalid_argument", buf.destroy_agrs_session, "no session")
    _expect_error("capacity_exceeded", lambda: buf.agrs_set_config(buf.num_bytes + 1, 1), "num_bytes")
    _expect_error("invalid_argument", lambda: buf.agrs_set_config(1024, 33), "1..32")
    with buf.agrs_new_session(enabled=False):
        assert not buf._agrs_in_session
    buf.destroy()
    return True


def _check_gathered(key, shapes, dtype, outs, m):
    import torch
    assert len(outs) == len(shapes)
    for i, (sh, out) in enumerate(zip(shapes, outs)):
        ref = torch.stack([_tensor(j, key + (i,), sh, dtype) for j in range(m)])
        assert out.dtype == ref.dtype and out.shape == ref.shape, (out.dtype, out.shape, ref.shape)
        assert torch.equal(out, ref), f"gather {key} tensor {i}"
    return 1


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("sub", [False, True], ids=["world", "subgroup"])
def test_all_gather_sessions_equal_the_stacked_tensors(kind, sub):
    assert launch(_agrs, kind, 7, sub) == [True] * P


# -- pipeline send / recv ----------------------------------------------------------------
def _pp(rank, n, kind, seed, pair):
    import torch
    import torch.distributed as dist
    group = None
    if pair:  # a ring of two: prev == next
        group = dist.new_group([2, 3])
        if rank not in (2, 3):
            return True
    me, m = dist.get_rank(group), dist.get_world_size(group)
    max_bytes, inflight = 6000, 3
    buf = make(kind, group, Mixed.get_pp_buffer_size_hint(max_bytes, inflight))
    _expect_error("invalid_argument", lambda: buf.pp_send(torch.zeros(2), (me + 1) % m), "pp_set_config")
    _expect_error("capacity_exceeded", lambda: buf.pp_set_config(buf.num_bytes, 1), "num_bytes")
    buf.pp_set_config(max_bytes, inflight)
    nxt, prev = (me + 1) % m, (me - 1) % m

    def msg(src, dst, k):
        g = torch.Generator().manual_seed(seed * 7919 + src * 131 + dst * 17 + k)
        numel = int(torch.randint(1, max_bytes // 2 + 1, (1,), generator=g))
        return torch.randint(-30000, 30000, (numel,), generator=g, dtype=torch.int16)

    # rounds: a burst of up to `inflight` to each neighbour, then receive what the neighbours sent
    for rnd in range(6):
        count = 1 + rnd % inflight
        for peer in ({nxt, prev} if m > 2 else {nxt}):
            for k in range(count):
                buf.pp_send(msg(me, peer, rnd * 10 + k), peer)
        for peer in ({prev, nxt} if m > 2 else {prev}):
            for k in range(count):
                want = msg(peer, me, rnd * 10 + k)
                got = torch.empty_like(want)
                assert buf.pp_recv(got, peer) is None
                assert torch.equal(got, want), (rnd, peer, k)
    if m > 2:
        far = (me + 2) % m
        _expect_error("invalid_argument", lambda: buf.pp_send(torch.zeros(2), far), f"dst_rank_idx = {far}",
                      f"previous ({prev})", f"next ({nxt})")
        _expect_error("invalid_argument", lambda: buf.pp_recv(torch.zeros(2), far), f"src_rank_idx = {far}")
    _expect_error("capacity_exceeded", lambda: buf.pp_send(torch.zeros(max_bytes + 64, dtype=torch.uint8), nxt),
                  "num_max_tensor_bytes")
    _expect_error("invalid_argument", lambda: buf.pp_send(torch.zeros(4, 4).t(), nxt), "contiguous")
    buf.pp_set_config(64, 1)  # made anew, smaller
    buf.pp_send(torch.full((16,), me, dtype=torch.int32), nxt, num_sms=3)
    got = torch.empty(16, dtype=torch.int32)
    buf.pp_recv(got, prev, num_sms=3)
    assert torch.equal(got, torch.full((16,), prev, dtype=torch.int32))
    buf.destroy()
    return True


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("pair", [False, True], ids=["ring4", "ring2"])
def test_pp_ring_moves_every_byte(kind, pair):
    assert launch(_pp, kind, 3, pair) == [True] * P


# -- engram -----------------------------------------------------------------------------------
def _rows(rank, n_entries, hidden, fp8, seed):
    import torch
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    if fp8:
        data = torch.randint(0, 256, (n_entries, hidden), generator=g, dtype=torch.uint8)
        sf = torch.rand((n_entries, hidden // 128), generator=g) + 0.5
        return data, sf
    return torch.randn((n_entries, hidden), generator=g).to(torch.bfloat16), None


def _engram(rank, n, kind, fp8):
    import torch
    n_entries, hidden, tokens, per_token = 300, 256 if fp8 else 96, 9, 5
    dtype = torch.uint8 if fp8 else torch.bfloat16
    gpu, cpu = Mixed.get_engram_storage_size_hint(n_entries, hidden, tokens * per_token, dtype)
    buf = make(kind, None, gpu + cpu, cpu)
    _expect_error("invalid_argument", lambda: buf.engram_fetch(torch.zeros((1, 1), dtype=torch.int32)),
                  "engram_write first")
    for seed in (1, 2):  # a second write replaces the table
        mine, _ = _rows(rank, n_entries, hidden, fp8, seed)
        table = torch.cat([_rows(j, n_entries, hidden, fp8, seed)[0] for j in range(n)])
        table_sf = torch.cat([_rows(j, n_entries, hidden, fp8, seed)[1] for j in range(n)]) if fp8 else None
        buf.engram_write(mine, sf=table_sf)
        g = torch.Generator().manual_seed(seed * 31 + rank)
        idx = torch.randint(0, n * n_entries, (tokens, per_token), generator=g, dtype=torch.int32)
        idx[0, 0], idx[-1, -1] = 0, n * n_entries - 1
        for col in (False, True):
            data, sf = buf.engram_fetch(idx, num_qps=5, use_tma_aligned_col_major_sf=col)()
            ref = table[idx.view(-1).long()].view(tokens, -1)
            assert data.dtype == dtype and data.shape == (tokens, per_token * hidden)
            assert torch.equal(data, ref)
            if fp8:
                ref_sf = table_sf[idx.view(-1).long()].view(tokens, -1)
                assert sf.dtype == torch.float32 and torch.equal(sf, ref_sf)
                assert sf.stride() == ((1, (tokens + 3) // 4 * 4) if col else (per_token * hidden // 128, 1))
            else:
                assert sf is None
    bad = torch.zeros((2, 3), dtype=torch.int32)
    bad[1, 2] = n * n_entries
    _expect_error("invalid_argument", lambda: buf.engram_fetch(bad), "indices[1, 2]", str(n * n_entries))
    _expect_error("dtype_mismatch", lambda: buf.engram_fetch(bad.long()), "int32")
    too_many = torch.zeros((gpu // hidden + 1, 1), dtype=torch.int32)
    _expect_error("capacity_exceeded", lambda: buf.engram_fetch(too_many), "GPU part")
    big, _ = _rows(rank, cpu // hidden + 1, hidden, fp8, 3)
    _expect_error("capacity_exceeded", lambda: buf.engram_write(big, sf=table_sf), "num_cpu_bytes")
    if fp8:
        _expect_error("invalid_argument", lambda: buf.engram_write(mine), "sf must be given")
        _expect_error("unsupported", lambda: buf.engram_write(mine, sf=table_sf[:, :1].repeat(1, 3)),
                      "hidden / 128")
    buf.destroy()
    return True


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_engram_fetch_equals_the_concatenated_tables(kind, fp8):
    assert launch(_engram, kind, fp8) == [True] * P


# -- BucketBuffer on each rank's own groups ---------------------------------------------------
def _roles(rank, n, bad):
    import torch
    import torch.distributed as dist
    # data-parallel {0,2} {1,3} and tensor-parallel {0,1} {2,3}: every rank makes every group
    dp = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    tp = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    mine = [dp[rank % 2], tp[rank // 2]]
    if bad:
        if bad == "nonmember":  # rank 3 names the other tensor-parallel group as its own
            mine = [dp[rank % 2], tp[0] if rank == 3 else tp[rank // 2]]
        else:  # rank 1 names the world, where its peer 0 names {0, 1}
            mine = [dp[rank % 2], dist.group.WORLD if rank == 1 else tp[rank // 2]]
        try:
            epx.BucketBuffer(mine, 1 << 16)
        except epx.Error as e:
            return e.code, e.origin_rank, str(e)
        return "built"
    buf = epx.BucketBuffer(mine, 1 << 16)
    x = buf.storage[:4096].view(torch.float32)
    out = []
    for role, members in ((0, [rank % 2, rank % 2 + 2]), (1, [rank // 2 * 2, rank // 2 * 2 + 1])):
        assert buf.get_context_idx(mine[role]) == role
        x.copy_(torch.arange(1024, dtype=torch.float32) * (rank + 1) + role)
        got = buf.all_reduce(x, group=mine[role]).wait()
        want = sum(torch.arange(1024, dtype=torch.float32) * (j + 1) + role for j in members)
        out.append(torch.equal(got, want))
        y = buf.storage[8192:8192 + 64].view(torch.float32)
        y.fill_(rank)
        g = buf.all_gather(y[members.index(rank) * 8:][:8], group=mine[role]).wait()
        out.append(torch.equal(g, torch.tensor([float(j) for j in members]).repeat_interleave(8)))
    buf.destroy()
    return out


def test_bucket_with_each_ranks_own_groups():
    assert launch(_roles, None) == [[True] * 4] * P


@pytest.mark.parametrize("bad, rank, words", [
    ("nonmember", 3, "rank 3 passes a group it is not a member of"),
    ("member", 1, "rank 0 passes [0, 1], which has rank 1, but rank 1 passes [0, 1, 2, 3]")])
def test_bucket_groups_that_disagree_fail_every_rank_at_construction(bad, rank, words):
    got = launch(_roles, bad)
    assert got == [("invalid_argument", rank, got[0][2])] * P, got
    assert words in got[0][2] and "group 1" in got[0][2], got[0][2]


# -- under torch.inference_mode (DeepEP's tests decorate their ranks with it) -------------------
def _inference(rank, n):
    import torch
    import torch.distributed as dist
    with torch.inference_mode():
        group = dist.new_group(list(range(n)))  # a new group: its transport bootstraps in here
        buf = Mixed(group, 4 << 20, 2 << 20)
        buf.pp_set_config(1024, 2)
        buf.pp_send(torch.full((4,), float(rank)), (rank + 1) % n)
        x = torch.empty(4)
        buf.pp_recv(x, (rank - 1) % n)
        ok = [torch.equal(x, torch.full((4,), float((rank - 1) % n)))]
        buf.agrs_set_config(1 << 20, 4)
        with buf.agrs_new_session():
            t = buf.agrs_get_inplace_tensor((3,), torch.float32)
            t.fill_(rank)
            g, h = buf.all_gather(t)
            h()
            ok.append(torch.equal(g, torch.arange(n, dtype=torch.float32)[:, None].expand(n, 3)))
        table = torch.arange(8 * 128 * n, dtype=torch.float32).view(8 * n, 128).to(torch.bfloat16)
        buf.engram_write(table[rank * 8:(rank + 1) * 8].clone())
        idx = torch.tensor([[8 * n - 1, 0], [3, 9]], dtype=torch.int32)
        data, sf = buf.engram_fetch(idx)()
        ok.append(sf is None and torch.equal(data, table[idx.view(-1).long()].view(2, -1)))
        buf.destroy()
    return ok


def test_methods_under_inference_mode():
    assert launch(_inference) == [[True] * 3] * P
