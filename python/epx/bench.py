"""python -m epx.bench — epx from PyTorch vs the dispatcher a PyTorch user writes without it.

    /usr/bin/python3 -m epx.bench [--ranks 4] [--tokens 256] [--hidden 2048] [--experts 32]
        [--topk 4] [--iters 20] [--warmup 3] [--layout both|compact|expanded]
        [--start barrier|instant] [--order interleaved|blocked] [--no-overlap]
        [--epx PATH | --no-cpp] [--json FILE]

On the same routing (uniform top-k, `--seed`) and the same tokens, P ranks started by
`epx.launch`, every op started after epx's shared-memory barrier (as `epx bench` starts its
calls; `--start instant`: after a sleep to an instant rank 0 names 10 ms ahead), per
iteration the slowest rank (max-rank), p50 and avg over the timed iterations (the
definitions of `epx bench --help`; round trip = dispatch + combine, p50s and avgs summed):

1. all_to_all_single: a Megatron-style token dispatcher (Megatron-LM's
   MoEAlltoAllTokenDispatcher) over torch.distributed gloo: count tokens per expert, exchange
   the counts (all_to_all_single), permute one row per (token, expert) slot into expert
   order, all_to_all_single the rows (gloo has no bf16: the bytes travel as uint8), sort the
   received chunks by local expert; combine = the reverse and an index_add_ (float32) per
   token. Unweighted, like epx's default combine.
2. epx: `EPBuffer.dispatch` and `EPBuffer.combine` from Python, in each `--layout`:
   compact (`do_expand=False`, the default: a row per received token) and expanded
   (`do_expand=True`, deterministic: a row per slot, in the gloo dispatcher's order),
   interleaved with the gloo calls (`--order blocked`: all of gloo's iterations first, then
   each layout's: no gloo call between epx's); every output is dropped before the next call, and the
   EPBuffer's output pool holds the largest rank's expanded output (`output_pool_rows`, as
   `epx bench --layout expanded` sizes it), so both layouts' recv_x are one copy.
   Checks (every run, before the timing): expanded — both dispatchers give the same rows
   bit for bit on every rank; compact — every row is its source token's bits (recv_src), the
   tokens are exactly those routed to the rank and recv_topk_idx names their local experts;
   each layout's combine of the same expert output (f(x) per slot; compact: the row's sum of
   its local slots) agrees with gloo's within 1e-2 of the largest value (the float32 sums run
   in different orders and epx rounds each rank's partial to bf16).
3. overlap (unless --no-overlap): per iteration, an expanded dispatch then a float32 matmul
   of about the dispatch's time (sized on rank 0 against 7 dispatches of this loop), timed
   apart (sequential = their sum), and an async epx dispatch (`async_with_compute_stream=True`:
   it returns once its puts are handed to epx's thread) with the same matmul computed
   meanwhile, then `event.current_stream_wait()` (overlapped).
   efficiency = (sequential - overlapped) / min(dispatch, matmul), from the p50s: 1 = the
   shorter one is fully hidden, 0 = no overlap (negative when the two compete for cores).
   Also timed: an async dispatch waited on at once (the cost of the async form itself).
4. C++: `epx bench --routing DIR --layout L --no-counters` (counters off, as in an EPBuffer)
   per layout on the same routing and x, written as a docs/spec.md §7 directory, run once before and
   once after the Python ranks (not at the same time; the mean of the two p50s): binding
   cost = Python epx time / C++ epx time.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.distributed as dist

import epx
from epx.group import transport_of

HERE = os.path.dirname(os.path.abspath(__file__))
COMBINE_TOL = 1e-2


# ----------------------------------------------------------------------------------------
# The problem: the same on every rank and in the C++ bench
# ----------------------------------------------------------------------------------------

def make_problem(a):
    """Per rank: topk_idx [S, K] int64 (K distinct experts, uniform), topk_weights, x bf16."""
    g = torch.Generator().manual_seed(a.seed)
    out = []
    for _ in range(a.ranks):
        idx = torch.stack([torch.randperm(a.experts, generator=g)[:a.topk]
                           for _ in range(a.tokens)]) if a.tokens else \
            torch.zeros(0, a.topk, dtype=torch.int64)
        w = torch.rand(a.tokens, a.topk, generator=g) + 0.05
        x = torch.randn(a.tokens, a.hidden, generator=g).bfloat16()
        out.append((idx, w, x))
    return out


def write_routing_dir(a, problem, path):
    """docs/spec.md §7 input directory for `epx bench --routing`."""
    with open(os.path.join(path, "meta.json"), "w") as f:
        json.dump({"num_ranks": a.ranks, "num_experts": a.experts, "hidden": a.hidden,
                   "num_topk": a.topk, "num_max_tokens_per_rank": a.tokens}, f)
    for r, (idx, w, x) in enumerate(problem):
        d = os.path.join(path, "rank%d" % r)
        os.makedirs(d)
        np.save(os.path.join(d, "topk_idx.npy"), idx.numpy().astype("<i8"))
        np.save(os.path.join(d, "topk_weights.npy"), w.numpy().astype("<f4"))
        np.save(os.path.join(d, "x.npy"), x.view(torch.int16).numpy().view("<u2"))


# ----------------------------------------------------------------------------------------
# The baseline: a Megatron-style all-to-all token dispatcher
# ----------------------------------------------------------------------------------------

class AllToAllDispatcher:
    """What a PyTorch user writes without epx (Megatron-LM's MoEAlltoAllTokenDispatcher,
    without its TP/EP-group extras). Rows come out grouped by local expert, inside an expert
    by source rank, then token: the order of epx's deterministic expanded layout."""

    def __init__(self, num_experts, group=None):
        self.P = dist.get_world_size(group)
        self.E, self.L, self.group = num_experts, num_experts // self.P, group

    def dispatch(self, x, topk_idx):
        P, L, E = self.P, self.L, self.E
        S, K = topk_idx.shape
        flat = topk_idx.reshape(-1)
        slots = torch.nonzero(flat >= 0).flatten()
        order = torch.argsort(flat[slots], stable=True)  # expert order (= destination order)
        slots = slots[order]
        tokens = torch.div(slots, K, rounding_mode="floor")
        per_expert = torch.bincount(flat[slots], minlength=E)             # [E]
        recv_per_expert = torch.empty_like(per_expert)                    # [P * L]: (s, j)
        dist.all_to_all_single(recv_per_expert, per_expert, group=self.group)
        in_splits = per_expert.view(P, L).sum(1).tolist()
        out_splits = recv_per_expert.view(P, L).sum(1).tolist()
        permuted = x.index_select(0, tokens)
        recv = torch.empty(sum(out_splits), x.shape[1], dtype=x.dtype)
        dist.all_to_all_single(_wire(recv), _wire(permuted), out_splits, in_splits,
                               group=self.group)
        counts = recv_per_expert.tolist()                                 # chunk (s, j)
        chunks = recv.split(counts)
        by_expert = [s * L + j for j in range(L) for s in range(P)]
        grouped = torch.cat([chunks[c] for c in by_expert]) if chunks else recv
        state = (tokens, S, in_splits, out_splits, counts, by_expert)
        return grouped, [sum(counts[s * L + j] for s in range(P)) for j in range(L)], state

    def combine(self, y, state):
        tokens, S, in_splits, out_splits, counts, by_expert = state
        sizes = [counts[c] for c in by_expert]
        pieces = dict(zip(by_expert, y.split(sizes)))
        back_in = torch.cat([pieces[c] for c in range(len(counts))]) if counts else y
        back = torch.empty(sum(in_splits), y.shape[1], dtype=y.dtype)
        dist.all_to_all_single(_wire(back), _wire(back_in.contiguous()), in_splits,
                               out_splits, group=self.group)
        out = torch.zeros(S, y.shape[1], dtype=torch.float32)
        out.index_add_(0, tokens, back.float())
        return out.to(y.dtype)


