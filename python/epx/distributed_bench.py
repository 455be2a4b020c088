"""torch.distributed on epx against gloo, in one job:

    python3 -m epx.distributed_bench [--ranks 8] [--quick] [--only NAME] [--profile]
    python3 -m epx.distributed_bench --machines      # 2 namespace machines x 2 ranks (root, a checkout)

Starts the ranks itself (spawned processes, a file:// store), makes a gloo default group, an
"epx" group and a gloo group over every rank, and times torch's own calls on both groups
interleaved (each repetition: a barrier, the epx call, a barrier, the gloo call): the
median per rank, the slowest rank's median reported. Every case checks its results: epx's
output equals gloo's and a reference each rank computes from the inputs it knows every
rank has (integer-valued data: every summation order gives the same bits); the DDP step
compares the losses of the two models.

Cases (NAME for --only; the target is gloo's time over epx's):
  all_reduce_64M      all_reduce of 64 MiB float32                            >= 8x
  all_reduce_16K      all_reduce of 16 KiB float32 (latency)                  >= 3x
  all_to_all_4096     all_to_all_single at DeepSeek-V3's MoE shape: 4096 tokens per rank,
                      hidden 7168 bf16, top-8 of 256 experts (random router logits, rows sent
                      once per (token, destination rank)): uneven splits      >= 8x
  all_to_all_128      the same at 128 tokens per rank                         >= 5x
  all_gather_64M      all_gather_into_tensor, 64 MiB output (gloo: list all_gather + cat)  >= 8x
  reduce_scatter_64M  reduce_scatter_tensor, 64 MiB input (gloo: all_reduce + slice)  >= 8x
  ddp_step            a DistributedDataParallel step of a 25M-parameter MLP (forward,
                      backward, SGD step), the same loss on both              >= 2x

gloo's all_to_all takes neither bf16 nor int16: both groups move the bf16 rows as float16 bits
(the same bytes, never converted). --quick: small sizes,
3 ranks (a smoke test, seconds). --machines: torchrun on two network-namespace machines of
tests/multinode/torchrun.py (2 x 2 ranks: all_reduce 16 MiB, all_to_all_single at 512
tokens, both >= 2x). --profile: rank 0 runs each case's epx call under cProfile afterwards
and prints where its time goes. Exit status 1 when a result check fails (a missed target
is reported, not an error).
"""
import argparse
import datetime
import os
import sys
import time

MiB = 1 << 20

# name: (label, target ratio, full size, quick size, machines size, repetitions full / quick)
# (sizes in bytes, tokens per rank or the MLP's width; {} in a label is the size used)
CASES = {
    "all_reduce_64M": ("all_reduce {} float32", 8.0, 64 * MiB, 1 * MiB, None, (5, 4)),
    "all_reduce_16K": ("all_reduce {} float32 (latency)", 3.0, 16 << 10, 16 << 10, None, (200, 30)),
    "all_to_all_4096": ("all_to_all_single MoE {} tok x 7168 bf16, top-8/256", 8.0, 4096, 64, None, (5, 4)),
    "all_to_all_128": ("all_to_all_single MoE {} tok x 7168 bf16, top-8/256", 5.0, 128, 16, None, (30, 6)),
    "all_gather_64M": ("all_gather_into_tensor {} out", 8.0, 64 * MiB, 1 * MiB, None, (5, 4)),
    "reduce_scatter_64M": ("reduce_scatter_tensor {} in", 8.0, 64 * MiB, 1 * MiB, None, (5, 4)),
    "ddp_step": ("DDP step, MLP {} params", 2.0, 4096, 512, None, (6, 3)),
    # across machines (--machines)
    "all_reduce_16M": ("all_reduce {} float32 (2 machines)", 2.0, None, None, 16 * MiB, (8, 3)),
    "all_to_all_512": ("all_to_all_single MoE {} tok x 7168 bf16 (2 machines)", 2.0, None, None, 512, (8, 3)),
}
LOCAL = ["all_reduce_64M", "all_reduce_16K", "all_to_all_4096", "all_to_all_128", "all_gather_64M",
         "reduce_scatter_64M", "ddp_step"]
MACHINES = ["all_reduce_16M", "all_to_all_512"]
HIDDEN, EXPERTS, TOPK = 7168, 256, 8


def _size(nbytes):
    return f"{nbytes / MiB:g} MiB" if nbytes >= MiB else f"{nbytes >> 10} KiB"


