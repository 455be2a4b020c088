# epx as a torch.distributed backend: every op against the same op on a gloo group of the same
# job (or a float64 / local reference where gloo lacks it), on 4 ranks of this machine.
import datetime
import multiprocessing as mp
import os
import queue
import socket
import tempfile
import time
import traceback

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

P = 4
TIMEOUT = 60


def _shm():
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith("epx"))


def _no_new_shm(before):
    """No epx segment made since `before` is left (other jobs of the machine may make and
    unlink their own meanwhile: a new name must be gone within a few seconds)."""
    for _ in range(50):
        if not set(_shm()) - set(before):
            return True
        time.sleep(0.1)
    return False


def _rank_main(fn, rank, size, init, env, q):
    try:
        os.environ.update(env)
        os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(size)
        os.environ.setdefault("EPX_DIST_WINDOW_BYTES", str(1 << 20))  # small: the chunked paths run
        os.environ.setdefault("EPX_DIST_PP_BYTES", str(64 << 10))
        os.environ.setdefault("EPX_DIST_P2P_BYTES", str(64 << 10))
        import torch.distributed as dist
        import epx.distributed  # noqa: F401
        kw = {} if init == "env://" else {"rank": rank, "world_size": size}
        dist.init_process_group("epx", init_method=init, timeout=datetime.timedelta(seconds=TIMEOUT), **kw)
        try:
            value = fn(rank, size)
        finally:
            dist.destroy_process_group()
        # destroy_process_group unmaps every epx segment of the process (their memory is freed)
        mapped = sorted({ln.split()[5] for ln in open("/proc/self/maps") if "/dev/shm/epx" in ln})
        q.put((rank, value, f"mapped after destroy_process_group: {mapped}" if mapped else None))
    except BaseException as e:  # noqa: BLE001
        q.put((rank, None, "".join(traceback.format_exception(type(e), e, e.__traceback__))))


def _run(fn, size=P, init=None, env=None):
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="epx-dist-test-") as d:
        init = init or "file://" + os.path.join(d, "store")
        q = ctx.Queue()
        procs = [ctx.Process(target=_rank_main, args=(fn, r, size, init, env or {}, q), daemon=True) for r in range(size)]
        for p in procs:
            p.start()
        out, errors = {}, {}
        try:
            for _ in range(size):  # every rank's answer first: the first error may be a consequence of another's
                try:
                    rank, value, err = q.get(timeout=TIMEOUT + 60)
                except queue.Empty:
                    raise AssertionError(f"ranks {sorted(set(range(size)) - set(out))} never answered; the others: "
                                         + "\n".join(f"rank {r} failed:\n{e}" for r, e in sorted(errors.items())))
                if err is not None:
                    errors[rank] = err
                out[rank] = value
            assert not errors, "\n".join(f"rank {r} failed:\n{e}" for r, e in sorted(errors.items()))
        finally:
            for p in procs:
                p.join(timeout=10)
                if p.exitcode is None:
                    p.kill()
    return [out[r] for r in range(size)]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


DTYPES = ["float32", "float64", "bfloat16", "float16", "int8", "int16", "int32", "int64", "uint8", "bool"]


def _data(rank, dtype, shape, seed=0):
    g = torch.Generator().manual_seed(1000 * seed + rank)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 4).to(dtype)
    lo, hi = (0, 4) if dtype == torch.uint8 else (-3, 4)
    return torch.randint(lo, hi, shape, generator=g).to(dtype)


def _exception_of(work):
    """What work.exception() gives: torch 1.13 cannot return it to Python (TypeError) for
    gloo's Work as for one made from a Future."""
    try:
        return ("value", work.exception())
    except Exception as e:  # noqa: BLE001
        return ("raises", type(e).__name__)


