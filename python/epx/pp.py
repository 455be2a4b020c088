"""PPBuffer: pipeline-parallel send / receive for PyTorch and NumPy (DeepEP V2.5's names).

    pp = epx.PPBuffer(group, num_max_tensor_bytes=64 << 20, num_max_inflight_tensors=2)
    pp.send(activation, dst_rank_idx)      # returns once the bytes are in the peer's slot
    pp.recv(grad, src_rank_idx)            # fills grad with the next message from that peer
    v = pp.recv_view(src_rank_idx, dtype=torch.float32, shape=(m, d))
    use(v.tensor); v.release()             # or: with pp.recv_view(...) as v: ...

The k-th recv from s gets the k-th send to this rank on s, bitwise; the byte count travels
with the data and a receive tensor of another byte count raises epx.Error (shape_mismatch)
naming both counts, the peer and the message number (the message stays: a receive of the
right size gets it). A send waits only while the pair's num_max_inflight_tensors slots are
full, up to the transport's timeout (then epx.Error "timeout" naming the peer whose
receives are behind). Any peer may be addressed, this rank included, if linked: `links`
lists the pairs of ranks that talk ([(0, 1), (2, 3)], "ring", or None = every pair);
each rank's window holds num_max_inflight_tensors slots per linked rank. Between ranks whose
memory is mapped (shm, threads) a message of at least 4 x `chunk_bytes` (default 256 KiB) that
the receiver already waits for in recv() moves through a small ring it empties as it fills
(the bytes cross memory once): see docs/buffers.md.

Planned tensors (DeepEP's BufferAllocator): with ``allocation_plan=plan`` the plan's tensors
become views of this buffer's window (``plan = epx.BufferAllocator(); act =
plan.allocate((4096, 7168), torch.bfloat16); pp = epx.PPBuffer(group, ...,
allocation_plan=plan)``). ``pp.recv(act, src)`` into such a tensor between mapped ranks takes
one copy instead of two: a receiver that waits posts the tensor, and the sender writes the
bytes straight into it (``stats(peer)["direct"]`` on the sender counts them).

Construction and destroy() are collective (every rank of the group, the same arguments; a
difference raises epx.Error on every rank). send / recv / recv_view are point-to-point and
fail only on the calling rank. Tensors: any dtype, CPU, contiguous; received into in place.
`sl_idx`, `num_sms` and `num_gpu_timeout_secs` are DeepEP's GPU knobs, accepted and unused.
"""
import numpy as np

from . import _convert as cv
from . import _epx
from ._lifecycle import BufferLifecycle
from .errors import Error
from .group import transport_of
from ._sizes import itemsize


def _bytes_of(x, what, writable):
    """(address, nbytes) of a CPU C-contiguous torch tensor or numpy array."""
    if cv.is_torch(x):
        if x.device.type != "cpu":
            raise Error(f"{what}: expected a CPU tensor, got device {x.device}", "invalid_argument")
        if not x.is_contiguous():
            raise Error(f"{what}: expected a contiguous tensor", "invalid_argument")
        return x.data_ptr(), x.numel() * x.element_size()
    a = x if isinstance(x, np.ndarray) else None
    if a is None:
        raise Error(f"{what}: expected a torch tensor or a numpy array, got {type(x).__name__}", "invalid_argument")
    if not a.flags.c_contiguous:
        raise Error(f"{what}: expected a C-contiguous array", "invalid_argument")
    if writable and not a.flags.writeable:
        raise Error(f"{what}: the array is read-only", "invalid_argument")
    return a.ctypes.data, a.nbytes


def _links(links, size):
    if links is None:
        return []
    if links == "ring":
        return [(r, (r + 1) % size) for r in range(size)]
    return [(int(a), int(b)) for a, b in links]


class PPView:
    """A received message left in its slot: `nbytes`, `src`, `seq`, and `tensor` (a torch
    tensor or numpy array over the slot's bytes, as recv_view's dtype asked; valid until
    release()). release() gives the slot back to the sender; views of one peer may be
    released in any order. Also a context manager (release on exit)."""

    def __init__(self, buffer, raw, dtype, shape):
        self._buffer, self._raw = buffer, raw
        self.nbytes, self.src, self.seq = raw.nbytes, raw.src, raw.seq
        self.tensor = _view_tensor(raw, dtype, shape)

    def release(self):
        if self._raw is None:
            raise Error("PPView.release: released already", "bad_handle")
        raw, self._raw, self.tensor = self._raw, None, None
        self._buffer._runtime.release(raw)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self._raw is not None:
            self.release()


def _view_tensor(raw, dtype, shape):
    """The slot's bytes (zero-copy) as `dtype` (torch or numpy; None: numpy uint8) and `shape`."""
    if _is_torch_dtype(dtype):
        t = cv.out(raw.bytes("torch"), "torch").view(dtype)
    else:
        t = cv.out(raw.bytes("numpy"), "numpy").view(np.dtype(dtype) if dtype is not None else np.uint8)
    return t.reshape(tuple(shape)) if shape is not None else t


