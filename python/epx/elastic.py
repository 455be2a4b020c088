"""ElasticBuffer: DeepEP 2.1.0's one buffer class (EP dispatch / combine, AG/RS, PP, Engram),
with its constructor and methods name for name, on CPU. Dispatch and combine run on
EPBuffer's engine (epx/buffer.py); the AG/RS, PP and Engram methods come from their mixins.
"""
from . import _convert as cv
from . import _weights
from ._elastic_agrs import AgrsMixin
from ._elastic_engram import EngramMixin
from ._elastic_pp import PPMixin
from .buffer import EPBuffer, EPHandle, _ALIGN, _WEIGHT_PARTS, _wait_for
from .errors import Error
from .events import EventOverlap
from .group import bootstrap_of


def get_physical_domain_size(group=None):
    """DeepEP's (num_rdma_ranks, num_nvlink_ranks) of `group` (None: the default group): (1, P)
    — epx's transport reaches every rank of the group the same way (one domain). Local."""
    _, size, _ = bootstrap_of(group, need_allgather=False)
    return 1, size


def get_logical_domain_size(group=None, allow_hybrid_mode=True):
    """DeepEP's (num_scaleout_ranks, num_scaleup_ranks) of `group`: (1, P) (one domain; DeepEP's
    hybrid mode splits a group across nodes, epx does not). allow_hybrid_mode: no effect. Local."""
    _, size, _ = bootstrap_of(group, need_allgather=False)
    return 1, size


