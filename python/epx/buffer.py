"""EPBuffer: dispatch and combine for PyTorch and NumPy, with DeepEP V2.5's signatures.

Every collective method must be called by every rank of the group in the same order, with
the same shape arguments (num_experts, num_max_tokens_per_rank, ...). A bad input on any
rank raises epx.Error on every rank with the same code, message and ``origin_rank`` (the
rank at fault). Tensors come in and go out by DLPack without copies: torch in, torch out;
numpy in, numpy out. bf16 is torch.bfloat16, or uint16 raw bits in numpy; FP8 input is a
pair ``(data, scales)``, data uint8 raw E4M3 bits [S, H], scales float32 [S, H/128]. The
GIL is released while a call runs. docs/deepep.md: what matches DeepEP and what differs.
"""

import weakref

from . import _convert as cv
from . import _epx
from . import _lb
from . import _weights
from ._lifecycle import BufferLifecycle
from .errors import Error
from .events import EventHandle, EventOverlap
from .group import _healed, bootstrap_of, transport_of
from .handle import EPHandle

_ALIGN = 2 << 20
#: The most local experts (num_experts / group size) an EPBuffer supports; a size hint
#: without num_experts is for this many.
MAX_LOCAL_EXPERTS = 1024
#: num_topk a size hint with num_topk=0 is for (the window grows with K).
HINT_TOPK = 32
_WEIGHT_PARTS = 3  # bf16 parts of an exact float32 weight on its way back (8 + 8 + 8 bits)


def get_num_allocation_alignment():
    """DeepEP's allocation alignment: num_bytes and size hints are multiples of it (2 MiB)."""
    return _ALIGN


def _round_up(n):
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


