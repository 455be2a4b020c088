"""Buffer and Config: DeepEP V1's normal-mode API (what Megatron-LM's and SGLang's DeepEP
dispatchers call, and DeepEP's tests/legacy/test_intranode.py), on CPU tensors, over epx's
EPBuffer.

    import epx as deep_ep
    buffer = deep_ep.Buffer(group, num_nvl_bytes, num_rdma_bytes)
    num_tokens_per_rank, num_tokens_per_rdma_rank, num_tokens_per_expert, is_token_in_rank, _ = \\
        buffer.get_dispatch_layout(topk_idx, num_experts)
    recv_x, recv_topk_idx, recv_topk_weights, num_recv_tokens_per_expert_list, handle, event = \\
        buffer.dispatch(x, topk_idx=topk_idx, topk_weights=topk_weights, num_tokens_per_rank=...,
                        num_tokens_per_rdma_rank=..., is_token_in_rank=..., num_tokens_per_expert=...)
    combined_x, combined_topk_weights, event = buffer.combine(y, handle, topk_weights=...)

V1's dispatch output is epx's compact layout (docs/spec.md §3.1), DeepEP's intranode order:
one row per received token, ordered by (source rank, token); recv_topk_idx the local expert
or -1, recv_topk_weights 0 where it is -1. The per-expert list is num_tokens_per_expert
summed over the source ranks for this rank's experts, each rounded up to expert_alignment
(empty with num_worst_tokens). With topk_idx the rows go where topk_idx sends them (the layout
tensors must be its layout, as get_dispatch_layout gives it); without topk_idx
(layout-only, as DeepEP allows) they go where is_token_in_rank says, and recv_topk_idx /
recv_topk_weights are None.

The handle is DeepEP's intranode 6-tuple (rank_prefix_matrix, channel_prefix_matrix,
recv_channel_prefix_matrix, recv_src_idx, is_token_in_rank, send_head), with DeepEP's
shapes, dtypes and values (channels: config.num_sms // 2 equal token ranges, as DeepEP
splits them; send_head: a token's position in its channel's queue to that rank, -1 when not
sent). It also carries the EPHandle underneath (its fields, e.g. ``handle.recv_src``, read
through), and a plain tuple of its six fields works as the handle too.

A V1 Buffer is not sized by num_nvl_bytes: it keeps one EPBuffer per (hidden, num_topk,
num_experts), built collectively at the first dispatch of that shape for the largest token
count of any rank then (one all-reduce over the group), and rebuilt larger — on every rank,
since every rank sees the same capacity_exceeded error — when a later dispatch brings more
tokens. A fresh dispatch also all-gathers every rank's is_token_in_rank and
num_tokens_per_expert over the group (one all_gather_object) before any row moves: it
builds the handle and the per-expert list, and fails the call on every rank, naming the
rank, when any rank's layout is bad.

combine(topk_weights=) is DeepEP's: each token's weights come back as the float32 sum over
the ranks that received it of the whole row each passes (every slot, not only the slots
whose expert that rank holds; EPBuffer.combine counts only those).
"""
import weakref

import numpy as np

from . import _convert as cv
from . import _weights
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