def _wire(t):
    """gloo moves no bf16 (nor int16): send its bytes as uint8 ([N, H] -> [N, 2H])."""
    return t.view(torch.uint8) if t.dtype == torch.bfloat16 else t


# ----------------------------------------------------------------------------------------
# Timing
# ----------------------------------------------------------------------------------------

START_MARGIN_S = 0.010
_late = []  # per timed call (--start instant): how late this rank started after the agreed start (us)


def _instant_start():
    """--start instant: every rank starts at the same CLOCK_MONOTONIC instant (system-wide
    on Linux): rank 0 names one START_MARGIN_S ahead, every rank sleeps until then; the
    lateness of a rank that woke too late is recorded (reported as start skew). A call after
    a sleep runs on cold caches, and a late rank's wait counts as op time on the others."""
    t = torch.tensor([time.monotonic() + START_MARGIN_S], dtype=torch.float64)
    dist.broadcast(t, 0)
    target = t.item()
    wait = target - time.monotonic()
    if wait > 0:
        time.sleep(wait)  # sleeping, not spinning: P ranks may share fewer cores
    now = time.monotonic()
    _late.append((now - target) * 1e6)
    return now


def _starter(how):
    """What every rank runs before each timed op: --start barrier (default) = epx's barrier
    over its transport (shared memory), as `epx bench` times its calls; --start instant =
    the sleep to an agreed instant (_instant_start)."""
    if how == "instant":
        return _instant_start
    tr = transport_of(None)  # the EPBuffer's (the same group, kind and timeout)

    def barrier():
        tr.barrier("epx.bench: start")
        return time.monotonic()
    return barrier


