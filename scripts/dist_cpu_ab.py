#!/usr/bin/env python3
"""One torch.distributed call, timed in CPU seconds of all ranks per call (which a shared
machine's load inflates far less than wall time) and in wall time (the slowest rank's median).
Run it several times, interleaved, to compare two settings, two checkouts (PYTHONPATH) or
epx against gloo:

    for i in 1 2 3; do for b in epx gloo; do
      PYTHONPATH=build/python python3 scripts/dist_cpu_ab.py all_reduce 8 5 --backend $b
    done; done

case: all_gather (64 MiB float32 in, RANKS x that out), all_reduce (64 MiB float32), all_reduce_16k, reduce_scatter
(64 MiB in), a2a_4096 / a2a_128 (all_to_all_single of 4096 / 128 tokens x 8 of 7168 fp16 rows a
rank, even splits), ddp (a DistributedDataParallel step of the 25M-parameter MLP of
epx.distributed_bench, batch 8) and step (the same step without DDP: no communication, the
floor of ddp on this machine). CPU time counts every thread of a rank (DDP's and epx's worker
threads, gloo's), so a wait that spins shows in it; it includes a gloo barrier before each call
(the same for every setting).
"""
import argparse
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

MiB = 1 << 20


def _mlp():
    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 4096),
                               torch.nn.ReLU(), torch.nn.Linear(4096, 1024))


def _call(case, rank, world, group):
    if case == "all_gather":
        x = torch.full((16 * MiB,), float(rank))
        out = torch.empty(world * x.numel())
        return lambda: dist.all_gather_into_tensor(out, x, group=group)
    if case in ("all_reduce", "all_reduce_16k"):
        x = torch.full(((64 * MiB if case == "all_reduce" else 16 << 10) // 4,), float(rank))
        return lambda: dist.all_reduce(x, group=group)
    if case == "reduce_scatter":
        x = torch.full((16 * MiB,), float(rank))
        out = torch.empty(x.numel() // world)
        return lambda: dist.reduce_scatter_tensor(out, x, group=group)
    if case in ("a2a_4096", "a2a_128"):
        rows = int(case.split("_")[1]) * 8 // world
        x = torch.randn(rows * world, 7168).half()
        out = torch.empty_like(x)
        return lambda: dist.all_to_all_single(out, x, group=group)
    if case in ("ddp", "step"):
        model = _mlp()
        if case == "ddp":
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(model, process_group=group)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        g = torch.Generator().manual_seed(rank)

        def step():
            x, y = torch.randn(8, 1024, generator=g), torch.randn(8, 1024, generator=g)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        return step
    raise SystemExit(f"unknown case {case}")


def _rank(rank, world, init, a, q):
    import epx.distributed  # noqa: F401  (registers "epx")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    group = dist.new_group(backend=a.backend) if a.backend != "gloo" else None
    f = _call(a.case, rank, world, group)
    f()
    walls = []
    dist.barrier()
    c0 = time.process_time()
    for _ in range(a.n):
        dist.barrier()  # gloo's: the call's wall time starts with every rank in it
        t0 = time.perf_counter()
        f()
        walls.append(time.perf_counter() - t0)
    dist.barrier()
    cpu = time.process_time() - c0
    q.put((sorted(walls)[len(walls) // 2], cpu))
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("case")
    ap.add_argument("world", type=int)
    ap.add_argument("n", type=int)
    ap.add_argument("--backend", default="epx", choices=["epx", "gloo"])
    a = ap.parse_args()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="epx-dist-ab-") as d:
        init = "file://" + os.path.join(d, "store")  # no port another job could hold
        procs = [ctx.Process(target=_rank, args=(r, a.world, init, a, q)) for r in range(a.world)]
        for p in procs:
            p.start()
        try:
            res = [q.get(timeout=900) for _ in procs]
        finally:
            for p in procs:
                p.join(timeout=30)
                if p.exitcode is None:
                    p.kill()
                    p.join()
    wall, cpu = max(r[0] for r in res), sum(r[1] for r in res) / a.n
    load = os.getloadavg()[0]
    print(f"{a.case} P={a.world} {a.backend} ({os.environ.get('PYTHONPATH', '')}): wall {wall * 1e3:.1f} ms/call "
          f"(slowest rank's median), cpu {cpu * 1e3:.1f} ms/call (all ranks), load {load:.1f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