class _Handle(tuple):
    """DeepEP V1's intranode handle: the 6-tuple (rank_prefix_matrix, channel_prefix_matrix,
    recv_channel_prefix_matrix, recv_src_idx, is_token_in_rank, send_head) its callers index
    and unpack, carrying the EPHandle of the dispatch underneath; the EPHandle's fields
    (recv_src, num_recv_tokens_per_expert, ...) read through as attributes."""

    def __new__(cls, fields, owner, buffer, ep_handle):
        h = super().__new__(cls, fields)
        h._owner, h._buffer, h._ep = owner, buffer, ep_handle
        return h

    def __copy__(self):  # immutable routing: a copy is the handle itself
        return self

    def __deepcopy__(self, memo):
        return self

    def __getattr__(self, name):
        ep = self.__dict__.get("_ep")
        if name.startswith("_") or ep is None:
            raise AttributeError(name)
        return getattr(ep, name)


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
        self._handles = {}  # id(recv_src_idx) -> (weakref to it, EPBuffer, EPHandle): plain-tuple handles
        self._destroyed = False

    # -- DeepEP V1's static helpers -----------------------------------------------------
    @staticmethod
    def is_sm90_compiled():
        """True: DeepEP asks it whether FP8 dispatch exists, and epx has it on CPU (x as the
        pair (uint8 raw E4M3 bits [S, H], float32 scales [S, H / 128]), H % 128 == 0)."""
        return True

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
        self._handles.clear()
        self._destroyed = True

    def _is_live(self):
        return not getattr(self, "_destroyed", True)

    # -- the calls ----------------------------------------------------------------------
    def get_dispatch_layout(self, topk_idx, num_experts, previous_event=None, async_finish=False,
                            allocate_on_comm_stream=False):
        """Local. (num_tokens_per_rank int32 [P], None (no RDMA ranks), num_tokens_per_expert
        int32 [E], is_token_in_rank bool [S, P], event)."""
        _wait_for(previous_event)
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
        num_recv_tokens_per_expert_list, handle, event); a cached dispatch (handle=, no
        topk_idx / topk_weights) returns (recv_x, None, None, None, None, event). A fresh
        one needs num_tokens_per_expert (its length is num_experts) and topk_idx or
        is_token_in_rank (module docstring). x: bf16 [S, H], or the FP8 pair (data, scales)
        with scales of any strides (DeepEP's tests pass them column-major). async_finish=True:
        the call returns once its puts are issued and event.current_stream_wait() finishes
        it (the handle's tensors hold their values at once)."""
        _wait_for(previous_event)
        x = _plain_x(x)
        if handle is not None:
            if topk_idx is not None or topk_weights is not None:
                raise Error(f"rank {self.rank}: Buffer.dispatch: a cached dispatch (handle=) takes no topk_idx or "
                            "topk_weights (as in DeepEP): it reuses the handle's routing", "invalid_argument",
                            self.rank)
            buf, eh = self._resolve(handle, "dispatch")
            recv_x, _, _, _, ev = buf.dispatch(x, handle=eh, async_with_compute_stream=async_finish)
            return recv_x, None, None, None, None, ev
        if self._destroyed:  # else a fresh dispatch would quietly build a new EPBuffer
            raise Error(f"rank {self.rank}: this Buffer was destroyed (destroy() was called)", "bad_handle", self.rank)
        f = cv.flavor_of(x)
        data = x[0] if isinstance(x, tuple) else x
        S = int(data.shape[0]) if len(getattr(data, "shape", ())) == 2 else -1
        prep = self._routing(S, topk_idx, is_token_in_rank, num_tokens_per_expert)
        info = self._exchange(prep)  # collective; raises on every rank if any rank's inputs are bad
        in_rank, route_idx, E = prep["in_rank"], prep["route_idx"], prep["num_experts"]
        recv_x, recv_idx, recv_w, eh, ev = self._fresh(x, route_idx, topk_weights if topk_idx is not None else None,
                                                       E, expert_alignment, num_worst_tokens, async_finish)
        buf = self._buffers[self._key(x, route_idx, E)]
        fields = self._handle_fields(info, in_rank, is_token_in_rank, config, num_worst_tokens, f)
        if int(fields[3].shape[0]) != int(eh.num_recv_rows):
            raise Error(f"rank {self.rank}: Buffer.dispatch: the handle counts {int(fields[3].shape[0])} rows, the "
                        f"dispatch received {eh.num_recv_rows}", "internal", self.rank)
        h = _Handle(fields, self, buf, eh)
        self._remember(h)
        L = E // self.group_size
        per_expert = info["num_tokens_per_expert"][:, self.rank * L:(self.rank + 1) * L].sum(axis=0)
        a = max(1, int(expert_alignment))
        counts = [] if num_worst_tokens else [int((n + a - 1) // a * a) for n in per_expert]
        if topk_idx is None:
            recv_idx = recv_w = None
        return recv_x, recv_idx, recv_w, counts, h, ev

    def combine(self, x, handle, topk_weights=None, bias=None, config=None, previous_event=None, async_finish=False,
                allocate_on_comm_stream=False):
        """Collective. (combined_x, combined_topk_weights, event): combined_x the unweighted
        sum of each token's rows (plus bias); topk_weights [N, K] float32 (e.g. the gradient
        of recv_topk_weights): combined_topk_weights [S, K] is, as in DeepEP, the float32 sum
        over the ranks that received each token of the row they pass — every slot, not only
        the slots whose expert they hold — exact (each rank's row travels as three bf16
        parts in columns of its own: one more combine per H // K of the 3 P parts); None
        without topk_weights."""
        _wait_for(previous_event)
        buf, eh = self._resolve(handle, "combine")
        reduced = None
        if topk_weights is not None:
            reduced = self._weights_back(buf, eh, topk_weights, cv.flavor_of(x))
        combined, _, ev = buf.combine(x, eh, None, bias, async_with_compute_stream=async_finish)
        return combined, reduced, ev

    def low_latency_dispatch(self, *args, **kwargs):
        raise Error("Buffer.low_latency_dispatch is not provided: use epx.EPBuffer.dispatch", "unsupported")

    def low_latency_combine(self, *args, **kwargs):
        raise Error("Buffer.low_latency_combine is not provided: use epx.EPBuffer.combine", "unsupported")

    # -- routing, the handle ---------------------------------------------------------------
    def _routing(self, S, topk_idx, is_token_in_rank, num_tokens_per_expert):
        """This rank's side of a fresh dispatch, checked locally: {problem, code, in_rank
        (bool [S, P] numpy: where the rows go), route_idx (what EPBuffer routes by: topk_idx,
        or one slot per destination rank made from is_token_in_rank), num_experts,
        num_tokens_per_expert}. A problem is raised later, on every rank (_exchange)."""
        from . import _epx
        P, me = self.group_size, self.rank
        out = {"problem": "", "code": "", "in_rank": np.zeros((max(S, 0), P), dtype=bool), "route_idx": None,
               "num_experts": 0, "num_tokens_per_expert": np.zeros(0, dtype=np.int64)}
        try:
            if num_tokens_per_expert is None or (topk_idx is None and is_token_in_rank is None):
                raise Error("Buffer.dispatch: a fresh dispatch needs num_tokens_per_expert and topk_idx or "
                            "is_token_in_rank (get_dispatch_layout's), as DeepEP's does", "invalid_argument")
            npe = cv.to_numpy(num_tokens_per_expert)
            E = int(npe.shape[0]) if npe.ndim == 1 else -1
            if E <= 0 or E % P:
                raise Error(f"Buffer.dispatch: num_tokens_per_expert must be [num_experts], num_experts a positive "
                            f"multiple of the group size {P}, got shape {list(npe.shape)}", "shape_mismatch")
            if S < 0:
                raise Error("Buffer.dispatch: x must be [num_tokens, hidden] (or the FP8 pair)", "shape_mismatch")
            out["num_experts"], out["num_tokens_per_expert"] = E, npe.astype(np.int64)
            if topk_idx is not None:
                r = _epx.dispatch_layout(cv.plain(topk_idx), E, P, me, "numpy")
                in_rank = np.asarray(r["is_token_in_rank"]).view(np.bool_).reshape(-1, P)
                out["route_idx"] = topk_idx
            else:
                in_rank = np.asarray(cv.to_numpy(is_token_in_rank)).astype(bool)
                if in_rank.shape != (S, P):
                    raise Error(f"Buffer.dispatch: is_token_in_rank must be bool [num_tokens, num_ranks] = [{S}, {P}], "
                                f"got {list(in_rank.shape)}", "shape_mismatch")
                L = E // P
                idx = np.where(in_rank, (np.arange(P, dtype=np.int64) * L)[None, :], np.int64(-1))
                out["route_idx"] = cv.from_numpy(idx, cv.flavor_of(is_token_in_rank))
            if in_rank.shape[0] != S:
                raise Error(f"Buffer.dispatch: topk_idx has {in_rank.shape[0]} rows, x has {S}", "shape_mismatch")
            out["in_rank"] = in_rank
        except Error as e:
            out["problem"], out["code"] = str(e), e.code
        return out

    def _exchange(self, prep):
        """Every rank's (problem, S, is_token_in_rank, num_tokens_per_expert), all-gathered over
        the group. Raises on every rank when any rank's inputs were bad (naming that rank)."""
        import torch.distributed as dist
        mine = (prep["problem"], prep["code"], int(prep["in_rank"].shape[0]), np.packbits(prep["in_rank"], axis=None),
                prep["num_tokens_per_expert"], prep["num_experts"])
        every = [None] * self.group_size
        dist.all_gather_object(every, mine, group=self.group)
        for r, (problem, code, *_rest) in enumerate(every):
            if problem:
                raise Error(f"rank {r}: {problem}", code, r)
        Es = {e[5] for e in every}
        if len(Es) != 1:
            raise Error(f"rank {self.rank}: Buffer.dispatch: the ranks pass different num_experts {sorted(Es)}",
                        "invalid_argument", self.rank)
        P = self.group_size
        in_ranks = [np.unpackbits(bits, count=n * P).astype(bool).reshape(n, P) for _, _, n, bits, _, _ in every]
        return {"tokens": [e[2] for e in every], "in_rank": in_ranks,
                "num_tokens_per_expert": np.stack([e[4] for e in every])}

    def _handle_fields(self, info, in_rank, given_in_rank, config, worst, f):
        """DeepEP's intranode handle fields (module docstring), in the caller's flavour."""
        P, me = self.group_size, self.rank
        C = max(1, int((config or Buffer.get_dispatch_config(P)).num_sms) // 2)

        def channels(n):  # DeepEP's channel of each of n tokens: C equal ranges
            per = -(-n // C) if n else 1
            return np.arange(n) // per

        counts = np.array([[int(ir[:, d].sum()) for d in range(P)] for ir in info["in_rank"]], dtype=np.int64)
        rank_prefix = np.cumsum(counts, axis=0).astype(np.int32)
        chan = channels(in_rank.shape[0])
        channel_prefix = np.zeros((P, C), dtype=np.int32)
        send_head = np.full(in_rank.shape, -1, dtype=np.int32)
        for d in range(P):
            sent = in_rank[:, d]
            per_channel = np.bincount(chan[sent], minlength=C)
            channel_prefix[d] = np.cumsum(per_channel)
            start = np.concatenate([[0], np.cumsum(per_channel)[:-1]])
            pos = np.cumsum(sent) - 1 - start[chan]
            send_head[sent, d] = pos[sent]
        recv_channel_prefix = np.zeros((P, C), dtype=np.int32)
        src_idx = []
        for s, ir in enumerate(info["in_rank"]):
            tokens = np.nonzero(ir[:, me])[0]
            src_idx.append(tokens)
            per_channel = np.bincount(channels(ir.shape[0])[tokens], minlength=C)
            recv_channel_prefix[s] = np.concatenate([[0], np.cumsum(per_channel)[:-1]])
        recv_src_idx = np.concatenate(src_idx).astype(np.int32) if src_idx else np.zeros(0, dtype=np.int32)
        if worst:
            recv_src_idx = np.concatenate([recv_src_idx, np.full(max(0, worst - recv_src_idx.shape[0]), -1,
                                                                 dtype=np.int32)])
        if given_in_rank is None:
            given_in_rank = cv.from_numpy(in_rank, f)
        return tuple(cv.from_numpy(a, f) if isinstance(a, np.ndarray) else a for a in
                     (rank_prefix, channel_prefix, recv_channel_prefix, recv_src_idx, given_in_rank, send_head))

    def _remember(self, h):
        """A plain tuple of the handle's fields finds its dispatch again (by its recv_src_idx)."""
        key_obj = h[3]
        key = id(key_obj)
        self._handles[key] = (weakref.ref(key_obj), h._buffer, h._ep)
        weakref.finalize(key_obj, self._handles.pop, key, None)

    def _resolve(self, handle, what):
        """(EPBuffer, EPHandle) of a handle of this Buffer's dispatch."""
        if isinstance(handle, _Handle) and handle._owner is self:
            return handle._buffer, handle._ep
        if isinstance(handle, (tuple, list)) and len(handle) == 6:
            entry = self._handles.get(id(handle[3]))
            if entry is not None and entry[0]() is handle[3]:
                return entry[1], entry[2]
        raise Error(f"rank {self.rank}: Buffer.{what}: handle is not a handle of this Buffer's dispatch (the 6-tuple "
                    "its dispatch returned)", "bad_handle", self.rank)

    def _weights_back(self, buf, eh, weights, f):
        """combine's topk_weights, DeepEP's way (combine's docstring): float32 [S, K]."""
        w = cv.to_numpy(weights)
        N = int(eh.num_recv_rows)
        if w.ndim != 2 or w.shape[0] != N or w.dtype != np.float32:
            raise Error(f"rank {self.rank}: Buffer.combine: topk_weights must be float32 [{N}, num_topk] (the "
                        f"dispatch's rows), got {w.dtype} {list(w.shape)}", "shape_mismatch", self.rank)
        K, H = int(w.shape[1]), int(buf.hidden)
        if K > H:
            raise Error(f"rank {self.rank}: Buffer.combine: topk_weights on the way back need hidden >= num_topk "
                        f"(hidden {H}, num_topk {K})", "shape_mismatch", self.rank)
        real = cv.to_numpy(eh.recv_src)[:, 0] >= 0  # padding rows (num_worst_tokens) carry nothing
        rounds = _weights.rank_rounds(self.group_size, K, H)
        combined = []
        for units in rounds:
            packed = _weights.pack_rank_round(w, real, self.rank, K, H, units)
            c, _, _ = buf.combine(cv.from_numpy(packed, f, bf16=True), eh)
            combined.append(np.array(cv.to_numpy(c)))
        return cv.from_numpy(_weights.unpack_rank_rounds(combined, rounds, self.group_size, K), f)

    # -- one EPBuffer per shape ----------------------------------------------------------
    @staticmethod
    def _key(x, topk_idx, num_experts):
        data = x[0] if isinstance(x, (tuple, list)) else x
        return int(data.shape[1]), int(topk_idx.shape[1]), num_experts

    def _fresh(self, x, topk_idx, topk_weights, E, alignment, worst, async_finish):
        """A fresh dispatch on the EPBuffer of this shape, built or rebuilt (collectively)
        when the tokens outgrow it."""
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


def _plain_x(x):
    """x as EPBuffer takes it: an FP8 pair becomes a tuple with C-contiguous scales (DeepEP
    reads the scales' strides; its tests pass them column-major)."""
    if not isinstance(x, (tuple, list)):
        return x
    if len(x) != 2:
        return tuple(x)
    data, scales = x
    if cv.is_torch(scales):
        scales = scales.contiguous()
    elif scales is not None:
        scales = np.ascontiguousarray(scales)
    return data, scales


# The names that say what these classes are, next to DeepEP's (deep_ep.Buffer / deep_ep.Config,
# kept): DeepEP V1's normal-mode API, not the EP buffer itself (that is EPBuffer, which
# epx::EPBuffer is in C++).
LegacyBuffer = Buffer
LegacyConfig = Config
