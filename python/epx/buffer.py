"""EPBuffer: dispatch and combine for PyTorch and NumPy (DeepEP V2.5's names).

Every collective method must be called by every rank of the group in the same order. A
bad input on any rank raises epx.Error on every rank, naming the rank at fault
(``origin_rank``). Tensors come in and go out by DLPack without copies: torch in, torch
out; numpy in, numpy out. bf16 is torch.bfloat16, or uint16 raw bits in numpy; FP8 input
is a pair ``(data, scales)``, data uint8 raw E4M3 bits [S, H], scales float32 [S, H/128].
The GIL is released while a call runs.
"""
import sys
import warnings

import numpy as np

from . import _convert as cv
from . import _epx
from .errors import Error
from .group import bootstrap_of, transport_of

_ALIGN = 2 << 20


class EventOverlap:
    """An asynchronous call in flight. ``wait()`` (alias ``current_stream_wait()``) blocks
    until the call finished (Ctrl-C ends the wait; a call that failed raises its epx.Error
    here, on every rank); after it the tensors the call returned hold their values. Waiting
    again returns at once.

    ``async_with_compute_stream=True``: the call already returned its tuple (the tensors with
    their final shapes) and this event in it; epx's threads carry the call on, and wait()
    returns None. With ``defer_epilogue=True`` the call returns only this event, and wait()
    runs the call's back half (completion and epilogue) on the waiting thread, then returns
    the result tuple (whose own event is a finished one). A synchronous call's event is
    finished already. (No event refers to a tuple holding it: no reference cycle keeps a
    call's tensors, and their pooled memory, alive after the caller dropped them.)"""

    def __init__(self, pending=None, result=None):
        self._pending, self._result, self._after = pending, result, None

    def wait(self):
        if self._pending is not None:
            p, self._pending = self._pending, None
            p.wait()
            if self._after is not None:
                self._after()
        return self._result

    current_stream_wait = wait

    def done(self):
        """True when wait() would not block."""
        return self._pending is None or self._pending.done()


class EPHandle:
    """The routing plan of one dispatch: pass it to combine, or back to dispatch for a
    cached dispatch (same routing, new x). Valid only with the EPBuffer that made it.

    num_recv_tokens_per_expert: list [L], unaligned counts per local expert.
    num_recv_tokens_per_expert_aligned: list [L], each rounded up to expert_alignment.
    expert_offsets: list [L + 1] (expanded layout; [] for compact): expert j's rows are
        [expert_offsets[j], expert_offsets[j] + count[j]).
    recv_src: int64 [N, 2] (s, t) compact, [N, 3] (s, t, k) expanded; -1 on padding rows.
    num_recv_rows: N; num_tokens: this rank's S; do_expand, expert_alignment,
    num_worst_tokens: the dispatch's layout options.
    """

    def __init__(self, buffer, raw, r, opts, topk_idx, recv_weights):
        self._buffer = buffer
        self._raw = r["handle"]
        self.num_recv_tokens_per_expert = r["num_recv_tokens_per_expert"]  # fresh lists from the binding
        self.num_recv_tokens_per_expert_aligned = r["num_recv_tokens_per_expert_aligned"]
        self.expert_offsets = r["expert_offsets"]
        self.recv_src = raw["recv_src"]
        self.num_recv_rows = self._raw.num_recv_rows
        self.do_expand, self.expert_alignment, self.num_worst_tokens, self.num_tokens = opts
        self._topk_idx = topk_idx
        self._topk_version = cv.version_of(topk_idx)
        self._recv_weights = recv_weights

    def _problem(self, buffer):
        """Why this handle cannot be used with `buffer` (None if it can)."""
        if self._topk_version is not None and cv.version_of(self._topk_idx) != self._topk_version:
            return ("handle: the topk_idx it was made from was modified in place since (torch version "
                    f"{self._topk_version} -> {cv.version_of(self._topk_idx)}); dispatch afresh")
        return None


