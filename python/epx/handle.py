"""EPHandle: the routing plan of one EPBuffer dispatch (passed to combine and to a cached
dispatch), with DeepEP 2.1.0's handle fields computed from epx's outputs and DeepEP's
deterministic epilogue (deterministic_sort). The buffer that makes handles: epx/buffer.py.
"""

import numpy as np

from . import _convert as cv
from .errors import Error


class EPHandle:
    """The routing plan of one dispatch: pass it to combine, or back to dispatch for a
    cached dispatch (same routing, new x). Valid only with the EPBuffer that made it.

    num_recv_tokens_per_expert: list [L], unaligned counts per local expert.
    num_recv_tokens_per_expert_aligned (DeepEP: num_recv_tokens_per_expert_list): list [L],
        each rounded up to expert_alignment.
    expert_offsets: list [L + 1] (expanded layout; [] for compact): expert j's rows are
        [expert_offsets[j], expert_offsets[j] + count[j]).
    recv_src: int64 [N, 2] (s, t) compact, [N, 3] (s, t, k) expanded; -1 on padding rows.
    num_recv_rows: N; num_tokens: this rank's S; topk_idx: the dispatch's (raises if it was
    modified in place since). The layout choices, kept by every cached dispatch: do_expand,
    expert_alignment, num_worst_tokens, do_zero_padding, num_experts,
    num_max_tokens_per_rank. num_sms: 0 (no SMs on CPU; ElasticBuffer's: the dispatch's).

    DeepEP 2.1.0's fields too (each documented as a property below; computed at first read,
    final once an asynchronous dispatch was waited on; assignable, as DeepEP's plain
    attributes): recv_src_metadata, psum_num_recv_tokens_per_scaleup_rank,
    psum_num_recv_tokens_per_expert, num_unaligned_recv_tokens_per_expert,
    dst_buffer_slot_idx, num_recv_tokens, num_expanded_tokens, token_metadata_at_forward and
    channel_linked_list (None: hybrid mode only), cached_recv_src_metadata_before_sort; and
    deterministic_sort(...).
    """

    num_recv_tokens_per_expert: list
    num_recv_tokens_per_expert_aligned: list
    num_recv_tokens_per_expert_list: list
    expert_offsets: list
    recv_src: object
    num_recv_rows: int
    num_tokens: int
    do_expand: bool
    expert_alignment: int
    num_worst_tokens: int
    do_zero_padding: bool
    num_experts: int
    num_max_tokens_per_rank: int
    num_sms: int

    def __init__(self, owner, engine, r, opts, topk_idx, recv_src, recv_idx, recv_weights):
        self._owner, self._engine = owner, engine
        self._raw = r["handle"]
        self.num_recv_tokens_per_expert = r["num_recv_tokens_per_expert"]  # fresh lists from the binding
        self.num_recv_tokens_per_expert_aligned = r["num_recv_tokens_per_expert_aligned"]
        self.num_recv_tokens_per_expert_list = self.num_recv_tokens_per_expert_aligned
        self.expert_offsets = r["expert_offsets"]
        self.recv_src = recv_src
        self.num_recv_rows = self._raw.num_recv_rows
        (self.do_expand, self.expert_alignment, self.num_worst_tokens, self.num_tokens, self.do_zero_padding,
         self.num_experts, self.num_max_tokens_per_rank) = opts
        self.num_sms = 0
        self._topk_idx = topk_idx
        self._topk_version = cv.version_of(topk_idx)
        self._recv_idx, self._recv_weights = recv_idx, recv_weights
        self._weights_given = False
        self._fields = None  # DeepEP 2.1.0's fields, once computed
        self._sorted = False  # made by a deterministic ElasticBuffer (DeepEP sorts then)
        self._event = None  # weakref to the event of an asynchronous dispatch

    # -- DeepEP 2.1.0's fields (computed on first read: the receive side's need the
    # dispatch finished, i.e. its event waited on when it was asynchronous) -------------
    def _deepep_fields(self):
        f = self._fields
        if f is not None:
            return f
        f = _deepep_fields_of(self)
        if self._sorted:  # DeepEP's deterministic epilogue keeps the metadata as received
            f["cached_recv_src_metadata_before_sort"] = cv.copy_of(f["recv_src_metadata"])
        ev = self._event() if self._event is not None else None
        if ev is None or ev._pending is None:  # final values: kept
            self._fields = f
        return f

    def _field(name, doc):
        def get(self):
            return self._deepep_fields()[name]

        def set_(self, value):  # DeepEP's handles are plain objects: a field may be replaced
            self._deepep_fields()[name] = value
        return property(get, set_, doc=doc)

    recv_src_metadata = _field("recv_src_metadata", """int32 [num_recv_tokens, 2 + K] (int64 on a torch
        before 2.0, which cannot index with int32), one row per received token in the order of
        the compact output's rows (by source rank, then token):
        column 0 the token's global index s * num_max_tokens_per_rank + t; column 1 s * K + the
        first slot k of the token on this rank; columns 2 + k: expanded layout, the output row of
        slot k (-1 where slot k's expert is elsewhere); compact layout, -1.""")
    psum_num_recv_tokens_per_scaleup_rank = _field("psum_num_recv_tokens_per_scaleup_rank", """int32 [P]:
        inclusive prefix sum of the tokens received from each source rank (a token once however
        many of its experts are here); the last element is num_recv_tokens.""")
    psum_num_recv_tokens_per_expert = _field("psum_num_recv_tokens_per_expert", """int32 [L]: compact,
        the inclusive prefix sum of the aligned counts; expanded, expert j's first row plus its
        unaligned count (align(psum[j-1]) is where expert j starts).""")
    num_unaligned_recv_tokens_per_expert = _field("num_unaligned_recv_tokens_per_expert",
                                                  "int32 [L]: the unaligned counts (both layouts).")
    dst_buffer_slot_idx = _field("dst_buffer_slot_idx", """int32 [S, K] (int64 as recv_src_metadata),
        the sending side's: for slot k of token t, t's position among the tokens this rank sends
        to the rank of slot k's expert (where the row lands in that rank's area for this rank);
        -1 for an unused slot.""")
    num_recv_tokens = _field("num_recv_tokens", "int: tokens received (each once).")
    num_expanded_tokens = _field("num_expanded_tokens", "int: the sum of the aligned counts (expanded rows).")
    token_metadata_at_forward = _field("token_metadata_at_forward",
                                       "None: DeepEP's hybrid (multi-domain) mode only; epx has one domain.")
    channel_linked_list = _field("channel_linked_list", "None: DeepEP's hybrid mode only.")
    cached_recv_src_metadata_before_sort = _field("cached_recv_src_metadata_before_sort",
                                                  "recv_src_metadata before deterministic_sort (None until it ran; "
                                                  "a deterministic ElasticBuffer's dispatch runs it).")
    del _field

    def deterministic_sort(self, do_cpu_sync, is_cached_dispatch, recv_x, recv_sf, recv_topk_idx, recv_topk_weights,
                           channel_linked_list):
        """DeepEP's deterministic epilogue, in place: orders the received tokens by their global
        source index (compact: the rows of every given output and, for a fresh dispatch,
        recv_src_metadata; expanded: each expert's rows, with recv_src_metadata's row pointers
        following). epx's outputs come in that order already (docs/spec.md §3.1, §3.2), so on
        them it changes nothing; it records recv_src_metadata's pre-sort copy as DeepEP does.
        do_cpu_sync and channel_linked_list: no effect (exact counts; no hybrid mode)."""
        f = self._deepep_fields()
        meta = f["recv_src_metadata"]
        if not is_cached_dispatch:
            f["cached_recv_src_metadata_before_sort"] = cv.copy_of(meta)
        before = f["cached_recv_src_metadata_before_sort"]
        if before is None:
            raise Error("deterministic_sort: a cached dispatch's handle has no pre-sort metadata (sort the fresh "
                        "dispatch first)", "bad_handle")
        m = cv.to_numpy(before)
        n = m.shape[0]
        if not self.do_expand:
            order = np.argsort(m[:, 0], kind="stable")
            if np.array_equal(order, np.arange(n)):
                return None
            for t in (recv_x, recv_sf, recv_topk_idx, recv_topk_weights) + ((meta,) if not is_cached_dispatch else ()):
                if t is not None:
                    _permute_rows(t, order)
            return None
        if is_cached_dispatch:
            return None
        rows = m[:, 2:]
        N = int(recv_x.shape[0])
        starts = np.asarray(self.expert_offsets[:-1], dtype=np.int64) if self.expert_offsets else np.zeros(0, np.int64)
        expert_of_row = np.searchsorted(starts, np.arange(N), side="right") - 1
        key = np.zeros(N, dtype=np.int64)  # (expert, source index) with padding rows last in their expert
        key[:] = np.iinfo(np.int64).max // 2
        valid = rows >= 0
        key[rows[valid]] = np.broadcast_to(m[:, :1], rows.shape)[valid]
        order = np.lexsort((key, expert_of_row))
        if np.array_equal(order, np.arange(N)):
            return None
        for t in (recv_x, recv_sf, recv_topk_weights):
            if t is not None:
                _permute_rows(t, order)
        to = np.empty_like(order)
        to[order] = np.arange(N)
        mm = cv.to_numpy(meta)
        mm[:, 2:][valid] = to[rows[valid]]
        return None

    @property
    def topk_idx(self):
        p = self._problem()
        if p:
            raise Error(p, "bad_handle")
        return self._topk_idx

    def _problem(self, buffer=None):
        """Why this handle cannot be used (with `buffer`; None if it can)."""
        if buffer is not None and buffer is not self._owner:
            return "handle: made by another EPBuffer's dispatch (a handle is valid only with its own buffer)"
        if self._topk_version is not None and cv.version_of(self._topk_idx) != self._topk_version:
            return ("handle: the topk_idx it was made from was modified in place since (torch version "
                    f"{self._topk_version} -> {cv.version_of(self._topk_idx)}); dispatch afresh")
        return None


