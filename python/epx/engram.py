"""EngramBuffer: rows fetched from tables sharded across the ranks of a group, for PyTorch
and NumPy (DeepEP V2.5's names).

    num_bytes, num_storage_bytes = epx.EngramBuffer.get_storage_size_hint(
        group, num_entries_per_layer, hidden, num_max_tokens, num_entries_per_token, dtype)
    buf = epx.EngramBuffer(group, num_bytes, num_storage_bytes)
    buf.set_config(num_entries_per_layer, hidden, num_max_tokens, num_entries_per_token, dtype)
    buf.write(local_tables, sfs=None)             # this rank's [N_l, H] shard of every layer
    hooks = buf.fetch(indices)                    # int32 [L, T, E']
    out_1 = hooks[1]()                            # [T, E' * H], waits for layer 1 only

Layer l has P * N_l rows; global row g lives on rank g // N_l. hooks[l]() (any order, any
number of times) returns out_l with out_l[t, e*H:(e+1)*H] = table_l[indices[l, t, e]]
bitwise; -1 gives a zero row. FP8 (dtype "fp8", numpy uint8 raw E4M3 bits, or torch's
float8_e4m3fn where it exists): tables are raw bits, sfs float32 [N_l, H/128] per layer
(this rank's scale rows, or DeepEP's [P * N_l, H/128] whole-table form), and a hook returns
(data, scales), scales float32 [T, E' * H/128] (column-major with
use_tma_aligned_col_major_sf, as DeepEP lays them out). bf16 is torch.bfloat16, or uint16
raw bits in numpy. The outputs are views of the buffer, valid until the next fetch.

set_config and write are collective: a shard of the wrong shape or dtype on any rank raises
epx.Error on every rank. fetch is local where rows are read in place (shm, threads) or by
one-sided gets; where the owners serve them (the simulator) it is collective, and a bad
index on one rank fails every rank. A bad index names layer, token, entry and value.
`fetch(...).stats` after the hooks: which path the rows took. DeepEP's RDMA knobs
(use_cpu_rdma_storage, num_allocated_qps, qp_depth, ...) are accepted and unused.
"""
import numpy as np

from . import _convert as cv
from . import _epx
from ._lifecycle import BufferLifecycle
from .errors import Error
from .group import transport_of


def _dtype_name(dtype):
    """'bf16' or 'fp8' for the dtypes epx tables take."""
    if isinstance(dtype, str):
        if dtype in ("bf16", "bfloat16"):
            return "bf16"
        if dtype in ("fp8", "fp8_e4m3", "float8_e4m3fn"):
            return "fp8"
    torch = cv._torch()
    if torch is not None and isinstance(dtype, torch.dtype):
        if dtype == torch.bfloat16:
            return "bf16"
        if dtype == torch.uint8 or dtype == getattr(torch, "float8_e4m3fn", None):
            return "fp8"
    elif dtype is not None:
        d = np.dtype(dtype)
        if d == np.uint16:
            return "bf16"
        if d == np.uint8:
            return "fp8"
    raise Error(f"engram: dtype {dtype!r}, expected bfloat16 (numpy uint16 bits) or FP8 E4M3 (uint8 bits)",
                "dtype_mismatch")


def _sf_packs(num_sf_packs):
    """0 (DeepEP's default) lets epx choose: 0 for bf16, hidden / 128 float32 scales for FP8."""
    return int(num_sf_packs) if num_sf_packs else -1


class EngramFetch(list):
    """The hooks of one fetch (a list: hooks[l]() is layer l); `.stats` (a dict: rows,
    rows_padding, rows_local, rows_mapped, rows_get, rows_served, bytes, path) once the
    hooks ran."""

    def __init__(self, raw, flavor, fp8, col_major):
        self._raw = raw
        super().__init__(self._hook(l, flavor, fp8, col_major) for l in range(raw.num_layers))

    def _hook(self, l, flavor, fp8, col_major):
        raw = self._raw

        def hook():
            data, scales = raw.layer(l, flavor)
            if not fp8:
                return data
            return data, cv.col_major(scales) if col_major else scales
        return hook

    @property
    def stats(self):
        return self._raw.stats()


