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
import threading
import time

import numpy as np
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup, ReduceOp, Work, _create_work_from_future

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
    if op == R.PREMUL_SUM:  # NCCL's; gloo 1.13 refuses it alike
        raise RuntimeError("epx backend: Cannot use ReduceOp.PREMUL_SUM with epx (as with Gloo: it is NCCL's)")
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


def _single(tensors, op):
    if len(tensors) != 1:
        raise RuntimeError(f"epx backend: {op}: requires a single-element tensor list, got {len(tensors)}")


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


# -- point-to-point: asynchronous, matched by (source, tag) as gloo does -------------------
# Every user message is a 32-byte header (bytes, dtype code, tag, kind) and then its bytes in
# chunks of at most EPX_DIST_P2P_BYTES, on the group's own point-to-point PPBuffer. A thread
# per destination sends the queued messages in issue order (so isend returns at once, whatever
# the receiver does); a thread per source, running while a receive that a message from that
# source could match is posted, takes each message as it comes: into the first posted receive
# of its tag (in posting order, any-source receives included), or else into a stash that the
# next matching receive takes. The threads wait inside epx with the GIL released.
_HEAD = 32
_DATA, _CLOSE = 0, 1


def _secs(timeout, default):
    if timeout is None:
        return default
    s = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)
    return default if s <= 0 else s


def _is(e, code):
    return getattr(e, "code", None) == code


class _P2PWork(Work):
    """The Work of a send or a receive: done when its thread has moved the bytes. wait(timeout)
    raises a RuntimeError after the timeout (the group's when none is given; the message stays
    queued, as gloo's does); exception() is the error or None; get_future() is completed with
    the tensors (or the error) from the group's thread."""

    def __init__(self, pg, what, tensors, peer):
        super().__init__()
        self._pg_timeout, self._rank = pg._timeout, pg._rank
        self._what, self._tensors, self._peer = what, tensors, peer
        self._event = threading.Event()
        self._error = None
        self._fut = torch.futures.Future()

    def _finish(self, error=None, src=None):
        if src is not None:
            self._peer = src
        self._error = error
        self._event.set()
        if error is None:
            self._fut.set_result(self._tensors)
        else:
            self._fut.set_exception(error)

    def wait(self, timeout=datetime.timedelta(0)):
        secs = _secs(timeout, self._pg_timeout)
        if not self._event.wait(secs):
            raise RuntimeError(f"epx backend: {self._what}: rank {self._rank}: Timed out waiting {secs:g} s for the "
                               f"{self._what} (rank {self._peer}) to complete")
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self):
        return self._event.is_set()

    def is_success(self):
        return self._error is None

    def exception(self):
        return self._error

    def get_future(self):
        return self._fut

    def result(self):
        return list(self._tensors)

    def synchronize(self):
        pass

    def source_rank(self):
        if not self._what.startswith("recv"):
            raise RuntimeError("epx backend: source_rank() is only defined for the Work of a receive")
        if not self._event.is_set():
            raise RuntimeError("epx backend: source_rank() before the receive completed (wait() first)")
        return self._peer

    _source_rank = source_rank


class _Recv:
    """A posted receive: its flat bytes, dtype code and tag, and where the bytes go back."""

    def __init__(self, work, src, tag, tensor):
        flat, self.back = _flat(tensor)
        self.u8, self.code, self.dtype = _u8(flat), _code(tensor.dtype), tensor.dtype
        self.work, self.src, self.tag = work, src, tag

    def takes(self, src, tag):
        return (self.src is None or self.src == src) and self.tag == tag


class _Stash:
    """A message that arrived before a receive matched it."""

    def __init__(self, src, tag, code, nbytes):
        self.src, self.tag, self.code = src, tag, code
        self.data = torch.empty(nbytes, dtype=torch.uint8)
        self.ready, self.taker, self.error = False, None, None


