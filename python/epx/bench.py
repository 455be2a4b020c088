"""python -m epx.bench — epx from PyTorch vs the dispatcher a PyTorch user writes without it.

    /usr/bin/python3 -m epx.bench [--ranks 4] [--tokens 256] [--hidden 2048] [--experts 32]
        [--topk 4] [--iters 20] [--warmup 3] [--epx PATH | --no-cpp] [--json FILE]

On the same routing (uniform top-k, `--seed`) and the same tokens, P ranks started by
`epx.launch`, each op started by every rank at one agreed CLOCK_MONOTONIC instant (rank 0
names it 10 ms ahead; the ranks sleep until then — a gloo barrier lets ranks leave it ms
apart),
per iteration the slowest rank (max-rank), p50 and avg over the timed iterations (the
definitions of `epx bench --help`):

1. all_to_all_single: a Megatron-style token dispatcher (Megatron-LM's
   MoEAlltoAllTokenDispatcher) over torch.distributed gloo: count tokens per expert, exchange
   the counts (all_to_all_single), permute one row per (token, expert) slot into expert
   order, all_to_all_single the rows (gloo has no bf16: the bytes travel as uint8), sort the
   received chunks by local expert; combine = the reverse and an index_add_ (float32) per
   token. Unweighted, like epx's default combine.
2. epx: `EPBuffer.dispatch(do_expand=True)` (deterministic, so rows are in the same order)
   and `EPBuffer.combine`, from Python.
   Check (every run): both dispatchers give the same rows bit for bit on every rank, and
   their combines of the same expert output agree within 1e-2 of the largest value (the
   float32 sums run in different orders and epx rounds each rank's partial to bf16).
3. overlap: per iteration, a dispatch then a float32 matmul of about the dispatch's time
   (sized on rank 0 against 7 dispatches of this loop), timed apart (sequential = their
   sum), and an async epx dispatch (`async_with_compute_stream=True`: it returns once its
   puts are handed to epx's thread) with the same matmul computed meanwhile, then
   `event.current_stream_wait()` (overlapped).
   efficiency = (sequential - overlapped) / min(dispatch, matmul), from the p50s: 1 = the
   shorter one is fully hidden, 0 = no overlap (negative when the two compete for cores).
   Also timed: an async dispatch waited on at once (the cost of the async form itself).
4. C++: `epx bench --routing DIR --layout expanded --no-counters` (counters off, as in an
   EPBuffer) on the same routing and x, written as a SPEC §7 directory, run once before and
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
    """SPEC §7 input directory for `epx bench --routing`."""
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
_late = []  # per timed call: how late this rank started after the agreed start (us)


def _aligned_start():
    """Every rank starts at the same CLOCK_MONOTONIC instant (system-wide on Linux): rank 0
    names one START_MARGIN_S ahead, every rank sleeps until then. A gloo barrier lets ranks leave
    it milliseconds apart, which would count as op time; the lateness of a rank that got
    the instant too late is recorded (reported as start skew)."""
    t = torch.tensor([time.monotonic() + START_MARGIN_S], dtype=torch.float64)
    dist.broadcast(t, 0)
    target = t.item()
    wait = target - time.monotonic()
    if wait > 0:
        time.sleep(wait)  # sleeping, not spinning: P ranks may share fewer cores
    now = time.monotonic()
    _late.append((now - target) * 1e6)
    return now


def _timed(fn):
    t0 = _aligned_start()
    r = fn()
    return r, (time.monotonic() - t0) * 1e6


def _rank_main(rank, num_ranks, a, problem):
    """One rank under epx.launch (torch.distributed gloo is initialised there)."""
    torch.set_num_threads(1)
    idx, w, x = problem[rank]
    base = AllToAllDispatcher(a.experts)
    samples = {k: [] for k in ("a2a_dispatch", "a2a_combine", "epx_dispatch", "epx_combine",
                               "seq_dispatch", "mm", "seq", "ovl", "async_alone")}
    with epx.EPBuffer(None, num_max_tokens_per_rank=a.tokens, hidden=a.hidden,
                      num_topk=a.topk, num_experts=a.experts, deterministic=True,
                      num_workers=a.workers) as buf:
        # the check: same rows, combines of the same y agree
        rows_a2a, counts_a2a, st = base.dispatch(x, idx)
        recv_x, _, _, handle, _ = buf.dispatch(x, idx, w, do_expand=True)
        same_rows = (list(handle.num_recv_tokens_per_expert) == counts_a2a and
                     torch.equal(recv_x.view(torch.int16), rows_a2a.view(torch.int16)))
        y = (rows_a2a.float() * 0.5 + 1).bfloat16()
        comb_a2a = base.combine(y, st).float()
        comb_epx = buf.combine(y, handle)[0].float()
        scale = max(comb_a2a.abs().max().item() if comb_a2a.numel() else 0.0, 1e-30)
        comb_diff = (comb_a2a - comb_epx).abs().max().item() / scale if comb_a2a.numel() else 0.0

        for it in range(a.warmup + a.iters):  # interleaved: baseline, epx, baseline, ...
            keep = it >= a.warmup
            (r_a, _, st), t1 = _timed(lambda: base.dispatch(x, idx))
            _, t2 = _timed(lambda: base.combine(r_a, st))
            (r_e, _, _, h, _), t3 = _timed(lambda: buf.dispatch(x, idx, w, do_expand=True))
            _, t4 = _timed(lambda: buf.combine(r_e, h))
            if keep:
                for k, t in zip(("a2a_dispatch", "a2a_combine", "epx_dispatch",
                                 "epx_combine"), (t1, t2, t3, t4)):
                    samples[k].append(t)

        # overlap: a matmul of about one dispatch's time in this loop (a dispatch after a
        # dispatch: no rows first), sized on rank 0
        t_d = float(np.median([_timed(lambda: buf.dispatch(x, idx, w, do_expand=True))[1] for _ in range(7)]))
        m = torch.tensor([_matmul_size(t_d)] if rank == 0 else [0])
        dist.broadcast(m, 0)
        m = int(m.item())
        A, B = torch.randn(m, m), torch.randn(m, m)
        for it in range(a.warmup + a.iters):
            keep = it >= a.warmup
            t0 = _aligned_start()  # sequential: dispatch, then the matmul
            buf.dispatch(x, idx, w, do_expand=True)
            t1 = time.monotonic()
            torch.mm(A, B)
            t2 = time.monotonic()

            def ovl():
                r = buf.dispatch(x, idx, w, do_expand=True, async_with_compute_stream=True)
                torch.mm(A, B)  # while epx's threads put and receive the rows
                r[4].current_stream_wait()  # now r's tensors hold the rows

            _, t_ovl = _timed(ovl)
            _, t_async = _timed(lambda: buf.dispatch(x, idx, w, do_expand=True,
                                                     async_with_compute_stream=True
                                                     )[4].current_stream_wait())
            if keep:
                samples["async_alone"].append(t_async)
                samples["seq_dispatch"].append((t1 - t0) * 1e6)
                samples["mm"].append((t2 - t1) * 1e6)
                samples["seq"].append((t2 - t0) * 1e6)
                samples["ovl"].append(t_ovl)
    gathered = [None] * num_ranks
    dist.all_gather_object(gathered, samples)
    checks = [None] * num_ranks
    dist.all_gather_object(checks, (same_rows, comb_diff, float(np.percentile(_late, 50)),
                                    float(np.percentile(_late, 95))))
    if rank != 0:
        return None
    series = {k: np.max(np.array([g[k] for g in gathered]), axis=0) for k in samples}
    return {"max_rank_us": {k: {"p50": float(np.median(v)), "avg": float(np.mean(v))}
                            for k, v in series.items()},
            "matmul_n": m, "same_rows": [c[0] for c in checks],
            "combine_rel_diff": [c[1] for c in checks],
            "start_late_p50_us": [c[2] for c in checks],
            "start_late_p95_us": [c[3] for c in checks]}


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


def run_cpp(a, cli, routing_dir):
    out = os.path.join(routing_dir, "cpp.json")
    cmd = [cli, "bench", "--routing", routing_dir, "--layout", "expanded",
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
    ap.add_argument("--workers", type=int, default=0,
                    help="the EPBuffer's num_workers (0 = auto: cores / ranks). An async call's "
                         "thread is its worker 0: with P ranks, P * workers threads move rows while "
                         "the P matmul threads compute")
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


def report(a, res, cpp, cpp_cmd, cpp_err):
    us = res["max_rank_us"]
    lines = ["epx.bench: P=%d S=%d H=%d E=%d K=%d, expanded layout, %d timed iterations "
             "(warmup %d); max-rank latency us, p50 (avg); %d cores, load average %.1f at "
             "the start" % (a.ranks, a.tokens, a.hidden, a.experts, a.topk, a.iters, a.warmup,
                            os.cpu_count(), res["load_average"])]
    hdr = "%-9s %22s %22s %10s" % ("op", "all_to_all_single", "epx (Python)", "a2a/epx")
    if cpp:
        hdr += " %22s %12s" % ("epx (C++ bench)", "Python/C++")
    lines.append(hdr)
    for op in ("dispatch", "combine"):
        b, e = us["a2a_" + op], us["epx_" + op]
        row = "%-9s %12.1f (%7.1f) %12.1f (%7.1f) %9.2fx" % (
            op, b["p50"], b["avg"], e["p50"], e["avg"], _ratio(b["p50"], e["p50"]))
        if cpp:
            c = cpp[op]
            row += " %12.1f (%7.1f) %11.2fx" % (c["p50"], c["avg"], _ratio(e["p50"], c["p50"]))
        lines.append(row)
    td, tm = us["seq_dispatch"]["p50"], us["mm"]["p50"]
    ts, to = us["seq"]["p50"], us["ovl"]["p50"]
    eff = _ratio(ts - to, min(td, tm))
    lines.append("overlap: dispatch %.1f us then matmul %dx%d f32 %.1f us = sequential %.1f us; "
                 "overlapped %.1f us; efficiency %.2f (an async dispatch waited at once: "
                 "%.1f us)" % (td, res["matmul_n"], res["matmul_n"], tm, ts, to, eff,
                               us["async_alone"]["p50"]))
    lines.append("check: same rows on every rank: %s; combine max rel diff %.2e (tol %.0e); "
                 "late start (after the agreed instant, worst rank) p50 %.1f us, p95 %.1f us" % (
                     "yes" if all(res["same_rows"]) else "NO", max(res["combine_rel_diff"]),
                     COMBINE_TOL, max(res["start_late_p50_us"]), max(res["start_late_p95_us"])))
    if cpp:
        lines.append("C++ (mean of a run before and one after the Python ranks; p50 dispatch "
                     "%s, combine %s us): %s" % (
                         " / ".join("%.1f" % v for v in cpp["dispatch"]["p50_runs"]),
                         " / ".join("%.1f" % v for v in cpp["combine"]["p50_runs"]), cpp_cmd))
    else:
        lines.append("C++ epx bench: not run (%s)" % (cpp_err or "no --epx CLI found"))
    res["overlap_efficiency"] = eff
    return "\n".join(lines)


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    torch.set_num_threads(1)  # as in the ranks; and no thread pool for them to inherit
    problem = make_problem(a)
    load = os.getloadavg()[0]
    tmp = tempfile.mkdtemp(prefix="epx_bench_")
    try:
        cli = None if a.no_cpp else find_cli(a.epx)
        runs, cpp_cmd, cpp_err = [], None, None
        rdir = os.path.join(tmp, "routing")
        if cli:
            os.makedirs(rdir)
            write_routing_dir(a, problem, rdir)

        def cpp_run():  # the C++ bench before and after the Python ranks (the load drifts)
            if cli:
                r, cmd, err = run_cpp(a, cli, rdir)
                runs.extend([r] if r else [])
                return cmd, err
            return None, None

        cpp_run()
        # fork: the ranks inherit torch (this process ran torch ops on one thread only)
        res = epx.launch(_rank_main, a.ranks, a, problem, start_method="fork")[0]
        res["load_average"] = load
        cpp_cmd, cpp_err = cpp_run()
        cpp = None
        if runs:
            cpp = {op: {"p50": float(np.mean([r[op]["p50"] for r in runs])),
                        "avg": float(np.mean([r[op]["avg"] for r in runs])),
                        "p50_runs": [r[op]["p50"] for r in runs]} for op in ("dispatch", "combine")}
        print(report(a, res, cpp, cpp_cmd, cpp_err), flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"options": vars(a), "python": res, "cpp": cpp,
                           "cpp_command": cpp_cmd}, f, indent=1)
        ok = all(res["same_rows"]) and max(res["combine_rel_diff"]) <= COMBINE_TOL
        return 0 if ok else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
