#!/usr/bin/python3
"""The torch.distributed (gloo) baseline of `epx bench --op pp|engram`: what a PyTorch user
writes without epx. Same problems, data and JSON as epx_mpi_p2p_baseline (p2p_data.hpp
defines the data; this file follows it word for word in numpy).

    python3 gloo_p2p_baseline.py --ranks P --op pp --sizes 16384,58720256 [--pattern pairs|ring]
            [--messages 4] --iters N --warmup W --json OUT
    python3 gloo_p2p_baseline.py --ranks P --op engram --layers 2 --rows 131072 --hidden 256
            --tokens 512 --entries 24 [--seed 1] --iters N --warmup W --json OUT

pp: dist.send / dist.recv of uint8 tensors (a stream of --messages per iteration from a 0-byte
"go" of each receiver, and a ping-pong between 2k and 2k+1 after an untimed round trip); engram: counts by all_to_all_single, (layer, row) requests
by all_to_all_single, the owners' rows back the same way, then put in place.
"""
import argparse
import datetime
import json
import os
import sys
import tempfile
import time

import numpy as np

M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def mix(x):
    """splitmix64's finaliser on a uint64 array (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def words(key, first, nbytes):
    n = (nbytes + 7) // 8
    with np.errstate(over="ignore"):
        w = mix(np.uint64(key) + np.uint64(first) + np.arange(n, dtype=np.uint64))
    return w.view(np.uint8)[:nbytes]


def message(src, nbytes):
    return words((0x5050 << 48) + (src << 40), 0, nbytes)


def table_rows(seed, layer, first_row, rows, row_bytes):
    key = int(mix(np.array([seed * 131 + layer], dtype=np.uint64))[0])
    return words(key, first_row * (row_bytes // 8), rows * row_bytes).reshape(rows, row_bytes)


def indices(seed, rank, layer, count, table_rows_):
    key = mix(np.array([seed * 7919 + rank * 977 + layer + 1], dtype=np.uint64))[0]
    with np.errstate(over="ignore"):
        return (mix(key + np.arange(count, dtype=np.uint64)) % np.uint64(table_rows_)).astype(np.int64)


def check_hash(b):
    b = np.ascontiguousarray(b).reshape(-1).view(np.uint8)
    pad = (-len(b)) % 8
    w = np.concatenate([b, np.zeros(pad, np.uint8)]).view(np.uint64)
    with np.errstate(over="ignore"):
        return int(np.sum(mix(w ^ mix(np.arange(len(w), dtype=np.uint64))), dtype=np.uint64))


def max_over_ranks(dist, torch, x):
    t = torch.tensor([x], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t[0])


def pp_stream(a, dist, torch, me, ring, src, dst, x, out):
    """One timed stream of a.messages messages along the pattern; the slowest receiver's us."""
    none = torch.empty(0, dtype=torch.uint8)
    dist.barrier()
    t0 = time.perf_counter()
    go = dist.isend(none, src) if src >= 0 else None  # the receiver's "go" to its sender
    if dst >= 0:
        dist.recv(none, dst)
    if go is not None:
        go.wait()
    for _ in range(a.messages):
        if ring and me % 2 == 1:
            dist.recv(out, src)
        if dst >= 0:
            dist.send(x, dst)
        if src >= 0 and not (ring and me % 2 == 1):
            dist.recv(out, src)
    us = (time.perf_counter() - t0) * 1e6 / a.messages if src >= 0 else 0.0
    return max_over_ranks(dist, torch, us)


def pp_pingpong(dist, me, x, out):
    """One-way latency of a pair's round trips (us, on the even rank; 0 on the odd one)."""
    peer = me + 1 if me % 2 == 0 else me - 1

    def round_trip():
        if me % 2 == 0:
            dist.send(x, peer)
            dist.recv(out, peer)
        else:
            dist.recv(out, peer)
            dist.send(x, peer)
    dist.barrier()
    round_trip()  # untimed: both ends in step
    t0 = time.perf_counter()
    for _ in range(8):
        round_trip()
    return (time.perf_counter() - t0) * 1e6 / 16 if me % 2 == 0 else 0.0


