"""A quick comparison with gloo (not a test): python3 -m epx.distributed [ranks]."""
import datetime
import os

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup

from ._util import _WINDOW, BACKEND, _done


class _NoopGroup(ProcessGroup):
    """A backend whose all_reduce does nothing: the cost of a Python ProcessGroup call alone."""

    def __init__(self, store, rank, size, timeout):
        super().__init__(rank, size)

    def allreduce(self, tensors, opts=None):
        return _done(list(tensors))


def _cases(size, gloo):
    """(name, repetitions, the epx call, the gloo call) of each case; indented names are
    parts of the case above them, epx only."""
    P = size
    cases = []
    small = torch.ones(4096)
    cases.append(("all_reduce 16 KiB f32", 200,
                  lambda g: dist.all_reduce(small, group=g), lambda: dist.all_reduce(small, group=gloo)))
    pg = dist.distributed_c10d._get_default_group()
    raw = pg._view(_WINDOW, torch.float32)
    cases.append(("  BucketBuffer.all_reduce alone", 200,
                  lambda g: pg._bucket.all_reduce([(raw.data_ptr(), 4096 * 4, 4)], 1.0, 0).wait(), lambda: None))
    big = torch.ones(16 << 20)
    cases.append(("all_reduce 64 MiB f32", 3,
                  lambda g: dist.all_reduce(big, group=g), lambda: dist.all_reduce(big, group=gloo)))

    def raw_calls(g, n=big.numel()):  # the BucketBuffer alone, in its window: what staging adds is the rest
        for s in range(0, n, raw.numel()):
            m = min(raw.numel(), n - s)
            pg._bucket.all_reduce([(raw.data_ptr(), m * 4, 4)], 1.0, 0).wait()

    cases.append(("  BucketBuffer.all_reduce alone", 3, raw_calls, lambda: None))
    ag_out = torch.empty(16 << 20)
    ag_in = torch.ones((16 << 20) // P)
    ag_list = list(ag_out.chunk(P))  # gloo has no all_gather_into_tensor: the list form into the same bytes
    cases.append(("all_gather_into_tensor 64 MiB out", 3,
                  lambda g: dist.all_gather_into_tensor(ag_out, ag_in, group=g),
                  lambda: dist.all_gather(ag_list, ag_in, group=gloo)))
    a2a_in = torch.ones(128, 7168, dtype=torch.bfloat16)
    a2a_out = torch.empty_like(a2a_in)
    cases.append(("all_to_all_single 128x7168 bf16", 30,
                  lambda g: dist.all_to_all_single(a2a_out, a2a_in, group=g),
                  lambda: dist.all_to_all_single(a2a_out.view(torch.int32), a2a_in.view(torch.int32), group=gloo)))
    return cases, small


def _bench_rank(rank, size, path, q):
    import time
    dist.Backend.register_backend("epxnoop", _NoopGroup)
    dist.init_process_group(BACKEND, init_method="file://" + path, rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=120))
    gloo = dist.new_group(backend="gloo")
    noop = dist.new_group(backend="epxnoop")
    cases, small = _cases(size, gloo)
    rows = []
    for name, reps, epx_call, gloo_call in cases:
        t_epx, t_gloo, t_noop = [], [], []
        epx_call(None), gloo_call()  # warm up
        for _ in range(reps):  # interleaved: both see the same machine state
            dist.barrier(group=gloo)
            t0 = time.perf_counter()
            epx_call(None)
            t1 = time.perf_counter()
            dist.barrier(group=gloo)
            t2 = time.perf_counter()
            gloo_call()
            t3 = time.perf_counter()
            t_epx.append(t1 - t0), t_gloo.append(t3 - t2)
            if name.startswith("all_reduce 16"):
                t4 = time.perf_counter()
                dist.all_reduce(small, group=noop)
                t_noop.append(time.perf_counter() - t4)
        med = lambda v: sorted(v)[len(v) // 2] if v else 0.0  # noqa: E731
        mine = torch.tensor([med(t_epx), med(t_gloo), med(t_noop)], dtype=torch.float64)
        dist.all_reduce(mine, op=dist.ReduceOp.MAX, group=gloo)  # the slowest rank's median
        rows.append((name, *mine.tolist()))
    if rank == 0:
        q.put(rows)
    dist.destroy_process_group()


def _bench_main(size=8):
    import multiprocessing as mp
    import tempfile
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="epx-dist-bench-") as d:
        q = ctx.Queue()
        procs = [ctx.Process(target=_bench_rank, args=(r, size, os.path.join(d, "store"), q)) for r in range(size)]
        for p in procs:
            p.start()
        rows = q.get(timeout=600)
        for p in procs:
            p.join(timeout=60)
    print(f"{size} ranks, median of interleaved runs (slowest rank), window {_WINDOW >> 20} MiB")
    print(f"{'call':36s} {'epx ms':>10s} {'gloo ms':>10s} {'gloo/epx':>9s}")
    for name, te, tg, tn in rows:
        if name.startswith("  "):
            print(f"{name:36s} {te * 1e3:10.3f}")
            continue
        print(f"{name:36s} {te * 1e3:10.3f} {tg * 1e3:10.3f} {tg / te:9.2f}")
        if tn:
            print(f"{'  a Python ProcessGroup call alone':36s} {tn * 1e3:10.3f}")


