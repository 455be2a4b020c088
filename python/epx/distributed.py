"""epx as a torch.distributed backend (CPU tensors, ranks on one machine).

    import epx.distributed                       # registers the backend "epx"
    dist.init_process_group("epx", init_method="env://")     # or tcp://, file://
    sub = dist.new_group([0, 1], backend="epx")
    dist.all_reduce(t)                           # epx's BucketBuffer underneath

Each process group of this backend bootstraps its own epx transport through the c10d Store
it is given (no other process group is needed) and holds, built collectively when the group
is made: a BucketBuffer over a staging window (all_reduce, all_gather, reduce_scatter, and
every reduction built from them), a PPBuffer for the collectives that move pieces between
pairs (broadcast, scatter, all_to_all) and a second PPBuffer for the user's send/recv (so
that point-to-point messages never interleave with a collective's).

Tensors of any size go through the window in chunks; non-contiguous tensors are worked on
as a contiguous copy and written back (a view: only the view is written). Every call runs
to completion before it returns (async_op=True returns a completed Work); an error raises
at the call, on every rank for a collective (see docs/distributed.md for the list of what
is implemented and how each reduction is ordered).
"""
import datetime
import os

import numpy as np
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup, ReduceOp, _create_work_from_future

from . import _epx

BACKEND = "epx"
_WINDOW = int(os.environ.get("EPX_DIST_WINDOW_BYTES", 32 << 20))
_PP_BYTES = int(os.environ.get("EPX_DIST_PP_BYTES", 4 << 20))
_P2P_BYTES = int(os.environ.get("EPX_DIST_P2P_BYTES", 1 << 20))
_INFLIGHT = 2  # pairwise exchanges interleave one send and one receive: two slots never deadlock

_DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int8, torch.int16, torch.int32,
           torch.int64, torch.uint8, torch.bool, torch.complex64, torch.complex128]
_FAST = (torch.float32, torch.bfloat16, torch.float16)  # summed by the BucketBuffer in float32
R = ReduceOp.RedOpType
_OPS = {R.SUM: "SUM", R.AVG: "AVG", R.PRODUCT: "PRODUCT", R.MIN: "MIN", R.MAX: "MAX", R.BAND: "BAND",
        R.BOR: "BOR", R.BXOR: "BXOR"}


def _code(dtype):
    return _DTYPES.index(dtype) + 1 if dtype in _DTYPES else 99


def _op_of(opts_or_op):
    op = getattr(opts_or_op, "reduceOp", opts_or_op)
    op = getattr(op, "op", op)  # a ReduceOp instance wraps its RedOpType
    name = _OPS.get(op)
    if name is None:
        raise RuntimeError(f"epx backend: reduce op {op} is not implemented yet")
    return op, name


def _with_rank(msg, rank):
    """epx's messages name their rank first; others get this rank's."""
    return msg if msg.startswith(("rank ", "every rank")) else f"rank {rank}: {msg}"


def _signature(dtype, op):
    """A call's dtype and op as one float32 code c: summed over P ranks, the slots (c, c^2)
    come to (P c, P c^2) only when every rank has the same c."""
    return float(_code(dtype) * 2 + (op == R.AVG))


def _nyi(op):
    raise RuntimeError(f"epx backend: {op} is not implemented yet")


def _done(result):
    """A finished Work over a completed Future: a C++ Work, so that torch's C++ callers
    (DDP's checks and reducer) can wait() on it too (they do not see a Python subclass's
    methods)."""
    fut = torch.futures.Future()
    fut.set_result(result)
    return _create_work_from_future(fut)


def _store_allgather(store, rank, size, prefix):
    """allgather(bytes) over the c10d store: each round's keys are new (a counter)."""
    state = {"round": 0}

    def allgather(data):
        k = state["round"]
        state["round"] += 1
        store.set(f"{prefix}/{k}/{rank}", bytes(data))
        return b"".join(store.get(f"{prefix}/{k}/{r}") for r in range(size))

    return allgather