class EngramBuffer(BufferLifecycle):
    def __init__(self, group=None, num_gpu_bytes=0, num_rdma_storage_bytes=0, use_cpu_rdma_storage=True,
                 num_allocated_qps=1, qp_depth=1, restrict_rd_atomic=False, allow_hybrid_mode=True, sl_idx=None,
                 num_gpu_timeout_secs=100, explicitly_destroy=False, *, num_bytes=None, num_storage_bytes=None,
                 transport="auto", num_cpu_timeout_secs=300):
        """Collective over `group` (None: the default group): a window of the two sizes
        get_storage_size_hint gave (num_bytes / num_storage_bytes are epx's names for them).
        transport, num_cpu_timeout_secs: as EPBuffer (the group's shared transport of that
        kind and timeout)."""
        del use_cpu_rdma_storage, num_allocated_qps, qp_depth, restrict_rd_atomic, allow_hybrid_mode, sl_idx
        del num_gpu_timeout_secs
        self.group = group
        self.explicitly_destroy = explicitly_destroy
        nb = num_gpu_bytes if num_bytes is None else num_bytes
        ns = num_rdma_storage_bytes if num_storage_bytes is None else num_storage_bytes
        self._transport = transport_of(group, transport, num_cpu_timeout_secs)
        self._runtime = _epx.EngramBuffer(self._transport, int(nb), int(ns))
        self.rank_idx, self.num_ranks = self._runtime.rank, self._runtime.num_ranks
        self._fp8 = False

    @staticmethod
    def get_storage_size_hint(group, num_entries_per_layer, hidden, num_max_tokens, num_entries_per_token,
                              dtype="bf16", num_sf_packs=0):
        """(num_bytes, num_storage_bytes) a buffer needs for this config on `group`'s ranks
        (a group object or its size)."""
        size = group if isinstance(group, int) else transport_of(group).num_ranks
        return _epx.engram_size_hint(int(size), [int(n) for n in num_entries_per_layer], int(hidden),
                                     int(num_max_tokens), int(num_entries_per_token), _dtype_name(dtype),
                                     _sf_packs(num_sf_packs))

    @staticmethod
    def get_theoretical_config(group, num_layers, num_max_tokens, num_entries_per_token,
                               num_max_read_requests_per_qp=16):
        """DeepEP's queue-pair advice; epx has no queue pairs: (1, 1, False)."""
        return 1, 1, False

    def set_config(self, num_entries_per_layer, hidden, num_max_tokens, num_entries_per_token, dtype="bf16",
                   num_sf_packs=0):
        """Collective: the tables' shape (the same on every rank)."""
        name = _dtype_name(dtype)
        self._runtime.set_config([int(n) for n in num_entries_per_layer], int(hidden), int(num_max_tokens),
                                 int(num_entries_per_token), name, _sf_packs(num_sf_packs))
        self._fp8 = name == "fp8"

    def write(self, storages, sfs=None):
        """Collective: this rank's shard of every layer (and for FP8 its scales)."""
        self._runtime.write([cv.plain(t) for t in storages], None if sfs is None else [cv.plain(s) for s in sfs])

    def fetch(self, indices, num_qps=0, use_tma_aligned_col_major_sf=True):
        """The hooks, one per layer, for int32 indices [L, T, E']."""
        del num_qps
        return EngramFetch(self._runtime.fetch(indices), cv.flavor_of(indices), self._fp8, use_tma_aligned_col_major_sf)

    @property
    def path(self):
        """'mapped', 'get' or 'served': how this buffer moves remote rows."""
        return self._runtime.path

    @property
    def window_bytes(self):
        return self._runtime.window_bytes

    def destroy(self):
        """Collective, idempotent."""
        self._runtime.destroy()
        self._destroyed = True

    def _is_live(self):
        return getattr(self, "_runtime", None) is not None and not getattr(self, "_destroyed", False)