def _ints(n, rank, salt=0):
    """This rank's integer-valued float32 input (< 1000: sums of up to 16000 ranks are exact)."""
    import torch
    return ((torch.arange(n, dtype=torch.int64) * 7 + rank * 131 + salt * 17) % 1000).to(torch.float32)


class _Routing:
    """A real top-k routing: random router logits per rank (seeded by the rank, so every rank
    knows every other's), experts in contiguous blocks over the ranks, each token's row sent
    once to every rank that holds one of its experts."""

    def __init__(self, P, tokens, hidden):
        import torch
        self.P, self.T, self.H = P, tokens, hidden
        self.masks = []
        for r in range(P):
            g = torch.Generator().manual_seed(4242 + r)
            experts = torch.randn(tokens, EXPERTS, generator=g).topk(TOPK, dim=1).indices
            dest = experts * P // EXPERTS  # expert e lives on rank e * P // E
            mask = torch.zeros(tokens, P, dtype=torch.bool)
            mask.scatter_(1, dest, True)
            self.masks.append(mask)

    def splits(self, src):
        """Rows src sends to each rank."""
        return self.masks[src].sum(0).tolist()

    def tokens(self, src, dst):
        return self.masks[src][:, dst].nonzero().view(-1)

    def rows(self, src, tokens):
        """src's rows for these tokens, as bf16 bits (int16): small integers, exact in bf16."""
        import torch
        v = (tokens.view(-1, 1) * 31 + torch.arange(self.H).view(1, -1) + src * 7919) % 251
        return v.to(torch.bfloat16).view(torch.int16)

    def send(self, me):
        return torch_cat([self.rows(me, self.tokens(me, d)) for d in range(self.P)], self.H)

    def reference(self, me):
        return torch_cat([self.rows(s, self.tokens(s, me)) for s in range(self.P)], self.H)


def torch_cat(parts, width):
    import torch
    parts = [p for p in parts if p.numel()]
    return torch.cat(parts) if parts else torch.empty(0, width, dtype=torch.int16)


