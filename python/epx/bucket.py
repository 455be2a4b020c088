"""BucketBuffer and BufferAllocator (DeepEP V2.5's names): all-gather, reduce-scatter and
all-reduce on symmetric storage, for PyTorch and NumPy (the math is docs/spec.md §8).

    plan = epx.BufferAllocator()
    grads = plan.allocate((1 << 20,), torch.float32)   # a placeholder ...
    buf = epx.BucketBuffer(dist.group.WORLD, plan)     # ... now a view of the buffer's storage
    grads.copy_(local_grads)
    buf.all_reduce(grads, scale=1 / world_size).wait() # in place, bitwise identical on every rank

Every collective must be called by every member of its group in the same order (ranks
outside the group do not call it). A bad input on any member raises epx.Error on every
member, naming the argument, the rank and what was expected. Tensors are torch tensors or
numpy arrays, CPU, C-contiguous; outside a session they must be views of ``buf.storage``
(all_gather's srcs may lie anywhere when dsts are given). Every call returns an
EventOverlap: ``wait()`` returns the result (one tensor in, one out; a list in, a list
out) and until then the inputs must stay unchanged; another call on the buffer while one is
pending raises epx.Error. The GIL is released while a call runs.
"""
import math

import numpy as np

from . import _epx
from .buffer import EventOverlap
from ._lifecycle import BufferLifecycle
from .errors import Error
from .group import _healed, transport_of
from ._sizes import align as _align

_ALIGNMENT = 2 << 20  # DeepEP's planned-tensor alignment (epx::kBufferAlignment)
_SESSION_ALIGNMENT = 64
_MAX_GROUPS = 8


def _torch():
    import torch
    return torch


def _is_torch(t):
    return type(t).__module__.startswith("torch")


def _nbytes(t):
    return t.numel() * t.element_size() if _is_torch(t) else t.nbytes


def _ptr(t):
    return t.data_ptr() if _is_torch(t) else t.__array_interface__["data"][0]


def _itemsize(t):
    return t.element_size() if _is_torch(t) else t.itemsize


def _is_float32(t):
    return t.dtype == _torch().float32 if _is_torch(t) else t.dtype == np.float32


def _problem(t, name):
    """What is wrong with tensor `t` as argument `name`, or None."""
    if _is_torch(t):
        if t.device.type != "cpu":
            return f"{name}: a {t.device.type} tensor, expected a CPU tensor"
        if not t.is_contiguous():
            return f"{name}: not contiguous"
        return None
    if isinstance(t, np.ndarray):
        return None if t.flags["C_CONTIGUOUS"] else f"{name}: not C-contiguous"
    return f"{name}: a {type(t).__name__}, expected a torch tensor or a numpy array"


