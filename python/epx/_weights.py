"""Routing weights on their way back (combine's topk_weights; epx.autograd's weight
gradients) and DeepEP's cumulative_local_expert_recv_stats, in numpy.

Back to the source: each received row's float32 weight is split into bf16 parts (round to
nearest even, then the exact remainder; three parts hold all 24 significand bits) written
in columns of their own of an [N, H] bf16 tensor — compact: parts p at columns p*K + k of
the row, expanded: of the row's slot k — and combined with the dispatch's handle. Exactly
one rank contributes to each (token, slot) column (compact: the rank holding the slot's
expert; the others' are zeroed here), so each part arrives unrounded, and their float32
sum is the weight.
"""
import numpy as np

from . import _convert as cv


def _split(w, parts):
    """float32 w -> `parts` uint16 bf16 bit arrays whose float32 sum is w (exact for 3)."""
    out, rest = [], w.astype(np.float32)
    for _ in range(parts):
        bits = rest.view(np.uint32).astype(np.uint64)
        hi = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
        out.append((hi >> 16).astype(np.uint16))
        rest = (rest - hi.view(np.float32)).astype(np.float32)
    return out


def pack(weights, recv_src, recv_idx, expanded, K, H, max_parts=3):
    """(packed uint16 [N, H], parts) for weights float32 [N, K] (compact) or [N] (expanded).
    Raises ValueError naming what was expected."""
    w = cv.to_numpy(weights).astype(np.float32, copy=False)
    src = cv.to_numpy(recv_src)
    N = src.shape[0]
    parts = min(max_parts, H // K)
    if parts < 1:
        raise ValueError(f"topk_weights on the way back need hidden >= num_topk (hidden {H}, num_topk {K})")
    want = (N,) if expanded else (N, K)
    if tuple(w.shape) != want:
        raise ValueError(f"topk_weights must be float32 {list(want)} (the dispatch's rows), got {list(w.shape)}")
    packed = np.zeros((N, H), dtype=np.uint16)
    if expanded:
        rows = np.nonzero(src[:, 0] >= 0)[0]
        k = src[rows, 2]
        for p, part in enumerate(_split(w[rows], parts)):
            packed[rows, p * K + k] = part
    else:
        w = np.where(cv.to_numpy(recv_idx) >= 0, w, np.float32(0))
        for p, part in enumerate(_split(w, parts)):
            packed[:, p * K:(p + 1) * K] = part
    return packed, parts


def unpack(combined_bits, K, parts):
    """The combined uint16 bf16 bits [S, H] -> float32 [S, K], the parts summed in order."""
    f = (combined_bits.astype(np.uint32) << 16).view(np.float32)
    total = np.zeros((f.shape[0], K), dtype=np.float32)
    for p in range(parts):
        total = (total + f[:, p * K:(p + 1) * K]).astype(np.float32)
    return total


def check_stats(stats, num_local_experts):
    """(problem, code) if cumulative_local_expert_recv_stats is not an integer [L] tensor
    or array, else None."""
    if stats is None:
        return None
    shape = tuple(getattr(stats, "shape", ()))
    if shape != (num_local_experts,):
        return (f"cumulative_local_expert_recv_stats must be [{num_local_experts}] (the local experts), got "
                f"{list(shape)}", "shape_mismatch")
    kind = str(getattr(stats, "dtype", ""))
    if "int" not in kind or "uint" in kind:
        return f"cumulative_local_expert_recv_stats must be int32 or int64, got {kind}", "dtype_mismatch"
    return None


def add_stats(stats, counts):
    """stats += counts (this dispatch's received tokens per local expert), in place."""
    if stats is None:
        return
    if cv.is_torch(stats):
        import torch
        stats += torch.tensor(counts, dtype=stats.dtype)
    else:
        stats += np.asarray(counts, dtype=stats.dtype)
