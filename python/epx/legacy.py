"""Buffer and Config: DeepEP V1's normal-mode API (what Megatron-LM's and SGLang's DeepEP
dispatchers call), on CPU tensors, over epx's EPBuffer.

    import epx as deep_ep
    buffer = deep_ep.Buffer(group, num_nvl_bytes, num_rdma_bytes)
    num_tokens_per_rank, num_tokens_per_rdma_rank, num_tokens_per_expert, is_token_in_rank, _ = \\
        buffer.get_dispatch_layout(topk_idx, num_experts)
    recv_x, recv_topk_idx, recv_topk_weights, num_recv_tokens_per_expert_list, handle, event = \\
        buffer.dispatch(x, topk_idx=topk_idx, topk_weights=topk_weights, num_tokens_per_rank=...,
                        num_tokens_per_rdma_rank=..., is_token_in_rank=..., num_tokens_per_expert=...)
    combined_x, combined_topk_weights, event = buffer.combine(y, handle, topk_weights=...)

V1's dispatch output is epx's compact layout (docs/spec.md §3.1): one row per received token,
ordered by (source rank, token), recv_topk_idx the local expert or -1; the per-expert list
is rounded up to expert_alignment (empty with num_worst_tokens). The layout tensors
dispatch takes are recomputed from topk_idx (they must be its layout). A V1 Buffer is not
sized by num_nvl_bytes: it keeps one EPBuffer per (hidden, num_topk, num_experts), built
collectively at the first dispatch of that shape for the largest token count of any rank
then (one all-reduce over the group), and rebuilt larger — on every rank, since every rank
sees the same capacity_exceeded error — when a later dispatch brings more tokens.
"""
from ._lifecycle import BufferLifecycle
from .buffer import EPBuffer, _wait_for
from .errors import Error
from .events import EventHandle, EventOverlap


class Config:
    """DeepEP V1's performance config (SM count and chunk sizes). epx's CPU paths take none
    of these: kept for the signature, and for the size hints below."""

    def __init__(self, num_sms=20, num_max_nvl_chunked_send_tokens=6, num_max_nvl_chunked_recv_tokens=256,
                 num_max_rdma_chunked_send_tokens=6, num_max_rdma_chunked_recv_tokens=128):
        self.num_sms = num_sms
        self.num_max_nvl_chunked_send_tokens = num_max_nvl_chunked_send_tokens
        self.num_max_nvl_chunked_recv_tokens = num_max_nvl_chunked_recv_tokens
        self.num_max_rdma_chunked_send_tokens = num_max_rdma_chunked_send_tokens
        self.num_max_rdma_chunked_recv_tokens = num_max_rdma_chunked_recv_tokens

    def get_nvl_buffer_size_hint(self, hidden_bytes, num_ranks):
        """A nominal size (num_ranks x recv chunk tokens x hidden_bytes, rounded up to 2 MiB):
        epx's Buffer does not size itself by it (module docstring)."""
        n = num_ranks * self.num_max_nvl_chunked_recv_tokens * hidden_bytes
        return (n + (2 << 20) - 1) // (2 << 20) * (2 << 20)

    def get_rdma_buffer_size_hint(self, hidden_bytes, num_ranks):
        """0: epx needs no separate RDMA buffer."""
        return 0


