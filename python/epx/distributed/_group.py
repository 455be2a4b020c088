"""ProcessGroupEpx: the group's transport and buffers, its identity for c10d, barriers,
send / recv and its release."""
import contextlib
import datetime
import os
import sys
import time

import numpy as np
import torch
from torch._C._distributed_c10d import ProcessGroup

from ._gather import _Gathers
from ._p2p import _P2P
from ._pairwise import _Pairwise
from ._reduce import _Reductions
from ._worker import _Worker, _mode
from ._util import _ASYNC, _INFLIGHT, _P2P_BYTES, _PP_BYTES, _WAIT, _WINDOW, BACKEND, _done, _is, _single, _store_allgather, _with_rank
from .. import _epx

_live = []  # the groups of this process not yet released (closed at interpreter exit)


@contextlib.contextmanager
def _wait_mode():
    """The group's transport and buffers made with EPX_WAIT=_WAIT (docs/distributed.md,
    Settings) unless the user set EPX_WAIT: epx reads it once, when each of them is made.

    Why sleep by default: a rank of a torch program waits long in its collectives (a DDP
    bucket's all_reduce waits on its worker thread for the other ranks' backward passes),
    and epx's default wait yields the core between looks, which keeps the waiter runnable:
    with more ranks than cores those looks take CPU from the ranks it waits for. Sleep mode
    yields for 500 us and then sleeps on a futex that the peers' signals ring."""
    if not _WAIT or "EPX_WAIT" in os.environ:
        yield
        return
    os.environ["EPX_WAIT"] = _WAIT
    try:
        yield
    finally:
        os.environ.pop("EPX_WAIT", None)


class ProcessGroupEpx(_Reductions, _Gathers, _Pairwise, ProcessGroup):
    """A torch.distributed ProcessGroup over epx's buffers (made by init_process_group /
    new_group with backend "epx"; not meant to be built directly)."""

    def __init__(self, store, rank, size, timeout):
        super().__init__(rank, size)
        self._rank, self._size = rank, size
        secs = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)
        self._timeout = secs
        with _wait_mode():
            self._transport = _epx.Transport(rank, size, _store_allgather(store, rank, size, "epx-bootstrap"), "auto",
                                             secs)
            self._bucket = _epx.BucketBuffer(self._transport, [list(range(size))], _WINDOW, [], 0, "auto")
            self._pp = _epx.PPBuffer(self._transport, _PP_BYTES, _INFLIGHT, [], 0, [], 0)
            self._p2p = _epx.PPBuffer(self._transport, _P2P_BYTES, _INFLIGHT, [], 0, [], 0)
        self._storage = self._bucket.storage("torch")
        self._f32 = self._storage.numpy().view(np.float32)
        self._base = self._storage.data_ptr()
        self._want = {}
        self._q = _P2P(self, self._p2p)
        self._worker = _Worker(rank)
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

    # -- how a collective runs --------------------------------------------------------------
    def _issue(self, name, args, kwargs):
        """The collective `name` (the mixins' method, which returns the result's tensors): run
        here, or queued on the group's worker thread (_worker.py says which), and its Work."""
        run = getattr(super(), name)
        if self._worker.here():  # a collective inside another (reduce's all_reduce, ...)
            return _done(run(*args, **kwargs))
        try:
            mode = _mode(sys._getframe(2))  # 0 is _issue, 1 its wrapper, 2 the caller (C++ shows no frame)
        except ValueError:
            mode = None
        if mode is None or not _ASYNC:
            self._worker.drain()
            return _done(run(*args, **kwargs))
        if self._bucket is None:
            raise RuntimeError(f"epx backend: {name} on a process group that was destroyed")
        return self._worker.submit(name, lambda: run(*args, **kwargs), mode, self)

    # -- monitored barrier, send / recv -------------------------------------------------------------
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
        self._worker.close()
        self._storage = self._f32 = None
        self._bucket = self._pp = self._p2p = self._q = None
        self._transport = None


def _routed(name):
    def call(self, *args, **kwargs):
        return self._issue(name, args, kwargs)

    call.__name__ = call.__qualname__ = name
    return call


# every collective of c10d's ProcessGroup that the mixins implement
_COLLECTIVES = ("allreduce", "allreduce_coalesced", "allgather", "allgather_coalesced", "_allgather_base",
                "reduce_scatter", "_reduce_scatter_base", "broadcast", "alltoall_base", "alltoall", "scatter", "gather",
                "reduce", "barrier")
for _name in _COLLECTIVES:
    setattr(ProcessGroupEpx, _name, _routed(_name))