class _Placeholder:
    """A planned numpy tensor: ``array`` (and np.asarray(p)) is its view of the buffer's
    storage once a BucketBuffer materialised the plan."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype, self.array = tuple(shape), np.dtype(dtype), None

    def __array__(self, dtype=None):
        if self.array is None:
            raise Error("BufferAllocator: this tensor is not materialised yet (build a BucketBuffer or PPBuffer from the plan)",
                        "invalid_argument")
        return self.array if dtype is None else self.array.astype(dtype)


class BufferAllocator:
    """Plans tensors of a BucketBuffer before it exists: ``allocate(shape, dtype)`` appends one
    at the next multiple of 2 MiB and returns a placeholder — a torch tensor for a torch
    dtype (it becomes a view of the storage in place, Tensor.set_, when the buffer is built),
    else an object whose ``array`` becomes the numpy view. ``num_bytes``: the storage the plan
    needs. Every rank must plan the same list (a difference fails the BucketBuffer on every
    rank, naming the first differing entry and the rank)."""

    def __init__(self):
        self.alignment = _ALIGNMENT
        self.allocations = []  # (placeholder, offset, nbytes, name, shape, dtype name)
        self.num_bytes = 0
        self.materialized = False

    def allocate(self, shape, dtype, name=None):
        if self.materialized:
            raise Error("BufferAllocator.allocate: a materialised plan cannot be changed", "invalid_argument")
        shape = (shape,) if isinstance(shape, int) else tuple(int(s) for s in shape)
        if any(s < 0 for s in shape):
            raise Error(f"BufferAllocator.allocate: negative dimension in {shape}", "invalid_argument")
        if _is_torch_dtype(dtype):
            torch = _torch()
            placeholder = torch.empty(shape, dtype=dtype)  # untouched pages: no memory until written
            nbytes, dname = placeholder.numel() * placeholder.element_size(), str(dtype).replace("torch.", "")
        else:
            placeholder = _Placeholder(shape, dtype)
            nbytes, dname = math.prod(shape) * placeholder.dtype.itemsize, placeholder.dtype.name
        offset = _align(self.num_bytes, self.alignment)
        name = name if name is not None else f"tensor{len(self.allocations)}"
        self.allocations.append((placeholder, offset, nbytes, name, shape, dname))
        self.num_bytes = _align(offset + nbytes, self.alignment)
        return placeholder

    def _entries(self):
        """(name, shape, dtype name, bytes) per tensor: what the ranks agree on (the dtype also in
        the name, for the dtypes epx plans as raw bytes)."""
        return [(f"{name} ({dname})", list(shape), dname, nbytes) for _, _, nbytes, name, shape, dname in self.allocations]

    def materialize(self, storage):
        """Makes every placeholder a view of `storage` (uint8, num_bytes long). Once."""
        if self.materialized:
            raise Error("BufferAllocator.materialize: a plan is materialised once", "invalid_argument")
        for placeholder, offset, nbytes, _, shape, _ in self.allocations:
            if isinstance(placeholder, _Placeholder):
                arr = np.asarray(storage)[offset:offset + nbytes] if not _is_torch(storage) else storage.numpy()[offset:offset + nbytes]
                placeholder.array = arr.view(placeholder.dtype).reshape(placeholder.shape)
            else:
                view = storage.narrow(0, offset, nbytes).view(placeholder.dtype).view(shape)
                placeholder.set_(view)
        self.materialized = True


def _is_torch_dtype(dtype):
    return type(dtype).__module__.startswith("torch")



def _pack(*lists):
    """(packed, lists): one tensor becomes [tensor] (packed = True); None becomes []."""
    packed = not isinstance(lists[0], (list, tuple))
    out = [[] if x is None else [x] if not isinstance(x, (list, tuple)) else list(x) for x in lists]
    return packed, out


class BucketSession:
    """``with buf.session() as s:`` — inside, the collectives also take tensors outside the
    storage: they are staged into it (``offset`` onwards; by default the storage past the
    plan's tensors — BucketBuffer(..., session_bytes=N) reserves room there — or the whole
    storage of a buffer built from a byte count, as DeepEP) and the results copied back at wait(): all_gather into its dsts, reduce_scatter into the
    caller's own shard of its src, all_reduce into its src. ``s.allocate(shapes, dtype)``
    gives staging tensors for zero-copy use. Every collective of a session uses one group.
    Running out of staging space raises epx.Error (on every member) instead of overwriting."""

    def __init__(self, buffer, offset=None):
        self.buffer = buffer
        self.start = buffer._plan_bytes if offset is None else int(offset)
        self.cursor = self.start
        self.group = None

    def __enter__(self):
        if self.buffer._session is not None:
            raise Error("BucketBuffer.session: nested sessions are not supported", "invalid_argument")
        self.buffer._session = self
        self.cursor, self.group = self.start, None
        return self

    def __exit__(self, *exc):
        self.buffer._session = None

    def _take(self, nbytes):
        """Storage offset of `nbytes` of staging, or None when it does not fit."""
        off = _align(self.cursor, _SESSION_ALIGNMENT)
        if off + nbytes > self.buffer.num_bytes:
            return None
        self.cursor = off + nbytes
        return off

    def allocate(self, shapes, dtype=None, group=None):
        """Staging tensors of `shapes` (one shape, or a list of shapes) in the storage."""
        b = self.buffer
        batched = len(shapes) > 0 and isinstance(shapes[0], (list, tuple))
        out = []
        for shape in (shapes if batched else [shapes]):
            proto = b._empty(shape, dtype)
            off = self._take(_nbytes(proto))
            if off is None:
                raise Error(f"rank {b.rank}: BucketSession.allocate: out of staging storage ({b.num_bytes - self.cursor} "
                            f"bytes left of {b.num_bytes - self.start})", "capacity_exceeded", b.rank)
            out.append(b._view(off, proto))
        return tuple(out) if batched else out[0]


class BucketBuffer(BufferLifecycle):
    """Symmetric storage on one or more groups (DeepEP V2.5's BucketBuffer).

    group: a torch.distributed ProcessGroup or a list of ranks, or a list of up to 8 of
        them (subsets of the default group's ranks: the world, halves, pairs, rails), the
        same on every rank of the default group, which builds the buffer collectively.
        A group may also be each rank's own of its kind, as ProcessGroups (ranks 0, 1 pass [dp01, tp...], ranks
        2, 3 pass [dp23, tp...], as data- and tensor-parallel groups are made): group i is
        then this rank's group of role i, every rank of it must pass that same group as its
        i-th, and all the groups of all roles together count against the 8.
    allocation_plan_or_num_bytes: a BufferAllocator (its tensors become views of the
        storage) or the storage's size in bytes.
    transport, num_cpu_timeout_secs: as EPBuffer (the default group's shared transport).
    transport_group: build the buffer over this torch.distributed group's transport instead
        (only its ranks take part; `group` then names ranks of it: a list of its ranks, or
        this group itself). A group epx.agree_and_rebuild returned is taken as its own
        transport_group.
    chunk_bytes, algorithm: epx::BucketOptions (0 / "auto" unless measuring).
    session_bytes: storage for sessions' staging past the plan's tensors (or added to num_bytes).
    """

    def __init__(self, group, allocation_plan_or_num_bytes, *, transport="auto", num_cpu_timeout_secs=300,
                 explicitly_destroy=False, chunk_bytes=0, algorithm="auto", session_bytes=0, transport_group=None):
        plan = allocation_plan_or_num_bytes if isinstance(allocation_plan_or_num_bytes, BufferAllocator) else None
        num_bytes = plan.num_bytes if plan is not None else int(allocation_plan_or_num_bytes)
        if plan is not None and plan.materialized:
            raise Error("BucketBuffer: the allocation plan is materialised already", "invalid_argument")
        entries = plan._entries() if plan is not None else []
        if plan is not None and session_bytes > 0:  # staging room past the plan's tensors
            entries.append(("session staging", [int(session_bytes)], "uint8", int(session_bytes)))
            num_bytes += _align(int(session_bytes), _ALIGNMENT)
        elif session_bytes > 0:
            num_bytes += int(session_bytes)
        single = not isinstance(group, (list, tuple)) or (len(group) > 0 and all(isinstance(r, int) for r in group))
        self.groups = [group] if single else list(group)
        self.explicitly_destroy = explicitly_destroy
        self._session = None
        self._plan_bytes = plan.num_bytes if plan is not None else 0
        if transport_group is None and single and _healed(group) is not None:
            transport_group = group  # a group rebuilt over the survivors is its own transport's group
        self._transport_group = transport_group
        self._transport = transport_of(transport_group, transport, num_cpu_timeout_secs)
        if transport_group is not None:
            ranks, every = _local_groups_ranks(self.groups, transport_group, self._transport.num_ranks), None
        else:
            ranks, every = _groups_ranks(self.groups)
        # the native buffer serves the distinct groups of every rank; role i of this rank is one of them
        self._native_groups, self._native_idx = ranks, list(range(len(ranks)))
        if every is not None:
            self._native_groups, self._native_idx = _union_of_roles(ranks, every)
        self.runtime = _epx.BucketBuffer(self._transport, self._native_groups, num_bytes, entries, int(chunk_bytes),
                                         str(algorithm))
        self.rank, self.num_ranks, self.num_bytes = self.runtime.rank, self.runtime.num_ranks, num_bytes
        self._group_ranks = ranks
        self.storage = self.runtime.storage("torch" if _torch_loaded() else "numpy")
        if not _is_torch(self.storage):
            self.storage = np.asarray(self.storage)
        if plan is not None:
            plan.materialize(self.storage)

    # -- groups ------------------------------------------------------------------------
    def get_context_idx(self, group=None):
        """The index of `group` among the buffer's groups (None: the only one; an int: that
        index), -1 if the buffer does not have it."""
        if isinstance(group, int):
            if not 0 <= group < len(self.groups):
                raise Error(f"rank {self.rank}: BucketBuffer: group {group} unknown (this buffer has {len(self.groups)})",
                            "invalid_argument", self.rank)
            return group
        if group is None:
            if len(self.groups) > 1:
                raise Error(f"rank {self.rank}: BucketBuffer: `group` is required when the buffer has "
                            f"{len(self.groups)} groups", "invalid_argument", self.rank)
            return 0
        for i, g in enumerate(self.groups):
            if g is group or (isinstance(group, (list, tuple)) and list(group) == self._group_ranks[i]):
                return i
        return -1

    def _members(self, group):
        """(index, world ranks) of `group`; index -1 for a group the buffer does not have."""
        idx = self.get_context_idx(group)
        if idx >= 0:
            return idx, self._group_ranks[idx]
        if self._transport_group is not None:
            return -1, _local_groups_ranks([group], self._transport_group, self.num_ranks)[0]
        return -1, _groups_ranks([group])[0][0]

    # -- the collectives ---------------------------------------------------------------
    def all_gather(self, srcs, dsts=None, group=None):
        """Batched all-gather (any dtype). Without dsts each src is this member's shard of a
        storage tensor, gathered in place; with dsts (each n x src bytes, in the storage) the
        srcs may lie anywhere. wait() returns the gathered tensors as flat views."""
        if self._session is not None:
            return self._session_call("all_gather", srcs, dsts, group)
        packed, (srcs, dsts) = _pack(srcs, dsts)
        idx, members = self._members(group)
        self._check("all_gather", idx, members, [("srcs", srcs), ("dsts", dsts)], dsts and len(dsts) != len(srcs) and
                    f"dsts: {len(dsts)} tensors for {len(srcs)} srcs")
        ev = self.runtime.all_gather([_desc(t) for t in srcs], [_desc(t) for t in dsts], self._native_idx[idx])
        return self._event(ev, packed, [(t, len(members)) for t in srcs], keep=(srcs, dsts))

    def reduce_scatter(self, srcs, comm_precision="fp32", scale=1.0, group=None):
        """Batched in-place reduce-scatter of float32 tensors (numel % n == 0): this member's
        shard of the sum (x scale) replaces its own shard. wait() returns the shards."""
        if self._session is not None:
            return self._session_call("reduce_scatter", srcs, None, group, comm_precision=comm_precision, scale=scale)
        packed, (srcs,) = _pack(srcs)
        idx, members = self._members(group)
        self._check("reduce_scatter", idx, members, [("srcs", srcs)], _float32_problem("reduce_scatter", srcs) or
                    (comm_precision not in ("fp32", "bf16") and f"comm_precision: '{comm_precision}', expected fp32 or bf16"))
        ev = self.runtime.reduce_scatter([_desc(t) for t in srcs], str(comm_precision), float(scale), self._native_idx[idx])
        return self._event(ev, packed, [(t, 1.0 / len(members)) for t in srcs], keep=(srcs,))

    def all_reduce(self, srcs, scale=1.0, group=None):
        """Batched in-place all-reduce of float32 tensors; wait() returns the tensors."""
        if self._session is not None:
            return self._session_call("all_reduce", srcs, None, group, scale=scale)
        packed, (srcs,) = _pack(srcs)
        idx, members = self._members(group)
        self._check("all_reduce", idx, members, [("srcs", srcs)], _float32_problem("all_reduce", srcs))
        ev = self.runtime.all_reduce([_desc(t) for t in srcs], float(scale), self._native_idx[idx])
        result = srcs[0] if packed else list(srcs)
        return EventOverlap._of(_Pending(ev), result)

    def session(self, offset=None):
        """A session in which the collectives take tensors outside the storage (BucketSession)."""
        return BucketSession(self, offset)

    def destroy(self):
        """Collective (every rank of the default group) and idempotent. Views of the storage
        that are still held keep its memory mapped; calls after it raise epx.Error."""
        if self.runtime is not None:
            self.runtime.destroy()
            self.runtime = None

    def _is_live(self):
        return getattr(self, "runtime", None) is not None

    @property
    def window_bytes(self):
        return self.runtime.window_bytes if self.runtime is not None else 0

    @property
    def last_algorithm(self):
        return self.runtime.last_algorithm if self.runtime is not None else "none"

    # -- internals ---------------------------------------------------------------------
    def _alive(self, call):
        if self.runtime is None:
            raise Error(f"rank {self.rank}: bucket.{call}: the buffer was destroyed", "invalid_argument", self.rank)

    def _check(self, call, idx, members, tensor_lists, problem=None):
        """Fails the call on every member when this rank's Python-side arguments are wrong (or
        it named a group the buffer does not have); returns otherwise."""
        self._alive(call)
        if self.rank not in members:
            raise Error(f"rank {self.rank}: bucket.{call}: this rank is not a member of the group", "invalid_argument",
                        self.rank)
        for name, ts in tensor_lists:
            for i, t in enumerate(ts):
                problem = problem or _problem(t, f"{name}[{i}]")
        if idx < 0:
            problem = problem or f"group: not one of this buffer's {len(self.groups)} groups"
        if problem:
            self.runtime.fail_call(members, call, problem)

    def _event(self, ev, packed, shapes, keep):
        """The event with the results as views of the storage (dtype and layout of the srcs)."""
        pending = _Pending(ev, keep)
        views = []
        for (ptr, nbytes), (src, _) in zip(ev.results(), shapes):
            views.append(self._view(ptr - self.runtime.storage_ptr, src, nbytes))
        return EventOverlap._of(pending, views[0] if packed else views)

    def _empty(self, shape, dtype):
        if _is_torch(self.storage):
            return _torch().empty(0, dtype=dtype or _torch().float32).new_empty(shape)
        return np.empty(shape, dtype=dtype or np.float32)

    def _view(self, off, like, nbytes=None):
        """A flat (nbytes given) or like-shaped view of the storage at `off`, with like's dtype."""
        n = _nbytes(like) if nbytes is None else nbytes
        if _is_torch(like) and _is_torch(self.storage):
            v = self.storage.narrow(0, off, n).view(like.dtype)
            return v if nbytes is not None else v.view(like.shape)
        arr = self.storage.numpy() if _is_torch(self.storage) else self.storage
        v = arr[off:off + n].view(like.dtype if not _is_torch(like) else _numpy_dtype(like))
        return v if nbytes is not None else v.reshape(like.shape)

    def _in_storage(self, t):
        p, s = _ptr(t), self.runtime.storage_ptr
        return s <= p and p + _nbytes(t) <= s + self.num_bytes

    def _session_call(self, name, srcs, dsts, group, **kw):
        return _SessionCall(self, self._session, name, srcs, dsts, group, kw).run()