class Buffer(BufferLifecycle):
    """DeepEP V1's ``Buffer`` (normal mode) over epx; see the module docstring.

    Buffer(group, num_nvl_bytes=0, num_rdma_bytes=0, low_latency_mode=False,
           num_qps_per_rank=24, allow_nvlink_for_low_latency_mode=True, allow_mnnvl=False,
           explicitly_destroy=False, enable_shrink=False, comm=None)

    Collective calls as V1's. The sizes and GPU knobs are kept as attributes and have no
    effect; low_latency_mode's calls (low_latency_dispatch / combine) are not provided — use
    EPBuffer, whose dispatch covers them on CPU. ``comm`` (mpi4py) is not supported: pass a
    torch.distributed group (None = the default group)."""

    num_sms = 20

    def __init__(self, group=None, num_nvl_bytes=0, num_rdma_bytes=0, low_latency_mode=False, num_qps_per_rank=24,
                 allow_nvlink_for_low_latency_mode=True, allow_mnnvl=False, explicitly_destroy=False,
                 enable_shrink=False, comm=None):
        import torch.distributed as dist
        if comm is not None and group is None:
            raise Error("Buffer: an mpi4py comm is not supported; pass a torch.distributed group", "unsupported")
        self.group = group
        g = group if group is not None else dist.group.WORLD
        self.rank, self.group_size = dist.get_rank(g), dist.get_world_size(g)
        self.num_nvl_bytes, self.num_rdma_bytes = num_nvl_bytes, num_rdma_bytes
        self.low_latency_mode, self.num_qps_per_rank = low_latency_mode, num_qps_per_rank
        self.explicitly_destroy, self.enable_shrink = explicitly_destroy, enable_shrink
        self._buffers = {}  # (hidden, num_topk, num_experts) -> EPBuffer
        self._destroyed = False

    # -- DeepEP V1's static helpers -----------------------------------------------------
    @staticmethod
    def set_num_sms(new_num_sms):
        if new_num_sms % 2 != 0:
            raise Error(f"Buffer.set_num_sms: the SM count must be even, got {new_num_sms}", "invalid_argument")
        Buffer.num_sms = new_num_sms

    @staticmethod
    def capture():
        return EventOverlap(EventHandle())

    @staticmethod
    def get_dispatch_config(num_ranks):
        return Config(Buffer.num_sms)

    @staticmethod
    def get_combine_config(num_ranks):
        return Config(Buffer.num_sms)

    def get_comm_stream(self):
        """None: no streams on CPU."""
        return None

    def destroy(self):
        """Frees every EPBuffer of this Buffer (collective in effect). Idempotent."""
        for b in self._buffers.values():
            b.destroy()
        self._buffers.clear()
        self._destroyed = True

    def _is_live(self):
        return not getattr(self, "_destroyed", True)

    # -- the calls ----------------------------------------------------------------------
    def get_dispatch_layout(self, topk_idx, num_experts, previous_event=None, async_finish=False,
                            allocate_on_comm_stream=False):
        """Local. (num_tokens_per_rank int32 [P], None (no RDMA ranks), num_tokens_per_expert
        int32 [E], is_token_in_rank bool [S, P], event)."""
        _wait_for(previous_event)
        from . import _convert as cv
        from . import _epx
        f = cv.flavor_of(topk_idx)
        r = _epx.dispatch_layout(cv.plain(topk_idx), num_experts, self.group_size, self.rank, f)
        return (cv.out(r["num_tokens_per_rank"], f), None, cv.out(r["num_tokens_per_expert"], f),
                cv.out_bool(r["is_token_in_rank"], f), EventOverlap())

    def dispatch(self, x, handle=None, num_tokens_per_rank=None, num_tokens_per_rdma_rank=None,
                 is_token_in_rank=None, num_tokens_per_expert=None, topk_idx=None, topk_weights=None,
                 expert_alignment=1, num_worst_tokens=0, config=None, previous_event=None, async_finish=False,
                 allocate_on_comm_stream=False):
        """Collective. (recv_x, recv_topk_idx, recv_topk_weights,
        num_recv_tokens_per_expert_list, handle, event); a cached dispatch (handle=)
        returns (recv_x, None, None, None, None, event). num_tokens_per_expert (or the
        layout's length) gives num_experts. async_finish=True: the call returns once its
        puts are issued and event.current_stream_wait() finishes it."""
        _wait_for(previous_event)
        if handle is not None:
            buf = getattr(handle, "_v1_buffer", None)
            if buf is None:
                raise Error(f"rank {self.rank}: Buffer.dispatch: handle is not a handle of this Buffer's dispatch",
                            "bad_handle", self.rank)
            recv_x, _, _, _, ev = buf.dispatch(x, handle=handle, async_with_compute_stream=async_finish)
            return recv_x, None, None, None, None, ev
        if num_tokens_per_expert is None:
            raise Error(f"rank {self.rank}: Buffer.dispatch: num_tokens_per_expert (from get_dispatch_layout) is "
                        "needed with topk_idx", "invalid_argument", self.rank)
        E = int(num_tokens_per_expert.shape[0])
        out = self._fresh(x, topk_idx, topk_weights, E, expert_alignment, num_worst_tokens, async_finish)
        recv_x, recv_idx, recv_w, h, ev = out
        h._v1_buffer = self._buffers[self._key(x, topk_idx, E)]
        counts = [] if num_worst_tokens else list(h.num_recv_tokens_per_expert_aligned)
        return recv_x, recv_idx, recv_w, counts, h, ev

    def combine(self, x, handle, topk_weights=None, bias=None, config=None, previous_event=None, async_finish=False,
                allocate_on_comm_stream=False):
        """Collective. (combined_x, combined_topk_weights, event): the unweighted sum of each
        token's rows; topk_weights [N, K] (e.g. the gradient of recv_topk_weights) reduced
        to [S, K] (one more combine), None without it."""
        _wait_for(previous_event)
        buf = getattr(handle, "_v1_buffer", None)
        if buf is None:
            raise Error(f"rank {self.rank}: Buffer.combine: handle is not a handle of this Buffer's dispatch",
                        "bad_handle", self.rank)
        combined, cw, ev = buf.combine(x, handle, topk_weights, bias, async_with_compute_stream=async_finish)
        return combined, cw if topk_weights is not None else None, ev

    def low_latency_dispatch(self, *args, **kwargs):
        raise Error("Buffer.low_latency_dispatch is not provided: use epx.EPBuffer.dispatch", "unsupported")

    def low_latency_combine(self, *args, **kwargs):
        raise Error("Buffer.low_latency_combine is not provided: use epx.EPBuffer.combine", "unsupported")

    # -- one EPBuffer per shape ----------------------------------------------------------
    @staticmethod
    def _key(x, topk_idx, num_experts):
        data = x[0] if isinstance(x, (tuple, list)) else x
        return int(data.shape[1]), int(topk_idx.shape[1]), num_experts

    def _fresh(self, x, topk_idx, topk_weights, E, alignment, worst, async_finish):
        """A fresh dispatch on the EPBuffer of this shape, built or rebuilt (collectively)
        when the tokens outgrow it."""
        if self._destroyed:  # else a fresh dispatch would quietly build a new EPBuffer
            raise Error(f"rank {self.rank}: this Buffer was destroyed (destroy() was called)", "bad_handle", self.rank)
        key = self._key(x, topk_idx, E)
        S = int((x[0] if isinstance(x, (tuple, list)) else x).shape[0])
        for _ in range(2):
            buf = self._buffers.get(key)
            if buf is None:
                buf = self._build(key, S, isinstance(x, (tuple, list)))
            try:
                return buf.dispatch(x, topk_idx, topk_weights, num_experts=E, expert_alignment=alignment,
                                    num_worst_tokens=worst, async_with_compute_stream=async_finish)
            except Error as e:
                # the same error on every rank: every rank rebuilds, or none does
                if e.code != "capacity_exceeded" or "num_max_tokens_per_rank" not in str(e):
                    raise
                del self._buffers[key]  # its handles keep it alive as long as they are used
        raise Error(f"rank {self.rank}: Buffer.dispatch: no buffer holds this dispatch", "internal", self.rank)

    def _build(self, key, S, fp8):
        """The EPBuffer for `key`, sized for the most tokens any rank has now (rounded up to
        a power of two, at least 64): collective."""
        import torch
        import torch.distributed as dist
        H, K, E = key
        n = torch.tensor([S], dtype=torch.int64)
        dist.all_reduce(n, op=dist.ReduceOp.MAX, group=self.group)
        C = max(64, 1 << (int(n.item()) - 1).bit_length())
        buf = EPBuffer(self.group, num_max_tokens_per_rank=C, hidden=H, num_topk=K, num_experts=E,
                       use_fp8_dispatch=fp8 and H % 128 == 0)
        self._buffers[key] = buf
        return buf