def _flat(t):
    """(a flat contiguous tensor to work on, a function that writes it back into t)."""
    if t.is_contiguous():
        return t.view(-1) if t.dim() != 1 else t, lambda: None
    c = t.contiguous().view(-1)
    return c, lambda: t.copy_(c.view(t.shape))


def _bytes(t):
    return t.numel() * t.element_size()


def _u8(t):
    """A contiguous tensor's bytes as a flat uint8 view (bool and complex included)."""
    t = t.reshape(-1)
    if t.dtype == torch.bool:
        t = t.view(torch.uint8)
    elif t.is_complex():
        t = torch.view_as_real(t).reshape(-1)
    return t.view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)


def _reduce_local(parts, op, dtype):
    """Left fold in rank order: acc = parts[0]; acc = op(acc, parts[r])."""
    if dtype == torch.bool:
        table = {R.SUM: torch.logical_or, R.MAX: torch.logical_or, R.BOR: torch.logical_or,
                 R.PRODUCT: torch.logical_and, R.MIN: torch.logical_and, R.BAND: torch.logical_and,
                 R.BXOR: torch.logical_xor}
    else:
        table = {R.SUM: torch.add, R.AVG: torch.add, R.PRODUCT: torch.mul, R.MIN: torch.minimum,
                 R.MAX: torch.maximum, R.BAND: torch.bitwise_and, R.BOR: torch.bitwise_or,
                 R.BXOR: torch.bitwise_xor}
    if op not in table:
        raise RuntimeError(f"epx backend: reduce op {_OPS.get(op, op)} is not defined for {dtype}")
    if dtype.is_floating_point and op in (R.BAND, R.BOR, R.BXOR):
        raise RuntimeError(f"epx backend: reduce op {_OPS[op]} is not defined for {dtype}")
    if op == R.AVG and not (dtype.is_floating_point or dtype.is_complex):
        raise RuntimeError(f"epx backend: reduce op AVG is not defined for {dtype}")
    low = dtype in (torch.bfloat16, torch.float16)
    acc = parts[0].float() if low else parts[0].clone()
    for p in parts[1:]:
        acc = table[op](acc, p.float() if low else p)
    if op == R.AVG:
        acc = acc / len(parts)
    return acc.to(dtype)


