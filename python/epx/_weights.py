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


# DeepEP V1's combine(topk_weights=): at the source, the float32 sum over the ranks that
# received a token of the whole row each passes (epx/legacy.py). Each rank's three bf16
# parts go in columns no other rank writes — unit (r, p), K columns, for rank r's part p —
# so every column of a combine has one contributor and arrives exact; the parts are summed
# per rank, then the ranks in ascending order, in float32. A combine holds H // K units.

def rank_rounds(num_ranks, K, H, parts=3):
    """The units (rank, part) of each combine, in order."""
    per = max(1, H // K)
    units = [(r, p) for r in range(num_ranks) for p in range(parts)]
    return [units[i:i + per] for i in range(0, len(units), per)]


def pack_rank_round(weights, real_rows, rank, K, H, units, parts=3):
    """This rank's uint16 bf16 bits [N, H] for one combine of `units`: its parts of the float32
    weights [N, K] (every slot; rows not real zeroed) in its own units' columns, 0 elsewhere."""
    w = np.where(np.asarray(real_rows)[:, None], np.asarray(weights, dtype=np.float32), np.float32(0))
    split = _split(w, parts)
    packed = np.zeros((w.shape[0], H), dtype=np.uint16)
    for u, (r, p) in enumerate(units):
        if r == rank:
            packed[:, u * K:(u + 1) * K] = split[p]
    return packed


def unpack_rank_rounds(combined_bits, rounds, num_ranks, K, parts=3):
    """The combines' uint16 bf16 bits [S, H] (one per round) -> float32 [S, K]: per rank its
    parts summed in order, then the ranks summed in ascending order."""
    S = combined_bits[0].shape[0] if combined_bits else 0
    part = {}
    for bits, units in zip(combined_bits, rounds):
        f = (np.asarray(bits).astype(np.uint32) << 16).view(np.float32)
        for u, unit in enumerate(units):
            part[unit] = f[:, u * K:(u + 1) * K]
    total = np.zeros((S, K), dtype=np.float32)
    for r in range(num_ranks):
        w = np.zeros((S, K), dtype=np.float32)
        for p in range(parts):
            w = (w + part[(r, p)]).astype(np.float32)
        total = (total + w).astype(np.float32)
    return total