def _eq(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


# -- the one job that checks every op ------------------------------------------------------
def _ops(rank, size):
    gloo = dist.new_group(backend="gloo")
    R = dist.ReduceOp
    checks = []

    def check(name, ok):
        checks.append((name, bool(ok)))

    # all_reduce SUM float32 over several windows: bitwise the left fold in rank order
    for n in (0, 1, 4097, 600_000):
        x = _data(rank, torch.float32, (n,))
        mine = x.clone()
        dist.all_reduce(mine)
        ref = _data(0, torch.float32, (n,))
        for r in range(1, size):
            ref = ref + _data(r, torch.float32, (n,))
        check(f"all_reduce f32 n={n} left fold", _eq(mine, ref))
        g = x.clone()
        dist.all_reduce(g, group=gloo)
        check(f"all_reduce f32 n={n} ~gloo", torch.allclose(mine, g, rtol=1e-5, atol=1e-4))
    # bitwise identical on every rank: gathered through gloo
    y = _data(rank, torch.float32, (3000,), seed=1)
    dist.all_reduce(y)
    ys = [torch.empty_like(y) for _ in range(size)]
    dist.all_gather(ys, y, group=gloo)
    check("all_reduce identical on every rank", all(_eq(ys[0], v) for v in ys))
    # AVG, bf16 / fp16 summed in float32
    for dt in (torch.bfloat16, torch.float16):
        x = _data(rank, dt, (5000,))
        dist.all_reduce(x)
        acc = _data(0, dt, (5000,)).float()
        for r in range(1, size):
            acc = acc + _data(r, dt, (5000,)).float()
        check(f"all_reduce {dt} summed in f32", _eq(x, acc.to(dt)))
    x = _data(rank, torch.float32, (1000,))
    dist.all_reduce(x, op=R.AVG)
    acc = sum((_data(r, torch.float32, (1000,)) for r in range(1, size)), _data(0, torch.float32, (1000,)))
    check("all_reduce AVG", _eq(x, acc * (1.0 / size)))
    # every dtype x op against a local fold in rank order (gloo lacks several of these dtypes)
    names = {R.SUM: "SUM", R.PRODUCT: "PRODUCT", R.MIN: "MIN", R.MAX: "MAX", R.BAND: "BAND", R.BOR: "BOR",
             R.BXOR: "BXOR"}
    fold = {R.SUM: torch.add, R.PRODUCT: torch.mul, R.MIN: torch.minimum, R.MAX: torch.maximum,
            R.BAND: torch.bitwise_and, R.BOR: torch.bitwise_or, R.BXOR: torch.bitwise_xor}
    for name in DTYPES:
        dt = getattr(torch, name)
        ops = [R.SUM, R.PRODUCT, R.MIN, R.MAX] + ([] if dt.is_floating_point else [R.BAND, R.BOR, R.BXOR])
        for op in ops:
            x = _data(rank, dt, (33,), seed=2)
            e = x.clone()
            dist.all_reduce(e, op=op)
            parts = [_data(r, dt, (33,), seed=2) for r in range(size)]
            if dt == torch.bool:
                parts = [p.to(torch.uint8) for p in parts]
                f = {R.SUM: torch.bitwise_or, R.MAX: torch.bitwise_or, R.PRODUCT: torch.bitwise_and,
                     R.MIN: torch.bitwise_and}.get(op, fold[op])
            else:
                f = fold[op]
            low = dt in (torch.bfloat16, torch.float16)
            acc = parts[0].float() if low else parts[0]
            for p in parts[1:]:
                acc = f(acc, p.float() if low else p)
            check(f"all_reduce {name} {names[op]}", _eq(e, acc.to(dt)))
    for op in (R.SUM, R.MAX, R.BXOR):  # and int32 against gloo itself
        x = _data(rank, torch.int32, (50,), seed=4)
        e, g = x.clone(), x.clone()
        dist.all_reduce(e, op=op)
        dist.all_reduce(g, op=op, group=gloo)
        check(f"all_reduce int32 {names[op]} = gloo", _eq(e, g))
    # non-contiguous and a view: only the view is written
    base = _data(rank, torch.float32, (8, 6))
    col = base.clone()
    dist.all_reduce(col[:, 1::2])
    ref = base.clone()
    s = sum((_data(r, torch.float32, (8, 6)) for r in range(1, size)), _data(0, torch.float32, (8, 6)))
    ref[:, 1::2] = s[:, 1::2]
    check("all_reduce non-contiguous view", _eq(col, ref))
    buf = torch.full((10,), 7.0)
    dist.all_reduce(buf[2:5])
    check("all_reduce view writes only the view", buf[:2].eq(7).all() and buf[5:].eq(7).all() and buf[2:5].eq(7 * size).all())
    # async Work
    x = torch.ones(100)
    w = dist.all_reduce(x, async_op=True)
    w.wait()
    fut = w.get_future()
    check("async work", w.is_completed() and w.is_success() and fut.done() and x.eq(size).all()
          and _eq(fut.value()[0], x))
    check("async work exception() is None after success", _exception_of(w) == ("value", None))
    # many outstanding: they run on the group's thread in issue order; a call that waits runs after them
    xs = [torch.full((3000,), float(rank + i)) for i in range(4)]
    ws = [dist.all_reduce(t, async_op=True) for t in xs]
    y = xs[3].clone()
    wy = dist.all_reduce(xs[3], op=dist.ReduceOp.MAX, async_op=True)  # after ws[3] on the same tensor
    dist.all_reduce(y)  # waits: the four before it ran first (y is its own copy, taken before ws[3] ran)
    for w_ in ws + [wy]:
        w_.wait()
    want = [sum(float(r + i) for r in range(size)) for i in range(4)]
    check("async calls complete in issue order", all(t.eq(v).all() for t, v in zip(xs[:3], want))
          and xs[3].eq(want[3]).all() and y.eq(sum(float(r + 3) for r in range(size))).all())
    # an error of an async call is wait()'s (on every rank), the future's and exception()'s
    bad = torch.ones(3 if rank == 0 else 4, dtype=torch.float64)
    wb = dist.all_reduce(bad, op=dist.ReduceOp.MAX, async_op=True)
    try:
        wb.wait()
        raised = None
    except RuntimeError as e:
        raised = str(e)
    check("async error raised by wait()", raised is not None and "epx backend: allreduce(MAX)" in raised
          and wb.is_completed() and not wb.is_success() and str(wb.exception()) == raised
          and wb.get_future().done())
    dist.barrier()

    # broadcast (chunked), every dtype
    for name in DTYPES + ["complex64"]:
        dt = getattr(torch, name)
        x = _data(rank, dt, (70_000,)) if name != "complex64" else torch.randn(50, dtype=dt, generator=torch.Generator().manual_seed(rank))
        e = x.clone()
        dist.broadcast(e, src=2)
        ref = _data(2, dt, (70_000,)) if name != "complex64" else torch.randn(50, dtype=dt, generator=torch.Generator().manual_seed(2))
        check(f"broadcast {name}", _eq(e, ref))
    g = _data(rank, torch.float32, (1000,))
    e = g.clone()
    dist.broadcast(e, src=1)
    dist.broadcast(g, src=1, group=gloo)
    check("broadcast = gloo", _eq(e, g))

    # all_gather (list) and into one tensor, with a zero-size and a chunked case
    for n, dt in ((0, torch.float32), (5, torch.int64), (300_000, torch.float32), (777, torch.bool), (99, torch.bfloat16)):
        x = _data(rank, dt, (n,), seed=3)
        e = [torch.empty_like(x) for _ in range(size)]
        dist.all_gather(e, x)
        ref = [_data(r, dt, (n,), seed=3) for r in range(size)]
        check(f"all_gather {dt} n={n}", all(_eq(a, b) for a, b in zip(e, ref)))
        out = torch.empty(size * n, dtype=dt)
        dist.all_gather_into_tensor(out, x)
        check(f"all_gather_into_tensor {dt} n={n}", _eq(out, torch.cat(ref)))
    x = _data(rank, torch.float32, (4, 5)).t()  # non-contiguous input
    e = [torch.empty(5, 4) for _ in range(size)]
    dist.all_gather(e, x)
    check("all_gather non-contiguous", all(_eq(e[r], _data(r, torch.float32, (4, 5)).t().contiguous()) for r in range(size)))
    objs = [None] * size
    dist.all_gather_object(objs, {"rank": rank})
    check("all_gather_object", objs == [{"rank": r} for r in range(size)])

    # reduce_scatter (list and tensor), SUM float32 (fold in rank order) and MAX int32
    for n in (3, 100_000):
        ins = [_data(rank, torch.float32, (n,), seed=10 + i) for i in range(size)]
        out = torch.empty(n)
        dist.reduce_scatter(out, ins)
        ref = sum((_data(r, torch.float32, (n,), seed=10 + rank) for r in range(1, size)),
                  _data(0, torch.float32, (n,), seed=10 + rank))
        check(f"reduce_scatter f32 n={n}", _eq(out, ref))
        out2 = torch.empty(n)
        dist.reduce_scatter_tensor(out2, torch.cat(ins))
        check(f"reduce_scatter_tensor f32 n={n}", _eq(out2, ref))
    ins = [_data(rank, torch.int32, (9,), seed=20 + i) for i in range(size)]
    out = torch.empty(9, dtype=torch.int32)
    dist.reduce_scatter(out, ins, op=R.MAX)
    ref = torch.stack([_data(r, torch.int32, (9,), seed=20 + rank) for r in range(size)]).max(0).values
    check("reduce_scatter int32 MAX", _eq(out, ref))

    # all_to_all_single even and uneven, all_to_all of lists, against gloo
    x = _data(rank, torch.bfloat16, (size * 6, 10)).view(torch.int32)  # gloo has no bf16: the same bytes
    e, g = torch.empty_like(x), torch.empty_like(x)
    dist.all_to_all_single(e, x)
    dist.all_to_all_single(g, x, group=gloo)
    check("all_to_all_single even", _eq(e, g))
    in_splits = [(rank + p) % 3 * 700 for p in range(size)]  # row counts that go above the chunk size
    out_splits = [(r + rank) % 3 * 700 for r in range(size)]
    x = _data(rank, torch.float32, (sum(in_splits), 12))
    e = torch.empty(sum(out_splits), 12)
    g = torch.empty_like(e)
    dist.all_to_all_single(e, x, out_splits, in_splits)
    dist.all_to_all_single(g, x, out_splits, in_splits, group=gloo)
    check("all_to_all_single uneven", _eq(e, g))
    ins = [_data(rank, torch.int64, (p + 1, 3), seed=30) for p in range(size)]
    outs = [torch.empty(rank + 1, 3, dtype=torch.int64) for _ in range(size)]
    dist.all_to_all(outs, ins)
    check("all_to_all lists", all(_eq(outs[r], _data(r, torch.int64, (rank + 1, 3), seed=30)) for r in range(size)))

    # send / recv around a ring (chunked), isend / irecv
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    x = _data(rank, torch.float64, (20_000,))
    got = torch.empty_like(x)
    if rank % 2 == 0:
        dist.send(x, nxt)
        dist.recv(got, prv)
    else:
        dist.recv(got, prv)
        dist.send(x, nxt)
    check("send/recv", _eq(got, _data(prv, torch.float64, (20_000,))))
    small = torch.tensor([rank * 10], dtype=torch.int32)
    into = torch.empty(1, dtype=torch.int32)
    reqs = [dist.isend(small, nxt), dist.irecv(into, prv)]
    for r in reqs:
        r.wait()
    check("isend/irecv", int(into) == prv * 10)

    # reduce, gather, scatter, barrier
    x = _data(rank, torch.int64, (7,))
    e, g = x.clone(), x.clone()
    dist.reduce(e, dst=1)
    dist.reduce(g, dst=1, group=gloo)
    check("reduce", _eq(e, g) if rank == 1 else _eq(e, x))
    x = _data(rank, torch.float32, (5,))
    gl = [torch.empty(5) for _ in range(size)] if rank == 3 else None
    dist.gather(x, gl, dst=3)
    check("gather", rank != 3 or all(_eq(gl[r], _data(r, torch.float32, (5,))) for r in range(size)))
    sl = [torch.full((4,), float(r)) for r in range(size)] if rank == 0 else None
    out = torch.empty(4)
    dist.scatter(out, sl, src=0)
    check("scatter", out.eq(rank).all())
    dist.barrier()

    # a mismatch between ranks is a RuntimeError on every rank, naming it
    msgs = []
    try:
        dist.all_reduce(torch.ones(10 if rank != 2 else 11))
    except RuntimeError as ex:
        msgs.append(str(ex))
    try:
        dist.all_reduce(torch.ones(10, dtype=torch.float32 if rank != 1 else torch.float16))
    except RuntimeError as ex:
        msgs.append(str(ex))
    try:
        dist.all_gather_into_tensor(torch.empty(4 * 3, dtype=torch.int32 if rank != 3 else torch.float32),
                                    torch.ones(3, dtype=torch.int32 if rank != 3 else torch.float32))
    except RuntimeError as ex:
        msgs.append(str(ex))
    try:  # float32 takes the BucketBuffer's all_reduce, float64 its all_gather: epx names the two calls
        dist.all_reduce(torch.ones(10, dtype=torch.float32 if rank != 3 else torch.float64))
    except RuntimeError as ex:
        msgs.append(str(ex))
    try:  # the ops differ (int32: an all_gather and a fold): every rank names them
        dist.all_reduce(torch.ones(5, dtype=torch.int32), op=R.MIN if rank == 3 else R.MAX)
        omsg = ""
    except RuntimeError as ex:
        omsg = str(ex)
    check("op mismatch", ("rank 3 reduces with MIN" in omsg) if rank != 3 else ("reduces with MAX, rank 3 with MIN" in omsg))
    check("mismatch errors", len(msgs) == 4 and "rank 2" in msgs[0] and "differ" in msgs[1] and "rank 3" in msgs[2]
          and "all_gather" in msgs[3] and "all_reduce" in msgs[3])
    # pairwise calls: the receiver of a mismatched message raises naming the sender, and the
    # pairs stay in step for the next call
    try:
        dist.broadcast(torch.zeros(100_000 if rank != 1 else 99_999), src=0)
        bmsg = None
    except RuntimeError as ex:
        bmsg = str(ex)
    check("broadcast mismatch raises on every rank", bmsg is not None and "rank 0 sends 400000 bytes" in bmsg
          and "rank 1 expects 399996 bytes" in bmsg)
    try:
        n_in = [3] * size
        n_out = [3] * size if rank != 2 else [3, 3, 3, 4]  # rank 3 sends rank 2 three rows
        dist.all_to_all_single(torch.empty(sum(n_out), 50), torch.ones(sum(n_in), 50), n_out, n_in)
        amsg = None
    except RuntimeError as ex:
        amsg = str(ex)
    check("all_to_all_single mismatch raises on every rank", amsg is not None and "rank 3 sends" in amsg
          and "rank 2 expects" in amsg)
    try:  # rank 1's split sizes do not add up: every rank hears it, and the exchange moves nothing
        dist.all_to_all_single(torch.empty(4 * size), torch.ones(4 * size), None, [4] * size if rank != 1 else [4, 4, 4, 5])
        amsg = None
    except RuntimeError as ex:
        amsg = str(ex)
    check("all_to_all_single split sizes of one rank", amsg is not None and "rank 1: input split sizes [4, 4, 4, 5]" in amsg)
    x = torch.full((100_000,), float(rank))
    dist.broadcast(x, src=3)
    e = torch.empty(size * 20)
    dist.all_to_all_single(e, torch.full((size * 20,), float(rank)))
    check("pairs in step after a mismatch", x.eq(3).all() and _eq(e, torch.arange(size).float().repeat_interleave(20)))
    # and the group still works afterwards
    z = torch.ones(3)
    dist.all_reduce(z)
    check("usable after errors", z.eq(size).all())
    # point-to-point as gloo: from any source, tags matched out of order, asynchronous. The
    # any-source messages have a tag of their own: rank 3 may already have sent rank 0 the big
    # tag-0 message below (it waits for nobody on the way), which a tag-0 any-source receive
    # would rightly match.
    if rank == 0:
        senders = set()
        for _ in range(size - 1):
            t = torch.empty(3)
            src = dist.recv(t, tag=3)
            senders.add(src)
            check(f"recv from any source: the data of rank {src}", t.eq(src).all())
        w = dist.irecv(torch.empty(3), tag=3)
        dist.send(torch.full((3,), 0.0), 0, tag=3)  # to itself, matched by the any-source irecv
        w.wait()
        check("recv from any source: every sender, itself too", senders == set(range(1, size))
              and w._source_rank() == 0)
    else:
        dist.send(torch.full((3,), float(rank)), 0, tag=3)
    wa = dist.isend(torch.full((5,), 7.0 + rank), nxt, tag=7)
    wb = dist.isend(torch.full((5,), 8.0 + rank), nxt, tag=8)
    b8, b7 = torch.empty(5), torch.empty(5)
    dist.recv(b8, prv, tag=8)  # the tag-7 message came first: it waits, stashed
    dist.recv(b7, prv, tag=7)
    wa.wait(), wb.wait()
    check("tags matched out of order", b8.eq(8.0 + prv).all() and b7.eq(7.0 + prv).all())
    big = _data(rank, torch.float32, (300_000,))  # 1.2 MB: many chunks, more than the pair's slots
    w = dist.isend(big, nxt)
    dist.barrier(group=gloo)  # the receiver posts only after this: isend must not wait for it
    got = torch.empty_like(big)
    dist.irecv(got, prv).wait()
    w.wait()
    check("isend before the receiver posts", _eq(got, _data(prv, torch.float32, (300_000,))))
    src_nc = _data(rank, torch.float64, (6, 8)).t()  # non-contiguous both ways; a view written only
    w = dist.isend(src_nc, nxt, tag=3)
    base = torch.full((8, 12), -1.0, dtype=torch.float64)
    dist.recv(base[:, 2:8], prv, tag=3)
    w.wait()
    check("send / recv of non-contiguous views", _eq(base[:, 2:8], _data(prv, torch.float64, (6, 8)).t())
          and base[:, :2].eq(-1).all() and base[:, 8:].eq(-1).all())
    sends = [dist.isend(torch.full((100 + i,), float(i)), nxt) for i in range(30)]
    outs = [torch.empty(100 + i) for i in range(30)]
    recvs = [dist.irecv(o, prv) for o in outs]
    for w in reversed(recvs + sends):
        w.wait()
    check("30 outstanding isend/irecv complete in issue order", all(o.eq(i).all() for i, o in enumerate(outs)))
    w = recvs[3]
    check("p2p Work: completed, success, no exception, future, source",
          w.is_completed() and w.is_success() and w.exception() is None and w.get_future().done()
          and w.get_future().value()[0] is outs[3] and w._source_rank() == prv)
    lonely = dist.irecv(torch.empty(1), prv, tag=99)  # no such message: wait(timeout) raises in time
    t0 = time.time()
    try:
        lonely.wait(datetime.timedelta(seconds=0.5))
        check("recv wait(timeout) raises", False)
    except RuntimeError as ex:
        check("recv wait(timeout) raises", "Timed out" in str(ex) and 0.4 < time.time() - t0 < 10
              and not lonely.is_completed())
    dist.send(torch.ones(10), nxt)  # 10 floats into 11: the receiver raises naming the sender
    try:
        dist.recv(torch.empty(11), prv)
        pmsg = ""
    except RuntimeError as ex:
        pmsg = str(ex)
    check("p2p size mismatch", f"rank {prv} sends 40 bytes" in pmsg and f"rank {rank} expects 44 bytes" in pmsg)
    dist.send(torch.ones(4), nxt)
    try:
        dist.recv(torch.empty(4, dtype=torch.int32), prv)
        pmsg = ""
    except RuntimeError as ex:
        pmsg = str(ex)
    check("p2p dtype mismatch", "torch.float32" in pmsg and "torch.int32" in pmsg)
    # monitored_barrier as gloo's: rank 0 names the rank that did not come (every one with wait_all_ranks)
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=20))
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=20), wait_all_ranks=True)
    if rank != 2:
        try:
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=1))
            mmsg = ""
        except RuntimeError as ex:
            mmsg = str(ex)
        want = "Rank 2 failed to pass monitoredBarrier" if rank == 0 else f"Rank {rank} successfully reached"
        check("monitored_barrier names the missing rank", want in mmsg)
    dist.barrier(group=gloo)
    if rank < 2:
        try:
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=1), wait_all_ranks=True)
            mmsg = ""
        except RuntimeError as ex:
            mmsg = str(ex)
        check("monitored_barrier wait_all_ranks", rank != 0 or "Ranks 2, 3 failed to pass monitoredBarrier" in mmsg)
    dist.barrier(group=gloo)  # (a rank that skipped a monitored_barrier is a round behind, as on gloo)
    # all_gather_coalesced, PREMUL_SUM (NCCL's: refused, as gloo does)
    outs = [[torch.empty(2, 3), torch.empty(4)] for _ in range(size)]
    dist.all_gather_coalesced(outs, [_data(rank, torch.float32, (2, 3)), _data(rank, torch.float32, (4,), seed=5)])
    check("all_gather_coalesced", all(_eq(outs[r][0], _data(r, torch.float32, (2, 3)))
                                      and _eq(outs[r][1], _data(r, torch.float32, (4,), seed=5)) for r in range(size)))
    try:
        dist.all_reduce(torch.ones(3), op=dist._make_nccl_premul_sum(2.0))
        check("PREMUL_SUM refused", False)
    except RuntimeError as ex:
        check("PREMUL_SUM refused", "PREMUL_SUM" in str(ex))
    # complex, coalesced, batch_isend_irecv
    c = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64) * (rank + 1)
    dist.all_reduce(c)
    check("all_reduce complex64", _eq(c, torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64) * (size * (size + 1) // 2)))
    ts = [torch.full((3,), float(rank)), torch.ones(2)]
    dist.all_reduce_coalesced(ts)
    check("all_reduce_coalesced", ts[0].eq(size * (size - 1) / 2).all() and ts[1].eq(size).all())
    got = torch.empty(6)
    ops = [dist.P2POp(dist.isend, torch.full((6,), float(rank)), nxt), dist.P2POp(dist.irecv, got, prv)]
    for w in dist.batch_isend_irecv(ops if rank % 2 == 0 else ops[::-1]):
        w.wait()
    check("batch_isend_irecv", got.eq(prv).all())
    # DDP: torch's C++ calls the group (parameter checks, broadcast, the reducer's all_reduce)
    grads = []
    for pg in (None, gloo):
        torch.manual_seed(0)
        m = torch.nn.Linear(8, 3)
        if rank == 1:
            with torch.no_grad():
                m.weight.add_(1.0)  # DDP's broadcast from rank 0 must undo this
        ddp = torch.nn.parallel.DistributedDataParallel(m, process_group=pg)
        ddp(torch.full((5, 8), float(rank + 1))).square().sum().backward()
        grads.append(torch.cat([m.weight.grad.reshape(-1), m.bias.grad]))
    check("DDP grads as on gloo", torch.allclose(grads[0], grads[1], rtol=1e-5, atol=1e-5))
    # a subgroup of the epx backend
    sub = dist.new_group([1, 3], backend="epx")
    if rank in (1, 3):
        z = torch.full((5,), float(rank))
        dist.all_reduce(z, group=sub)
        check("new_group epx", z.eq(4).all())
    # the path this job was asked for: every rank reading its peers' tensors, or the window
    default = dist.distributed_c10d._get_default_group()
    check("peer reads as asked", (default._peer_pids() is not None) == (os.environ.get("EPX_DIST_PEER_READ", "1") != "0"))
    return checks


# On one machine the pieces of broadcast, all_to_all and the gathers, and large sums, are read
# out of the peers' tensors; the window paths (those of ranks on several machines) run with
# the reads turned off.
@pytest.mark.parametrize("peer_read", ["1", "0"])
def test_every_op_against_gloo(peer_read):
    before = _shm()
    results = _run(_ops, env={"EPX_DIST_PEER_READ": peer_read})
    failed = [(r, name) for r, checks in enumerate(results) for name, ok in checks if not ok]
    print(len(results[0]), "checks on each rank")
    assert len(results[0]) >= 100, "checks missing"
    assert not failed, failed
    assert _no_new_shm(before)


def _small(rank, size):
    x = torch.full((3,), float(rank + 1))
    dist.all_reduce(x)
    return x.tolist(), dist.get_backend()


def test_init_tcp():  # env:// is torchrun's, below; file:// the big job's
    port = _free_port()
    before = _shm()
    res = _run(_small, size=2, init=f"tcp://127.0.0.1:{port}")
    assert res == [([3.0] * 3, "epx")] * 2
    assert _no_new_shm(before)


_TORCHRUN_SCRIPT = """
import datetime, os, time, torch, torch.distributed as dist
import epx.distributed
dist.init_process_group("epx", timeout=datetime.timedelta(seconds=60))
r = dist.get_rank()
x = torch.full((5,), float(r + 1))
dist.all_reduce(x)
print("RESULT", r, x.tolist(), dist.get_backend(), flush=True)
short = dist.new_group(backend="epx", timeout=datetime.timedelta(seconds=2))
if r == 0:
    t0 = time.time()
    try:
        dist.all_reduce(torch.ones(3), group=short)  # rank 1 never joins: epx's timeout, naming rank 1
    except RuntimeError as e:
        print("RAISED", 1.9 < time.time() - t0 < 15, "rank 1" in str(e), flush=True)
    open("rank0-done", "w").close()
else:
    t0 = time.time()
    while not os.path.exists("rank0-done") and time.time() - t0 < 30:  # alive until rank 0 timed out
        time.sleep(0.05)
dist.destroy_process_group()
"""


def test_torchrun_and_timeout(tmp_path):
    import shutil
    import subprocess
    import sys
    script = tmp_path / "run.py"
    script.write_text(_TORCHRUN_SCRIPT)
    torchrun = shutil.which("torchrun") or "/usr/bin/torchrun"
    cmd = [torchrun, "--nproc_per_node", "2", "--master_port", str(_free_port()), "--monitor_interval", "0.2",
           "--redirects", "1", "--tee", "1", str(script)]  # --redirects/--tee parse to None unless named
    if not os.path.exists(torchrun):
        cmd = [sys.executable, "-m", "torch.distributed.run"] + cmd[1:]
    before = _shm()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path).stdout
    assert out.count("[3.0, 3.0, 3.0, 3.0, 3.0] epx") == 2, out
    assert "RAISED True True" in out, out
    assert _no_new_shm(before)


def _both_paths(rank, size):
    """The same calls on a group that reads its peers' tensors and on one that goes through
    the window: the same bits (the sums are the same left fold in rank order)."""
    on = dist.new_group(backend="epx")
    reads = on._peer_pids() is not None
    os.environ["EPX_DIST_PEER_READ"] = "0"
    off = dist.new_group(backend="epx")
    window = off._peer_pids() is None
    diffs = []
    for i, dt in enumerate((torch.float32, torch.bfloat16, torch.float16)):
        for n in (300_000, (1 << 20) + 7):  # below and above the sums' 1 MiB switch, over several windows
            for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
                x = _data(rank + 10 * i, torch.float32, (n,)).mul(100).to(dt)
                a, b = x.clone(), x.clone()
                dist.all_reduce(a, op=op, group=on)
                dist.all_reduce(b, op=op, group=off)
                oa, ob = torch.empty(n // size, dtype=dt), torch.empty(n // size, dtype=dt)
                dist._reduce_scatter_base(oa, x[:n // size * size], op=op, group=on)
                dist._reduce_scatter_base(ob, x[:n // size * size], op=op, group=off)
                ga, gb = torch.empty(n * size, dtype=dt), torch.empty(n * size, dtype=dt)
                dist.all_gather_into_tensor(ga, x, group=on)
                dist.all_gather_into_tensor(gb, x, group=off)
                diffs += [name for name, u, v in (("all_reduce", a, b), ("reduce_scatter", oa, ob), ("all_gather", ga, gb))
                          if not _eq(u, v)]
    rows = [3 + (rank * 5 + p) % 7 for p in range(size)]  # uneven splits: rank r sends p 3 + (5r + p) % 7 rows
    recv = [3 + (r * 5 + rank) % 7 for r in range(size)]
    inp = _data(rank, torch.float32, (sum(rows), 33))
    outs = []
    for g in (on, off):
        out = torch.empty(sum(recv), 33)
        dist.all_to_all_single(out, inp, recv, rows, group=g)
        outs.append(out)
    if not _eq(outs[0], outs[1]):
        diffs.append("all_to_all_single")
    return reads, window, diffs


def test_peer_reads_equal_the_window():
    before = _shm()
    for reads, window, diffs in _run(_both_paths, env={"EPX_DIST_WINDOW_BYTES": str(1 << 20)}):
        assert reads and window, "a group did not take the path asked for"
        assert not diffs, diffs
    assert _no_new_shm(before)
