#!/usr/bin/python3
"""Independent numpy reference for `epx replay` (docs/spec.md §7).

Written from docs/spec.md alone, apart from the C++ engine.  Given an input
directory in the docs/spec.md §7 layout and the replay options, it computes
every output file of every rank:

    num_tokens_per_rank, num_tokens_per_expert, is_token_in_rank,
    recv_x | recv_x_fp8 + recv_x_scales, recv_src, num_recv_tokens_per_expert,
    recv_topk_idx + recv_topk_weights (compact) | recv_weights + expert_offsets
    (expanded), combined_x

Float32 arithmetic is done in float32, one addition at a time, in the order
docs/spec.md §4 fixes; the work is vectorised across the H columns only.

Usage as a library:

    case = load_case(in_dir)
    res = compute(case, layout="expanded", alignment=4, worst=0,
                  deterministic=True, zero_padding=False, weighted=False)
    res.ranks[r]["combined_x"]          # expected arrays, exact dtypes
    res.unspecified_rows[r]             # bool [N]: rows whose recv_x content
                                        #   docs/spec.md leaves unspecified
    res.segments[r]                     # expanded: [(o_j, n_j)] per expert

Usage from the shell (writes the expected outputs in the epx layout):

    /usr/bin/python3 epx_ref.py --in IN --out OUT [--layout compact|expanded]
        [--alignment A] [--worst W] [--deterministic] [--zero-padding]
        [--weighted]
"""

import argparse
import json
import os
import sys

import numpy as np

# ----------------------------------------------------------------------------
# Number formats
# ----------------------------------------------------------------------------

F32 = np.dtype("<f4")
U16 = np.dtype("<u2")
U8 = np.dtype("|u1")
I64 = np.dtype("<i8")

FP8_BLOCK = 128


def bf16_to_f32(bits):
    """Exact widening of bf16 raw bits (uint16) to float32."""
    bits = np.asarray(bits, dtype=U16)
    return (bits.astype(np.uint32) << np.uint32(16)).view(F32)