class EPBuffer:
    """Expert-parallel dispatch / combine over the ranks of a torch.distributed group.

    EPBuffer(group, num_max_tokens_per_rank, hidden, num_topk, num_experts,
             use_fp8_dispatch=False, deterministic=False, explicitly_destroy=False,
             num_cpu_timeout_secs=300, *, num_workers=0, max_recv_rows=0, transport="auto")

    Collective. `group`: a torch.distributed ProcessGroup (gloo on CPU; None = the default
    group); it carries only setup traffic (window names and sizes, the config check), the
    rows move over epx's transport ("auto": shared memory when every rank is on this
    machine). num_experts % group size == 0; FP8 dispatch needs hidden % 128 == 0.
    num_cpu_timeout_secs bounds every wait; a dead peer fails the others sooner.
    With explicitly_destroy=True, destroy() must be called (a warning otherwise); any
    buffer may be destroyed early with destroy() or by leaving a `with` block. Using a
    destroyed buffer raises epx.Error.
    """

    def __init__(self, group=None, num_max_tokens_per_rank=0, hidden=0, num_topk=0, num_experts=0,
                 use_fp8_dispatch=False, deterministic=False, explicitly_destroy=False, num_cpu_timeout_secs=300,
                 *, num_workers=0, max_recv_rows=0, transport="auto"):
        if use_fp8_dispatch and hidden % 128 != 0:
            raise Error(f"EPBuffer: use_fp8_dispatch needs hidden % 128 == 0, got hidden = {hidden}",
                        "shape_mismatch")
        rank, size, _ = bootstrap_of(group, need_allgather=False)
        self._b = None
        self.explicitly_destroy = explicitly_destroy
        self._b = _epx.Buffer(transport_of(group, transport, num_cpu_timeout_secs), num_experts, hidden,
                              num_topk, num_max_tokens_per_rank, max_recv_rows, num_workers)
        self.rank, self.group_size = rank, size
        self.num_max_tokens_per_rank, self.hidden, self.num_topk, self.num_experts = (
            num_max_tokens_per_rank, hidden, num_topk, num_experts)
        self.num_local_experts = num_experts // size
        self.use_fp8_dispatch, self.deterministic = use_fp8_dispatch, deterministic
        self.window_bytes = self._b.window_bytes  # the symmetric window this rank allocated
        self.transport = self._b.transport

    # -- life cycle -----------------------------------------------------------------
    def destroy(self):
        """Collective in effect (peers waiting for this rank fail at once): frees the
        window and the transport. Idempotent."""
        if self._b is not None and not self._b.closed:
            self._b.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.destroy()
        return False

    def __del__(self):
        b = getattr(self, "_b", None)
        if b is not None and not b.closed and getattr(self, "explicitly_destroy", False) and sys is not None:
            warnings.warn("EPBuffer(explicitly_destroy=True) was garbage-collected without destroy()", ResourceWarning)

    @staticmethod
    def get_buffer_size_hint(group, num_max_tokens_per_rank, hidden, num_topk, use_fp8_dispatch=False,
                             num_experts=None, *, num_workers=0, max_recv_rows=0):
        """Bytes of the window an EPBuffer of this shape allocates per rank (its
        ``window_bytes``), rounded up to 2 MiB. Local. num_experts is needed (the window
        holds per-expert counts); the FP8 scales' space is always reserved when
        hidden % 128 == 0, so use_fp8_dispatch does not change it."""
        if num_experts is None:
            raise Error("get_buffer_size_hint: num_experts is needed (the window holds per-expert counts)",
                        "invalid_argument")
        _, size, _ = bootstrap_of(group, need_allgather=False)
        return _epx.size_hint(size, num_experts, hidden, num_topk, num_max_tokens_per_rank, max_recv_rows, num_workers)

    # -- layout ---------------------------------------------------------------------
    def get_dispatch_layout(self, topk_idx):
        """Local. topk_idx int64 [S, K] -> (num_tokens_per_rank int32 [P],
        num_tokens_per_expert int32 [E], is_token_in_rank bool [S, P]) (SPEC §2)."""
        f = cv.flavor_of(topk_idx)
        r = self._b.layout(cv.plain(topk_idx), f)
        return (cv.out(r["num_tokens_per_rank"], f), cv.out(r["num_tokens_per_expert"], f),
                cv.out_bool(r["is_token_in_rank"], f))

    # -- dispatch -------------------------------------------------------------------
    def dispatch(self, x, topk_idx=None, topk_weights=None, *, handle=None, expert_alignment=None,
                 num_worst_tokens=None, do_cpu_sync=True, do_expand=None, do_zero_padding=False,
                 async_with_compute_stream=False, defer_epilogue=False, use_tma_aligned_col_major_sf=False,
                 deterministic=None):
        """Collective (SPEC §3). Returns (recv_x, recv_topk_idx, recv_topk_weights, handle, event).

        x: bf16 [S, H], or (data uint8 [S, H], scales float32 [S, H/128]) for FP8; recv_x is
        then the pair (data [N, H], scales [N, H/128]), the scales row-major or, with
        use_tma_aligned_col_major_sf=True, column-major (strides (1, N)).
        topk_idx int64 [S, K] in [-1, E); topk_weights float32 [S, K] (None: zeros, and
        recv_topk_weights is None). With `handle` (a cached dispatch) both are taken from
        the handle, and do_expand / expert_alignment / num_worst_tokens default to its.
        do_expand=False (compact, SPEC §3.1): one row per received token, recv_topk_idx
        int64 [N, K] (local expert or -1), recv_topk_weights float32 [N, K].
        do_expand=True (expanded, §3.2): one row per (token, slot) grouped by local expert,
        each expert's rows padded to expert_alignment; recv_topk_idx is None and
        recv_topk_weights float32 [N] (one weight per row); handle.expert_offsets says
        where each expert's rows start. num_worst_tokens=W > 0: exactly W rows (§3.3).
        do_zero_padding: padding rows of recv_x are zeros. deterministic (default: the
        buffer's): expanded rows sorted by (source rank, token) in each expert.
        do_cpu_sync: accepted for DeepEP's signature; on CPU the counts are always known.
        async_with_compute_stream=True: returns the tuple above once the rows' puts are
        handed to epx's threads — recv_x, recv_topk_idx, recv_topk_weights and handle with
        their final shapes and counts, their values only after event.wait() (alias
        current_stream_wait()), which finishes the call; compute meanwhile. The handle may
        be used only after that. defer_epilogue=True: returns an EventOverlap whose wait()
        runs the rest of the call (completion, epilogue) and returns the tuple. Until the
        wait, the inputs must stay unchanged, and any other dispatch or combine on this
        buffer raises epx.Error naming the pending call.
        """
        f = cv.flavor_of(x)
        problem, code = "", ""
        if handle is not None:
            if not isinstance(handle, EPHandle):
                problem, code = f"handle: expected an EPHandle from this buffer's dispatch, got {type(handle).__name__}", "bad_handle"
            else:
                p = handle._problem(self)
                if p:
                    problem, code = p, "bad_handle"
                do_expand = handle.do_expand if do_expand is None else do_expand
                expert_alignment = handle.expert_alignment if expert_alignment is None else expert_alignment
                num_worst_tokens = handle.num_worst_tokens if num_worst_tokens is None else num_worst_tokens
        do_expand = bool(do_expand)
        expert_alignment = 1 if expert_alignment is None else int(expert_alignment)
        num_worst_tokens = 0 if num_worst_tokens is None else int(num_worst_tokens)
        deterministic = self.deterministic if deterministic is None else bool(deterministic)
        fp8 = isinstance(x, (tuple, list))
        if fp8 and len(x) != 2:
            problem, code = f"x: an FP8 input is the pair (data, scales), got {len(x)} items", "invalid_argument"
            x = (x[0] if x else None, None)
        data, scales = (x[0], x[1]) if fp8 else (x, None)
        weights_given = topk_weights is not None
        if handle is None and topk_weights is None and topk_idx is not None and hasattr(topk_idx, "shape"):
            topk_weights = cv.zeros_f32(tuple(topk_idx.shape), topk_idx)
        raw_handle = handle._raw if isinstance(handle, EPHandle) else None
        data, scales, topk_idx, topk_weights = map(cv.plain, (data, scales, topk_idx, topk_weights))
        mode = 2 if defer_epilogue else 1 if async_with_compute_stream else 0
        r = self._b.dispatch(data, scales, topk_idx, topk_weights, raw_handle, do_expand, expert_alignment,
                             num_worst_tokens, deterministic, do_zero_padding, f, mode, problem, code)
        src_idx = handle._topk_idx if isinstance(handle, EPHandle) else topk_idx
        opts = (do_expand, expert_alignment, num_worst_tokens,
                int(data.shape[0]) if hasattr(data, "shape") else 0)
        with_weights = weights_given or (isinstance(handle, EPHandle) and handle._weights_given)

        ev = EventOverlap(r.get("pending"))
        recv_x = cv.out(r["recv_x"], f)
        if fp8:
            s = cv.out(r["recv_x_scales"], f)
            if use_tma_aligned_col_major_sf:  # a column-major copy: (re)filled once the values are there
                cm = cv.col_major(s)
                if mode:
                    ev._after = lambda: cm.__setitem__(Ellipsis, s)
                s = cm
            recv_x = (recv_x, s)
        raw = {"recv_src": cv.out(r["recv_src"], f)}
        if do_expand:
            recv_idx, recv_w = None, cv.out(r["recv_weights"], f)
        else:
            recv_idx, recv_w = cv.out(r["recv_topk_idx"], f), cv.out(r["recv_topk_weights"], f)
        h = EPHandle(self, raw, r, opts, src_idx, recv_w)
        h._weights_given = with_weights
        if defer_epilogue:
            ev._result = (recv_x, recv_idx, recv_w if with_weights else None, h, EventOverlap())
            return ev
        return (recv_x, recv_idx, recv_w if with_weights else None, h, ev)

    # -- combine --------------------------------------------------------------------
    def combine(self, x, handle, topk_weights=None, bias=None, *, weighted=False, async_with_compute_stream=False,
                defer_epilogue=False):
        """Collective (SPEC §4). Returns (combined_x bf16 [S, H], combined_topk_weights
        float32 [S, K], event).

        x: bf16 [N, H], the rows of `handle`'s dispatch output on this rank (padding rows
        ignored). bias: None, a bf16 [S, H] tensor, or a pair (bias0, bias1); added in
        SPEC §4's fixed order. weighted=True (expanded layout only): each row is first
        multiplied by its routing weight (the handle's). topk_weights: accepted for
        DeepEP's signature; epx takes the weights from the handle and returns the
        dispatch's topk_weights as combined_topk_weights. async_with_compute_stream /
        defer_epilogue: as in dispatch (the tuple at once with combined_x's values after
        event.wait(); or only the EventOverlap, whose wait() reduces and returns the tuple).
        """
        f = cv.flavor_of(x)
        problem, code = "", ""
        if not isinstance(handle, EPHandle):
            raise Error(f"rank {self.rank}: combine needs the EPHandle of a dispatch, got {type(handle).__name__}",
                        "bad_handle", self.rank)
        p = handle._problem(self)
        if p:
            problem, code = p, "bad_handle"
        if isinstance(bias, (tuple, list)):
            if len(bias) != 2:
                problem, code = f"bias: expected a tensor or a pair (bias0, bias1), got {len(bias)} items", "invalid_argument"
                bias = (None, None)
            b0, b1 = bias
        else:
            b0, b1 = bias, None
        x, b0, b1 = map(cv.plain, (x, b0, b1))
        mode = 2 if defer_epilogue else 1 if async_with_compute_stream else 0
        r = self._b.combine(x, handle._raw, b0, b1, bool(weighted), f, mode, problem, code)
        ev = EventOverlap(r.get("pending"))
        if defer_epilogue:
            ev._result = (cv.out(r["combined_x"], f), cv.out(r["combined_topk_weights"], f), EventOverlap())
            return ev
        return (cv.out(r["combined_x"], f), cv.out(r["combined_topk_weights"], f), ev)

    # -- redundant experts (epx/lb.hpp) ---------------------------------------------
    def lb_prefetch_weights(self, redundant_weights, expert_weights, mapping):
        """Collective: every used redundant slot receives a bitwise copy of its logical
        expert's weights from the expert's home rank (DeepEP's ``lb_prefetch_weights``).

        ``expert_weights``: a list of weight kinds (w1, w2, ...), each a C-contiguous CPU
        tensor or array ``[L, ...]`` of this rank's L home experts (logical expert e lives on
        rank e // L); ``redundant_weights``: the same kinds, ``[B, ...]``, this rank's B slots
        (written; unused slots are left alone); ``mapping``: ``[P, B]`` integer, the logical
        expert of every slot of every rank (-1 unused), the same on every rank. Any dtype: the
        bytes travel as they are, over this buffer's own dispatch (so no other call may run
        meanwhile). Returns when this rank's slots hold the bytes."""
        self._lb(False, redundant_weights, expert_weights, mapping)

    def lb_reduce_grads(self, redundant_grads, expert_grads, mapping):
        """Collective, in place (DeepEP's ``lb_reduce_grads``): every home expert's gradient
        ``expert_grads[kind][j]`` += its replicas' ``redundant_grads[kind][b]``, as
        ``home = ((home + g_0) + g_1) + ...`` in float32 over the slots holding that expert in
        ascending global slot (rank * B + b): the same bits on every run. float32 only; the
        shapes as in :meth:`lb_prefetch_weights`."""
        self._lb(True, redundant_grads, expert_grads, mapping)

    def _lb(self, reduce, slots, homes, mapping):
        what = "lb_reduce_grads" if reduce else "lb_prefetch_weights"
        problem = ""
        slot_kinds, home_kinds, flat, L, B = [], [], [], 1, 0
        try:
            if not isinstance(slots, (list, tuple)):
                slots = [slots]
            if not isinstance(homes, (list, tuple)):
                homes = [homes]
            m = np.asarray(mapping.detach().cpu().numpy() if cv.is_torch(mapping) else mapping)
            if m.ndim != 2 or m.shape[0] != self.group_size or not np.issubdtype(m.dtype, np.integer):
                raise ValueError(f"mapping must be an integer [P = {self.group_size}, B] array, got "
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
        self._b.lb(reduce, slot_kinds, home_kinds, L, B, flat, problem, code)



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
