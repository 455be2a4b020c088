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
as a contiguous copy and written back (a view: only the view is written). A collective
called with async_op=True, or by DDP's reducer during the backward pass, runs on the group's
worker thread in issue order and its Work completes there (its error raised by wait() and
set on its future); every other call runs to completion before it returns, after the
collectives issued before it, and an error raises at the call, on every rank for a
collective (see docs/distributed.md for the list of what is implemented and how each
reduction is ordered).
"""
import torch.distributed as dist

from ._group import ProcessGroupEpx, _live
from ._util import (_DTYPES, _FAST, _INFLIGHT, _OPS, _P2P_BYTES, _PP_BYTES, _WINDOW, BACKEND, R, _code, _done,  # noqa: F401
                    _flat, _op_of, _reduce_local, _store_allgather, _u8)

__all__ = ["BACKEND", "ProcessGroupEpx"]


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
    came back from epx during finalization would abort the process), the collectives' worker too."""
    for pg in list(_live):
        pg._worker.close()
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
