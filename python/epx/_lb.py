"""The load-balancing calls' Python side (EPBuffer.lb_prefetch_weights / lb_reduce_grads):
argument checks, the tensors' memory, and DeepEP's LB allocation plan."""
import numpy as np

from . import _convert as cv
from .errors import Error


def materialize(plan_or_bytes):
    """(num_lb_bytes, lb_storage) of EPBuffer's lb_allocation_plan_or_num_bytes: a byte count
    is only recorded (epx's lb calls move bytes over the dispatch path and need no region); a
    BufferAllocator-like plan (``num_bytes``, ``materialize(storage)``) is materialised into
    a CPU uint8 storage of its size, as DeepEP does into its LB region."""
    if hasattr(plan_or_bytes, "materialize"):
        import torch
        storage = torch.zeros(int(plan_or_bytes.num_bytes), dtype=torch.uint8)
        plan_or_bytes.materialize(storage)
        return int(plan_or_bytes.num_bytes), storage
    if not isinstance(plan_or_bytes, int) or plan_or_bytes < 0:
        raise Error(f"EPBuffer: lb_allocation_plan_or_num_bytes must be a byte count >= 0 or a BufferAllocator, "
                    f"got {plan_or_bytes!r}", "invalid_argument")
    return plan_or_bytes, None


def transfer_args(reduce, slots, homes, mapping, group_size):
    """The binding's lb arguments (slots, homes, L, B, mapping, problem, code) of an
    lb_prefetch_weights / lb_reduce_grads call; a problem fails the call on every rank."""
    what = "lb_reduce_grads" if reduce else "lb_prefetch_weights"
    problem = ""
    slot_kinds, home_kinds, flat, L, B = [], [], [], 1, 0
    try:
        if not isinstance(slots, (list, tuple)):
            slots = [slots]
        if not isinstance(homes, (list, tuple)):
            homes = [homes]
        m = np.asarray(mapping.detach().cpu().numpy() if cv.is_torch(mapping) else mapping)
        if m.ndim != 2 or m.shape[0] != group_size or not np.issubdtype(m.dtype, np.integer):
            raise ValueError(f"mapping must be an integer [P = {group_size}, B] array, got "
                             f"{m.dtype} {list(m.shape)}")
        B = int(m.shape[1])
        flat = [int(v) for v in m.reshape(-1)]
        if len(slots) != len(homes) or not homes:
            raise ValueError(f"redundant and expert tensors must list the same weight kinds (>= 1), got "
                             f"{len(slots)} and {len(homes)}")
        L = int(_lb_rows(homes[0], "expert tensor 0"))
        for k, (sl, ho) in enumerate(zip(slots, homes)):
            hp, hb, hn = _lb_memory(ho, f"{what}: expert tensor {k}", reduce, writes=reduce)
            sp, sb, sn = _lb_memory(sl, f"{what}: redundant tensor {k}", reduce, writes=not reduce)
            if hn != L:
                raise ValueError(f"expert tensor {k} has {hn} experts, expert tensor 0 has {L}")
            if sn != B:
                raise ValueError(f"redundant tensor {k} has {sn} slots, mapping has B = {B}")
            per = hb // L
            if B and sb // B != per:
                raise ValueError(f"redundant tensor {k} has {sb // B} bytes per slot, its expert tensor "
                                 f"{per} bytes per expert")
            home_kinds.append((hp, per))
            slot_kinds.append((sp, per))
    except (ValueError, TypeError) as e:
        problem = f"{what}: {e}"
    code = "invalid_argument" if problem else ""
    return slot_kinds, home_kinds, L, B, flat, problem, code


def _lb_rows(t, name):
    shape = tuple(t.shape)
    if not shape:
        raise ValueError(f"{name} must have a leading expert dimension, got a scalar")
    return shape[0]


def _lb_memory(t, name, float32, writes):
    """(address, bytes, leading count) of a C-contiguous CPU tensor or array."""
    if cv.is_torch(t):
        import torch
        if t.device.type != "cpu":
            raise ValueError(f"{name} must be on the CPU, got {t.device}")
        if not t.is_contiguous():
            raise ValueError(f"{name} must be C-contiguous")
        if float32 and t.dtype != torch.float32:
            raise TypeError(f"{name} must be float32, got {t.dtype}")
        return t.data_ptr(), t.numel() * t.element_size(), _lb_rows(t, name)
    if isinstance(t, np.ndarray):
        if not t.flags.c_contiguous:
            raise ValueError(f"{name} must be C-contiguous")
        if writes and not t.flags.writeable:
            raise ValueError(f"{name} is written by this call but is read-only")
        if float32 and t.dtype != np.float32:
            raise TypeError(f"{name} must be float32, got {t.dtype}")
        return t.ctypes.data, t.nbytes, _lb_rows(t, name)
    raise TypeError(f"{name} must be a torch.Tensor or numpy.ndarray, got {type(t).__name__}")