class _P2P:
    def __init__(self, pg, pp):
        self.pg, self.pp, self.me, self.P = pg, pp, pg._rank, pg._size
        self.cv = threading.Condition()
        self.posted = []      # _Recv in posting order
        self.stash = []       # _Stash in arrival order
        self.queues = {}      # dst -> [(work, u8, code, tag)]
        self.busy = set()     # dsts whose thread is moving a message
        self.senders, self.receivers = {}, {}
        self.broken = {}      # peer -> the error that broke the pair
        self.closing = False

    # -- threads ---------------------------------------------------------------------------
    def _thread(self, table, peer, fn):
        t = table.get(peer)
        if t is None or not t.is_alive():
            t = threading.Thread(target=fn, args=(peer,), daemon=True, name=f"epx-p2p-{fn.__name__}-{peer}")
            table[peer] = t
            t.start()

    def _native(self, fn, ptr, n, peer):
        """One PPBuffer call, again after epx's timeout (a wait longer than the group's timeout is
        the waiting Work's to report); None once the group is closing."""
        while True:
            try:
                fn(ptr, n, peer)
                return True
            except RuntimeError as e:
                if not _is(e, "timeout"):
                    raise
                if self.closing:
                    return None

    def _error(self, what, peer, e):
        if str(e).startswith("epx"):
            return e
        return RuntimeError(f"epx backend: {what}: {_with_rank(str(e), self.me)}")

    def _break(self, peer, err):
        """The pair with `peer` failed: every queued or posted message of it fails with `err`."""
        with self.cv:
            self.broken.setdefault(peer, err)
            doomed = [r for r in self.posted if r.src == peer]
            self.posted = [r for r in self.posted if r.src != peer]
            sends = self.queues.pop(peer, [])
        for r in doomed:
            r.work._finish(err)
        for w, *_ in sends:
            if not w.is_completed():
                w._finish(err)

    def _free_slot(self, dst):
        """Waits in Python (not inside epx) until the pair has a free slot, so that the send
        after it does not wait: a sender thread never waits inside epx, where an exit of the
        process could find it (a thread that comes back from epx while the interpreter
        finalizes aborts the process). None once the group is closing."""
        delay = 0.0
        while self.pp.in_flight(dst) >= _INFLIGHT:
            if self.closing:
                return None
            time.sleep(delay)
            delay = min(max(2 * delay, 2e-5), 1e-3)
        return True

    def _send_loop(self, dst):
        pp, head = self.pp, torch.empty(4, dtype=torch.int64)
        cap = _P2P_BYTES
        while True:
            with self.cv:
                while (not self.queues.get(dst) or dst in self.busy) and not self.closing:
                    self.cv.wait()
                q = self.queues.get(dst)
                if not q:
                    return
                work, u8, code, tag, kind = q[0]
                self.busy.add(dst)
            try:
                head[0], head[1], head[2], head[3] = u8.numel(), code, tag, kind
                ok = self._free_slot(dst) and self._native(pp.send, head.data_ptr(), _HEAD, dst)
                for s in range(0, u8.numel(), cap):
                    if not ok:
                        break
                    piece = u8[s:s + cap]
                    ok = self._free_slot(dst) and self._native(pp.send, piece.data_ptr(), piece.numel(), dst)
            except RuntimeError as e:
                with self.cv:
                    self.busy.discard(dst)
                self._break(dst, self._error(f"send to rank {dst}", dst, e))
                return
            with self.cv:
                self.busy.discard(dst)
                if q and q[0][0] is work:
                    q.pop(0)
                self.cv.notify_all()
            if ok is None:
                work._finish(RuntimeError(f"epx backend: send: rank {self.me}: the group was destroyed while the "
                                          f"message to rank {dst} was in flight"))
                return
            work._finish()

    def _wanted(self, src):
        return any(r.src is None or r.src == src for r in self.posted)

    def _recv_loop(self, src):
        pp, head = self.pp, torch.empty(4, dtype=torch.int64)
        cap = _P2P_BYTES
        while True:
            with self.cv:
                while not self.closing and not self._wanted(src):
                    self.cv.wait()
                if self.closing:
                    return
            try:
                if self._native(pp.recv, head.data_ptr(), _HEAD, src) is None:
                    return
                nbytes, code, tag, kind = (int(v) for v in head)
                if kind == _CLOSE:
                    self._break(src, RuntimeError(f"epx backend: rank {self.me}: rank {src} destroyed the group "
                                                  f"(or exited): no message from it will come, none to it be taken"))
                    return
                with self.cv:
                    mine = next((r for r in self.posted if r.takes(src, tag)), None)
                    if mine is not None:
                        self.posted.remove(mine)
                        stash = None
                    else:
                        stash = _Stash(src, tag, code, nbytes)
                        self.stash.append(stash)
                if stash is not None:
                    dst = stash.data
                elif nbytes == mine.u8.numel():
                    dst = mine.u8
                else:
                    dst = None  # drained
                for s in range(0, nbytes, cap):
                    m = min(cap, nbytes - s)
                    if dst is None:
                        v = pp.recv_view(src, -1)
                        pp.release(v)
                    elif self._native(pp.recv, dst[s:s + m].data_ptr(), m, src) is None:
                        return
            except RuntimeError as e:
                self._break(src, self._error(f"recv from rank {src}", src, e))
                return
            if stash is None:
                self._deliver(mine, src, nbytes, code, None)
            else:
                with self.cv:
                    stash.ready = True
                    taker = stash.taker
                if taker is not None:
                    self._deliver(taker, src, nbytes, code, stash.data)

    def _deliver(self, r, src, nbytes, code, data):
        """Completes the receive r with a message of src (data: a stashed copy, else already in r)."""
        if nbytes != r.u8.numel() or (code and r.code and code != r.code):
            got = f"{nbytes} bytes" + (f" of {_DTYPES[code - 1]}" if 0 < code <= len(_DTYPES) else "")
            r.work._finish(RuntimeError(
                f"epx backend: recv: rank {src} sends {got} (tag {r.tag}), rank {self.me} expects "
                f"{r.u8.numel()} bytes of {r.dtype}"))
            return
        try:
            if data is not None and nbytes:
                r.u8.copy_(data)
            r.back()
        except RuntimeError as e:
            r.work._finish(e)
            return
        r.work._finish(None, src)

    # -- what the ProcessGroup calls --------------------------------------------------------
    def send(self, tensor, dst, tag, kind=_DATA, what="send"):
        u8 = _u8(_flat(tensor)[0])  # the tensor itself when contiguous: torch's rule is not to touch it before wait()
        work = _P2PWork(self.pg, what, [tensor], dst)
        if dst == self.me:  # to itself: matched here, a copy (no thread waits on this rank)
            data = u8.clone()
            with self.cv:
                mine = next((r for r in self.posted if r.takes(dst, int(tag))), None)
                if mine is not None:
                    self.posted.remove(mine)
                else:
                    st = _Stash(dst, int(tag), _code(tensor.dtype), 0)
                    st.data, st.ready = data, True
                    self.stash.append(st)
            if mine is not None:
                self._deliver(mine, dst, data.numel(), _code(tensor.dtype), data)
            work._finish()
            return work
        with self.cv:
            if self.closing:
                raise RuntimeError(f"epx backend: {what}: rank {self.me}: the group was destroyed")
            if dst in self.broken:
                raise self.broken[dst]
            inline = (not self.queues.get(dst) and dst not in self.busy and u8.numel() <= _P2P_BYTES
                      and self.pp.in_flight(dst) + 1 + (u8.numel() > 0) <= _INFLIGHT)
            if inline:  # the pair's slots are free: sent from here at once, no thread hand-off
                self.busy.add(dst)
        if inline:
            try:
                head = torch.tensor([u8.numel(), _code(tensor.dtype), int(tag), kind], dtype=torch.int64)
                self.pp.send(head.data_ptr(), _HEAD, dst)  # neither waits: a slot is free for each
                if u8.numel():
                    self.pp.send(u8.data_ptr(), u8.numel(), dst)
            except RuntimeError as e:
                with self.cv:
                    self.busy.discard(dst)
                    self.cv.notify_all()
                self._break(dst, self._error(f"send to rank {dst}", dst, e))
                raise self.broken[dst]
            with self.cv:
                self.busy.discard(dst)
                self.cv.notify_all()
            work._finish()
            return work
        with self.cv:
            self.queues.setdefault(dst, []).append((work, u8, _code(tensor.dtype), int(tag), kind))
            self._thread(self.senders, dst, self._send_loop)
            self.cv.notify_all()
        return work

    def recv(self, tensor, src, tag, what="recv"):
        work = _P2PWork(self.pg, what, [tensor], src)
        r = _Recv(work, src, int(tag), tensor)
        with self.cv:
            if self.closing:
                raise RuntimeError(f"epx backend: {what}: rank {self.me}: the group was destroyed")
            if src is not None and src in self.broken:
                raise self.broken[src]
            hit = next((s for s in self.stash if r.takes(s.src, s.tag) and s.taker is None), None)
            if hit is not None:
                self.stash.remove(hit)
                if not hit.ready:
                    hit.taker = r
            else:
                self.posted.append(r)
                for p in ([src] if src is not None else range(self.P)):
                    if p not in self.broken and p != self.me:
                        self._thread(self.receivers, p, self._recv_loop)
                self.cv.notify_all()
        if hit is not None and hit.ready:
            self._deliver(r, hit.src, hit.data.numel(), hit.code, hit.data)
        return work

    def cancel(self, work):
        """Withdraws a posted receive that no message matched yet (True if it was withdrawn)."""
        with self.cv:
            for r in self.posted:
                if r.work is work:
                    self.posted.remove(r)
                    return True
        return False

    def close(self):
        """Local: the threads stop. Each peer whose pair is idle gets a close message, which ends
        a receive thread of that peer still waiting for this rank (an any-source receive's)."""
        with self.cv:
            self.closing = True
            self.cv.notify_all()
            idle = [d for d in range(self.P) if d != self.me and not self.queues.get(d) and d not in self.busy
                    and d not in self.broken]
        head = torch.tensor([0, 0, 0, _CLOSE], dtype=torch.int64)
        for d in idle:
            try:
                if self.pp.in_flight(d) < _INFLIGHT:
                    self.pp.send(head.data_ptr(), _HEAD, d)
            except RuntimeError:
                pass
        deadline = time.monotonic() + 2.0  # a receive thread still waiting ends with its peer's close
        for table in (self.senders, self.receivers):
            for t in list(table.values()):
                t.join(timeout=max(0.0, deadline - time.monotonic()))
        with self.cv:
            pending = [r for r in self.posted]
            self.posted = []
        for r in pending:
            r.work._finish(RuntimeError(f"epx backend: recv: rank {self.me}: the group was destroyed before a "
                                        f"message matched"))


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
        self._q = _P2P(self, self._p2p)
        self._mb_round = 0
        self._seq = 0
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
        self._seq += 1

    # torch (init_process_group, for gloo and NCCL by name) numbers each group's calls; every
    # rank counts its own calls from 0 here, which agrees across ranks as the calls do
    def _set_sequence_number_for_group(self):
        self._seq = 0

    def _get_sequence_number_for_group(self):
        return self._seq

    def _view(self, nbytes, dtype, offset=0):
        return self._storage.narrow(0, offset, nbytes).view(dtype)

    def _bucket_call(self, op, fn, *args):
        try:
            ev = fn(*args)
            ev.wait()
            return ev
        except RuntimeError as e:
            # "Timed out" as gloo words it: code that matches gloo's message matches this one
            what = "Timed out waiting for the other ranks: " if _is(e, "timeout") else ""
            raise RuntimeError(f"epx backend: {op}: {what}{_with_rank(str(e), self._rank)}") from e

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
        if t.is_sparse:
            self._allreduce_sparse(t, op, opname)
            return
        if t.is_complex() and op in (R.SUM, R.AVG):
            self._allreduce_one(torch.view_as_real(t), op, opname)
            return
        if t.dtype in _FAST and op in (R.SUM, R.AVG):
            self._sum_fast(t, op, opname)
            return
        flat, back = _flat(t)
        parts = self._gather_all(flat, f"allreduce({opname})", int(op) + 1)
        flat.copy_(_reduce_local(parts, op, t.dtype))
        back()

    def _allreduce_sparse(self, t, op, opname):
        """A sparse COO tensor (gloo's SUM): every rank's indices and values, gathered padded to
        the largest count, summed by coalescing; the result replaces t's contents."""
        if op != R.SUM:
            raise RuntimeError(f"epx backend: allreduce: rank {self._rank}: a sparse tensor takes SUM only, "
                               f"not {opname}")
        c = t.coalesce()
        idx, val = c.indices(), c.values()
        counts = self._gather_all(torch.tensor([idx.shape[1]], dtype=torch.int64), "allreduce(sparse counts)")
        most = max(int(n) for n in counts)
        pad_i = torch.zeros(idx.shape[0], most, dtype=torch.int64)
        pad_i[:, :idx.shape[1]] = idx
        pad_v = torch.zeros((most,) + tuple(val.shape[1:]), dtype=val.dtype)
        pad_v[:val.shape[0]] = val
        all_i = self._gather_all(pad_i.reshape(-1), "allreduce(sparse indices)")
        all_v = self._gather_all(pad_v.reshape(-1), "allreduce(sparse values)")
        ii = torch.cat([a.view(idx.shape[0], most)[:, :int(n)] for a, n in zip(all_i, counts)], 1)
        vv = torch.cat([a.view((most,) + tuple(val.shape[1:]))[:int(n)] for a, n in zip(all_v, counts)], 0)
        t.copy_(torch.sparse_coo_tensor(ii, vv, t.shape).coalesce())

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
    def _gather_all(self, flat, op, kind=0):
        """Every rank's `flat` (contiguous, same dtype and size on every rank), by rank:
        the BucketBuffer's all_gather, chunked; the first chunk carries a 16-byte header
        (dtype code, numel) whose copies name the first rank that differs."""
        out = [torch.empty_like(flat) for _ in range(self._size)]
        self._gather_into(flat, [o for o in out], op, kind)
        return out

    def _gather_into(self, flat, outs, op, kind=0):
        """all_gather of flat (contiguous 1-D) into outs[r] (contiguous 1-D, flat's size)."""
        P, me = self._size, self._rank
        src = _u8(flat)
        dst = [_u8(o) for o in outs]
        nbytes, hdr = src.numel(), 16
        cap = (_WINDOW // P - hdr) // 64 * 64
        # (dtype code + 256 x the reduction's op + 1, numel): the ranks agree on all three
        header = torch.tensor([_code(flat.dtype) + 256 * kind, flat.numel()], dtype=torch.int64).view(torch.uint8)
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
                        c_r, k_r = int(heads[r, 0]) % 256, int(heads[r, 0]) // 256
                        if c_r == _code(flat.dtype) and heads[r, 1] == flat.numel():
                            name = {int(o) + 1: n for o, n in _OPS.items()}
                            raise RuntimeError(f"epx backend: {op}: rank {r} reduces with {name.get(k_r, k_r)}, "
                                               f"rank {me} with {name.get(kind, kind)}")
                        d_r = _DTYPES[c_r - 1] if 0 < c_r <= len(_DTYPES) else "?"
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
        """output_tensor_lists[r][i] = rank r's input_tensors[i]: one all_gather of the inputs
        laid end to end (torch checks that they share one dtype)."""
        self._alive("allgather_coalesced")
        me, P = self._rank, self._size
        if len(output_tensor_lists) != P:
            raise RuntimeError(f"epx backend: allgather_coalesced: rank {me}: {len(output_tensor_lists)} output lists, "
                               f"expected {P}")
        for outs in output_tensor_lists:
            if len(outs) != len(input_tensors) or any(o.numel() != i.numel() or o.dtype != i.dtype
                                                      for o, i in zip(outs, input_tensors)):
                raise RuntimeError(f"epx backend: allgather_coalesced: rank {me}: each output list must match the "
                                   f"inputs {[(i.dtype, tuple(i.shape)) for i in input_tensors]}")
        if len({i.dtype for i in input_tensors}) > 1:
            raise RuntimeError(f"epx backend: allgather_coalesced: rank {me}: the inputs differ in dtype")
        flat = torch.cat([i.reshape(-1) for i in input_tensors]) if input_tensors else torch.empty(0)
        parts = self._gather_all(flat, "allgather_coalesced")
        for r, outs in enumerate(output_tensor_lists):
            off = 0
            for o in outs:
                o.copy_(parts[r][off:off + o.numel()].view(o.shape))
                off += o.numel()
        return _done([o for outs in output_tensor_lists for o in outs])

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
            parts = self._gather_all(whole, f"reduce_scatter({opname})", int(op) + 1)
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
        e = RuntimeError(f"epx backend: {op}: rank {peer} sends {words(got)}, rank {self._rank} expects "
                         f"{words(want)}")
        e.epx_mismatch = True  # the pair stayed in step: the call settles (_settle) instead of failing here
        return e

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
            what = "Timed out waiting for the other ranks: " if _is(e, "timeout") else ""
            raise RuntimeError(f"epx backend: {op}: {what}{_with_rank(str(e), self._rank)}") from e

    def broadcast(self, tensors, opts=None):
        self._alive("broadcast")
        root = opts.rootRank if opts is not None else 0
        for t in tensors:
            flat, back = _flat(t)
            u8 = _u8(flat)
            problem = None
            if self._rank == root:
                for peer in range(self._size):
                    if peer != root:
                        self._pp_call("broadcast", self._send, self._pp, u8, peer, _PP_BYTES, _code(t.dtype))
            else:
                try:
                    self._pp_call("broadcast", self._recv, self._pp, u8, root, _PP_BYTES, _code(t.dtype), "broadcast")
                except RuntimeError as e:
                    if not getattr(e, "epx_mismatch", False):
                        raise
                    problem = e
            self._settle("broadcast", problem)
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
        return problem

    def _settle(self, op, problem, local=False):
        """After a pairwise call (its messages all moved or drained): every rank learns every
        rank's problem (a 256-byte text each, one BucketBuffer all_gather), so a mismatch is an
        error on every rank, naming the rank that saw it. A rank's own wrong arguments (`local`)
        come first: the size mismatches they cause on its peers follow from them."""
        P, me, k = self._size, self._rank, 256
        mine = self._view(k, torch.uint8, me * k)
        mine.zero_()
        if problem is not None:
            text = (("!" if local else "?") + str(problem)).encode()[:k]
            mine[:len(text)].copy_(torch.frombuffer(bytearray(text), dtype=torch.uint8))
        self._bucket_call(op, self._bucket.all_gather, [(mine.data_ptr(), k, 1)], [], 0)
        texts = [bytes(self._view(k, torch.uint8, r * k).numpy()).rstrip(b"\0").decode(errors="replace")
                 for r in range(P)]
        if problem is not None and local:
            raise problem
        for mark in "!?":
            if problem is not None and mark == "?":
                raise problem
            for r, text in enumerate(texts):
                if text.startswith(mark):
                    raise RuntimeError(f"epx backend: {op}: rank {me}: the call failed on rank {r}: {text[1:]}")

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

        problem = None

        def splits(given, rows, what):
            nonlocal problem
            if not given:
                if rows % P and problem is None:
                    problem = RuntimeError(f"epx backend: all_to_all_single: rank {self._rank}: {what} has {rows} "
                                           f"rows, not divisible by {P} ranks")
                return [rows // P] * P
            if (len(given) != P or sum(given) != rows) and problem is None:
                problem = RuntimeError(f"epx backend: all_to_all_single: rank {self._rank}: {what} split sizes "
                                       f"{list(given)} do not cover its {rows} rows in {P} parts")
            return list(given)

        so, si = splits(output_split_sizes, rows_o, "output"), splits(input_split_sizes, rows_i, "input")
        if problem is None and so[self._rank] * row_o != si[self._rank] * row_i:
            problem = RuntimeError(f"epx backend: all_to_all_single: rank {self._rank}: sends itself "
                                   f"{si[self._rank]} rows but expects {so[self._rank]}")
        if problem is None:
            uo, ui = _u8(of), _u8(inf)
            bo, bi = row_o * of.element_size(), row_i * inf.element_size()
            offs_o = [sum(so[:p]) * bo for p in range(P)]
            offs_i = [sum(si[:p]) * bi for p in range(P)]
            recvs = [uo[offs_o[p]:offs_o[p] + so[p] * bo] for p in range(P)]
            sends = [ui[offs_i[p]:offs_i[p] + si[p] * bi] for p in range(P)]
        else:  # this rank's arguments are wrong: it still takes part, moving nothing
            sends = recvs = [torch.empty(0, dtype=torch.uint8)] * P
        seen = self._pp_call("all_to_all_single", self._exchange, "all_to_all_single", sends, recvs)
        self._settle("all_to_all_single", problem or seen, local=problem is not None)
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
        problem = None
        if recvs[self._rank].numel() != sends[self._rank].numel():
            problem = RuntimeError(f"epx backend: all_to_all: rank {self._rank}: its own input and output differ "
                                   f"in size")
            sends = recvs = [torch.empty(0, dtype=torch.uint8)] * P
        seen = self._pp_call("all_to_all", self._exchange, "all_to_all", sends, recvs)
        self._settle("all_to_all", problem or seen, local=problem is not None)
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
            problem = None
        else:
            try:
                self._pp_call("scatter", self._recv, self._pp, _u8(of), root, _PP_BYTES, _code(out.dtype), "scatter")
                problem = None
            except RuntimeError as e:
                if not getattr(e, "epx_mismatch", False):
                    raise
                problem = e
        self._settle("scatter", problem)
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

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        """gloo's monitored barrier: every rank reports to rank 0, which waits for each (in rank
        order) within `timeout` and then releases them; rank 0 raises naming the first rank that
        did not arrive (every such rank with wait_all_ranks), the others that they arrived but
        were not released."""
        self._alive("monitored_barrier")
        secs = self._timeout if timeout is None else (
            timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout))
        ms = int(secs * 1000)
        self._mb_round += 1
        arrive, release = -(1 << 40) - 2 * self._mb_round, -(1 << 40) - 2 * self._mb_round - 1
        me, q = self._rank, self._q
        if me != 0:
            sw = q.send(torch.zeros(1), 0, arrive, what="monitored_barrier")
            rw = q.recv(torch.zeros(1), 0, release, what="recv monitored_barrier")
            t0 = time.monotonic()
            ok = sw._event.wait(secs) and rw._event.wait(max(0.0, secs - (time.monotonic() - t0)))
            if not ok or sw._error is not None or rw._error is not None:
                q.cancel(rw)
                why = rw._error or sw._error or f"no reply from rank 0 within {ms} ms"
                raise RuntimeError(f"epx backend: monitored_barrier: Rank {me} successfully reached monitoredBarrier, "
                                   f"but received errors while waiting for send/recv from rank 0. Please check rank 0 "
                                   f"logs for faulty rank. ({why})")
            return _done([])
        start = time.monotonic()
        works = {r: q.recv(torch.zeros(1), r, arrive, what="recv monitored_barrier") for r in range(1, self._size)}
        failed = []
        try:
            for r, w in works.items():
                left = secs if wait_all_ranks else secs - (time.monotonic() - start)
                if not wait_all_ranks and left <= 0 and not w.is_completed():
                    raise RuntimeError(f"epx backend: monitored_barrier: Rank 0 timed out in monitoredBarrier after "
                                       f"{ms} ms (ranks {[p for p in works if not works[p].is_completed()]} had not "
                                       f"arrived)")
                if not w._event.wait(max(left, 0.0)) or w._error is not None:
                    if not wait_all_ranks:
                        raise RuntimeError(f"epx backend: monitored_barrier: [Rank 0]: Rank {r} failed to pass "
                                           f"monitoredBarrier in {ms} ms")
                    failed.append(r)
            if failed:
                raise RuntimeError(f"epx backend: monitored_barrier: [Rank 0]: Ranks {', '.join(map(str, failed))} "
                                   f"failed to pass monitoredBarrier in {ms} ms")
        except RuntimeError:
            for w in works.values():
                q.cancel(w)
            raise
        for w in [q.send(torch.zeros(1), r, release, what="monitored_barrier") for r in range(1, self._size)]:
            w.wait()
        return _done([])

    def send(self, tensors, dst, tag):
        self._alive("send")
        _single(tensors, "send")
        return self._q.send(tensors[0], dst, tag)

    def recv(self, tensors, src, tag):
        self._alive("recv")
        _single(tensors, "recv")
        return self._q.recv(tensors[0], src, tag)

    def recv_anysource(self, tensors, tag):
        self._alive("recv_anysource")
        _single(tensors, "recv_anysource")
        return self._q.recv(tensors[0], None, tag, what="recv from any source")

    # -- lifetime -------------------------------------------------------------------------
    def _release(self):
        """Drops this rank's buffers and transport (locally: it may run while peers are gone)."""
        if self._q is not None:
            self._q.close()
        self._storage = self._f32 = None
        self._bucket = self._pp = self._p2p = self._q = None
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


_torch_monitored_barrier = dist.monitored_barrier


def _monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
    """torch's monitored_barrier, which refuses every backend but gloo by name: an epx group's
    own monitored_barrier (gloo's semantics) for an epx group."""
    from torch.distributed import distributed_c10d as c10d
    pg = c10d._get_default_group() if group is None or group is c10d.GroupMember.WORLD else group
    if isinstance(pg, ProcessGroupEpx):
        return pg.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)
    return _torch_monitored_barrier(group=c10d.GroupMember.WORLD if group is None else group, timeout=timeout,
                                    wait_all_ranks=wait_all_ranks)


def _close_at_exit():
    """At interpreter exit, the point-to-point threads end while Python still runs (one that
    came back from epx during finalization would abort the process)."""
    for pg in list(_live):
        if pg._q is not None:
            pg._q.close()


if "EPX" not in dist.Backend._plugins:
    dist.Backend.register_backend(BACKEND, _create)
    dist.destroy_process_group = _destroy_process_group
    dist.monitored_barrier = _monitored_barrier
    import torch.distributed.distributed_c10d as _c10d
    _c10d.destroy_process_group = _destroy_process_group
    _c10d.monitored_barrier = _monitored_barrier
    import atexit
    atexit.register(_close_at_exit)


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