def run_pp(a, me, P, dist, torch):
    ring = a.pattern == "ring"
    dst = (me + 1) % P if ring else (me + 1 if me % 2 == 0 else -1)
    src = (me - 1) % P if ring else (me - 1 if me % 2 == 1 else -1)
    results = []
    for n in a.sizes:
        x = torch.from_numpy(message(me, n).copy())
        out = torch.empty(n, dtype=torch.uint8)
        st, lat = [], []
        for i in range(a.warmup + a.iters):
            s, l_ = pp_stream(a, dist, torch, me, ring, src, dst, x, out), pp_pingpong(dist, me, x, out)
            allv = [torch.zeros(1, dtype=torch.float64) for _ in range(P)]
            dist.all_gather(allv, torch.tensor([l_], dtype=torch.float64))
            if i >= a.warmup:
                st.append(s)
                lat.append([float(t[0]) for t in allv])
        pp_stream(a, dist, torch, me, ring, src, dst, x, out)
        h = check_hash(out.numpy()) if (ring or me % 2 == 1) else 0
        hs = [torch.zeros(1, dtype=torch.int64) for _ in range(P)]
        dist.all_gather(hs, torch.tensor([np.uint64(h).astype(np.int64)], dtype=torch.int64))
        results.append({"bytes": n, "stream_us": st,
                        "pair_latency_us": [[it[p] for it in lat] for p in range(0, P - 1, 2)],
                        "hash": ["0x%016x" % (int(t[0]) & 0xFFFFFFFFFFFFFFFF) for t in hs]})
    return {"op": "pp", "ranks": P, "pattern": a.pattern, "messages": a.messages, "results": results}


def run_engram(a, me, P, dist, torch):
    L, N, row = a.layers, a.rows, a.hidden * 2
    count = a.tokens * a.entries
    tables = [table_rows(a.seed, l, me * N, N, row) for l in range(L)]
    idx = [indices(a.seed, me, l, count, P * N) for l in range(L)]
    out = [np.zeros((count, row), np.uint8) for _ in range(L)]
    # the plan of one fetch: requests grouped by owner, then layer, then position
    lay = np.concatenate([np.full(count, l, np.int64) for l in range(L)])
    pos = np.concatenate([np.arange(count, dtype=np.int64) for _ in range(L)])
    g = np.concatenate(idx)

    def fetch():
        owner = g // N
        order = np.lexsort((pos, lay, owner))
        remote = order[owner[order] != me]
        local = order[owner[order] == me]
        for l in range(L):
            m = local[lay[local] == l]
            out[l][pos[m]] = tables[l][g[m] % N]
        counts = torch.from_numpy(np.bincount(owner[remote], minlength=P).astype(np.int64))
        asked_counts = torch.empty(P, dtype=torch.int64)
        dist.all_to_all_single(asked_counts, counts)
        req = torch.from_numpy(np.stack([lay[remote], g[remote] % N], 1).reshape(-1).copy())
        asked = torch.empty(int(asked_counts.sum()) * 2, dtype=torch.int64)
        dist.all_to_all_single(asked, req, (asked_counts * 2).tolist(), (counts * 2).tolist())
        asked = asked.numpy().reshape(-1, 2)
        rows = np.empty((len(asked), row), np.uint8)
        for l in range(L):
            m = asked[:, 0] == l
            rows[m] = tables[l][asked[m, 1]]
        back = torch.empty((len(remote), row), dtype=torch.uint8)
        dist.all_to_all_single(back, torch.from_numpy(rows), counts.tolist(), asked_counts.tolist())
        back = back.numpy()
        for l in range(L):
            m = lay[remote] == l
            out[l][pos[remote][m]] = back[m]

    times = []
    for i in range(a.warmup + a.iters):
        dist.barrier()
        t0 = time.perf_counter()
        fetch()
        us = max_over_ranks(dist, torch, (time.perf_counter() - t0) * 1e6)
        if i >= a.warmup:
            times.append(us)
    h = sum(check_hash(o) for o in out) & 0xFFFFFFFFFFFFFFFF
    hs = [torch.zeros(1, dtype=torch.int64) for _ in range(P)]
    dist.all_gather(hs, torch.tensor([np.uint64(h).astype(np.int64)], dtype=torch.int64))
    return {"op": "engram", "ranks": P, "max_rank_us": times, "rows_per_rank": L * count,
            "hash": ["0x%016x" % (int(t[0]) & 0xFFFFFFFFFFFFFFFF) for t in hs]}


def rank_main(me, a, store):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + store, rank=me, world_size=a.ranks,
                            timeout=datetime.timedelta(seconds=600))
    j = run_pp(a, me, a.ranks, dist, torch) if a.op == "pp" else run_engram(a, me, a.ranks, dist, torch)
    if me == 0 and a.json:
        with open(a.json, "w") as f:
            json.dump(j, f, indent=2)
    dist.barrier()
    dist.destroy_process_group()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, required=True)
    p.add_argument("--op", choices=["pp", "engram"], required=True)
    p.add_argument("--sizes", default="16384")
    p.add_argument("--pattern", choices=["pairs", "ring"], default="pairs")
    p.add_argument("--messages", type=int, default=4)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--rows", type=int, default=131072)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--entries", type=int, default=24)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", default="")
    a = p.parse_args(argv)
    a.sizes = [int(s) for s in a.sizes.split(",")]
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory(prefix="epx-gloo-") as d:
        mp.spawn(rank_main, args=(a, os.path.join(d, "store")), nprocs=a.ranks, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