class PPBuffer(BufferLifecycle):
    def __init__(self, group=None, num_max_tensor_bytes=0, num_max_inflight_tensors=1, sl_idx=None,
                 num_gpu_timeout_secs=100, explicitly_destroy=False, *, links=None, chunk_bytes=0,
                 allocation_plan=None, transport="auto", num_cpu_timeout_secs=300):
        """Collective over `group` (None: the default group). See the module's doc.
        allocation_plan: an epx.BufferAllocator whose tensors become views of the window's
        planned storage (every rank the same plan). transport, num_cpu_timeout_secs: as
        EPBuffer (the group's shared transport of that kind and timeout)."""
        del sl_idx, num_gpu_timeout_secs  # DeepEP's GPU knobs
        plan = allocation_plan
        if plan is not None and plan.materialized:
            raise Error("PPBuffer: the allocation plan is materialised already", "invalid_argument")
        self.group = group
        self._transport = transport_of(group, transport, num_cpu_timeout_secs)
        self._runtime = _epx.PPBuffer(self._transport, int(num_max_tensor_bytes), int(num_max_inflight_tensors),
                                      _links(links, self._transport.num_ranks), int(chunk_bytes),
                                      plan._entries() if plan is not None else [],
                                      plan.num_bytes if plan is not None else 0)
        self.storage = None
        if plan is not None and plan.num_bytes > 0:
            self.storage = self._runtime.storage("torch" if cv._torch() is not None else "numpy")
            if not cv.is_torch(self.storage):
                self.storage = np.asarray(self.storage)
            plan.materialize(self.storage)
        self.explicitly_destroy = explicitly_destroy
        self.rank_idx, self.num_ranks = self._runtime.rank, self._runtime.num_ranks
        self.num_max_tensor_bytes = int(num_max_tensor_bytes)
        self.num_max_inflight_tensors = int(num_max_inflight_tensors)

    def send(self, x, dst_rank_idx, num_sms=None):
        """Sends x's bytes to dst_rank_idx; returns once they are in its slot."""
        del num_sms
        addr, n = _bytes_of(x, "send: x", False)
        self._runtime.send(addr, n, int(dst_rank_idx))

    def recv(self, x, src_rank_idx, num_sms=None):
        """Fills x (its bytes) with the next message from src_rank_idx; returns x."""
        del num_sms
        addr, n = _bytes_of(x, "recv: x", True)
        self._runtime.recv(addr, n, int(src_rank_idx))
        return x

    def recv_view(self, src_rank_idx, dtype=None, shape=None):
        """The next message from src_rank_idx where it lies (a PPView); dtype (torch or numpy;
        None: uint8 numpy) and shape say how to look at it: a size that does not match the
        message raises epx.Error (shape_mismatch) and the message stays."""
        want = None if shape is None else int(np.prod(shape, dtype=np.int64)) * _itemsize(dtype)
        raw = self._runtime.recv_view(int(src_rank_idx), -1 if want is None else want)
        return PPView(self, raw, dtype, shape)

    def stats(self, peer):
        """This rank's counters for `peer`: sent, received, bytes_sent, bytes_received,
        send_wait_ns (sends waiting for a free slot), recv_wait_ns, streamed (messages sent
        partly through the peer's ring), direct (messages sent partly or wholly straight into
        the peer's planned tensor)."""
        return self._runtime.stats(int(peer))

    def in_flight(self, dst_rank_idx):
        """Messages sent to dst_rank_idx it has not released yet."""
        return self._runtime.in_flight(int(dst_rank_idx))

    def destroy(self):
        """Collective, idempotent."""
        self._runtime.destroy()
        self._destroyed = True

    def _is_live(self):
        return getattr(self, "_runtime", None) is not None and not getattr(self, "_destroyed", False)

    @property
    def window_bytes(self):
        return self._runtime.window_bytes

    @staticmethod
    def get_buffer_size_hint(num_ranks, num_max_tensor_bytes, num_max_inflight_tensors, links=None, chunk_bytes=0):
        """Bytes of each rank's window for these arguments."""
        return _epx.pp_buffer_size_hint(int(num_ranks), int(num_max_tensor_bytes), int(num_max_inflight_tensors),
                                        _links(links, int(num_ranks)), int(chunk_bytes))


def _is_torch_dtype(dtype):
    torch = cv._torch()
    return torch is not None and isinstance(dtype, torch.dtype)


def _itemsize(dtype):
    if dtype is None:
        return 1
    if _is_torch_dtype(dtype):
        return itemsize(dtype)
    return np.dtype(dtype).itemsize
