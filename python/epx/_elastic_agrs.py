"""ElasticBuffer's agrs methods (DeepEP 2.1.0's names), as a mixin over the buffer kind epx
already has. Relies on what ElasticBuffer.__init__ sets before anything else: self.group
(the torch.distributed group, None = default), self.rank_idx, self.num_ranks,
self.num_bytes, self.num_cpu_bytes, self.num_cpu_timeout_secs, self.transport_kind
("auto" unless given); ElasticBuffer.destroy() calls self._destroy_agrs().

The all-gathers run on an epx.BucketBuffer over the group's transport whose storage is the
session area (agrs_set_config makes it, collectively, as DeepEP's call is a barrier). A
session lays its gathers out one after another in that storage, DeepEP's way: gather k of
a session takes align(num_ranks * bytes, 32) bytes after gather k-1's, and this rank's
in-place tensor for it is its rank_idx-th shard there. The bucket engine runs one call at a
time: a gather issued while an earlier one is pending first completes the earlier one (its
handle then returns at once), so up to num_max_all_gathers_per_session gathers may be in
flight from the caller's view, as on the GPU.
"""
import math

from .errors import Error
from ._sizes import align as _align, itemsize as _itemsize

_ALIGNMENT = 2 << 20  # DeepEP's buffer alignment
_MAX_ALL_GATHERS_PER_SESSION = 32  # DeepEP's kNumMaxInflightAGRS



def _group_size(group):
    """The number of ranks of `group` (a ProcessGroup, None = the default group, or an int)."""
    if isinstance(group, int):
        return group
    if group is not None and hasattr(group, "size"):
        return group.size()
    import torch.distributed as dist
    return dist.get_world_size(group)


def _shape_list(shapes):
    """(batched, [shape, ...]): DeepEP's rule — a sequence whose first item is a tuple (a
    torch.Size is one) is a batch of shapes, anything else one shape."""
    batched = len(shapes) > 0 and isinstance(shapes[0], (tuple, list))
    return batched, [tuple(int(d) for d in s) for s in (shapes if batched else [shapes])]


class _AgrsHandle:
    """The wait handle of one all_gather: calling it waits for the gathered data (DeepEP's
    handle). Valid within the session that issued the gather."""

    def __init__(self, owner, session, event):
        self._owner, self._session, self._event = owner, session, event

    def __call__(self):
        o = self._owner
        if not o._agrs_in_session or o._agrs_session_idx != self._session:
            raise Error(f"rank {o.rank_idx}: all_gather handle: called after its session ended (call it before "
                        f"destroy_agrs_session)", "bad_handle", o.rank_idx)
        o._agrs_wait(self._event)