class _SessionCall:
    """One collective inside a session: stage what lies outside the storage, call, copy back."""

    def __init__(self, buf, session, name, srcs, dsts, group, kw):
        self.b, self.s, self.name, self.group, self.kw = buf, session, name, group, kw
        self.packed, (self.srcs, self.dsts) = _pack(srcs, dsts)

    def run(self):
        b, s = self.b, self.s
        idx, members = b._members(self.group)
        n, me = len(members), (members.index(b.rank) if b.rank in members else -1)
        problem = None
        if s.group not in (None, idx):
            problem = "group: every collective of a session uses one group"
        s.group = idx
        staged_in, staged_out, copy_back = [], [], []
        base = b.runtime.storage_ptr
        taken = [(_ptr(t) - base, _ptr(t) - base + _nbytes(t)) for t in self.srcs + self.dsts
                 if _problem(t, "") is None and b._in_storage(t)]
        for i, src in enumerate(self.srcs):
            problem = problem or _problem(src, f"srcs[{i}]")
            if problem:
                break
            dst = self.dsts[i] if self.dsts else None
            if self.name == "all_gather" and dst is not None and b._in_storage(dst):
                staged_in.append(src), staged_out.append(dst)  # srcs may lie anywhere with dsts in the storage
                continue
            if b._in_storage(src) and (dst is None or b._in_storage(dst)):
                staged_in.append(src), staged_out.append(dst)
                continue
            whole = _nbytes(src) * (n if self.name == "all_gather" else 1)
            off = s._take(whole)
            if off is not None and any(a < off + whole and off < e for a, e in taken):
                problem = (f"srcs[{i}]: its staging at storage bytes [{off}, {off + whole}) would overwrite a tensor "
                           f"of this call (open the session at another offset)")
                break
            if off is None:
                problem = (f"srcs[{i}]: out of session staging storage ({whole} bytes needed, "
                           f"{b.num_bytes - s.cursor} of {b.num_bytes - s.start} left)")
                break
            region = b._view(off, src, whole)
            if self.name == "all_gather":
                mine = region.view(n, -1)[me] if _is_torch(region) else region.reshape(n, -1)[me]
                _copy(mine.reshape(-1), src.reshape(-1))
                staged_in.append(mine.reshape(src.shape)), staged_out.append(None)
                copy_back.append((i, dst))
            else:
                _copy(region.reshape(-1), src.reshape(-1))
                staged_in.append(region.reshape(src.shape)), staged_out.append(None)
                copy_back.append((i, src))
        if problem:
            b._alive(self.name)
            b.runtime.fail_call(members, self.name, problem)
        method = getattr(BucketBuffer, self.name)
        saved, b._session = b._session, None
        try:
            if self.name == "all_gather":
                outs = [d for d in staged_out if d is not None]
                ev = method(b, staged_in, outs if len(outs) == len(staged_in) else None, self.group)
            else:
                ev = method(b, staged_in, group=self.group, **self.kw)
        finally:
            b._session = saved
        return self._wrap(ev, copy_back, n, me)

    def _wrap(self, ev, copy_back, n, me):
        results = ev._result if isinstance(ev._result, list) else [ev._result]
        final = list(results)
        hooks = []
        for i, target in copy_back:
            if target is None:
                continue
            r = results[i]
            if self.name == "reduce_scatter":
                shard = target.reshape(-1)[me * (target.numel() if _is_torch(target) else target.size) // n:][:r.shape[0]]
                hooks.append((shard, r))
                final[i] = shard
            else:
                hooks.append((target.reshape(-1), r.reshape(-1)))
                final[i] = target

        def after():
            for dst, src in hooks:
                _copy(dst, src)
        ev._result = final[0] if self.packed else final
        ev._after = after
        return ev


class _Pending:
    """The C++ event, and the tensors the call must keep alive until it is waited for."""

    def __init__(self, ev, keep=None):
        self._ev, self._keep = ev, keep

    def wait(self):
        self._ev.wait()
        self._keep = None

    def done(self):
        return self._ev.done()


def _copy(dst, src):
    if _is_torch(dst) and _is_torch(src):
        dst.copy_(src)
    else:
        np.copyto(np.asarray(dst).reshape(-1).view(np.uint8), np.asarray(src).reshape(-1).view(np.uint8))


def _numpy_dtype(t):
    torch = _torch()
    return {torch.bfloat16: np.uint16, torch.float8_e4m3fn if hasattr(torch, "float8_e4m3fn") else None: np.uint8}.get(
        t.dtype) or torch.empty(0, dtype=t.dtype).numpy().dtype


def _desc(t):
    """(data pointer, bytes, item size): what the native call reads."""
    return (_ptr(t), _nbytes(t), _itemsize(t))


def _float32_problem(call, srcs):
    for i, t in enumerate(srcs):
        if hasattr(t, "dtype") and not _is_float32(t):
            return f"srcs[{i}]: {call} reduces float32 tensors, got {t.dtype}"
    return None


def _torch_loaded():
    import sys
    return "torch" in sys.modules


def _groups_ranks(groups):
    """(each group's world ranks (ascending), every rank's lists or None). With ProcessGroups,
    every rank's view of the groups is gathered (one all_gather_object over the default
    group): a group this rank is not a member of is resolved from its members' answers, and
    a role whose group differs between ranks (each rank's own DP group, say) keeps this
    rank's own, once every rank is known to agree (else epx.Error on every rank naming the
    first rank whose list differs)."""
    if not groups or len(groups) > _MAX_GROUPS:
        raise Error(f"BucketBuffer: {len(groups)} groups, expected 1..{_MAX_GROUPS}", "invalid_argument")
    known = [_ranks_if_known(g) for g in groups]
    everyone = None
    if any(k is None for k in known) or any(not isinstance(g, (list, tuple, range)) for g in groups):
        import torch
        import torch.distributed as dist
        everyone = [None] * dist.get_world_size()
        with torch.inference_mode(False):  # gloo fills its tensors from its own thread
            dist.all_gather_object(everyone, known)
        _check_roles(everyone)
        known = [known[i] if known[i] is not None else next((o[i] for o in everyone if o[i] is not None), None)
                 for i in range(len(groups))]
    for i, k in enumerate(known):
        if k is None:
            raise Error(f"BucketBuffer: group {i}: no rank knows its members", "invalid_argument")
    return known, everyone


def _check_roles(everyone):
    """The same verdict on every rank (all see `everyone`): the number of groups agrees, and a
    rank that some rank counts as a member of its group i passes that group as its own i-th."""
    n0 = len(everyone[0])
    for r, o in enumerate(everyone):
        if len(o) != n0:
            raise Error(f"BucketBuffer: rank {r} passes {len(o)} groups, rank 0 passes {n0}", "invalid_argument", r)
    for i in range(n0):
        claims = [o[i] for o in everyone]
        if len({tuple(c) for c in claims if c is not None}) <= 1:
            continue  # one group for the role: its non-members resolve it from the members
        for r, c in enumerate(claims):
            if c is None:
                raise Error(f"BucketBuffer: group {i}: rank {r} passes a group it is not a member of, while the "
                            f"ranks pass different groups as group {i} "
                            f"({sorted({tuple(x) for x in claims if x is not None})}): with a group of its own per "
                            f"rank, every rank passes the one it is in", "invalid_argument", r)
        for r, c in enumerate(claims):
            for m in c:
                if 0 <= m < len(claims) and claims[m] != c:
                    raise Error(f"BucketBuffer: group {i}: rank {r} passes {c}, which has rank {m}, but rank {m} "
                                f"passes {claims[m]}: every member of a group passes that same group",
                                "invalid_argument", m)


def _union_of_roles(mine, everyone):
    """(the distinct groups of every rank and role, in role order then by first rank;
    the index of this rank's group i among them)."""
    union = []
    for i in range(len(mine)):
        for o in everyone:
            g = list(o[i]) if o[i] is not None else list(mine[i])
            if g not in union:
                union.append(g)
    if len(union) > _MAX_GROUPS:
        raise Error(f"BucketBuffer: the ranks' groups are {len(union)} distinct groups together ({union}), "
                    f"expected at most {_MAX_GROUPS}", "invalid_argument")
    return union, [union.index(list(g)) for g in mine]


def _local_groups_ranks(groups, transport_group, size):
    """Groups over transport_group's ranks: lists of its ranks, or transport_group itself."""
    if not groups or len(groups) > _MAX_GROUPS:
        raise Error(f"BucketBuffer: {len(groups)} groups, expected 1..{_MAX_GROUPS}", "invalid_argument")
    out = []
    for i, g in enumerate(groups):
        if g is None or g is transport_group:
            out.append(list(range(size)))
        elif isinstance(g, (list, tuple, range)):
            out.append([int(r) for r in g])
        else:
            raise Error(f"BucketBuffer: group {i}: with transport_group, a group is a list of transport_group's "
                        f"ranks or transport_group itself, got {type(g).__name__}", "invalid_argument")
    return out


def _ranks_if_known(g):
    if isinstance(g, (list, tuple, range)):
        return [int(r) for r in g]
    import torch.distributed as dist
    if g is None or g is dist.group.WORLD:
        return list(range(dist.get_world_size()))
    if g is dist.GroupMember.NON_GROUP_MEMBER:
        return None
    return sorted(dist.get_process_group_ranks(g))