def f32_to_bf16(values):
    """Round float32 to bf16 raw bits: nearest, ties to even; NaN stays NaN."""
    values = np.asarray(values, dtype=F32)
    u = values.view(np.uint32).astype(np.uint64)
    rounded = (u + np.uint64(0x7FFF) + ((u >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)
    out = rounded.astype(np.uint16)
    is_nan = np.isnan(values)
    if np.any(is_nan):
        # keep sign and the top payload bits, force it quiet so it stays NaN
        out[is_nan] = ((u[is_nan] >> np.uint64(16)) | np.uint64(0x0040)).astype(np.uint16)
    return out.astype(U16)


def _e4m3_table():
    table = np.zeros(256, dtype=F32)
    for b in range(256):
        sign = -1.0 if b & 0x80 else 1.0
        exp = (b >> 3) & 0xF
        man = b & 0x7
        if exp == 0xF and man == 0x7:
            value = float("nan")
        elif exp == 0:
            value = sign * (man / 8.0) * 2.0 ** -6
        else:
            value = sign * (1.0 + man / 8.0) * 2.0 ** (exp - 7)
        table[b] = np.float32(value)
    return table


E4M3_TO_F32 = _e4m3_table()


def fp8_to_f32(bits):
    """float8_e4m3fn raw bits (uint8) to float32 (exact)."""
    return E4M3_TO_F32[np.asarray(bits, dtype=U8)]


def expert_factor(n):
    """c = g(n) = float((n + 1) * 256^(n mod 4)) as a float32 (docs/spec.md §7)."""
    return np.float32(float((n + 1) * 256 ** (n % 4)))


# ----------------------------------------------------------------------------
# Input
# ----------------------------------------------------------------------------


class RefError(Exception):
    """The input (or the options) is invalid; `rank` names the rank at fault
    when there is one."""

    def __init__(self, msg, rank=None):
        super().__init__(msg)
        self.rank = rank


class Case:
    def __init__(self, meta, topk_idx, topk_weights, x=None, x_fp8=None, x_scales=None):
        self.P = int(meta["num_ranks"])
        self.E = int(meta["num_experts"])
        self.H = int(meta["hidden"])
        self.K = int(meta["num_topk"])
        self.meta = meta
        self.topk_idx = topk_idx          # list of [S_r, K] int64
        self.topk_weights = topk_weights  # list of [S_r, K] float32
        self.x = x                        # list of [S_r, H] uint16, or None
        self.x_fp8 = x_fp8                # list of [S_r, H] uint8, or None
        self.x_scales = x_scales          # list of [S_r, H/128] float32, or None
        self.S = [int(a.shape[0]) for a in topk_idx]
        self.C = int(meta.get("num_max_tokens_per_rank", max(self.S) if self.S else 0))

    @property
    def fp8(self):
        return self.x_fp8 is not None

    @property
    def L(self):
        return self.E // self.P


def load_case(in_dir):
    """Read IN/meta.json and IN/rank<r>/*.npy.  Checks only what the reference
    itself needs; it is meant for valid cases."""
    with open(os.path.join(in_dir, "meta.json")) as f:
        meta = json.load(f)
    P = int(meta["num_ranks"])
    topk_idx, topk_weights, xs, fp8s, scales = [], [], [], [], []
    for r in range(P):
        d = os.path.join(in_dir, "rank%d" % r)
        topk_idx.append(np.load(os.path.join(d, "topk_idx.npy")))
        topk_weights.append(np.load(os.path.join(d, "topk_weights.npy")))
        if os.path.exists(os.path.join(d, "x_fp8.npy")):
            fp8s.append(np.load(os.path.join(d, "x_fp8.npy")))
            scales.append(np.load(os.path.join(d, "x_scales.npy")))
        else:
            xs.append(np.load(os.path.join(d, "x.npy")))
    if fp8s and xs:
        raise RefError("mixed bf16 / fp8 inputs")
    case = Case(meta, topk_idx, topk_weights,
                x=xs if xs else None,
                x_fp8=fp8s if fp8s else None,
                x_scales=scales if scales else None)
    validate(case)
    return case


def validate(case):
    P, E, H, K = case.P, case.E, case.H, case.K
    if P < 1 or E < 1 or E % P != 0:
        raise RefError("num_experts %d is not a multiple of num_ranks %d" % (E, P))
    if case.fp8 and H % FP8_BLOCK != 0:
        raise RefError("fp8 needs hidden %% 128 == 0, got %d" % H)
    for r in range(P):
        idx, w = case.topk_idx[r], case.topk_weights[r]
        S = idx.shape[0] if idx.ndim == 2 else -1
        if idx.dtype != I64 or idx.shape != (S, K):
            raise RefError("rank %d: topk_idx must be <i8 [S,%d]" % (r, K), r)
        if w.dtype != F32 or w.shape != (S, K):
            raise RefError("rank %d: topk_weights must be <f4 [%d,%d]" % (r, S, K), r)
        if case.fp8:
            if case.x_fp8[r].dtype != U8 or case.x_fp8[r].shape != (S, H):
                raise RefError("rank %d: x_fp8 must be |u1 [%d,%d]" % (r, S, H), r)
            if case.x_scales[r].dtype != F32 or case.x_scales[r].shape != (S, H // FP8_BLOCK):
                raise RefError("rank %d: x_scales must be <f4 [%d,%d]" % (r, S, H // FP8_BLOCK), r)
        else:
            if case.x[r].dtype != U16 or case.x[r].shape != (S, H):
                raise RefError("rank %d: x must be <u2 [%d,%d]" % (r, S, H), r)
        if S > case.C:
            raise RefError("rank %d: %d tokens > num_max_tokens_per_rank %d" % (r, S, case.C), r)
        bad = (idx < -1) | (idx >= E)
        if np.any(bad):
            t, k = np.argwhere(bad)[0]
            raise RefError("rank %d: topk_idx[%d,%d] = %d outside [-1,%d)" % (r, t, k, idx[t, k], E), r)
        for t in range(S):
            valid = idx[t][idx[t] >= 0]
            if len(np.unique(valid)) != len(valid):
                raise RefError("rank %d: token %d names an expert twice" % (r, t), r)


# ----------------------------------------------------------------------------
# The reference
# ----------------------------------------------------------------------------


class Result:
    def __init__(self):
        self.ranks = []             # per rank: {file stem: expected ndarray}
        self.unspecified_rows = []  # per rank: bool [N], recv_x rows with unspecified content
        self.padding_rows = []      # per rank: bool [N], padding rows
        self.segments = []          # per rank, expanded: [(o_j, n_j)]
        self.needed_rows = []       # per rank: rows the rank needs (the W check)


def _align(n, a):
    return (n + a - 1) // a * a


def compute(case, layout="expanded", alignment=1, worst=0, deterministic=False,
            zero_padding=False, weighted=False):
    """Expected outputs of `epx replay` for every rank.  In the expanded layout
    without `deterministic`, the rows inside an expert are returned in (s,t)
    order (the deterministic order); the comparer must treat them as a multiset
    per expert.  Raises RefError for inputs or options docs/spec.md calls errors."""
    if layout not in ("compact", "expanded"):
        raise RefError("unknown layout %r" % (layout,))
    if alignment < 1:
        raise RefError("alignment must be >= 1")
    if weighted and layout == "compact":
        raise RefError("weighted combine needs the expanded layout")
    validate(case)
    P, E, H, K, L = case.P, case.E, case.H, case.K, case.L
    nblk = H // FP8_BLOCK if case.fp8 else 0
    res = Result()

    # ---------------- layout (docs/spec.md §2), source side ----------------
    in_rank = []  # per source s: bool [S_s, P]
    for s in range(P):
        idx = case.topk_idx[s]
        S = idx.shape[0]
        itr = np.zeros((S, P), dtype=bool)
        per_expert = np.zeros(E, dtype=I64)
        for t in range(S):
            for k in range(K):
                e = int(idx[t, k])
                if e >= 0:
                    itr[t, e // L] = True
                    per_expert[e] += 1
        in_rank.append(itr)
        res.ranks.append({
            "num_tokens_per_rank": itr.sum(axis=0).astype(I64),
            "num_tokens_per_expert": per_expert,
            "is_token_in_rank": itr.astype(U8),
        })

    def src_row(s, t):
        if case.fp8:
            return case.x_fp8[s][t], case.x_scales[s][t]
        return case.x[s][t], None

    # ---------------- dispatch (docs/spec.md §3), destination side ----------------
    # First the plan of every destination (row keys, None = padding), then the
    # W check over all ranks, then the rows themselves.
    plans = []
    for d in range(P):
        if layout == "expanded":
            rows = []  # (s, t, k)
            counts = []
            offsets = [0]
            segments = []
            for j in range(L):
                e = d * L + j
                lst = []
                for s in range(P):
                    idx = case.topk_idx[s]
                    for t in range(idx.shape[0]):
                        for k in range(K):
                            if int(idx[t, k]) == e:
                                lst.append((s, t, k))
                n = len(lst)
                a = _align(n, alignment)
                segments.append((offsets[-1], n))
                rows.extend(lst)
                rows.extend([None] * (a - n))
                counts.append(n)
                offsets.append(offsets[-1] + a)
            needed = offsets[-1]
        else:
            rows = []  # (s, t)
            for s in range(P):
                for t in range(case.S[s]):
                    if in_rank[s][t, d]:
                        rows.append((s, t))
            needed = len(rows)
            segments = counts = offsets = None
        res.needed_rows.append(needed)
        res.segments.append(segments)
        plans.append((rows, needed, counts, offsets, segments))

    if worst > 0:
        over = [d for d in range(P) if res.needed_rows[d] > worst]
        if over:
            d = over[0]
            raise RefError("rank %d needs %d rows > num_worst_tokens %d"
                           % (d, res.needed_rows[d], worst), d)

    place = []  # place[d][(s,t,k) or (s,t)] = row index on destination d
    y_all = []  # per destination: expert output y, bf16 bits [N, H]
    for d in range(P):
        out = res.ranks[d]
        rows, needed, counts, offsets, segments = plans[d]
        N = worst if worst > 0 else needed
        rows = rows + [None] * (N - needed)

        padding = np.array([key is None for key in rows], dtype=bool).reshape(N)
        res.padding_rows.append(padding)
        res.unspecified_rows.append(padding.copy() if not zero_padding else np.zeros(N, dtype=bool))

        if case.fp8:
            recv_x = np.zeros((N, H), dtype=U8)
            recv_scales = np.zeros((N, nblk), dtype=F32)
        else:
            recv_x = np.zeros((N, H), dtype=U16)
        y = np.zeros((N, H), dtype=U16)  # expert output, bf16 bits
        pl = {}
        if layout == "expanded":
            recv_src = np.full((N, 3), -1, dtype=I64)
            recv_weights = np.zeros(N, dtype=F32)
            for i, key in enumerate(rows[:needed]):
                if key is None:
                    continue
                s, t, k = key
                data, sc = src_row(s, t)
                recv_x[i] = data
                if case.fp8:
                    recv_scales[i] = sc
                recv_src[i] = (s, t, k)
                recv_weights[i] = case.topk_weights[s][t, k]
                pl[(s, t, k)] = i
            # expert function: n = j, the row's local expert
            for j, (o, n) in enumerate(segments):
                c = expert_factor(j)
                for i in range(o, o + n):
                    y[i] = _expert(recv_x[i], recv_scales[i] if case.fp8 else None, c)
            out["recv_src"] = recv_src
            out["num_recv_tokens_per_expert"] = np.array(counts, dtype=I64)
            out["recv_weights"] = recv_weights
            out["expert_offsets"] = np.array(offsets, dtype=I64)
        else:
            recv_src = np.full((N, 2), -1, dtype=I64)
            recv_idx = np.full((N, K), -1, dtype=I64)
            recv_w = np.zeros((N, K), dtype=F32)
            counts = np.zeros(L, dtype=I64)
            for i, key in enumerate(rows[:needed]):
                s, t = key
                data, sc = src_row(s, t)
                recv_x[i] = data
                if case.fp8:
                    recv_scales[i] = sc
                recv_src[i] = (s, t)
                for k in range(K):
                    e = int(case.topk_idx[s][t, k])
                    if e >= 0 and e // L == d:
                        recv_idx[i, k] = e - d * L
                        recv_w[i, k] = case.topk_weights[s][t, k]
                present = sorted(set(int(v) for v in recv_idx[i] if v >= 0))
                for j in present:
                    counts[j] += 1
                n = int(sum(int(v) for v in recv_idx[i] if v >= 0))
                y[i] = _expert(recv_x[i], recv_scales[i] if case.fp8 else None, expert_factor(n))
                pl[(s, t)] = i
            out["recv_src"] = recv_src
            out["num_recv_tokens_per_expert"] = counts
            out["recv_topk_idx"] = recv_idx
            out["recv_topk_weights"] = recv_w
        if case.fp8:
            out["recv_x_fp8"] = recv_x
            out["recv_x_scales"] = recv_scales
        else:
            out["recv_x"] = recv_x
        place.append(pl)
        y_all.append(y)

    # ---------------- combine (docs/spec.md §4), back on the source ----------------
    zero = np.float32(0.0)
    for s in range(P):
        S = case.S[s]
        idx = case.topk_idx[s]
        w = case.topk_weights[s]
        combined = np.zeros((S, H), dtype=U16)
        for t in range(S):
            # no bias in replay: f32(bias0) + f32(bias1) = 0.0f + 0.0f
            acc = np.full(H, zero, dtype=F32) + np.full(H, zero, dtype=F32)
            if layout == "expanded":
                groups = {}
                for k in range(K):
                    e = int(idx[t, k])
                    if e >= 0:
                        groups.setdefault(e // L, []).append(k)
                # groups added in ascending order of their largest k
                for d, ks in sorted(groups.items(), key=lambda item: max(item[1])):
                    ks = sorted(ks)
                    if len(ks) == 1 and not weighted:
                        p = y_all[d][place[d][(s, t, ks[0])]]
                    else:
                        part = np.full(H, zero, dtype=F32)
                        for k in ks:
                            term = bf16_to_f32(y_all[d][place[d][(s, t, k)]])
                            if weighted:
                                term = term * np.float32(w[t, k])
                            part = part + term
                        p = f32_to_bf16(part)
                    acc = acc + bf16_to_f32(p)
            else:
                for d in range(P):
                    if in_rank[s][t, d]:
                        acc = acc + bf16_to_f32(y_all[d][place[d][(s, t)]])
            combined[t] = f32_to_bf16(acc)
        res.ranks[s]["combined_x"] = combined
    return res


def _expert(row, scales, c):
    """y = bf16(v * c), v = f32(row) or, FP8, f32(q) * scale (per 128 block)."""
    if scales is None:
        v = bf16_to_f32(row)
    else:
        q = fp8_to_f32(row).reshape(-1, FP8_BLOCK)
        v = (q * scales.astype(F32)[:, None]).astype(F32).reshape(-1)
    return f32_to_bf16(v * np.float32(c))


def expected_files(case, layout):
    names = ["num_tokens_per_rank", "num_tokens_per_expert", "is_token_in_rank",
             "recv_src", "num_recv_tokens_per_expert", "combined_x"]
    names += ["recv_x_fp8", "recv_x_scales"] if case.fp8 else ["recv_x"]
    names += ["recv_topk_idx", "recv_topk_weights"] if layout == "compact" else ["recv_weights", "expert_offsets"]
    return names


def write_outputs(res, out_dir):
    for r, files in enumerate(res.ranks):
        d = os.path.join(out_dir, "rank%d" % r)
        os.makedirs(d, exist_ok=True)
        for name, arr in files.items():
            np.save(os.path.join(d, name + ".npy"), np.ascontiguousarray(arr))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--in", dest="in_dir", required=True)
    ap.add_argument("--out", dest="out_dir", required=True)
    ap.add_argument("--layout", choices=["compact", "expanded"], default="expanded")
    ap.add_argument("--alignment", type=int, default=1)
    ap.add_argument("--worst", type=int, default=0)
    ap.add_argument("--deterministic", action="store_true")
    ap.add_argument("--zero-padding", action="store_true")
    ap.add_argument("--weighted", action="store_true")
    a = ap.parse_args(argv)
    try:
        case = load_case(a.in_dir)
        res = compute(case, a.layout, a.alignment, a.worst, a.deterministic,
                      a.zero_padding, a.weighted)
    except (RefError, OSError, ValueError, KeyError) as e:
        print("epx_ref: error: %s" % e, file=sys.stderr)
        return 1
    write_outputs(res, a.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