def _timed(start, fn):
    """(fn's result, us from the start to its return) on this rank."""
    t0 = start()
    r = fn()
    return r, (time.monotonic() - t0) * 1e6


LAYOUTS = ("compact", "expanded")


def _layouts(a):
    return LAYOUTS if a.layout == "both" else (a.layout,)


def _expert_out(rows):
    """The stand-in expert every check applies: f(x) = 0.5 x + 1, rounded to bf16."""
    return (rows.float() * 0.5 + 1).bfloat16()


def _check_expanded(buf, base, x, idx, w):
    """Expanded epx vs the gloo dispatcher: the same rows bit for bit, the same counts; and
    the max relative difference of their combines of the same expert output."""
    rows_a2a, counts_a2a, st = base.dispatch(x, idx)
    recv_x, _, _, handle, _ = buf.dispatch(x, idx, w, do_expand=True)
    same = (list(handle.num_recv_tokens_per_expert) == counts_a2a and
            torch.equal(recv_x.view(torch.int16), rows_a2a.view(torch.int16)))
    y = _expert_out(rows_a2a)
    return same, _rel_diff(base.combine(y, st), buf.combine(y, handle)[0])


def _check_compact(buf, base, problem, rank, experts, x, idx, w):
    """Compact epx vs an independent reference and vs the gloo dispatcher: every received
    row is the bits of its source token (recv_src), the (source, token) pairs are exactly the
    tokens routed to this rank, recv_topk_idx names their local experts (-1 elsewhere); the
    combine of each row's expert sum (f(x) once per local slot) agrees with gloo's combine of
    f(x) per slot."""
    P = len(problem)
    L = experts // P
    recv_x, recv_idx, _, handle, _ = buf.dispatch(x, idx, w, do_expand=False)
    src = handle.recv_src.tolist()
    want = sorted((s, t) for s in range(P) for t in range(problem[s][0].shape[0])
                  if ((problem[s][0][t] // L) == rank).any())
    same = sorted(map(tuple, src)) == want and len(src) == recv_x.shape[0]
    for n, (s, t) in enumerate(src if same else []):
        sidx = problem[s][0][t]
        local = torch.where(sidx // L == rank, sidx - rank * L, torch.full_like(sidx, -1))
        same = same and torch.equal(recv_x[n].view(torch.int16), problem[s][2][t].view(torch.int16)) \
            and torch.equal(recv_idx[n], local)
    rows_a2a, _, st = base.dispatch(x, idx)
    slots = (recv_idx >= 0).sum(1, keepdim=True).float()
    y = (_expert_out(recv_x).float() * slots).bfloat16()  # the sum of the row's local experts
    return same, _rel_diff(base.combine(_expert_out(rows_a2a), st), buf.combine(y, handle)[0])


def _rel_diff(ref, got):
    ref, got = ref.float(), got.float()
    if not ref.numel():
        return 0.0
    return (ref - got).abs().max().item() / max(ref.abs().max().item(), 1e-30)


def _timed_loop(a, start, buf, base, x, idx, w, samples):
    """--order interleaved (default): per iteration gloo's dispatch and combine, then epx's in
    each layout. --order blocked: every iteration of gloo, then every iteration of each epx
    layout (each dispatcher on caches and allocator state of its own kind, as `epx bench`
    runs epx). Every output is dropped before the next call (as `epx bench` does): a recv_x
    still held keeps its block of the output pool, and the next dispatch would copy out."""
    def gloo(t):
        r, t["a2a_dispatch"] = _timed(start, lambda: base.dispatch(x, idx))
        t["a2a_combine"] = _timed(start, lambda: base.combine(r[0], r[2]))[1]

    def epx_in(lay):
        def run(t):
            d, t["epx_%s_dispatch" % lay] = _timed(
                start, lambda: buf.dispatch(x, idx, w, do_expand=lay == "expanded"))
            t["epx_%s_combine" % lay] = _timed(start, lambda: buf.combine(d[0], d[3]))[1]
        return run

    steps = [gloo] + [epx_in(lay) for lay in _layouts(a)]
    for group in ([steps] if a.order == "interleaved" else [[s] for s in steps]):
        for it in range(a.warmup + a.iters):
            t = {}
            for step in group:
                step(t)
            if it >= a.warmup:
                for k, v in t.items():
                    samples.setdefault(k, []).append(v)


def _overlap_loop(a, start, rank, buf, x, idx, w, samples):
    """Section 3 of the docstring (expanded dispatches); returns the matmul size."""
    def disp(wait_async=False):  # its outputs dropped at once
        r = buf.dispatch(x, idx, w, do_expand=True, async_with_compute_stream=wait_async)
        if wait_async:
            r[4].current_stream_wait()
    t_d = float(np.median([_timed(start, disp)[1] for _ in range(7)]))
    m = torch.tensor([_matmul_size(t_d)] if rank == 0 else [0])
    dist.broadcast(m, 0)
    m = int(m.item())
    A, B = torch.randn(m, m), torch.randn(m, m)

    def ovl():
        r = buf.dispatch(x, idx, w, do_expand=True, async_with_compute_stream=True)
        torch.mm(A, B)  # while epx's threads put and receive the rows
        r[4].current_stream_wait()  # now r's tensors hold the rows

    for it in range(a.warmup + a.iters):
        t0 = start()  # sequential: dispatch, then the matmul
        disp()
        t1 = time.monotonic()
        torch.mm(A, B)
        t2 = time.monotonic()
        _, t_ovl = _timed(start, ovl)
        _, t_async = _timed(start, lambda: disp(wait_async=True))
        if it >= a.warmup:
            for k, v in (("async_alone", t_async), ("seq_dispatch", (t1 - t0) * 1e6),
                         ("mm", (t2 - t1) * 1e6), ("seq", (t2 - t0) * 1e6), ("ovl", t_ovl)):
                samples.setdefault(k, []).append(v)
    return m


def _pool_rows(a, problem):
    """The EPBuffer's output_pool_rows: with the expanded layout, room for the largest rank's
    expanded output of this routing (as `epx bench --layout expanded` sizes its pool) and
    for a compact one (P x S rows), so both stay one copy; else 0 (auto)."""
    if "expanded" not in _layouts(a):
        return 0
    L = a.experts // a.ranks
    per_rank = np.zeros(a.ranks, dtype=np.int64)
    for idx, _, _ in problem:
        flat = idx.reshape(-1)
        per_rank += np.bincount((flat[flat >= 0] // L).numpy(), minlength=a.ranks)
    return int(max(per_rank.max(), a.ranks * a.tokens))


def _rank_main(rank, num_ranks, a, problem):
    """One rank under epx.launch (torch.distributed gloo is initialised there)."""
    torch.set_num_threads(1)
    idx, w, x = problem[rank]
    base = AllToAllDispatcher(a.experts)
    samples, checks = {}, {}
    with epx.EPBuffer(None, num_max_tokens_per_rank=a.tokens, hidden=a.hidden,
                      num_topk=a.topk, num_experts=a.experts, deterministic=True,
                      num_workers=a.workers, output_pool_rows=_pool_rows(a, problem)) as buf:
        start = _starter(a.start)
        for lay in _layouts(a):
            checks[lay] = (_check_expanded(buf, base, x, idx, w) if lay == "expanded" else
                           _check_compact(buf, base, problem, rank, a.experts, x, idx, w))
        _timed_loop(a, start, buf, base, x, idx, w, samples)
        m = _overlap_loop(a, start, rank, buf, x, idx, w, samples) if not a.no_overlap else 0
    gathered = [None] * num_ranks
    late = (float(np.percentile(_late, 50)), float(np.percentile(_late, 95))) if _late else (0.0, 0.0)
    dist.all_gather_object(gathered, (samples, checks, late))
    if rank != 0:
        return None
    series = {k: np.max(np.array([g[0][k] for g in gathered]), axis=0) for k in samples}
    return {"max_rank_us": {k: {"p50": float(np.median(v)), "avg": float(np.mean(v))}
                            for k, v in series.items()},
            "matmul_n": m,
            "same_rows": {lay: [g[1][lay][0] for g in gathered] for lay in checks},
            "combine_rel_diff": {lay: [g[1][lay][1] for g in gathered] for lay in checks},
            "start_late_p50_us": [g[2][0] for g in gathered],
            "start_late_p95_us": [g[2][1] for g in gathered]}


def _matmul_size(target_us):
    """n such that an n x n float32 matmul takes about target_us on one thread (two rounds
    of measuring and rescaling by the cube root of the time ratio)."""
    n = 128
    for _ in range(2):
        A, B = torch.randn(n, n), torch.randn(n, n)
        torch.mm(A, B)
        reps = 5
        t0 = time.perf_counter()
        for _ in range(reps):
            torch.mm(A, B)
        t = (time.perf_counter() - t0) / reps * 1e6
        n = max(16, int(n * (target_us / max(t, 1e-3)) ** (1.0 / 3)))
    return n


# ----------------------------------------------------------------------------------------
# The C++ bench on the same routing
# ----------------------------------------------------------------------------------------

def find_cli(path):
    """--epx, else the CLI of the build this package runs from (build/python/epx ->
    build/src/tools/epx) or of its source checkout (python/epx -> build/src/tools/epx),
    else `epx` on PATH."""
    src = os.path.dirname(os.path.realpath(__file__))
    for cand in ([path] if path else []) + [os.path.join(HERE, "..", "..", "src", "tools", "epx"),
                                            os.path.join(src, "..", "..", "build", "src", "tools",
                                                         "epx"), shutil.which("epx")]:
        if cand and os.access(cand, os.X_OK):
            return os.path.abspath(cand)
    return None


def run_cpp(a, cli, routing_dir, layout):
    """`epx bench` on the routing directory in `layout`, counters off (as in an EPBuffer):
    ({op: {p50, avg}}, command, error)."""
    out = os.path.join(routing_dir, "cpp.json")
    cmd = [cli, "bench", "--routing", routing_dir, "--layout", layout,
           "--iters", str(a.iters), "--warmup", str(a.warmup), "--json", out, "--no-progress",
           "--no-counters"]
    p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        return None, " ".join(cmd), p.stderr.strip()
    with open(out) as f:
        j = json.load(f)
    return {op: {"p50": j[op]["max_rank_us"]["p50"], "avg": j[op]["max_rank_us"]["avg"]}
            for op in ("dispatch", "combine")}, " ".join(cmd), None


# ----------------------------------------------------------------------------------------

def parse_args(argv):
    ap = argparse.ArgumentParser(prog="python -m epx.bench", description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=256, help="S per rank")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--topk", type=int, default=4)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--layout", choices=("both",) + LAYOUTS, default="both",
                    help="epx's receive layout(s) timed against the gloo dispatcher (default both: "
                         "compact, the default of EPBuffer.dispatch and of `epx bench`, and expanded)")
    ap.add_argument("--start", choices=("barrier", "instant"), default="barrier",
                    help="how the ranks start each timed op: barrier = epx's shared-memory barrier, as "
                         "`epx bench` does (default); instant = a sleep to an instant rank 0 names "
                         "(cold caches, and a rank waking late counts on the others)")
    ap.add_argument("--order", choices=("interleaved", "blocked"), default="interleaved",
                    help="interleaved (default): each iteration runs gloo, then epx in each layout; "
                         "blocked: all of gloo's iterations, then all of each layout's")
    ap.add_argument("--workers", type=int, default=0,
                    help="the EPBuffer's num_workers (0 = auto: cores / ranks). An async call's "
                         "thread is its worker 0: with P ranks, P * workers threads move rows while "
                         "the P matmul threads compute")
    ap.add_argument("--no-overlap", action="store_true", help="skip the overlap section (3.)")
    ap.add_argument("--epx", help="the epx CLI for the C++ comparison "
                                  "(default: build/src/tools/epx of this checkout, then PATH)")
    ap.add_argument("--no-cpp", action="store_true", help="skip the C++ epx bench")
    ap.add_argument("--json", help="write every number to FILE")
    a = ap.parse_args(argv)
    if a.experts % a.ranks:
        ap.error("--experts must be a multiple of --ranks")
    return a


def _ratio(num, den):
    return num / den if den else float("nan")


def _with_round_trip(d, c):
    """{dispatch, combine, round trip}: the round trip's p50 and avg are the sums of the
    ops' (the definition of `epx bench`'s round trip)."""
    return {"dispatch": d, "combine": c,
            "round trip": {k: d[k] + c[k] for k in ("p50", "avg")}}


def _table(a, res, cpp):
    """Rows per layout and op: gloo, epx from Python, gloo/epx (p50, avg), C++, Python/C++."""
    us = res["max_rank_us"]
    gloo = _with_round_trip(us["a2a_dispatch"], us["a2a_combine"])
    lines = ["%-9s %-10s %20s %20s %15s %20s %10s" % (
        "layout", "op", "gloo all_to_all", "epx (Python)", "gloo/epx p50,avg",
        "epx (C++ bench)", "Python/C++")]
    for lay in _layouts(a):
        e = _with_round_trip(us["epx_%s_dispatch" % lay], us["epx_%s_combine" % lay])
        c = _with_round_trip(cpp[lay]["dispatch"], cpp[lay]["combine"]) if cpp and lay in cpp else None
        for op in ("dispatch", "combine", "round trip"):
            b, p = gloo[op], e[op]
            row = "%-9s %-10s %10.1f (%7.1f) %10.1f (%7.1f) %7.2fx,%6.2fx" % (
                lay, op, b["p50"], b["avg"], p["p50"], p["avg"], _ratio(b["p50"], p["p50"]),
                _ratio(b["avg"], p["avg"]))
            if c:
                row += " %10.1f (%7.1f) %9.2fx" % (c[op]["p50"], c[op]["avg"], _ratio(p["p50"], c[op]["p50"]))
            lines.append(row)
            res.setdefault("ratios", {})["%s %s" % (lay, op)] = {
                "gloo/epx p50": _ratio(b["p50"], p["p50"]), "gloo/epx avg": _ratio(b["avg"], p["avg"]),
                "gloo/C++ p50": _ratio(b["p50"], c[op]["p50"]) if c else None}
    return lines


def report(a, res, cpp, cpp_cmds, cpp_err):
    us = res["max_rank_us"]
    lines = ["epx.bench: P=%d S=%d H=%d E=%d K=%d, %d timed iterations (warmup %d), start: %s, "
             "order: %s; max-rank latency us, p50 (avg); %d cores, load average %.1f at the start" % (
                 a.ranks, a.tokens, a.hidden, a.experts, a.topk, a.iters, a.warmup, a.start, a.order,
                 os.cpu_count(), res["load_average"])]
    lines += _table(a, res, cpp)
    if "seq" in us:
        td, tm = us["seq_dispatch"]["p50"], us["mm"]["p50"]
        ts, to = us["seq"]["p50"], us["ovl"]["p50"]
        eff = _ratio(ts - to, min(td, tm))
        lines.append("overlap (expanded): dispatch %.1f us then matmul %dx%d f32 %.1f us = sequential "
                     "%.1f us; overlapped %.1f us; efficiency %.2f (an async dispatch waited at once: "
                     "%.1f us)" % (td, res["matmul_n"], res["matmul_n"], tm, ts, to, eff,
                                   us["async_alone"]["p50"]))
        res["overlap_efficiency"] = eff
    for lay in res["same_rows"]:
        lines.append("check %s: same rows on every rank: %s; combine max rel diff %.2e (tol %.0e)" % (
            lay, "yes" if all(res["same_rows"][lay]) else "NO", max(res["combine_rel_diff"][lay]),
            COMBINE_TOL))
    if a.start == "instant":
        lines.append("late start (after the agreed instant, worst rank) p50 %.1f us, p95 %.1f us" % (
            max(res["start_late_p50_us"]), max(res["start_late_p95_us"])))
    if cpp:
        for lay in cpp:
            lines.append("C++ %s (mean of a run before and one after the Python ranks; p50 dispatch "
                         "%s, combine %s us): %s" % (
                             lay, " / ".join("%.1f" % v for v in cpp[lay]["dispatch"]["p50_runs"]),
                             " / ".join("%.1f" % v for v in cpp[lay]["combine"]["p50_runs"]),
                             cpp_cmds[lay]))
    else:
        lines.append("C++ epx bench: not run (%s)" % (cpp_err or "no --epx CLI found"))
    return "\n".join(lines)


def _cpp_runner(a, problem, tmp):
    """A function that runs the C++ bench once per layout on the routing (a no-op without a
    CLI), and its runs {layout: [result, ...]}, commands and last error."""
    cli = None if a.no_cpp else find_cli(a.epx)
    state = {"runs": {}, "cmds": {}, "err": None}
    rdir = os.path.join(tmp, "routing")
    if cli:
        os.makedirs(rdir)
        write_routing_dir(a, problem, rdir)

    def run():
        for lay in _layouts(a) if cli else ():
            r, state["cmds"][lay], err = run_cpp(a, cli, rdir, lay)
            state["err"] = err or state["err"]
            state["runs"].setdefault(lay, []).extend([r] if r else [])
    return run, state


def _cpp_means(runs):
    return {lay: {op: {"p50": float(np.mean([r[op]["p50"] for r in rs])),
                       "avg": float(np.mean([r[op]["avg"] for r in rs])),
                       "p50_runs": [r[op]["p50"] for r in rs]} for op in ("dispatch", "combine")}
            for lay, rs in runs.items() if rs} or None


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    torch.set_num_threads(1)  # as in the ranks; and no thread pool for them to inherit
    problem = make_problem(a)
    load = os.getloadavg()[0]
    tmp = tempfile.mkdtemp(prefix="epx_bench_")
    try:
        cpp_run, st = _cpp_runner(a, problem, tmp)
        cpp_run()  # the C++ bench before and after the Python ranks (the load drifts)
        # fork: the ranks inherit torch (this process ran torch ops on one thread only)
        res = epx.launch(_rank_main, a.ranks, a, problem, start_method="fork")[0]
        res["load_average"] = load
        cpp_run()
        cpp = _cpp_means(st["runs"])
        print(report(a, res, cpp, st["cmds"], st["err"]), flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"options": vars(a), "python": res, "cpp": cpp,
                           "cpp_commands": st["cmds"]}, f, indent=1)
        ok = all(all(v) for v in res["same_rows"].values()) and \
            all(max(v) <= COMBINE_TOL for v in res["combine_rel_diff"].values())
        return 0 if ok else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