class AgrsMixin:
    _agrs_bucket = None
    _agrs_session_bytes = 0
    _agrs_max_gathers = 0
    _agrs_in_session = False
    _agrs_session_idx = 0
    _agrs_offset = 0
    _agrs_slot = 0
    _agrs_pending = None

    # -- sizes (static, as DeepEP) ------------------------------------------------------
    @staticmethod
    def get_agrs_num_max_session_bytes(group, shapes, dtype):
        """Bytes one session needs for gathering tensors of `shapes` (this rank's shapes;
        one shape or a sequence of them) of `dtype` on `group`: each gather takes
        align(group size * bytes, 32)."""
        _, shapes = _shape_list(shapes)
        n, item = _group_size(group), _itemsize(dtype)
        return sum(_align(n * math.prod(s) * item, 32) for s in shapes)

    @staticmethod
    def get_agrs_buffer_size_hint(group, num_max_session_bytes):
        """num_bytes for a buffer whose sessions use up to num_max_session_bytes (2 MiB aligned)."""
        del group
        return _align(int(num_max_session_bytes), _ALIGNMENT)

    # -- configuration and sessions -------------------------------------------------------
    def agrs_set_config(self, num_max_session_bytes, num_max_all_gathers_per_session):
        """Collective: the session area (num_max_session_bytes, within the buffer's
        num_bytes) and the most all_gather calls per session (1..32). Makes the area anew."""
        num_max_session_bytes, n = int(num_max_session_bytes), int(num_max_all_gathers_per_session)
        r = self.rank_idx
        if self._agrs_in_session:
            raise Error(f"rank {r}: agrs_set_config: called inside an AGRS session (destroy_agrs_session first)",
                        "invalid_argument", r)
        if num_max_session_bytes <= 0 or not 0 < n <= _MAX_ALL_GATHERS_PER_SESSION:
            raise Error(f"rank {r}: agrs_set_config: num_max_session_bytes = {num_max_session_bytes} and "
                        f"num_max_all_gathers_per_session = {n}, expected > 0 and 1..{_MAX_ALL_GATHERS_PER_SESSION}",
                        "invalid_argument", r)
        budget = getattr(self, "num_bytes", None)
        if budget is not None and num_max_session_bytes > budget:
            raise Error(f"rank {r}: agrs_set_config: num_max_session_bytes = {num_max_session_bytes} exceeds the "
                        f"buffer's num_bytes = {budget} (size it with get_agrs_buffer_size_hint)",
                        "capacity_exceeded", r)
        self._destroy_agrs()
        from .bucket import BucketBuffer
        size = _align(num_max_session_bytes, 32)
        self._agrs_bucket = BucketBuffer([list(range(self.num_ranks))], size, transport=self.transport_kind,
                                         num_cpu_timeout_secs=self.num_cpu_timeout_secs, transport_group=self.group)
        self._agrs_session_bytes, self._agrs_max_gathers = size, n

    def create_agrs_session(self):
        """Begins a session: its gathers are laid out from the start of the session area."""
        r = self.rank_idx
        if self._agrs_in_session:
            raise Error(f"rank {r}: create_agrs_session: a session is open already (destroy_agrs_session first)",
                        "invalid_argument", r)
        self._agrs_in_session = True
        self._agrs_offset = self._agrs_slot = 0
        self._agrs_session_idx += 1

    def destroy_agrs_session(self):
        """Ends the session: waits for its gathers; their results are not to be used after."""
        r = self.rank_idx
        if not self._agrs_in_session:
            raise Error(f"rank {r}: destroy_agrs_session: no session is open", "invalid_argument", r)
        self._agrs_in_session = False
        pending, self._agrs_pending = self._agrs_pending, None
        if pending is not None:
            pending.wait()

    def agrs_new_session(self, enabled=True):
        """``with buf.agrs_new_session():`` create_agrs_session, then destroy_agrs_session at
        the end of the block; a no-op when not `enabled`."""
        return _Session(self, enabled)

    # -- tensors and gathers ----------------------------------------------------------------
    def agrs_get_inplace_tensor(self, shapes, dtype):
        """This rank's slot of the next gather(s) of the session, as tensors of `shapes` (one
        shape: one tensor; a sequence of shapes: a tuple, for one batched all_gather). Filled
        and passed to all_gather, they are gathered without a copy."""
        batched, shapes = _shape_list(shapes)
        self._agrs_check("agrs_get_inplace_tensor")
        item, n, out, off = _itemsize(dtype), self.num_ranks, [], self._agrs_offset
        storage = self._agrs_bucket.storage
        for s in shapes:
            nb = math.prod(s) * item
            if off + nb * n > self._agrs_session_bytes or self._agrs_slot >= self._agrs_max_gathers:
                self._agrs_full("agrs_get_inplace_tensor", off + nb * n)
            out.append(storage.narrow(0, off + nb * self.rank_idx, nb).view(dtype).view(s))
            off += _align(nb * n, 32)
        return tuple(out) if batched else out[0]

    def all_gather(self, t):
        """Gathers every rank's `t` (a tensor, or a sequence of them: one batched gather)
        within the open session. Returns (gathered, handle) for a tensor, (*gathered, handle)
        for a sequence: gathered[i] is [num_ranks, *t[i].shape] with rank j's tensor at [j],
        a view of the session area (valid until the session ends), to be read once
        handle() returned. A tensor from agrs_get_inplace_tensor is gathered in place."""
        import torch
        single = isinstance(t, torch.Tensor)
        tensors = [t] if single else list(t)
        self._agrs_check("all_gather")
        r, n = self.rank_idx, self.num_ranks
        if not tensors:
            raise Error(f"rank {r}: all_gather: no tensors", "invalid_argument", r)
        storage, base = self._agrs_bucket.storage, self._agrs_bucket.storage.data_ptr()
        off, offsets, inplace = self._agrs_offset, [], []
        for i, x in enumerate(tensors):
            if not isinstance(x, torch.Tensor) or x.device.type != "cpu" or not x.is_contiguous():
                raise Error(f"rank {r}: all_gather: tensor {i} is not a contiguous CPU tensor", "invalid_argument", r)
            nb = x.numel() * x.element_size()
            at = x.data_ptr() - base
            own = 0 <= at < self._agrs_session_bytes
            if own and at != off + nb * r:
                raise Error(f"rank {r}: all_gather: tensor {i} lies in the session area at byte {at}, but this "
                            f"gather's slot for rank {r} is at byte {off + nb * r} (pass the tensors of "
                            f"agrs_get_inplace_tensor in the order they were made, or tensors outside the buffer)",
                            "invalid_argument", r)
            offsets.append(off)
            inplace.append(own)
            off += _align(nb * n, 32)
        if off > self._agrs_session_bytes or self._agrs_slot >= self._agrs_max_gathers:
            self._agrs_full("all_gather", off)
        # the engine runs one call at a time: the previous gather completes first
        self._agrs_wait(self._agrs_pending)
        self._agrs_offset, self._agrs_slot = off, self._agrs_slot + 1
        outs = [storage.narrow(0, o, x.numel() * x.element_size() * n).view(x.dtype).view(n, *x.shape)
                for o, x in zip(offsets, tensors)]
        live = [i for i, x in enumerate(tensors) if x.numel() > 0]
        event = None
        if live:
            b = self._agrs_bucket
            if not any(inplace[i] for i in live):
                # out of place: the engine writes every rank's tensor into the session area
                event = b.all_gather([tensors[i].view(-1) for i in live], [outs[i].view(-1) for i in live])
            else:
                # in place: each tensor as this rank's shard of its slot (the others copied there first)
                srcs = []
                for i in live:
                    mine = outs[i][r]
                    if not inplace[i]:
                        mine.copy_(tensors[i])
                    srcs.append(mine.view(-1))
                event = b.all_gather(srcs)
        self._agrs_pending = event
        handle = _AgrsHandle(self, self._agrs_session_idx, event)
        return (outs[0], handle) if single else (*outs, handle)

    # -- internals ---------------------------------------------------------------------
    def _agrs_check(self, call):
        r = self.rank_idx
        if self._agrs_bucket is None:
            raise Error(f"rank {r}: {call}: AGRS is not configured (call agrs_set_config first)", "invalid_argument", r)
        if not self._agrs_in_session:
            raise Error(f"rank {r}: {call}: no AGRS session is open (create_agrs_session or agrs_new_session first)",
                        "invalid_argument", r)

    def _agrs_full(self, call, need):
        r = self.rank_idx
        raise Error(f"rank {r}: {call}: the session is full: {need} bytes of {self._agrs_session_bytes} "
                    f"(num_max_session_bytes), gather {self._agrs_slot + 1} of at most {self._agrs_max_gathers} "
                    f"(num_max_all_gathers_per_session); end the session (destroy_agrs_session) and open a new one",
                    "capacity_exceeded", r)

    def _agrs_wait(self, event):
        if event is not None and event is self._agrs_pending:
            self._agrs_pending = None
        if event is not None:
            event.wait()

    def _destroy_agrs(self):
        """Collective: the session area goes (its views keep their memory)."""
        pending, self._agrs_pending = self._agrs_pending, None
        if pending is not None:
            try:
                pending.wait()
            finally:
                pending = None
        if self._agrs_bucket is not None:
            b, self._agrs_bucket = self._agrs_bucket, None
            b.destroy()
        self._agrs_in_session = False
        self._agrs_session_bytes = self._agrs_max_gathers = 0


class _Session:
    def __init__(self, owner, enabled):
        self._owner, self._enabled = owner, enabled

    def __enter__(self):
        if self._enabled:
            self._owner.create_agrs_session()
        return None

    def __exit__(self, *exc):
        if self._enabled:
            self._owner.destroy_agrs_session()
        return False