class ProcessGroupEpx(ProcessGroup):
    """A torch.distributed ProcessGroup over epx's buffers (made by init_process_group /
    new_group with backend "epx"; not meant to be built directly)."""

    def __init__(self, store, rank, size, timeout):
        super().__init__(rank, size)
        self._rank, self._size = rank, size
        secs = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)
        self._timeout = secs
        self._transport = _epx.Transport(rank, size, _store_allgather(store, rank, size, "epx-bootstrap"), "auto", secs)
        self._bucket = _epx.BucketBuffer(self._transport, [list(range(size))], _WINDOW, [], 0, "auto")
        self._storage = self._bucket.storage("torch")
        self._f32 = self._storage.numpy().view(np.float32)
        self._base = self._storage.data_ptr()
        self._want = {}
        self._pp = _epx.PPBuffer(self._transport, _PP_BYTES, _INFLIGHT, [], 0, [], 0)
        self._p2p = _epx.PPBuffer(self._transport, _P2P_BYTES, _INFLIGHT, [], 0, [], 0)
        _live.append(self)

    # -- c10d's identity ----------------------------------------------------------------
    def getBackendName(self):
        return BACKEND

    def _get_backend_name(self):
        return BACKEND

    def name(self):
        return BACKEND

    def rank(self):
        return self._rank

    def size(self):
        return self._size

    # -- the window ---------------------------------------------------------------------
    def _alive(self, op):
        if self._bucket is None:
            raise RuntimeError(f"epx backend: {op} on a process group that was destroyed")

    def _view(self, nbytes, dtype, offset=0):
        return self._storage.narrow(0, offset, nbytes).view(dtype)

    def _bucket_call(self, op, fn, *args):
        try:
            ev = fn(*args)
            ev.wait()
            return ev
        except RuntimeError as e:
            raise RuntimeError(f"epx backend: {op}: {_with_rank(str(e), self._rank)}") from e

    # -- all_reduce ---------------------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        op, opname = _op_of(opts if opts is not None else R.SUM)
        self._alive("allreduce")
        if isinstance(tensors, torch.Tensor):  # pg.allreduce(tensor, op), c10d's third overload
            tensors = [tensors]
        for t in tensors:
            self._allreduce_one(t, op, opname)
        return _done(list(tensors))

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def _allreduce_one(self, t, op, opname):
        if t.is_complex() and op in (R.SUM, R.AVG):
            self._allreduce_one(torch.view_as_real(t), op, opname)
            return
        if t.dtype in _FAST and op in (R.SUM, R.AVG):
            self._sum_fast(t, op, opname)
            return
        flat, back = _flat(t)
        parts = self._gather_all(flat, f"allreduce({opname})")
        flat.copy_(_reduce_local(parts, op, t.dtype))
        back()

    def _sum_fast(self, t, op, opname):
        """float32 (bf16 and fp16 through float32 staging) SUM / AVG on the BucketBuffer,
        chunked; the first chunk carries two float32 slots (c, c^2) of this rank's dtype and
        op code whose sums tell every rank alike whether the ranks agree."""
        n, cap = t.numel(), _WINDOW // 4 - 2
        scale = 1.0 / self._size if op == R.AVG else 1.0
        sig = _signature(t.dtype, op)
        if n <= cap and t.dtype == torch.float32 and t.is_contiguous():
            self._sum_small(t, n, scale, sig, opname)
            return
        flat, back = _flat(t)
        start, first = 0, True
        while first or start < n:
            m = min(cap, n - start)
            extra = 2 if first else 0
            stage = self._view((m + extra) * 4, torch.float32)
            stage[:m].copy_(flat[start:start + m])
            if first:
                stage[m] = sig
                stage[m + 1] = sig * sig
            self._bucket_call(f"allreduce({opname})", self._bucket.all_reduce, [(stage.data_ptr(), (m + extra) * 4, 4)],
                              1.0, 0)
            if first:
                self._agree("allreduce", (float(stage[m]), float(stage[m + 1])), (self._size * sig, self._size * sig * sig),
                            f"{t.dtype}, {opname}, {n} elements")
            if scale != 1.0:
                stage[:m].mul_(scale)
            flat[start:start + m].copy_(stage[:m])
            start += m
            first = False
        back()

    def _agree(self, call, got, want, detail):
        """The (c, c^2) slots' sums against what they are when every rank has this rank's
        code (_signature): else the ranks took the call with different dtypes or ops."""
        if got[0] != want[0] or got[1] != want[1]:
            raise RuntimeError(f"epx backend: {call}: rank {self._rank}: the ranks differ in dtype or op "
                               f"(this rank: {detail})")

    def _sum_small(self, t, n, scale, sig, opname):
        """One window's worth of contiguous float32: numpy on the window (a small call is
        mostly its Python, and numpy's element access costs a fraction of torch's); the
        scale is the BucketBuffer's one multiply at the end."""
        f = self._f32
        src = t.detach().numpy().reshape(-1)
        f[:n] = src
        f[n] = sig
        f[n + 1] = sig * sig
        self._bucket_call(f"allreduce({opname})", self._bucket.all_reduce, [(self._base, (n + 2) * 4, 4)], scale, 0)
        want = self._want.get((sig, scale))
        if want is None:  # the sums of (c, c^2) when every rank has c, scaled as float32 does
            P = np.float32(self._size)
            want = [np.float32(P * np.float32(sig)), np.float32(P * np.float32(sig * sig))]
            if scale != 1.0:
                want = [w * np.float32(scale) for w in want]
            self._want[(sig, scale)] = want
        self._agree("allreduce", (f[n], f[n + 1]), want, f"{t.dtype}, {opname}, {n} elements")
        src[:] = f[:n]

    # -- all_gather -----------------------------------------------------------------------
    def _gather_all(self, flat, op):
        """Every rank's `flat` (contiguous, same dtype and size on every rank), by rank:
        the BucketBuffer's all_gather, chunked; the first chunk carries a 16-byte header
        (dtype code, numel) whose copies name the first rank that differs."""
        out = [torch.empty_like(flat) for _ in range(self._size)]
        self._gather_into(flat, [o for o in out], op)
        return out

    def _gather_into(self, flat, outs, op):
        """all_gather of flat (contiguous 1-D) into outs[r] (contiguous 1-D, flat's size)."""
        P, me = self._size, self._rank
        src = _u8(flat)
        dst = [_u8(o) for o in outs]
        nbytes, hdr = src.numel(), 16
        cap = (_WINDOW // P - hdr) // 64 * 64
        header = torch.tensor([_code(flat.dtype), flat.numel()], dtype=torch.int64).view(torch.uint8)
        start, first = 0, True
        while first or start < nbytes:
            m = min(cap, nbytes - start)
            k = m + (hdr if first else 0)
            mine = self._view(k, torch.uint8, me * k)  # this rank's piece in place
            if first:
                mine[:hdr].copy_(header)
                mine[hdr:].copy_(src[:m])
            else:
                mine.copy_(src[start:start + m])
            whole = self._view(k * P, torch.uint8)
            self._bucket_call(op, self._bucket.all_gather, [(mine.data_ptr(), k, 1)], [], 0)
            pieces = whole.view(P, k)
            if first:
                heads = pieces[:, :hdr].contiguous().view(torch.int64).view(P, 2)
                for r in range(P):
                    if heads[r, 0] != heads[me, 0] or heads[r, 1] != heads[me, 1]:
                        d_r = _DTYPES[int(heads[r, 0]) - 1] if 0 < heads[r, 0] <= len(_DTYPES) else "?"
                        raise RuntimeError(f"epx backend: {op}: rank {r}'s tensor is {d_r} x {int(heads[r, 1])} "
                                           f"elements, rank {me}'s is {flat.dtype} x {flat.numel()}")
                for r in range(P):
                    dst[r][:m].copy_(pieces[r, hdr:])
            else:
                for r in range(P):
                    dst[r][start:start + m].copy_(pieces[r])
            start += m
            first = False

    def allgather(self, output_tensor_lists, input_tensors, opts=None):
        self._alive("allgather")
        for outs, inp in zip(output_tensor_lists, input_tensors):
            if len(outs) != self._size:
                raise RuntimeError(f"epx backend: allgather: rank {self._rank}: {len(outs)} output tensors, expected "
                                   f"{self._size}")
            for o in outs:
                if o.numel() != inp.numel() or o.dtype != inp.dtype:
                    raise RuntimeError(f"epx backend: allgather: rank {self._rank}: an output tensor is {o.dtype} x "
                                       f"{o.numel()}, expected {inp.dtype} x {inp.numel()} as the input")
            flat, _ = _flat(inp)
            tmp = [o.view(-1) if o.is_contiguous() else torch.empty(o.numel(), dtype=o.dtype) for o in outs]
            self._gather_into(flat, tmp, "allgather")
            for o, t in zip(outs, tmp):
                if not o.is_contiguous():
                    o.copy_(t.view(o.shape))
        return _done([o for outs in output_tensor_lists for o in outs])

    def allgather_coalesced(self, output_tensor_lists, input_tensors, opts=None):
        _nyi("allgather_coalesced")

    def _allgather_base(self, output, input, opts=None):
        self._alive("_allgather_base")
        if output.numel() != input.numel() * self._size or output.dtype != input.dtype:
            raise RuntimeError(f"epx backend: all_gather_into_tensor: rank {self._rank}: output is {output.dtype} x "
                               f"{output.numel()}, expected {input.dtype} x {input.numel() * self._size}")
        out, back = _flat(output)
        flat, _ = _flat(input)
        n = flat.numel()
        self._gather_into(flat, [out[r * n:(r + 1) * n] for r in range(self._size)], "all_gather_into_tensor")
        back()
        return _done([output])

    # -- reduce_scatter -------------------------------------------------------------------
    def reduce_scatter(self, output_tensors, input_tensor_lists, opts=None):
        op, opname = _op_of(opts if opts is not None else R.SUM)
        self._alive("reduce_scatter")
        for out, ins in zip(output_tensors, input_tensor_lists):
            if len(ins) != self._size or any(i.numel() != out.numel() or i.dtype != out.dtype for i in ins):
                raise RuntimeError(f"epx backend: reduce_scatter: rank {self._rank}: expected {self._size} inputs of "
                                   f"{out.dtype} x {out.numel()} (the output's)")
            self._reduce_scatter_one(out, [i.reshape(-1) for i in ins], op, opname)
        return _done(list(output_tensors))

    def _reduce_scatter_base(self, output, input, opts=None):
        op, opname = _op_of(opts if opts is not None else R.SUM)
        self._alive("_reduce_scatter_base")
        if input.numel() != output.numel() * self._size or input.dtype != output.dtype:
            raise RuntimeError(f"epx backend: reduce_scatter_tensor: rank {self._rank}: input is {input.dtype} x "
                               f"{input.numel()}, expected {output.dtype} x {output.numel() * self._size}")
        flat, _ = _flat(input)
        n = output.numel()
        self._reduce_scatter_one(output, [flat[r * n:(r + 1) * n] for r in range(self._size)], op, opname)
        return _done([output])

    def _reduce_scatter_one(self, out, ins, op, opname):
        P, me = self._size, self._rank
        of, back = _flat(out)
        if out.dtype in _FAST and op in (R.SUM, R.AVG):
            n = of.numel()
            cap = _WINDOW // (4 * P) - 2
            scale = 1.0 / P if op == R.AVG else 1.0
            sig = _signature(out.dtype, op)
            start, first = 0, True
            while first or start < n:
                m = min(cap, n - start)
                row = m + 2  # each shard's row ends with the (c, c^2) slots
                stage = self._view(row * P * 4, torch.float32).view(P, row)
                for r in range(P):
                    stage[r, :m].copy_(ins[r][start:start + m])
                stage[:, m] = sig
                stage[:, m + 1] = sig * sig
                ev = self._bucket_call(f"reduce_scatter({opname})", self._bucket.reduce_scatter,
                                       [(stage.data_ptr(), row * P * 4, 4)], "fp32", 1.0, 0)
                (ptr, nb), = ev.results()
                shard = self._view(nb, torch.float32, ptr - self._bucket.storage_ptr)
                if first:
                    self._agree("reduce_scatter", (float(shard[m]), float(shard[m + 1])), (P * sig, P * sig * sig),
                                f"{out.dtype}, {opname}, {n} elements per rank")
                if scale != 1.0:
                    shard[:m].mul_(scale)
                of[start:start + m].copy_(shard[:m])
                start += m
                first = False
        else:
            whole = torch.cat([i.reshape(-1) for i in ins]) if ins else of.new_empty(0)
            parts = self._gather_all(whole, f"reduce_scatter({opname})")
            n = of.numel()
            of.copy_(_reduce_local([p[me * n:(me + 1) * n] for p in parts], op, out.dtype))
        back()

    # -- pairwise: broadcast, all_to_all, scatter ---------------------------------------
    # Every message of a pairwise call is a 16-byte header (bytes, dtype code) and then its
    # bytes in chunks of at most `cap`: a receiver whose tensor does not match drains the
    # sender's chunks and raises, so that neither side waits for the other and the pair's
    # queue stays in step for the next call.
    def _send(self, pp, src_u8, peer, cap, code=0):
        head = torch.tensor([src_u8.numel(), code], dtype=torch.int64)
        pp.send(head.data_ptr(), 16, peer)
        for s in range(0, src_u8.numel(), cap):
            piece = src_u8[s:s + cap]
            pp.send(piece.data_ptr(), piece.numel(), peer)

    def _recv_head(self, pp, peer):
        head = torch.empty(2, dtype=torch.int64)
        pp.recv(head.data_ptr(), 16, peer)
        return int(head[0]), int(head[1])

    def _drain(self, pp, peer, nbytes, cap):
        for _ in range(0, nbytes, cap):
            pp.release(pp.recv_view(peer, -1))

    def _mismatch(self, op, peer, got, want):
        def words(h):
            return f"{h[0]} bytes" + (f" of {_DTYPES[h[1] - 1]}" if 0 < h[1] <= len(_DTYPES) else "")
        return RuntimeError(f"epx backend: {op}: rank {peer} sends {words(got)}, rank {self._rank} expects "
                            f"{words(want)}")

    def _recv(self, pp, dst_u8, peer, cap, code=0, op="recv"):
        got = self._recv_head(pp, peer)
        if got[0] != dst_u8.numel() or (code and got[1] and got[1] != code):
            self._drain(pp, peer, got[0], cap)
            raise self._mismatch(op, peer, got, (dst_u8.numel(), code))
        for s in range(0, dst_u8.numel(), cap):
            piece = dst_u8[s:s + cap]
            pp.recv(piece.data_ptr(), piece.numel(), peer)

    def _pp_call(self, op, fn, *args):
        try:
            return fn(*args)
        except RuntimeError as e:
            if str(e).startswith("epx backend:"):
                raise
            raise RuntimeError(f"epx backend: {op}: {_with_rank(str(e), self._rank)}") from e

    def broadcast(self, tensors, opts=None):
        self._alive("broadcast")
        root = opts.rootRank if opts is not None else 0
        for t in tensors:
            flat, back = _flat(t)
            u8 = _u8(flat)
            if self._rank == root:
                for peer in range(self._size):
                    if peer != root:
                        self._pp_call("broadcast", self._send, self._pp, u8, peer, _PP_BYTES, _code(t.dtype))
            else:
                self._pp_call("broadcast", self._recv, self._pp, u8, root, _PP_BYTES, _code(t.dtype), "broadcast")
                back()
        return _done(list(tensors))

    def _exchange(self, op, sends, recvs):
        """Pairwise exchange: sends[p] / recvs[p] are flat uint8 tensors to / from rank p.
        First every peer gets its header and first chunk (the pair's two slots: this never
        waits on this call's peers, so a small exchange is not held in lockstep); then step s
        receives from rank-s and sends the rest to rank+s, chunk by chunk alternately (a
        sender is at most two messages ahead of its receiver: no cycle of full queues). A
        size that does not match is raised after every step, so the peers never wait."""
        P, me, cap, pp = self._size, self._rank, _PP_BYTES, self._pp
        recvs[me].copy_(sends[me])
        for s in range(1, P):
            dst = (me + s) % P
            out = sends[dst]
            head = torch.tensor([out.numel(), 0], dtype=torch.int64)
            pp.send(head.data_ptr(), 16, dst)
            if out.numel():
                piece = out[:cap]
                pp.send(piece.data_ptr(), piece.numel(), dst)
        problem = None
        for s in range(1, P):
            dst, src = (me + s) % P, (me - s) % P
            out, inp = sends[dst], recvs[src]
            got = self._recv_head(pp, src)
            ok = got[0] == inp.numel()
            if not ok and problem is None:
                problem = self._mismatch(op, src, got, (inp.numel(), 0))
            ns, nr = -(-out.numel() // cap), -(-got[0] // cap)
            for k in range(max(ns, nr)):
                if 0 < k < ns:
                    piece = out[k * cap:(k + 1) * cap]
                    pp.send(piece.data_ptr(), piece.numel(), dst)
                if k < nr:
                    if ok:
                        piece = inp[k * cap:(k + 1) * cap]
                        pp.recv(piece.data_ptr(), piece.numel(), src)
                    else:
                        pp.release(pp.recv_view(src, -1))
        if problem is not None:
            raise problem

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        self._alive("alltoall_base")
        P = self._size
        if output.dtype != input.dtype:
            raise RuntimeError(f"epx backend: all_to_all_single: rank {self._rank}: output is {output.dtype}, "
                               f"input {input.dtype}")
        of, back = _flat(output)
        inf, _ = _flat(input)
        rows_o = output.shape[0] if output.dim() else 1
        rows_i = input.shape[0] if input.dim() else 1
        row_o = of.numel() // rows_o if rows_o else 0
        row_i = inf.numel() // rows_i if rows_i else 0

        def splits(given, rows, what):
            if not given:
                if rows % P:
                    raise RuntimeError(f"epx backend: all_to_all_single: rank {self._rank}: {what} has {rows} rows, "
                                       f"not divisible by {P} ranks")
                return [rows // P] * P
            if len(given) != P or sum(given) != rows:
                raise RuntimeError(f"epx backend: all_to_all_single: rank {self._rank}: {what} split sizes {list(given)}"
                                   f" do not cover its {rows} rows in {P} parts")
            return list(given)

        so, si = splits(output_split_sizes, rows_o, "output"), splits(input_split_sizes, rows_i, "input")
        uo, ui = _u8(of), _u8(inf)
        bo, bi = row_o * of.element_size(), row_i * inf.element_size()
        offs_o = [sum(so[:p]) * bo for p in range(P)]
        offs_i = [sum(si[:p]) * bi for p in range(P)]
        recvs = [uo[offs_o[p]:offs_o[p] + so[p] * bo] for p in range(P)]
        sends = [ui[offs_i[p]:offs_i[p] + si[p] * bi] for p in range(P)]
        if recvs[self._rank].numel() != sends[self._rank].numel():
            raise RuntimeError(f"epx backend: all_to_all_single: rank {self._rank}: sends itself {si[self._rank]} rows "
                               f"but expects {so[self._rank]}")
        self._pp_call("all_to_all_single", self._exchange, "all_to_all_single", sends, recvs)
        back()
        return _done([output])

    def alltoall(self, output_tensors, input_tensors, opts=None):
        self._alive("alltoall")
        P = self._size
        if len(output_tensors) != P or len(input_tensors) != P:
            raise RuntimeError(f"epx backend: all_to_all: rank {self._rank}: expected {P} input and output tensors")
        flats = [_flat(o) for o in output_tensors]
        recvs = [_u8(f) for f, _ in flats]
        sends = [_u8(_flat(i)[0]) for i in input_tensors]
        if recvs[self._rank].numel() != sends[self._rank].numel():
            raise RuntimeError(f"epx backend: all_to_all: rank {self._rank}: its own input and output differ in size")
        self._pp_call("all_to_all", self._exchange, "all_to_all", sends, recvs)
        for _, back in flats:
            back()
        return _done(list(output_tensors))

    def scatter(self, output_tensors, input_tensors, opts=None):
        self._alive("scatter")
        root = opts.rootRank if opts is not None else 0
        out = output_tensors[0]
        of, back = _flat(out)
        if self._rank == root:
            ins = input_tensors[0]
            for peer in range(self._size):
                if peer != root:
                    self._pp_call("scatter", self._send, self._pp, _u8(_flat(ins[peer])[0]), peer, _PP_BYTES,
                                  _code(ins[peer].dtype))
            of.copy_(ins[root].reshape(-1))
        else:
            self._pp_call("scatter", self._recv, self._pp, _u8(of), root, _PP_BYTES, _code(out.dtype), "scatter")
        back()
        return _done([out])

    def gather(self, output_tensors, input_tensors, opts=None):
        self._alive("gather")
        root = opts.rootRank if opts is not None else 0
        flat, _ = _flat(input_tensors[0])
        parts = self._gather_all(flat, "gather")
        if self._rank == root:
            for o, p in zip(output_tensors[0], parts):
                o.copy_(p.view(o.shape))
        return _done(list(output_tensors[0]) if self._rank == root else [])

    def reduce(self, tensors, opts=None):
        self._alive("reduce")
        root = opts.rootRank if opts is not None else 0
        op, opname = _op_of(opts if opts is not None else R.SUM)
        for t in tensors:
            tmp = t.clone()
            self._allreduce_one(tmp, op, opname)
            if self._rank == root:
                t.copy_(tmp)
        return _done(list(tensors))

    # -- barrier, send / recv -------------------------------------------------------------
    def barrier(self, opts=None):
        self._alive("barrier")
        stage = self._view(4, torch.float32)
        stage.zero_()
        self._bucket_call("barrier", self._bucket.all_reduce, [(stage.data_ptr(), 4, 4)], 1.0, 0)
        return _done([])

    def monitored_barrier(self, *args, **kwargs):
        _nyi("monitored_barrier")

    def send(self, tensors, dst, tag):
        self._alive("send")
        if tag != 0:
            _nyi("send with a tag other than 0")
        for t in tensors:
            self._pp_call("send", self._send, self._p2p, _u8(_flat(t)[0]), dst, _P2P_BYTES)
        return _done(list(tensors))

    def recv(self, tensors, src, tag):
        self._alive("recv")
        if tag != 0:
            _nyi("recv with a tag other than 0")
        for t in tensors:
            flat, back = _flat(t)
            self._pp_call("recv", self._recv, self._p2p, _u8(flat), src, _P2P_BYTES)
            back()
        return _done(list(tensors))

    def recv_anysource(self, tensors, tag):
        _nyi("recv from any source")

    # -- lifetime -------------------------------------------------------------------------
    def _release(self):
        """Drops this rank's buffers and transport (locally: it may run while peers are gone)."""
        self._storage = self._f32 = None
        self._bucket = self._pp = self._p2p = None
        self._transport = None


_live = []


def _create(store, rank, size, timeout):
    return ProcessGroupEpx(store, rank, size, timeout)


def _release_groups(pgs):
    for pg in pgs:
        if isinstance(pg, ProcessGroupEpx):
            pg._release()
            if pg in _live:
                _live.remove(pg)


_torch_destroy = dist.destroy_process_group


def _destroy_process_group(group=None):
    """torch's destroy_process_group, releasing the epx groups it drops (their shared memory)."""
    from torch.distributed import distributed_c10d as c10d
    if group is None or group is c10d.GroupMember.WORLD:
        doomed = list(c10d._pg_map.keys())
    else:
        doomed = [group]
    _torch_destroy(group)
    _release_groups(doomed)
    import gc
    gc.collect()


if "EPX" not in dist.Backend._plugins:
    dist.Backend.register_backend(BACKEND, _create)
    dist.destroy_process_group = _destroy_process_group
    import torch.distributed.distributed_c10d as _c10d
    _c10d.destroy_process_group = _destroy_process_group


# -- a quick comparison with gloo (not a test): python3 -m epx.distributed [ranks] -----------
class _NoopGroup(ProcessGroup):
    """A backend whose all_reduce does nothing: the cost of a Python ProcessGroup call alone."""

    def __init__(self, store, rank, size, timeout):
        super().__init__(rank, size)

    def allreduce(self, tensors, opts=None):
        return _done(list(tensors))


def _bench_rank(rank, size, path, q):
    import time
    dist.Backend.register_backend("epxnoop", _NoopGroup)
    dist.init_process_group(BACKEND, init_method="file://" + path, rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=120))
    gloo = dist.new_group(backend="gloo")
    noop = dist.new_group(backend="epxnoop")
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


if __name__ == "__main__":
    import sys
    import epx.distributed as _self  # the registered module, also in the spawned ranks
    _self._bench_main(int(sys.argv[1]) if len(sys.argv) > 1 else 8)