class Bench:
    """One rank's cases; every timing and check on every rank, rank 0 prints."""

    def __init__(self, args, rank, size):
        import torch
        import torch.distributed as dist
        self.torch, self.dist = torch, dist
        self.a, self.rank, self.P = args, rank, size
        # a group's timeout is its own (new_group's default is 30 min): a stuck call raises
        # naming the rank it waits for, well before the job's timeout ends the ranks
        timeout = datetime.timedelta(seconds=args.group_timeout)
        self.E = dist.new_group(backend="epx", timeout=timeout)
        self.G = dist.new_group(backend="gloo", timeout=timeout)
        self.failed = []

    def log(self, *a):
        if self.rank == 0:
            print(*a, flush=True)

    def time_pair(self, reps, epx_call, gloo_call, before_epx=None, before_gloo=None):
        """Interleaved: (barrier, epx, barrier, gloo) per repetition after one warm-up; the
        slowest rank's median of each. before_*: untimed (refill an in-place call's input)."""
        dist, torch = self.dist, self.torch
        te, tg = [], []
        for k in range(reps + 1):
            if before_epx:
                before_epx()
            dist.barrier()
            t0 = time.perf_counter()
            epx_call()
            t1 = time.perf_counter()
            if before_gloo:
                before_gloo()
            dist.barrier()
            t2 = time.perf_counter()
            gloo_call()
            t3 = time.perf_counter()
            if k:  # the first is the warm-up
                te.append(t1 - t0)
                tg.append(t3 - t2)
        med = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
        m = torch.tensor([med(te), med(tg)], dtype=torch.float64)
        dist.all_reduce(m, op=dist.ReduceOp.MAX)
        return m.tolist()

    def agree(self, ok):
        """True when the check held on every rank."""
        t = self.torch.tensor([1.0 if ok else 0.0])
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MIN)
        return bool(t.item() == 1.0)

    def report(self, name, te, tg, ok, how, size):
        label, target = CASES[name][0].format(size), CASES[name][1]
        ratio = tg / te if te > 0 else float("inf")
        met = "met" if ratio >= target else "missed"
        checked = f"checked: {how}" if ok else f"CHECK FAILED: {how}"
        if not ok:
            self.failed.append(name)
        self.log(f"{label:58s} {te * 1e3:10.3f} {tg * 1e3:10.3f} {ratio:8.2f}x   >= {target:g}x {met:7s} {checked}")
        self.rows.append({"case": name, "epx_ms": te * 1e3, "gloo_ms": tg * 1e3, "ratio": ratio, "target": target,
                          "met": ratio >= target, "checked": ok})

    # -- cases --------------------------------------------------------------------------
    def all_reduce(self, name, nbytes, reps):
        torch, dist = self.torch, self.dist
        n = nbytes // 4
        src = _ints(n, self.rank)
        te, tg = src.clone(), src.clone()
        (t_e, t_g) = self.time_pair(reps, lambda: dist.all_reduce(te, group=self.E),
                                    lambda: dist.all_reduce(tg, group=self.G),
                                    before_epx=lambda: te.copy_(src), before_gloo=lambda: tg.copy_(src))
        ref = sum(_ints(n, r) for r in range(self.P))
        ok = self.agree(torch.equal(te, ref) and torch.equal(tg, ref))
        self.report(name, t_e, t_g, ok, "epx's sum == gloo's == the reference, bitwise", _size(nbytes))
        self.profile_call(name, lambda: dist.all_reduce(te, group=self.E))

    def all_to_all(self, name, tokens, reps):
        torch, dist = self.torch, self.dist
        rt = _Routing(self.P, tokens, HIDDEN)
        send = rt.send(self.rank).view(torch.float16)  # gloo takes neither bf16 nor int16: the bits as fp16
        s_in = rt.splits(self.rank)
        s_out = [rt.splits(s)[self.rank] for s in range(self.P)]
        oe = torch.full((sum(s_out), HIDDEN), -1, dtype=torch.int16).view(torch.float16)
        og = oe.clone()
        t_e, t_g = self.time_pair(reps, lambda: dist.all_to_all_single(oe, send, s_out, s_in, group=self.E),
                                  lambda: dist.all_to_all_single(og, send, s_out, s_in, group=self.G))
        ref = rt.reference(self.rank)
        ok = self.agree(torch.equal(oe.view(torch.int16), ref) and torch.equal(og.view(torch.int16), ref))
        rows = torch.tensor([float(send.shape[0])])
        dist.all_reduce(rows)
        self.report(name, t_e, t_g, ok, f"epx's rows == gloo's == the reference ({int(rows.item()) // self.P} rows "
                    f"sent per rank on average, {sum(s_in) * HIDDEN * 2 / MiB:.1f} MiB from rank 0; bf16 moved as fp16 bits)", tokens)
        self.profile_call(name, lambda: dist.all_to_all_single(oe, send, s_out, s_in, group=self.E))

    def all_gather(self, name, nbytes, reps):
        torch, dist = self.torch, self.dist
        m = nbytes // 4 // self.P
        inp = _ints(m, self.rank)
        oe = torch.full((m * self.P,), -1.0)
        og = torch.full((m * self.P,), -1.0)
        parts = [torch.empty(m) for _ in range(self.P)]

        def gloo_call():  # gloo has no all_gather_into_tensor: its list form, then one tensor
            dist.all_gather(parts, inp, group=self.G)
            torch.cat(parts, out=og)

        t_e, t_g = self.time_pair(reps, lambda: dist.all_gather_into_tensor(oe, inp, group=self.E), gloo_call)
        ref = torch.cat([_ints(m, r) for r in range(self.P)])
        ok = self.agree(torch.equal(oe, ref) and torch.equal(og, ref))
        self.report(name, t_e, t_g, ok, "epx's == gloo's (all_gather + cat) == the reference", _size(m * self.P * 4))
        self.profile_call(name, lambda: dist.all_gather_into_tensor(oe, inp, group=self.E))

    def reduce_scatter(self, name, nbytes, reps):
        torch, dist = self.torch, self.dist
        m = nbytes // 4 // self.P
        n = m * self.P
        src = _ints(n, self.rank, 3)
        buf = src.clone()
        oe = torch.full((m,), -1.0)
        og = torch.full((m,), -1.0)
        me = self.rank

        def gloo_call():  # gloo has no reduce_scatter: all_reduce, keep this rank's slice
            dist.all_reduce(buf, group=self.G)
            og.copy_(buf[me * m:(me + 1) * m])

        t_e, t_g = self.time_pair(reps, lambda: dist.reduce_scatter_tensor(oe, src, group=self.E), gloo_call,
                                  before_gloo=lambda: buf.copy_(src))
        ref = sum(_ints(n, r, 3) for r in range(self.P))[me * m:(me + 1) * m]
        ok = self.agree(torch.equal(oe, ref) and torch.equal(og, ref))
        self.report(name, t_e, t_g, ok, "epx's shard == gloo's (all_reduce + slice) == the reference", _size(n * 4))
        self.profile_call(name, lambda: dist.reduce_scatter_tensor(oe, src, group=self.E))

    def ddp_step(self, name, width, reps):
        torch, dist = self.torch, self.dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        torch.manual_seed(7)
        quarter = width // 4

        def mlp():
            torch.manual_seed(7)
            return torch.nn.Sequential(torch.nn.Linear(quarter, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                                       torch.nn.ReLU(), torch.nn.Linear(width, quarter))

        me, mg = mlp(), mlp()
        params = sum(p.numel() for p in me.parameters())
        de = DDP(me, process_group=self.E)
        dg = DDP(mg, process_group=self.G)
        oe = torch.optim.SGD(de.parameters(), lr=0.01)
        og = torch.optim.SGD(dg.parameters(), lr=0.01)
        batch = 8  # per rank: a small batch, the gradient all_reduce a large part of the step
        losses = {"e": [], "g": []}
        step_no = {"e": 0, "g": 0}

        def step(ddp, opt, key):
            k = step_no[key]
            step_no[key] += 1
            g = torch.Generator().manual_seed(1000 * k + self.rank)
            x = torch.randn(batch, quarter, generator=g)
            y = torch.randn(batch, quarter, generator=g)
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            loss.backward()
            opt.step()
            losses[key].append(loss.item())

        t_e, t_g = self.time_pair(reps, lambda: step(de, oe, "e"), lambda: step(dg, og, "g"))
        le, lg = torch.tensor(losses["e"]), torch.tensor(losses["g"])
        rel = float(((le - lg).abs() / lg.abs()).max())
        diff = max(float((a - b).abs().max()) for a, b in zip(me.parameters(), mg.parameters()))
        ok = self.agree(bool(le[0] == lg[0]) and rel < 1e-4 and diff < 1e-4)
        # both sum the same gradients in different orders: bitwise at step 0, then the last bits
        self.report(name, t_e, t_g, ok, f"the same loss on both ({len(le)} steps: step 0 bitwise, then within "
                    f"{rel:.1e} relative; parameters within {diff:.1e}); batch {batch} per rank",
                    f"{params / 1e6:.1f}M")
        self.profile_call(name, lambda: step(de, oe, "e"))

    # -- where the time goes ----------------------------------------------------------------
    def profile_call(self, name, call):
        """--profile: the epx call under cProfile on rank 0 (the others run it plainly)."""
        if not self.a.profile:
            return
        import cProfile
        import io
        import pstats
        self.dist.barrier()
        if self.rank == 0:
            pr = cProfile.Profile()
            pr.enable()
            call()
            pr.disable()
            s = io.StringIO()
            pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(12)
            lines = [ln for ln in s.getvalue().splitlines() if ln.strip()]
            start = next((i for i, ln in enumerate(lines) if ln.lstrip().startswith("ncalls")), 0)
            print(f"  profile of one epx {name} on rank 0 (tottime, s):", flush=True)
            for ln in lines[start:start + 13]:
                print("    " + ln, flush=True)
        else:
            call()
        self.dist.barrier()

    def run(self, names, which):
        self.rows = []
        self.log(f"{'case':58s} {'epx ms':>10s} {'gloo ms':>10s} {'gloo/epx':>9s}   target")
        for name in names:
            size = CASES[name][2 + which]
            reps = CASES[name][5][1 if which == 1 else 0]
            if name.startswith("all_reduce"):
                self.all_reduce(name, size, reps)
            elif name.startswith("all_to_all"):
                self.all_to_all(name, size, reps)
            elif name.startswith("all_gather"):
                self.all_gather(name, size, reps)
            elif name.startswith("reduce_scatter"):
                self.reduce_scatter(name, size, reps)
            elif name == "ddp_step":
                self.ddp_step(name, size, reps)
        return self.rows


def _select(args, which):
    names = MACHINES if which == 2 else LOCAL
    if args.only:
        picked = [n for n in names if any(o in n for o in args.only.split(","))]
        if not picked:
            raise SystemExit(f"distributed_bench: --only {args.only} names no case of {names}")
        names = picked
    return names


def _rank_main(rank, size, init, argv, which):
    """One rank: a gloo default group over `init` (file:// or env://), then the cases."""
    args = _parser().parse_args(argv)
    import torch
    import torch.distributed as dist
    import epx.distributed  # noqa: F401  (registers "epx")
    torch.set_num_threads(1)  # ranks share the machine's cores
    kw = {} if init == "env://" else {"rank": rank, "world_size": size}
    dist.init_process_group("gloo", init_method=init, timeout=datetime.timedelta(seconds=args.group_timeout), **kw)
    rank, size = dist.get_rank(), dist.get_world_size()
    b = Bench(args, rank, size)
    if rank == 0:
        window = int(os.environ.get("EPX_DIST_WINDOW_BYTES", 32 << 20)) >> 20
        where = "2 machines" if which == 2 else "one machine"
        print(f"epx.distributed_bench: {size} ranks on {where}, {'quick sizes' if which == 1 else 'full sizes'}, "
              f"torch {torch.__version__}, epx window {window} MiB; median of interleaved repetitions, the slowest "
              f"rank's; ratio = gloo / epx", flush=True)
    rows = b.run(_select(args, which), which)
    bad = b.failed
    b.log(f"epx.distributed_bench: {len(rows)} cases, {sum(r['met'] for r in rows)} targets met, "
          + (f"CHECKS FAILED: {', '.join(bad)}" if bad else "every result checked on every rank"))
    dist.barrier()
    dist.destroy_process_group()
    return 1 if bad else 0


def _spawned(rank, size, init, argv, which, q):
    try:
        q.put((rank, _rank_main(rank, size, init, argv, which), None))
    except BaseException as e:  # noqa: BLE001
        import traceback
        q.put((rank, 1, "".join(traceback.format_exception(type(e), e, e.__traceback__))))


def _local(args, argv):
    import multiprocessing as mp
    import queue
    import tempfile
    which = 1 if args.quick else 0
    size = args.ranks or (3 if args.quick else 8)
    _select(args, which)  # a bad --only fails here, before any rank starts
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="epx-dist-bench-") as d:
        q = ctx.Queue()
        init = "file://" + os.path.join(d, "store")
        procs = [ctx.Process(target=_spawned, args=(r, size, init, argv, which, q)) for r in range(size)]
        for p in procs:
            p.start()
        rc, deadline = 0, time.monotonic() + args.timeout + 60
        try:
            for _ in range(size):
                rank, code, err = q.get(timeout=max(1.0, deadline - time.monotonic()))
                if err:
                    print(f"distributed_bench: rank {rank} failed:\n{err}", file=sys.stderr, flush=True)
                rc = rc or code
        except queue.Empty:
            print(f"distributed_bench: ranks did not finish within {args.timeout + 60:.0f} s", file=sys.stderr)
            rc = 1
        finally:
            for p in procs:
                p.join(timeout=10)
                if p.exitcode is None:
                    p.kill()
                    p.join()
    return rc