def _deepep_fields_of(h):
    """DeepEP 2.1.0's EPHandle fields of an epx handle (EPHandle's properties document them),
    in the handle's flavour."""
    flavor = cv.flavor_of(h.recv_src)
    src = cv.to_numpy(h.recv_src)
    idx = cv.to_numpy(h._topk_idx)
    K = int(idx.shape[1]) if idx.ndim == 2 else 0
    C = int(h.num_max_tokens_per_rank)
    P = h._owner.group_size
    counts = np.asarray(h.num_recv_tokens_per_expert, dtype=np.int32)
    aligned = np.asarray(h.num_recv_tokens_per_expert_aligned, dtype=np.int32)
    L = counts.shape[0]
    rows = np.nonzero(src[:, 0] >= 0)[0] if src.shape[0] else np.zeros(0, np.int64)
    s, t = src[rows, 0], src[rows, 1]
    if not h.do_expand:
        n = rows.shape[0]
        meta = np.full((n, 2 + K), -1, dtype=np.int32)
        meta[:, 0] = s * C + t
        local = cv.to_numpy(h._recv_idx)[rows] >= 0 if h._recv_idx is not None else np.zeros((n, K), bool)
        meta[:, 1] = s * K + np.where(local.any(axis=1), local.argmax(axis=1), 0)
        psum_expert = np.cumsum(aligned, dtype=np.int64).astype(np.int32)
    else:
        k = src[rows, 2]
        glob, inv = np.unique(s * C + t, return_inverse=True)  # sorted: the compact order
        n = glob.shape[0]
        meta = np.full((n, 2 + K), -1, dtype=np.int32)
        meta[:, 0] = glob
        meta[inv, 2 + k] = rows
        first = np.full(n, K, dtype=np.int64)
        np.minimum.at(first, inv, k)
        meta[:, 1] = (glob // max(C, 1)) * K + first
        offsets = np.asarray(h.expert_offsets[:L], dtype=np.int64)
        psum_expert = (offsets + counts).astype(np.int32)
    per_rank = np.bincount(meta[:, 0] // max(C, 1), minlength=P)[:P] if n else np.zeros(P, np.int64)
    # where each token goes at its destinations (the sending side's view)
    S = idx.shape[0] if idx.ndim == 2 else 0
    dest = np.where(idx >= 0, idx // max(h.num_experts // P, 1), -1) if S else np.zeros((0, K), np.int64)
    goes = np.zeros((S, P + 1), dtype=np.int64)
    goes[np.repeat(np.arange(S), K), np.where(dest >= 0, dest, P).reshape(-1)] = 1
    pos = np.cumsum(goes, axis=0) - 1
    slot = np.where(dest >= 0, pos[np.arange(S)[:, None], np.where(dest >= 0, dest, P)], -1).astype(np.int32)

    def out(a):
        return cv.from_numpy(np.ascontiguousarray(a), flavor)
    index = cv.index_dtype(flavor)  # the row-index tensors are indexed with (DeepEP's test does)
    meta, slot = meta.astype(index), slot.astype(index)
    return {"recv_src_metadata": out(meta),
            "psum_num_recv_tokens_per_scaleup_rank": out(np.cumsum(per_rank).astype(np.int32)),
            "psum_num_recv_tokens_per_expert": out(psum_expert),
            "num_unaligned_recv_tokens_per_expert": out(counts),
            "dst_buffer_slot_idx": out(slot),
            "num_recv_tokens": int(n),
            "num_expanded_tokens": int(aligned.sum()),
            "token_metadata_at_forward": None,
            "channel_linked_list": None,
            "cached_recv_src_metadata_before_sort": None}


def _permute_rows(t, order):
    """t[:] = t[order] along the first dimension, in place (torch or numpy)."""
    if cv.is_torch(t):
        import torch
        t.copy_(t[torch.from_numpy(order)])
    else:
        t[...] = t[order]
