"""The backend's shared pieces: its settings, dtype and op codes, tensor views and the local reduction."""
import datetime
import os

import torch
from torch._C._distributed_c10d import ReduceOp, _create_work_from_future

BACKEND = "epx"
_WINDOW = int(os.environ.get("EPX_DIST_WINDOW_BYTES", 32 << 20))
_PP_BYTES = int(os.environ.get("EPX_DIST_PP_BYTES", 4 << 20))
_P2P_BYTES = int(os.environ.get("EPX_DIST_P2P_BYTES", 1 << 20))
_INFLIGHT = 2  # pairwise exchanges interleave one send and one receive: two slots never deadlock
_ASYNC = os.environ.get("EPX_DIST_ASYNC", "1") != "0"  # 0: every collective completes before it returns
# How the group's waits pass the time (EPX_WAIT for its transport and buffers; "" keeps epx's
# own default): _group.py's _wait_mode says why sleep
_WAIT = os.environ.get("EPX_DIST_WAIT", "sleep")

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



def _secs(timeout, default):
    if timeout is None:
        return default
    s = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)
    return default if s <= 0 else s


def _is(e, code):
    return getattr(e, "code", None) == code

