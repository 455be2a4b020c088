"""python -m epx.bench_collective — the bucket collectives as a torch.distributed user calls
them over gloo, on the inputs of `epx bench --op` (baselines/collective_data.hpp, through _epx),
timed as epx bench times them: `epx bench --op ... --baseline gloo` runs this and reads its
JSON.

    /usr/bin/python3 -m epx.bench_collective --ranks P --op all_gather|reduce_scatter|all_reduce
        --bytes N [--tensors T] [--iters I] [--warmup W] [--seed S] --json OUT

P ranks started by epx.launch (gloo over a FileStore); per iteration every rank restores its
inputs (untimed), then dist.barrier(), then times the T calls: dist.all_gather (into a list of
P tensors), dist.all_reduce (in place) and, since gloo has no reduce_scatter in torch 1.13,
dist.all_reduce followed by taking this rank's shard (what such a user does). Rank 0 writes
max-rank latency {avg, p50, p95, max} (nearest-rank percentiles, us), each rank's average,
the FNV-1a 64 hash of its outputs and their values at the sample indices.
"""
import argparse
import json
import math
import time

import numpy as np

from . import _epx
from .group import launch


def _stats(v):
    s = sorted(v)
    pct = lambda p: s[max(1, min(len(s), math.ceil(p / 100 * len(s)))) - 1]  # noqa: E731
    return {"avg": sum(s) / len(s), "p50": pct(50), "p95": pct(95), "max": s[-1]}


def _rank(rank, n, a):
    import torch
    import torch.distributed as dist
    each = _epx.collective_tensor_bytes(a.bytes, a.tensors, n)
    in_bytes = each // n if a.op == "all_gather" else each
    pristine = [torch.from_numpy(np.asarray(_epx.collective_input(a.seed, rank, t, in_bytes)).view(np.float32).copy())
                for t in range(a.tensors)]
    work = [p.clone() for p in pristine]
    gathered = [[torch.empty_like(p) for _ in range(n)] for p in pristine]
    lat = []
    for it in range(a.warmup + a.iters):
        for w, p in zip(work, pristine):
            w.copy_(p)
        dist.barrier()
        t0 = time.perf_counter()
        for k, w in enumerate(work):
            if a.op == "all_gather":
                dist.all_gather(gathered[k], w)
            else:
                dist.all_reduce(w)
        t1 = time.perf_counter()
        if it >= a.warmup:
            lat.append((t1 - t0) * 1e6)
    h, samples = 1469598103934665603, []
    for k, w in enumerate(work):
        if a.op == "all_gather":
            out = torch.cat(gathered[k])
        elif a.op == "reduce_scatter":
            shard = w.numel() // n
            out = w[rank * shard:(rank + 1) * shard].contiguous()
        else:
            out = w
        arr = out.numpy()
        h = _epx.collective_hash(arr.ctypes.data, arr.nbytes, h)
        samples += [float(arr[i]) for i in _epx.collective_sample_indices(arr.size)]
    everyone = [None] * n
    dist.all_gather_object(everyone, (lat, f"0x{h:016x}", samples))
    if rank == 0:
        mx = [max(e[0][i] for e in everyone) for i in range(len(lat))]
        j = {"op": a.op, "ranks": n, "tensor_bytes": each, "tensors": a.tensors, "max_rank_us": _stats(mx),
             "max_rank_series_us": mx,
             "ranks_detail": [{"avg_us": sum(e[0]) / len(e[0]), "hash": e[1], "samples": e[2]} for e in everyone]}
        if a.op == "reduce_scatter":
            j["note"] = "gloo has no reduce_scatter in torch 1.13: dist.all_reduce, then this rank's shard"
        with open(a.json, "w") as f:
            json.dump(j, f)
    return True


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m epx.bench_collective", description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--op", choices=["all_gather", "reduce_scatter", "all_reduce"], required=True)
    p.add_argument("--bytes", type=int, required=True)
    p.add_argument("--tensors", type=int, default=1)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", required=True)
    a = p.parse_args(argv)
    launch(_rank, a.ranks, a, start_method="fork", timeout_secs=900)


if __name__ == "__main__":
    main()