class EPBuffer(BufferLifecycle):
    """Expert-parallel dispatch / combine over the ranks of a torch.distributed group.

    EPBuffer(group, num_bytes=None, num_max_tokens_per_rank=0, hidden=0, num_topk=0,
             use_fp8_dispatch=False, lb_allocation_plan_or_num_bytes=0, deterministic=False,
             allow_hybrid_mode=True, allow_multiple_reduction=True,
             prefer_overlap_with_compute=True, sl_idx=None, num_allocated_qps=0,
             num_cpu_timeout_secs=300, num_gpu_timeout_secs=100, explicitly_destroy=False,
             *, num_experts=None, num_workers=0, max_recv_rows=0, output_pool_rows=0,
             transport="auto")

    DeepEP V2.5's arguments, then epx's own (keyword-only). Collective. `group`: a
    torch.distributed ProcessGroup (gloo on CPU; None = the default group); it carries only
    setup traffic, the rows move over epx's transport ("auto": shared memory when every
    rank is on this machine, else UCX — OpenSHMEM when oshrun started the ranks).

    Sizing, as DeepEP: num_max_tokens_per_rank / hidden / num_topk (what the buffer is
    built for), and num_experts with each dispatch. A dispatch with an expert count the
    buffer has not seen builds its state for that count (collective: every rank's first
    dispatch with it; its own window, the size of get_buffer_size_hint with that
    num_experts); `num_experts=` here builds it at once. `num_bytes` (a multiple of
    get_num_allocation_alignment(), 2 MiB): the most this rank's windows may take in all
    (a dispatch that would need more fails on every rank with capacity_exceeded); with
    num_bytes alone, hidden, num_topk and num_max_tokens_per_rank come from the first
    dispatch (its x, topk_idx and num_max_tokens_per_rank=). num_experts % group size == 0,
    at most MAX_LOCAL_EXPERTS per rank; FP8 dispatch needs hidden % 128 == 0.

    One copy: a dispatch's recv_x is a block of the window's output pool the senders put
    the rows straight into, while the pool has room; otherwise (a pool too small, or its
    block still held by an earlier recv_x) the rows are copied out once more. The auto pool
    (output_pool_rows=0) holds one compact output of max_recv_rows (default: group size x
    num_max_tokens_per_rank) rows; an expanded output has a row per slot (about num_topk x
    the tokens received), so for one-copy expanded outputs pass output_pool_rows = the
    largest output's rows (also the compact's, if both layouts are used). Drop recv_x (and
    recv_x_scales) before the next dispatch to give its block back.

    Accepted for DeepEP's signature, no effect here (no GPU): allow_hybrid_mode,
    allow_multiple_reduction, prefer_overlap_with_compute, sl_idx, num_allocated_qps,
    num_gpu_timeout_secs. lb_allocation_plan_or_num_bytes: a byte count is accepted (epx's
    lb calls need no region); a BufferAllocator plan is materialised into a CPU storage of
    its size (``lb_storage``). num_cpu_timeout_secs bounds every wait; a dead peer fails the
    others sooner. With explicitly_destroy=True, destroy() must be called (a warning
    otherwise); any buffer may be destroyed early with destroy() or by leaving a `with`
    block. Using a destroyed buffer raises epx.Error.
    """

    def __init__(self, group=None, num_bytes=None, num_max_tokens_per_rank=0, hidden=0, num_topk=0,
                 use_fp8_dispatch=False, lb_allocation_plan_or_num_bytes=0, deterministic=False,
                 allow_hybrid_mode=True, allow_multiple_reduction=True, prefer_overlap_with_compute=True,
                 sl_idx=None, num_allocated_qps=0, num_cpu_timeout_secs=300, num_gpu_timeout_secs=100,
                 explicitly_destroy=False, *, num_experts=None, num_workers=0, max_recv_rows=0, output_pool_rows=0,
                 transport="auto"):
        self._engines, self._destroyed, self._transport_name = {}, False, None
        self.explicitly_destroy = explicitly_destroy
        _check_num_bytes(num_bytes)
        if not isinstance(output_pool_rows, int) or output_pool_rows < 0:
            raise Error(f"EPBuffer: output_pool_rows = {output_pool_rows!r}: expected an int >= 0 (0 = auto)",
                        "invalid_argument")
        if use_fp8_dispatch and hidden % 128 != 0:
            raise Error(f"EPBuffer: use_fp8_dispatch needs hidden % 128 == 0, got hidden = {hidden}",
                        "shape_mismatch")
        rank, size, _ = bootstrap_of(group, need_allgather=False)
        self.group, self.rank, self.group_size = group, rank, size
        self.rank_idx, self.num_ranks = rank, size  # DeepEP's names
        self.num_max_tokens_per_rank, self.hidden, self.num_topk = num_max_tokens_per_rank, hidden, num_topk
        self.num_experts = num_experts or None
        self.use_fp8_dispatch, self.deterministic = use_fp8_dispatch, deterministic
        # num_bytes: the budget when given (DeepEP's num_bytes); else what the shape needs for
        # one expert count, as DeepEP reports it (get_buffer_size_hint), when it is known
        self._budget = num_bytes
        self.num_bytes = num_bytes if num_bytes is not None or not (num_max_tokens_per_rank and hidden) else \
            self.get_buffer_size_hint(group, num_max_tokens_per_rank, hidden, num_topk, use_fp8_dispatch,
                                      num_experts=num_experts, num_workers=num_workers, max_recv_rows=max_recv_rows,
                                      output_pool_rows=output_pool_rows)
        self.allow_hybrid_mode, self.allow_multiple_reduction = allow_hybrid_mode, allow_multiple_reduction
        self.prefer_overlap_with_compute, self.sl_idx = prefer_overlap_with_compute, sl_idx
        self.num_allocated_qps, self.num_gpu_timeout_secs = num_allocated_qps, num_gpu_timeout_secs
        self.num_cpu_timeout_secs = num_cpu_timeout_secs
        self._opts = (transport, num_workers, max_recv_rows, output_pool_rows)
        self.num_lb_bytes, self.lb_storage = _lb.materialize(lb_allocation_plan_or_num_bytes)
        if self.num_experts:
            problem, code = self._engine_problem(self.num_experts)
            if problem:
                raise Error(f"rank {rank}: {problem}", code, rank)
            self._engine_for(self.num_experts)

    # -- state per expert count -----------------------------------------------------
    def _engine_for(self, num_experts):
        """The engine Buffer for `num_experts` (the buffer's shape), built collectively on
        first use; _engine_problem must have passed."""
        b = self._engines.get(num_experts)
        if b is None:
            transport, workers, recv_rows, pool_rows = self._opts
            with cv.normal_tensors():
                b = _epx.Buffer(transport_of(self.group, transport, self.num_cpu_timeout_secs), num_experts,
                                self.hidden, self.num_topk, self.num_max_tokens_per_rank, recv_rows, workers, pool_rows)
            self._engines[num_experts] = b
            self._transport_name = b.transport
            for ref in getattr(self, "_engine_watchers", ()):  # epx.Diagnose(buffer): this engine's waits too
                watch = ref()
                if watch is not None:
                    watch(b)
        return b

    def _engine_problem(self, num_experts, x=None, topk_idx=None, C=None):
        """(problem, code) that keeps an engine for `num_experts` from being built ("" if it
        exists or can be): the count's range, the shape (a num_bytes-only buffer takes what it
        does not know from this call's x / topk_idx / C), the num_bytes budget."""
        if num_experts in self._engines:
            return "", ""
        self._live()
        P = self.group_size
        if num_experts <= 0 or num_experts % P or num_experts // P > MAX_LOCAL_EXPERTS:
            return (f"num_experts = {num_experts}: expected a positive multiple of the group size {P}, at most "
                    f"{MAX_LOCAL_EXPERTS} per rank", "invalid_argument")
        missing = self._learn_shape(x, topk_idx, C)
        if missing:
            return (f"EPBuffer: {', '.join(missing)} unknown: pass them to EPBuffer() (or num_max_tokens_per_rank "
                    "to the first dispatch)", "invalid_argument")
        if self._budget is not None:
            _, workers, recv_rows, pool_rows = self._opts
            need = _round_up(_epx.size_hint(P, num_experts, self.hidden, self.num_topk, self.num_max_tokens_per_rank,
                                            recv_rows, workers, pool_rows))
            used = sum(_round_up(e.window_bytes) for e in self._engines.values())
            if used + need > self._budget:
                return (f"EPBuffer(num_bytes = {self._budget}): the state for num_experts = {num_experts} needs "
                        f"{need} bytes, {self._budget - used} are left", "capacity_exceeded")
        return "", ""

    def _learn_shape(self, x, topk_idx, C):
        """Fills in hidden, num_topk and num_max_tokens_per_rank a num_bytes-only buffer takes
        from its first dispatch; returns the names still unknown."""
        data = x[0] if isinstance(x, (tuple, list)) and x else x
        if not self.hidden and hasattr(data, "shape") and len(data.shape) == 2:
            self.hidden = int(data.shape[1])
        if not self.num_topk and hasattr(topk_idx, "shape") and len(topk_idx.shape) == 2:
            self.num_topk = int(topk_idx.shape[1])
        if not self.num_max_tokens_per_rank and C:
            self.num_max_tokens_per_rank = int(C)
        return [n for n in ("hidden", "num_topk", "num_max_tokens_per_rank") if not getattr(self, n)]

    def _any_engine(self):
        """An engine to run a call on that needs no particular expert count (lb, or failing
        a call collectively); None if the buffer has none yet."""
        self._live()
        return next(iter(self._engines.values()), None)

    def _live(self):
        if self._destroyed:
            raise Error("this EPBuffer was destroyed (destroy() was called)", "bad_handle")

    @property
    def _b(self):  # the first engine (epx.bench_binding times its native calls)
        return self._any_engine()

    @property
    def num_local_experts(self):
        return self.num_experts // self.group_size if self.num_experts else None

    @property
    def window_bytes(self):
        """Bytes of the symmetric windows this rank allocated (one per expert count)."""
        return sum(e.window_bytes for e in self._engines.values())

    @property
    def transport(self):
        """The transport's name ("shm", ...; None before the first window)."""
        return self._transport_name

    # -- life cycle -----------------------------------------------------------------
    def destroy(self):
        """Collective in effect (peers waiting for this rank fail at once): frees the
        windows and the transport. Idempotent."""
        for e in self._engines.values():
            if not e.closed:
                e.close()
        self._destroyed = True

    def _is_live(self):
        return not getattr(self, "_destroyed", True) and bool(getattr(self, "_engines", None))

    # -- sizes and DeepEP's helpers ---------------------------------------------------
    @staticmethod
    def get_buffer_size_hint(group, num_max_tokens_per_rank, hidden, num_topk=0, use_fp8_dispatch=False,
                             allow_hybrid_mode=True, allow_multiple_reduction=True, *, num_experts=None,
                             num_workers=0, max_recv_rows=0, output_pool_rows=0):
        """DeepEP's signature. Local. Bytes of the window an EPBuffer of this shape allocates
        per rank for one expert count, rounded up to 2 MiB: for `num_experts` when given
        (its ``window_bytes`` then), else for the largest count it supports (group size x
        MAX_LOCAL_EXPERTS), which holds any. num_topk=0: sized for HINT_TOPK. The FP8 scales'
        space is always reserved when hidden % 128 == 0, so use_fp8_dispatch does not change
        it; allow_hybrid_mode / allow_multiple_reduction have no effect."""
        _, size, _ = bootstrap_of(group, need_allgather=False)
        E = num_experts if num_experts else size * MAX_LOCAL_EXPERTS
        return _epx.size_hint(size, E, hidden, num_topk or HINT_TOPK, num_max_tokens_per_rank, max_recv_rows,
                              num_workers, output_pool_rows)

    def barrier(self):
        """Collective: a barrier over the group (torch.distributed; a group epx.agree_and_rebuild
        returned: its own barrier, the torch group being broken after a lost rank)."""
        if _healed(self.group) is not None:
            self.group.barrier()
            return
        import torch.distributed as dist
        with cv.normal_tensors():
            dist.barrier(group=self.group)

    @staticmethod
    def capture():
        """An EventHandle: on CPU, everything issued so far has happened."""
        return EventHandle()

    def get_comm_stream(self):
        """None: there are no streams on CPU (epx's calls run on the caller's thread and epx's)."""
        return None

    def get_logical_domain_size(self):
        """(scale-out ranks, scale-up ranks): (1, P) — epx does not split the group in Python."""
        return 1, self.group_size

    def get_physical_domain_size(self):
        """(RDMA ranks, NVLink ranks): (1, P), as get_logical_domain_size."""
        return 1, self.group_size

    def get_theoretical_num_sms(self, num_experts=None, num_topk=None, *args, **kwargs):
        """epx's analogue of SMs: the worker threads per rank (num_workers; auto: this
        machine's cores / ranks, at least 1). Passing it back as num_sms has no effect."""
        import os
        return self._opts[1] or max(1, (os.cpu_count() or 1) // self.group_size)

    def get_theoretical_num_qps(self, num_sms=0):
        """0: no queue pairs on CPU."""
        return 0

    def lb_get_theoretical_num_sms(self):
        return self.get_theoretical_num_sms()

    def print_memory_usage(self):
        """Prints this rank's windows (one per expert count) and their total."""
        parts = ", ".join(f"num_experts {E}: {e.window_bytes} bytes" for E, e in self._engines.items())
        print(f"EPBuffer rank {self.rank}: {parts or 'no window yet'}; total {self.window_bytes} bytes")

    # -- layout ---------------------------------------------------------------------
    def get_dispatch_layout(self, topk_idx, num_experts=None):
        """Local. topk_idx int64 [S, K] -> (num_tokens_per_rank int32 [P],
        num_tokens_per_expert int32 [E], is_token_in_rank bool [S, P]) (docs/spec.md §2).
        num_experts: the buffer's when it was given one."""
        E = num_experts or self.num_experts
        if not E:
            raise Error(f"rank {self.rank}: get_dispatch_layout: num_experts is needed (the buffer has none)",
                        "invalid_argument", self.rank)
        f = cv.flavor_of(topk_idx)
        r = _epx.dispatch_layout(cv.plain(topk_idx), E, self.group_size, self.rank, f)
        return (cv.out(r["num_tokens_per_rank"], f), cv.out(r["num_tokens_per_expert"], f),
                cv.out_bool(r["is_token_in_rank"], f))

    # -- dispatch -------------------------------------------------------------------
    def dispatch(self, x, topk_idx=None, topk_weights=None, cumulative_local_expert_recv_stats=None,
                 num_experts=None, num_max_tokens_per_rank=None, expert_alignment=None, num_sms=0, num_qps=0,
                 previous_event=None, async_with_compute_stream=False, allocate_on_comm_stream=False,
                 handle=None, do_handle_copy=False, do_cpu_sync=None, do_expand=None, do_zero_padding=None,
                 use_tma_aligned_col_major_sf=False, defer_epilogue=False, *, num_worst_tokens=None,
                 deterministic=None):
        """Collective (docs/spec.md §3), DeepEP V2.5's signature. Returns (recv_x, recv_topk_idx,
        recv_topk_weights, handle, event); with defer_epilogue=True only the event, whose
        wait returns (recv_x, recv_topk_idx, recv_topk_weights, handle).

        x: bf16 [S, H], or (data uint8 [S, H], scales float32 [S, H/128]) for FP8; recv_x is
        then the pair (data [N, H], scales [N, H/128]), the scales row-major or, with
        use_tma_aligned_col_major_sf=True, column-major (strides (1, N)).
        topk_idx int64 [S, K] in [-1, E); topk_weights float32 [S, K] (None: zeros, and
        recv_topk_weights is None). num_experts: E (the buffer's when it was built with one).
        num_max_tokens_per_rank: at most the buffer's (a num_bytes-only buffer takes it from
        its first dispatch). With `handle` (a cached dispatch) topk_idx and the weights come
        from the handle, and so does everything about the layout: do_expand,
        expert_alignment, num_worst_tokens, num_experts and zero padding (a cached dispatch
        pads whenever its handle's did).
        do_expand=False (compact, docs/spec.md §3.1): one row per received token, recv_topk_idx
        int64 [N, K] (local expert or -1), recv_topk_weights float32 [N, K].
        do_expand=True (expanded, §3.2): one row per (token, slot) grouped by local expert,
        each expert's rows padded to expert_alignment; recv_topk_idx is None and
        recv_topk_weights float32 [N] (one weight per row); handle.expert_offsets says
        where each expert's rows start. num_worst_tokens=W > 0 (epx's): exactly W rows (§3.3).
        do_zero_padding (default True): padding rows of recv_x are zeros, so an expert run
        over its whole aligned group (a grouped GEMM, and its weight gradient) reads no
        leftover NaN; False skips one memset of the padding rows (at most L x (A - 1) rows,
        W - N with num_worst_tokens) and leaves their bytes unspecified.
        deterministic (default: the buffer's): expanded rows sorted by (source rank, token)
        in each expert — epx's order always. cumulative_local_expert_recv_stats: an int
        [L] tensor / array this rank's received (unaligned) counts per local expert are
        added to. previous_event: an EventOverlap / EventHandle waited on first.
        Accepted, no effect on CPU: num_sms, num_qps, allocate_on_comm_stream, do_cpu_sync
        (the counts are always known); do_handle_copy must be False (as in DeepEP).
        async_with_compute_stream=True: returns the tuple above once the rows' puts are
        handed to epx's threads — recv_x, recv_topk_idx, recv_topk_weights and handle with
        their final shapes and counts, their values only after event.wait() (alias
        current_stream_wait()), which finishes the call; compute meanwhile. The handle may
        be used only after that. defer_epilogue=True: the event's wait runs the rest of the
        call (completion, epilogue). Until the wait, the inputs must stay unchanged, and any
        other dispatch or combine on this buffer raises epx.Error naming the pending call.
        A call that fails leaves nothing pending (its event is finished before the error
        reaches the caller).
        """
        _wait_for(previous_event)
        return self._dispatch(x, topk_idx, topk_weights, cumulative_local_expert_recv_stats, num_experts,
                              num_max_tokens_per_rank, expert_alignment, async_with_compute_stream, handle,
                              do_handle_copy, do_expand, do_zero_padding, use_tma_aligned_col_major_sf,
                              defer_epilogue, num_worst_tokens, deterministic)

    def _dispatch(self, x, topk_idx, topk_weights, cumulative_local_expert_recv_stats, num_experts,
                  num_max_tokens_per_rank, expert_alignment, async_with_compute_stream, handle, do_handle_copy,
                  do_expand, do_zero_padding, use_tma_aligned_col_major_sf, defer_epilogue, num_worst_tokens,
                  deterministic, problem="", code=""):
        """dispatch's body (the events already waited on); `problem` (with its error `code`), when
        set, fails the call on every rank."""
        fresh = handle is None
        if not fresh and not isinstance(handle, EPHandle):
            problem, code = problem or f"handle: expected an EPHandle from this buffer's dispatch, got {type(handle).__name__}", code or "bad_handle"
            handle, fresh = None, False
        if handle is not None:
            mine = _cached_problem(handle, self, num_experts, do_handle_copy)
            problem, code = (problem, code) if problem else mine
            engine = handle._engine if handle._owner is self else self._any_engine()
            do_expand = handle.do_expand if do_expand is None else do_expand
            expert_alignment = handle.expert_alignment if expert_alignment is None else expert_alignment
            num_worst_tokens = handle.num_worst_tokens if num_worst_tokens is None else num_worst_tokens
            num_experts, C = handle.num_experts, handle.num_max_tokens_per_rank
            zero_padding = bool(do_zero_padding)  # the engine adds the handle's choice
        else:
            engine, num_experts, C, problem, code = self._fresh_engine(
                num_experts, x, topk_idx, num_max_tokens_per_rank, problem, code, do_handle_copy)
            zero_padding = True if do_zero_padding is None else bool(do_zero_padding)
        stats_problem = _weights.check_stats(cumulative_local_expert_recv_stats, num_experts // self.group_size)
        if stats_problem and not problem:
            problem, code = stats_problem
        opts = (bool(do_expand), 1 if expert_alignment is None else int(expert_alignment),
                0 if num_worst_tokens is None else int(num_worst_tokens), zero_padding, num_experts, C)
        out = self._dispatch_call(engine, x, topk_idx, topk_weights, handle, opts,
                                  self.deterministic if deterministic is None else bool(deterministic),
                                  2 if defer_epilogue else 1 if async_with_compute_stream else 0,
                                  use_tma_aligned_col_major_sf, problem, code)
        recv_x, recv_idx, recv_w, h, ev = out
        with _settled_on_error(ev):
            _weights.add_stats(cumulative_local_expert_recv_stats, h.num_recv_tokens_per_expert)
        if defer_epilogue:
            ev._result = (recv_x, recv_idx, recv_w, h)
            return ev
        return out

    def _fresh_engine(self, num_experts, x, topk_idx, C, problem, code, do_handle_copy):
        """(engine, E, C, problem, code) of a fresh dispatch; a problem fails it on an engine
        of any expert count (raised here, on this rank, when the buffer has none yet)."""
        E = num_experts or self.num_experts
        if do_handle_copy and not problem:
            problem, code = "do_handle_copy must be False (handle copies are gone, as in DeepEP V2.5)", "invalid_argument"
        if not E and not problem:
            problem, code = "dispatch: num_experts is needed (the buffer was built without it)", "invalid_argument"
        cap = self.num_max_tokens_per_rank
        if C and cap and C > cap and not problem:
            problem, code = (f"num_max_tokens_per_rank = {C} exceeds the buffer's {cap}", "capacity_exceeded")
        if not problem:
            problem, code = self._engine_problem(E, x, topk_idx, C)
        if not problem:
            return self._engine_for(E), E, C or self.num_max_tokens_per_rank, "", ""
        engine = self._any_engine()
        if engine is None:
            raise Error(f"rank {self.rank}: {problem}", code, self.rank)
        return engine, E or 0, C or cap, problem, code

    def _dispatch_call(self, engine, x, topk_idx, topk_weights, handle, opts, deterministic, mode, col_major,
                       problem, code):
        """The binding's dispatch and its outputs in the caller's flavour (the 5-tuple)."""
        do_expand, alignment, worst, zero_padding = opts[:4]
        f = cv.flavor_of(x)
        fp8 = isinstance(x, (tuple, list))
        if fp8 and len(x) != 2:
            problem, code = problem or f"x: an FP8 input is the pair (data, scales), got {len(x)} items", code or "invalid_argument"
            x = (x[0] if x else None, None)
        data, scales = (x[0], x[1]) if fp8 else (x, None)
        weights_given = topk_weights is not None or (handle is not None and handle._weights_given)
        if handle is None and topk_weights is None and hasattr(topk_idx, "shape"):
            topk_weights = cv.zeros_f32(tuple(topk_idx.shape), topk_idx)
        data, scales, topk_idx, topk_weights = map(cv.plain, (data, scales, topk_idx, topk_weights))
        r = engine.dispatch(data, scales, topk_idx, topk_weights, handle._raw if handle is not None else None,
                            do_expand, alignment, worst, deterministic, zero_padding, f, mode, problem, code)
        ev = EventOverlap._of(r.get("pending"))
        with _settled_on_error(ev):
            return self._dispatch_outputs(engine, r, ev, f, fp8, col_major, mode, handle, topk_idx, data, opts,
                                          weights_given)

    def _dispatch_outputs(self, engine, r, ev, f, fp8, col_major, mode, handle, topk_idx, data, opts, weights_given):
        """The binding's dispatch result `r` as the caller's 5-tuple (tensors of flavour `f`)."""
        do_expand, alignment, worst, zero_padding = opts[:4]
        recv_x = cv.out(r["recv_x"], f)
        if fp8:
            s = cv.out(r["recv_x_scales"], f)
            if col_major:  # a column-major copy: (re)filled once the values are there
                cm = cv.col_major(s)
                if mode:
                    ev._after = lambda cm=cm, s=s: cm.__setitem__(Ellipsis, s)  # bound now: `s` is rebound below
                s = cm
            recv_x = (recv_x, s)
        if do_expand:
            recv_idx, recv_w = None, cv.out(r["recv_weights"], f)
        else:
            recv_idx, recv_w = cv.out(r["recv_topk_idx"], f), cv.out(r["recv_topk_weights"], f)
        src_idx = handle._topk_idx if handle is not None else topk_idx
        S = int(data.shape[0]) if hasattr(data, "shape") and len(data.shape) else 0
        h = EPHandle(self, engine, r, (do_expand, alignment, worst, S, zero_padding or (handle is not None and
                                                                                 handle.do_zero_padding)) + opts[4:],
                     src_idx, cv.out(r["recv_src"], f), recv_idx, recv_w)
        h._weights_given = weights_given
        if mode:
            h._event = weakref.ref(ev)
        return recv_x, recv_idx, recv_w if weights_given else None, h, ev

    # -- combine --------------------------------------------------------------------
    def combine(self, x, handle, topk_weights=None, bias=None, num_sms=0, num_qps=0, previous_event=None,
                async_with_compute_stream=False, allocate_on_comm_stream=False, defer_epilogue=False, *,
                weighted=False):
        """Collective (docs/spec.md §4), DeepEP V2.5's signature. Returns (combined_x bf16 [S, H],
        combined_topk_weights float32 [S, K], event); with defer_epilogue=True only the
        event, whose wait reduces and returns (combined_x, combined_topk_weights).

        x: bf16 [N, H], the rows of `handle`'s dispatch output on this rank (padding rows
        ignored); an unweighted sum per token unless weighted=True. bias: None, a bf16
        [S, H] tensor, or a pair (bias0, bias1); added in docs/spec.md §4's fixed order.
        weighted=True (epx's; expanded layout only): each row is first multiplied by its
        routing weight (the handle's). topk_weights: float32 [N, K] (compact) or [N]
        (expanded), e.g. the gradient of recv_topk_weights: reduced back to their tokens'
        slots as combined_topk_weights [S, K] — exactly (float32) when H >= 3 K — by one
        more combine on the same handle, before this one (every rank passes topk_weights or
        none); compact slots whose expert is not on the receiving rank count as 0. Without
        it, combined_topk_weights is the dispatch's topk_weights. previous_event: waited on
        first. Accepted, no effect on CPU: num_sms, num_qps, allocate_on_comm_stream.
        async_with_compute_stream / defer_epilogue: as in dispatch.
        """
        _wait_for(previous_event)
        problem, code = "", ""
        if isinstance(handle, EPHandle) and handle._owner is self:
            engine, raw = handle._engine, handle._raw
            problem = handle._problem() or ""
            code = "bad_handle" if problem else ""
        else:
            engine, raw = self._any_engine(), None
            problem = (handle._problem(self) if isinstance(handle, EPHandle) else
                       f"combine needs the EPHandle of a dispatch, got {type(handle).__name__}")
            code = "bad_handle"
            if engine is None:
                raise Error(f"rank {self.rank}: {problem}", code, self.rank)
        f = cv.flavor_of(x)
        reduced = None
        if topk_weights is not None and not problem:
            reduced = self._weights_back(handle, topk_weights, f)
        if isinstance(bias, (tuple, list)):
            if len(bias) != 2:
                problem = problem or f"bias: expected a tensor or a pair (bias0, bias1), got {len(bias)} items"
                code = code or "invalid_argument"
                bias = (None, None)
            b0, b1 = bias
        else:
            b0, b1 = bias, None
        x, b0, b1 = map(cv.plain, (x, b0, b1))
        mode = 2 if defer_epilogue else 1 if async_with_compute_stream else 0
        r = engine.combine(x, raw, b0, b1, bool(weighted), f, mode, problem, code)
        ev = EventOverlap._of(r.get("pending"))
        with _settled_on_error(ev):
            result = (cv.out(r["combined_x"], f),
                      reduced if reduced is not None else cv.out(r["combined_topk_weights"], f))
        if defer_epilogue:
            ev._result = result
            return ev
        return result + (ev,)

    def _weights_back(self, handle, weights, flavor):
        """Every row's weight back to its (token, slot) at the source, summed, by one combine
        of the handle's rows (epx/_weights.py): [S, K] float32. A bad `weights` fails that
        combine on every rank."""
        K, H, problem = self.num_topk, self.hidden, ""
        try:
            packed, parts = _weights.pack(weights, handle.recv_src, handle._recv_idx, handle.do_expand, K, H,
                                          _WEIGHT_PARTS)
        except (ValueError, TypeError) as e:
            packed, parts, problem = None, 0, f"combine: {e}"
        y = None if packed is None else cv.from_numpy(packed, flavor, bf16=True)
        r = handle._engine.combine(y, handle._raw, None, None, False, flavor, 0, problem,
                                   "shape_mismatch" if problem else "")
        return cv.from_numpy(_weights.unpack(cv.to_numpy(cv.out(r["combined_x"], flavor)), K, parts), flavor)

    # -- redundant experts (epx/lb.hpp) ---------------------------------------------
    def lb_prefetch_weights(self, redundant_expert_weights, expert_weights, redundancy_mapping, num_sms=0,
                            previous_event=None):
        """Collective: every used redundant slot receives a bitwise copy of its logical
        expert's weights from the expert's home rank (DeepEP's ``lb_prefetch_weights``).
        Returns a finished EventOverlap.

        ``expert_weights``: a tensor or list of weight kinds (w1, w2, ...), each a C-contiguous
        CPU tensor or array ``[L, ...]`` of this rank's L home experts (logical expert e lives
        on rank e // L); ``redundant_expert_weights``: the same kinds, ``[B, ...]``, this rank's
        B slots (written; unused slots are left alone); ``redundancy_mapping``: ``[P, B]``
        integer, the logical expert of every slot of every rank (-1 unused), the same on every
        rank. Any dtype: the bytes travel as they are, over this buffer's own dispatch (so no
        other call may run meanwhile). Returns when this rank's slots hold the bytes.
        num_sms: no effect; previous_event: waited on first."""
        _wait_for(previous_event)
        self._lb(False, redundant_expert_weights, expert_weights, redundancy_mapping)
        return EventOverlap()

    def lb_reduce_grads(self, redundant_expert_grads, expert_grads, redundancy_mapping, num_sms=0,
                        previous_event=None):
        """Collective, in place (DeepEP's ``lb_reduce_grads``): every home expert's gradient
        ``expert_grads[kind][j]`` += its replicas' ``redundant_expert_grads[kind][b]``, as
        ``home = ((home + g_0) + g_1) + ...`` in float32 over the slots holding that expert in
        ascending global slot (rank * B + b): the same bits on every run. float32 only; the
        shapes as in :meth:`lb_prefetch_weights`. Returns a finished EventOverlap."""
        _wait_for(previous_event)
        self._lb(True, redundant_expert_grads, expert_grads, redundancy_mapping)
        return EventOverlap()

    def _lb(self, reduce, slots, homes, mapping):
        engine = self._any_engine()
        if engine is None:
            raise Error(f"rank {self.rank}: lb calls need the buffer's dispatch state: build it with num_experts= "
                        "or dispatch once first", "invalid_argument", self.rank)
        engine.lb(reduce, *_lb.transfer_args(reduce, slots, homes, mapping, self.group_size))


def _check_num_bytes(num_bytes):
    if num_bytes is None:
        return
    if not isinstance(num_bytes, int) or num_bytes <= 0 or num_bytes % _ALIGN:
        raise Error(f"EPBuffer: num_bytes = {num_bytes!r} is not a positive multiple of 2 MiB "
                    "(get_num_allocation_alignment()). EPBuffer takes DeepEP V2.5's arguments, "
                    "EPBuffer(group, num_bytes=None, num_max_tokens_per_rank=0, hidden=0, num_topk=0, ...): "
                    "name the shape, e.g. EPBuffer(group, num_max_tokens_per_rank=S, hidden=H, num_topk=K, "
                    "num_experts=E)", "invalid_argument")


def _cached_problem(handle, buffer, num_experts, do_handle_copy):
    """(problem, code) of a cached dispatch's own arguments on `buffer` ("" when fine)."""
    p = handle._problem(buffer)
    if p:
        return p, "bad_handle"
    if num_experts is not None and num_experts != handle.num_experts:
        return (f"cached dispatch: num_experts = {num_experts} but the handle's dispatch had "
                f"{handle.num_experts}", "bad_handle")
    if do_handle_copy:
        return "do_handle_copy must be False (handle copies are gone, as in DeepEP V2.5)", "invalid_argument"
    return "", ""


class _settled_on_error:
    """`with _settled_on_error(event):` a failure inside finishes the event's call before it
    propagates, so a caller who never received the event is not left with a pending call
    (which would refuse the buffer's next dispatch or combine). The call's own error, if it
    has one, is dropped: the failure being raised is the one to report."""

    def __init__(self, event):
        self.event = event

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        p = getattr(self.event, "_pending", None)
        if kind is not None and p is not None:
            self.event._pending = None
            try:
                p.wait()
            except Exception:
                pass
        return False


def _wait_for(event):
    """A DeepEP previous_event: an EventOverlap or EventHandle is waited on (None: nothing)."""
    if event is not None and hasattr(event, "current_stream_wait"):
        event.current_stream_wait()
