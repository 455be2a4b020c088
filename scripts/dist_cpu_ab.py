#!/usr/bin/env python3
"""One torch.distributed call on the "epx" backend, timed in CPU seconds of all ranks per call
(which a shared machine's load inflates far less than wall time) and wall time, with the
setting of the environment it runs in — run it twice, interleaved, to compare two settings:

    for i in 1 2; do for v in 0 1; do
      EPX_DIST_PEER_READ=$v PYTHONPATH=build/python python3 scripts/dist_cpu_ab.py all_gather 4 5
    done; done

case: all_gather (64 MiB in, 4x out), all_reduce (64 MiB float32), reduce_scatter (64 MiB in),
a2a_4096 / a2a_128 (all_to_all_single of 4096 / 128 tokens x 8 of 7168 fp16 rows a rank).
"""
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _call(case, rank, world):
    if case == "all_gather":
        x = torch.full((16 << 20,), float(rank))
        out = torch.empty(world * x.numel())
        return lambda: dist.all_gather_into_tensor(out, x)
    if case == "all_reduce":
        x = torch.full((16 << 20,), float(rank))
        return lambda: dist.all_reduce(x)
    if case == "reduce_scatter":
        x = torch.full((16 << 20,), float(rank))
        out = torch.empty(x.numel() // world)
        return lambda: dist.reduce_scatter_tensor(out, x)
    if case in ("a2a_4096", "a2a_128"):
        rows = int(case.split("_")[1]) * 8 // world
        x = torch.randn(rows * world, 7168).half()
        out = torch.empty_like(x)
        return lambda: dist.all_to_all_single(out, x)
    raise SystemExit(f"unknown case {case}")


def _rank(rank, world, port, case, n, q):
    import epx.distributed  # noqa: F401  (registers "epx")
    dist.init_process_group("epx", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    f = _call(case, rank, world)
    f()
    dist.barrier()
    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(n):
        f()
    dist.barrier()
    q.put((time.perf_counter() - t0, time.process_time() - c0))
    dist.destroy_process_group()


def main():
    case, world, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = 29000 + os.getpid() % 1000
    procs = [ctx.Process(target=_rank, args=(r, world, port, case, n, q)) for r in range(world)]
    for p in procs:
        p.start()
    res = [q.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    wall, cpu = max(r[0] for r in res) / n, sum(r[1] for r in res) / n
    print(f"{case} P={world} EPX_DIST_PEER_READ={os.environ.get('EPX_DIST_PEER_READ', '1')}: "
          f"wall {wall * 1e3:.1f} ms/call, cpu {cpu * 1e3:.1f} ms/call (all ranks)")


if __name__ == "__main__":
    main()