class ElasticBuffer(AgrsMixin, PPMixin, EngramMixin, EPBuffer):
    """DeepEP 2.1.0's ElasticBuffer on CPU: expert-parallel dispatch / combine (this class, on
    EPBuffer's engine), all-gather / reduce-scatter, pipeline send / receive and Engram fetch
    (their mixins, which also give DeepEP's static size hints of those areas:
    get_engram_storage_size_hint, get_pp_buffer_size_hint, get_agrs_num_max_session_bytes,
    get_agrs_buffer_size_hint), over the ranks of a torch.distributed group.

    ElasticBuffer(group, num_bytes=None, num_cpu_bytes=0, num_max_tokens_per_rank=0, hidden=0,
                  num_topk=0, use_fp8_dispatch=False, deterministic=False,
                  allow_hybrid_mode=True, allow_multiple_reduction=True,
                  prefer_overlap_with_compute=True, sl_idx=3, num_allocated_qps=0,
                  num_cpu_timeout_secs=300, num_gpu_timeout_secs=100, explicitly_destroy=False,
                  *, num_experts=None, num_workers=0, max_recv_rows=0, output_pool_rows=0,
                  transport="auto")

    Collective (every rank of the group, the same arguments). DeepEP 2.1.0's parameters in its
    order, then epx's own, keyword-only (as EPBuffer's):

    - group: a torch.distributed ProcessGroup (gloo on CPU; None = the default group). It
      carries setup traffic only; rows move over epx's transport (`transport`: "auto" = shared
      memory when every rank is on this machine, else UCX, or OpenSHMEM under oshrun).
    - num_bytes: None, or a multiple of 2 MiB: the most this rank's dispatch / combine windows
      may take in all (a dispatch needing more fails on every rank with capacity_exceeded);
      None = the size hint of the shape below (get_buffer_size_hint), unbounded. The AG/RS,
      PP and Engram areas are the mixins' (see their methods).
    - num_cpu_bytes: 0 or a multiple of 2 MiB: Engram storage bytes (DeepEP's CPU segment).
    - num_max_tokens_per_rank, hidden, num_topk (int): the shape dispatch is built for; 0 =
      taken from the first dispatch (its x [S, H], topk_idx [S, K], num_max_tokens_per_rank).
      num_experts comes with each dispatch (or keyword num_experts= here: built at once).
    - use_fp8_dispatch: FP8 input needs hidden % 128 == 0 (the scales' space is reserved
      whenever hidden % 128 == 0, so FP8 dispatches work without it too).
    - deterministic: accepted; epx's row order is DeepEP's deterministic order always.
    - num_cpu_timeout_secs: bounds every wait (a dead peer fails the others sooner).
    - explicitly_destroy: destroy() must then be called (a ResourceWarning otherwise); any
      ElasticBuffer may be destroyed with destroy() or by leaving a `with` block.
    - allow_multiple_reduction=False: the expanded combine adds every slot's row on its own
      (one float32 sum per token, rounded once), as DeepEP's; epx runs it as one combine per
      slot index (K of them), so it is slower. True (default): each rank's rows of a token are
      summed first (docs/spec.md §4). The compact combine is the same either way: the ranks'
      rows in ascending rank after the biases (spec §4), where DeepEP's reference adds them in
      the order of each rank's largest slot k — the same bits unless a token's ranks come in
      another order in its topk_idx and it has a bias or three or more ranks.
    - No effect (GPU only): allow_hybrid_mode, prefer_overlap_with_compute, sl_idx,
      num_allocated_qps (recorded: 0 becomes DeepEP's automatic 129 with hybrid mode, else
      17), num_gpu_timeout_secs.
    - num_workers (epx's SM analogue: worker threads per rank, 0 = auto), max_recv_rows,
      output_pool_rows, transport: as EPBuffer's.

    Attributes (DeepEP's): group, rank_idx, num_ranks, num_bytes, num_cpu_bytes,
    num_max_tokens_per_rank, allow_hybrid_mode, allow_multiple_reduction,
    prefer_overlap_with_compute, deterministic, num_allocated_qps, explicitly_destroy;
    num_scaleout_ranks = 1, num_scaleup_ranks = num_ranks, scaleout_rank_idx = 0,
    scaleup_rank_idx = rank_idx, num_rdma_ranks = 1, num_nvlink_ranks = num_ranks (one
    domain); transport_kind (the `transport` asked for). No `runtime` (epx's engine is private)
    and no `nccl_comm_handle`.

    Methods: dispatch, combine, barrier, destroy (collective); capture, get_comm_stream
    (None: no streams), get_physical_domain_size / get_logical_domain_size ((1, num_ranks)),
    get_theoretical_num_sms / get_theoretical_num_qps, and the static get_buffer_size_hint
    (local). dispatch / combine: DeepEP 2.1.0's signatures (their docstrings); the handle is
    an EPHandle with DeepEP 2.1.0's fields. Using a destroyed buffer raises epx.Error.
    """

    # DeepEP 2.1.0's instance attributes (set by __init__; see the docstring)
    group: object
    rank_idx: int
    num_ranks: int
    num_bytes: int
    num_cpu_bytes: int
    num_max_tokens_per_rank: int
    num_scaleout_ranks: int
    num_scaleup_ranks: int
    scaleout_rank_idx: int
    scaleup_rank_idx: int
    num_rdma_ranks: int
    num_nvlink_ranks: int
    allow_hybrid_mode: bool
    allow_multiple_reduction: bool
    prefer_overlap_with_compute: bool
    deterministic: bool
    num_allocated_qps: int
    explicitly_destroy: bool

    def __init__(self, group=None, num_bytes=None, num_cpu_bytes=0, num_max_tokens_per_rank=0, hidden=0, num_topk=0,
                 use_fp8_dispatch=False, deterministic=False, allow_hybrid_mode=True, allow_multiple_reduction=True,
                 prefer_overlap_with_compute=True, sl_idx=3, num_allocated_qps=0, num_cpu_timeout_secs=300,
                 num_gpu_timeout_secs=100, explicitly_destroy=False, *, num_experts=None, num_workers=0,
                 max_recv_rows=0, output_pool_rows=0, transport="auto"):
        # What the AG/RS, PP and Engram mixins build on, first.
        rank, size, _ = bootstrap_of(group, need_allgather=False)
        self.group, self.rank_idx, self.num_ranks = group, rank, size
        self.num_bytes, self.num_cpu_bytes = num_bytes, num_cpu_bytes
        self.num_cpu_timeout_secs, self.transport_kind = num_cpu_timeout_secs, transport
        if not isinstance(num_cpu_bytes, int) or num_cpu_bytes < 0 or num_cpu_bytes % _ALIGN:
            raise Error(f"rank {rank}: ElasticBuffer: num_cpu_bytes = {num_cpu_bytes!r}: expected 0 or a positive "
                        "multiple of 2 MiB", "invalid_argument", rank)
        EPBuffer.__init__(self, group, num_bytes, num_max_tokens_per_rank, hidden, num_topk, use_fp8_dispatch, 0,
                          deterministic, allow_hybrid_mode, allow_multiple_reduction, prefer_overlap_with_compute,
                          sl_idx, num_allocated_qps, num_cpu_timeout_secs, num_gpu_timeout_secs, explicitly_destroy,
                          num_experts=num_experts, num_workers=num_workers, max_recv_rows=max_recv_rows,
                          output_pool_rows=output_pool_rows, transport=transport)
        self.num_allocated_qps = num_allocated_qps or (129 if allow_hybrid_mode else 17)
        self.num_scaleout_ranks, self.num_scaleup_ranks = self.get_logical_domain_size()
        self.scaleout_rank_idx = rank // self.num_scaleup_ranks
        self.scaleup_rank_idx = rank % self.num_scaleup_ranks
        self.num_rdma_ranks, self.num_nvlink_ranks = self.get_physical_domain_size()

    # -- life cycle -----------------------------------------------------------------
    def destroy(self):
        """Collective in effect: frees the AG/RS, PP and Engram areas, then the dispatch /
        combine windows and the transport. Idempotent; allowed whatever explicitly_destroy."""
        if getattr(self, "_destroyed", True):
            return
        try:
            self._destroy_agrs()
            self._destroy_pp()
            self._destroy_engram()
        finally:
            EPBuffer.destroy(self)

    def _is_live(self):
        return not getattr(self, "_destroyed", True)

    # -- DeepEP's helpers -----------------------------------------------------------
    def barrier(self, use_comm_stream=True, with_cpu_sync=False, sequential=True):
        """Collective: a barrier over the group. use_comm_stream, with_cpu_sync, sequential: no
        effect (no streams; CPU work is synchronous)."""
        self._live()
        EPBuffer.barrier(self)

    def get_theoretical_num_sms(self, num_experts=None, num_topk=None, num_scaleout_topk=0, rdma_gbs=0, nvlink_gbs=0,
                                sm_read_gbs=200, sm_write_gbs=50):
        """epx's analogue of SMs: worker threads per rank (num_workers; auto: this machine's
        cores / ranks, at least 1). The bandwidth arguments have no effect; passing the result
        back as num_sms has none either."""
        return EPBuffer.get_theoretical_num_sms(self)

    def get_theoretical_num_qps(self, num_sms):
        """0: no queue pairs on CPU (0 also means "automatic" to dispatch / combine)."""
        return 0

    # -- dispatch -------------------------------------------------------------------
    def dispatch(self, x, topk_idx=None, topk_weights=None, cumulative_local_expert_recv_stats=None,
                 num_experts=None, num_max_tokens_per_rank=None, expert_alignment=None, num_sms=0, num_qps=0,
                 previous_event=None, previous_event_before_epilogue=None, async_with_compute_stream=False,
                 allocate_on_comm_stream=False, handle=None, do_handle_copy=True, do_cpu_sync=None, do_expand=False,
                 do_zero_padding=False, use_tma_aligned_col_major_sf=False):
        """Collective (docs/spec.md §3), DeepEP 2.1.0's signature. Returns (recv_x, recv_topk_idx,
        recv_topk_weights, handle, event).

        x: bf16 [S, H] with S <= num_max_tokens_per_rank, or (data float8_e4m3fn / uint8 raw
        bits [S, H], scales float32 [S, H/128]); recv_x is then the pair (data [N, H], scales
        [N, H/128]), the scales column-major with use_tma_aligned_col_major_sf=True.
        topk_idx: int64 [S, K] in [-1, E) (None with a handle); topk_weights: float32 [S, K]
        or None (then recv_topk_weights is None). num_experts: E (from the handle when cached).
        do_expand=False (compact, spec §3.1): N rows, one per received token, by source rank
        then token; recv_topk_idx int64 [N, K] (local expert or -1), recv_topk_weights float32
        [N, K] (0 where the slot's expert is elsewhere). do_expand=True (expanded, §3.2): one
        row per (token, slot) here, grouped by local expert, each expert's rows padded to
        expert_alignment (default 1); recv_topk_idx None, recv_topk_weights float32 [rows].
        do_zero_padding: the expanded padding rows (and their weights) are zeros (default: their
        values are unspecified, as DeepEP's); no padding rows in the compact layout.
        handle (a cached dispatch, same routing, new x): topk_idx must be None; the layout,
        num_experts, expert_alignment and num_max_tokens_per_rank are the handle's (passing
        others fails on every rank with bad_handle); the handle itself is returned, as in
        DeepEP. topk_weights with a handle (float32 [S, K], e.g. new weights for a backward
        pass): sent by one more cached dispatch (exactly: 3 bf16 columns per slot, so hidden
        >= 3 K, else unsupported), and the call is then synchronous; every rank passes them
        or none does.
        do_handle_copy (default True): handle.topk_idx is a copy of topk_idx, so later changes
        to the caller's tensor do not reach it; False: it is the caller's tensor itself.
        cumulative_local_expert_recv_stats: int [L], += this dispatch's unaligned counts.
        previous_event, previous_event_before_epilogue: waited on first.
        async_with_compute_stream=True: as EPBuffer.dispatch (outputs with their final shapes
        at return, values after event.current_stream_wait(); the handle's DeepEP fields are
        final after the wait). No effect: num_sms, num_qps, allocate_on_comm_stream,
        do_cpu_sync (the counts are always exact: outputs have exactly N rows).
        """
        _wait_for(previous_event)
        _wait_for(previous_event_before_epilogue)
        cached = handle is not None
        problem, code, topk_idx, layout = self._dispatch_layout(
            handle, topk_idx, topk_weights, do_cpu_sync, do_expand, num_experts, num_max_tokens_per_rank,
            expert_alignment, do_handle_copy)
        # a cached dispatch with weights runs synchronously: their own dispatch follows
        asy = bool(async_with_compute_stream) and not (cached and topk_weights is not None)
        recv_x, recv_idx, recv_w, h, ev = self._dispatch(
            x, topk_idx, None if cached else topk_weights, cumulative_local_expert_recv_stats, layout["num_experts"],
            layout["num_max_tokens_per_rank"], layout["expert_alignment"], asy, handle, False,
            layout["do_expand"], bool(do_zero_padding), use_tma_aligned_col_major_sf, False, None, None, problem, code)
        if not cached:
            h.num_sms = num_sms or self.get_theoretical_num_sms()
            h._sorted = bool(self.deterministic)  # epx's rows are in the sorted order already
            return recv_x, recv_idx, recv_w, h, ev
        if topk_weights is not None:
            recv_w = self._cached_weights(handle, topk_weights, recv_x[0] if isinstance(recv_x, tuple) else recv_x,
                                          problem, code)
        return recv_x, recv_idx, recv_w if topk_weights is not None else None, handle, ev

    def _dispatch_layout(self, handle, topk_idx, topk_weights, do_cpu_sync, do_expand, num_experts,
                         num_max_tokens_per_rank, expert_alignment, do_handle_copy):
        """(problem, code, topk_idx, layout) of a dispatch: a cached one's argument problem ("" when
        fine), no topk_idx and no layout of its own (the handle's); a fresh one's layout and its
        topk_idx (a copy unless do_handle_copy is False)."""
        if handle is not None:
            problem, code = self._cached_args_problem(handle, topk_idx, topk_weights, do_cpu_sync, do_expand,
                                                      num_experts, num_max_tokens_per_rank, expert_alignment)
            return problem, code, None, dict(do_expand=None, expert_alignment=None, num_experts=None,
                                             num_max_tokens_per_rank=None)
        if do_handle_copy and topk_idx is not None and hasattr(topk_idx, "shape"):
            topk_idx = cv.copy_of(topk_idx)
        return "", "", topk_idx, dict(do_expand=bool(do_expand), expert_alignment=expert_alignment,
                                      num_experts=num_experts, num_max_tokens_per_rank=num_max_tokens_per_rank)

    def _cached_args_problem(self, handle, topk_idx, topk_weights, do_cpu_sync, do_expand, num_experts, C, alignment):
        """(problem, code) of a cached dispatch's DeepEP arguments ("" when fine); the engine
        checks the rest (a foreign or stale handle)."""
        if not isinstance(handle, EPHandle):
            return "", ""  # the engine's message
        if topk_idx is not None:
            return "cached dispatch: topk_idx must be None (the handle's is used)", "invalid_argument"
        if do_cpu_sync:
            return "cached dispatch: do_cpu_sync=True is not allowed with a handle (as in DeepEP)", "invalid_argument"
        for name, given, own in (("do_expand", bool(do_expand) or None, handle.do_expand or None),
                                 ("num_experts", num_experts, handle.num_experts),
                                 ("num_max_tokens_per_rank", C, handle.num_max_tokens_per_rank),
                                 ("expert_alignment", alignment, handle.expert_alignment)):
            if given is not None and given != own:
                return f"cached dispatch: {name} = {given} but the handle's dispatch had {own}", "bad_handle"
        if topk_weights is not None:
            shape = tuple(getattr(topk_weights, "shape", ()))
            want = tuple(handle._topk_idx.shape)
            if shape != want:
                return (f"cached dispatch: topk_weights must be float32 {list(want)} (the handle's tokens and slots), "
                        f"got {list(shape)}", "shape_mismatch")
            if self.hidden < _WEIGHT_PARTS * want[1]:
                return (f"cached dispatch: topk_weights travel in {_WEIGHT_PARTS} bf16 columns per slot, which needs "
                        f"hidden >= {_WEIGHT_PARTS} x num_topk (hidden {self.hidden}, num_topk {want[1]}): dispatch "
                        "afresh with them", "unsupported")
        return "", ""

    def _cached_weights(self, handle, topk_weights, recv_x, problem, code):
        """A cached dispatch's new topk_weights, sent by one more cached dispatch of the same
        handle: each float32 weight split into bf16 parts whose float32 sum is exactly it, in
        columns p * K + k of its token's row; each received row's weights summed back. Returns
        recv_topk_weights as a fresh dispatch gives them: compact [N, K] (0 where the slot's
        expert is elsewhere), expanded [rows] (0 on padding rows). Collective: every rank
        passes topk_weights with its cached dispatch, or none does."""
        import numpy as np
        K = int(handle._topk_idx.shape[1])
        flavor = cv.flavor_of(recv_x)
        packed = None
        if not problem:
            w = cv.to_numpy(topk_weights).astype(np.float32, copy=False)
            packed = np.zeros((w.shape[0], self.hidden), dtype=np.uint16)
            for p, part in enumerate(_weights._split(w, _WEIGHT_PARTS)):
                packed[:, p * K:(p + 1) * K] = part
            packed = cv.from_numpy(packed, flavor, bf16=True)
        rows, _, _, h, _ = self._dispatch(packed, None, None, None, None, None, None, False, handle, False, None, False,
                                          False, False, None, None, problem, code)
        got = _weights.unpack(cv.to_numpy(rows), K, _WEIGHT_PARTS)  # [N, K] float32 per received row
        src = cv.to_numpy(h.recv_src)
        if handle.do_expand:
            k = np.where(src[:, 0] >= 0, src[:, 2], 0)
            out = np.where(src[:, 0] >= 0, got[np.arange(got.shape[0]), k], np.float32(0))
        else:
            out = np.where(cv.to_numpy(h._recv_idx) >= 0, got, np.float32(0))
        return cv.from_numpy(np.ascontiguousarray(out, dtype=np.float32), flavor)

    # -- combine --------------------------------------------------------------------
    def combine(self, x, handle, topk_weights=None, bias=None, num_sms=0, num_qps=0, previous_event=None,
                previous_event_before_epilogue=None, async_with_compute_stream=False, allocate_on_comm_stream=False):
        """Collective (docs/spec.md §4), DeepEP 2.1.0's signature. Returns (combined_x bf16 [S, H],
        combined_topk_weights float32 [S, K] or None, event).

        x: bf16 [N, H], the rows of `handle`'s dispatch output here (padding rows ignored),
        summed per token without weights: expanded, each rank's rows of a token first (in slot
        order, rounded to bf16 when more than one), then the ranks' partials; compact, the
        ranks' rows; the biases first (spec §4 gives the exact order). bias: None, a bf16
        [S, H] tensor or a pair of them. topk_weights: float32 [N, K] (compact) or [N]
        (expanded), e.g. recv_topk_weights or its gradient: summed back to their (token,
        slot) exactly (compact slots whose expert is elsewhere count as 0) as
        combined_topk_weights; None: combined_topk_weights is None. previous_event,
        previous_event_before_epilogue: waited on first. async_with_compute_stream: as in
        dispatch. No effect: num_sms, num_qps, allocate_on_comm_stream.
        """
        _wait_for(previous_event)
        _wait_for(previous_event_before_epilogue)
        if not self.allow_multiple_reduction and isinstance(handle, EPHandle) and handle.do_expand:
            return self._combine_once_reduced(x, handle, topk_weights, bias)
        combined_x, weights, ev = EPBuffer.combine(self, x, handle, topk_weights, bias, num_sms, num_qps, None,
                                                   async_with_compute_stream, allocate_on_comm_stream)
        return combined_x, weights if topk_weights is not None else None, ev

    def _combine_once_reduced(self, x, handle, topk_weights, bias):
        """The expanded combine with allow_multiple_reduction=False, as DeepEP's: every slot's
        row is added on its own, one float32 sum per token in slot order after the biases,
        rounded to bf16 once (no partial per rank). One combine per slot index k carries the
        rows of slot k alone, so each arrives unrounded at its source (K combines, then the
        sum here). Returns a finished event."""
        import torch
        K = int(handle._topk_idx.shape[1]) if hasattr(handle._topk_idx, "shape") else self.num_topk
        src = handle.recv_src
        torch_in = cv.is_torch(x)
        xt = x if torch_in else torch.from_numpy(cv.to_numpy(x).view("int16")).view(torch.bfloat16)
        slot = src[:, 2] if torch_in else torch.from_numpy(cv.to_numpy(src)[:, 2])
        b0, b1 = bias if isinstance(bias, (tuple, list)) else (bias, None)
        total = None
        for k in range(K):
            yk = torch.zeros_like(xt) if xt.shape[0] else xt
            if xt.shape[0]:
                rows = slot == k
                yk[rows] = xt[rows]
            part, _, _ = EPBuffer.combine(self, yk if torch_in else cv.to_numpy(yk), handle)
            part = part if torch_in else torch.from_numpy(cv.to_numpy(part).view("int16")).view(torch.bfloat16)
            if total is None:
                total = torch.zeros(part.shape, dtype=torch.float32)
                for b in (b0, b1):
                    if b is not None:
                        bt = b if cv.is_torch(b) else \
                            torch.from_numpy(cv.to_numpy(b).view("int16")).view(torch.bfloat16)
                        total += bt.float()
            total += part.float()
        weights = self._weights_back(handle, topk_weights, cv.flavor_of(x)) if topk_weights is not None else None
        out = total.to(torch.bfloat16)
        if not torch_in:
            out = out.view(torch.int16).numpy().view("uint16")
        return out, weights, EventOverlap()