def _machines(args, argv):
    """Through tests/multinode/torchrun.py of this checkout (epx/ is a symlink into it)."""
    here = os.path.dirname(os.path.realpath(__file__))
    harness = os.path.join(here, "..", "..", "tests", "multinode")
    if not os.path.exists(os.path.join(harness, "torchrun.py")):
        print("distributed_bench: --machines runs from a checkout (tests/multinode/torchrun.py)", file=sys.stderr)
        return 2
    sys.path.insert(0, os.path.abspath(harness))
    import torchrun
    why = torchrun.available()
    if why:
        print(f"distributed_bench: --machines: {why}", file=sys.stderr)
        return 2
    worker = [a for a in argv if a != "--machines"] + ["--worker"]
    with torchrun.Cluster(2) as c:
        run = c.torchrun("-m", ["epx.distributed_bench"] + worker, nproc=2, timeout=args.timeout)
        w0 = run.worker(0)
        print(w0.stdout if w0 else "", end="", flush=True)
        print(f"bytes sent on each machine's link: {run.tx}")
        if not run.ok:
            print(run.text(), file=sys.stderr)
            return 1
    return 0


def _parser():
    ap = argparse.ArgumentParser(prog="python3 -m epx.distributed_bench",
                                 description="torch.distributed: epx against gloo, in one job")
    ap.add_argument("--ranks", type=int, default=0, help="ranks (default 8; --quick: 3)")
    ap.add_argument("--quick", action="store_true", help="small sizes (CI smoke)")
    ap.add_argument("--only", default="", help="comma-separated case names (or parts of them)")
    ap.add_argument("--profile", action="store_true", help="where each epx call's time goes (cProfile, rank 0)")
    ap.add_argument("--machines", action="store_true", help="2 namespace machines x 2 ranks (root, a checkout)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds for the whole job")
    ap.add_argument("--group-timeout", type=float, default=120, help="each process group's timeout, seconds")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # a torchrun worker (env://)
    return ap


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    if args.worker:
        return _rank_main(-1, -1, "env://", argv, 2)
    if args.machines:
        return _machines(args, argv)
    return _local(args, argv)


if __name__ == "__main__":
    sys.exit(main())
