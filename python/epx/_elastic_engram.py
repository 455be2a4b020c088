"""ElasticBuffer's engram methods (DeepEP 2.1.0's names), as a mixin over the buffer kind epx
already has. Relies on what ElasticBuffer.__init__ sets before anything else: self.group
(the torch.distributed group, None = default), self.rank_idx, self.num_ranks,
self.num_bytes, self.num_cpu_bytes, self.num_cpu_timeout_secs, self.transport_kind
("auto" unless given); ElasticBuffer.destroy() calls self._destroy_engram().

The rows move through an epx.EngramBuffer over the group's transport holding one table:
P * N rows of H values, rank r's N rows being what it passed to engram_write. The first
engram_write (collective, as DeepEP's, which is a barrier) makes it, and a later one whose
shape or dtype differs makes it anew; its fetch area holds what the buffer's GPU part
(num_bytes - num_cpu_bytes) would, and the table must fit in num_cpu_bytes, as in DeepEP.
A fetch of indices [T, E] asks the engine for T * E rows of one entry each: row-major that
is the same memory as DeepEP's [T, E * H] result. FP8 is uint8 bits (torch 1.13 has no
float8 dtypes; torch.float8_e4m3fn is taken where it exists).
"""
from .errors import Error
from ._sizes import align as _align, itemsize

_ALIGNMENT = 2 << 20  # DeepEP's buffer alignment
_SF_ALIGNMENT = 4     # DeepEP's kNumAlignedSFPacks: the column stride of column-major factors



def _is_fp8(dtype):
    import torch
    return dtype == torch.uint8 or dtype == getattr(torch, "float8_e4m3fn", None)


def _itemsize(dtype):
    if isinstance(dtype, str):
        return 1 if dtype in ("fp8", "fp8_e4m3", "float8_e4m3fn") else 2
    return itemsize(dtype)


class _Fetch:
    """DeepEP's hook: calling it waits for the rows and returns (data, sf)."""

    def __init__(self, hook, shape, sf_shape, sf_dtype, col_major):
        self._hook, self._shape, self._sf_shape = hook, shape, sf_shape
        self._sf_dtype, self._col_major = sf_dtype, col_major

    def __call__(self):
        got = self._hook()
        if self._sf_shape is None:
            return got.view(self._shape), None
        data, sf = got
        sf = sf.view(self._sf_dtype).view(self._sf_shape)
        if self._col_major:  # DeepEP's TMA-aligned column-major layout: strides (1, align(T, 4))
            import torch
            t, c = self._sf_shape
            out = torch.empty_strided((t, c), (1, _align(t, _SF_ALIGNMENT)), dtype=sf.dtype)
            out.copy_(sf)
            sf = out
        return data.view(self._shape), sf


class EngramMixin:
    _engram = None
    _engram_key = None  # (entries, hidden, fp8, sf packs, rows of the fetch area)

    @staticmethod
    def get_engram_storage_size_hint(num_entries, hidden, num_max_tokens_per_rank, dtype=None):
        """(num_gpu_bytes, num_cpu_bytes), each 2 MiB aligned: the fetch area for
        num_max_tokens_per_rank rows and the storage of num_entries rows of `hidden` values
        of `dtype` (torch.bfloat16 by default; FP8 as torch.uint8), each row 32-byte aligned.
        The buffer takes num_bytes = the sum, num_cpu_bytes = the second."""
        item = 2 if dtype is None else _itemsize(dtype)
        row = _align(int(hidden) * item, 32)
        return _align(row * int(num_max_tokens_per_rank), _ALIGNMENT), _align(row * int(num_entries), _ALIGNMENT)

    def engram_write(self, storage, sf=None):
        """Collective: this rank's rows, storage [N, H] (bfloat16, or FP8 as uint8 bits),
        rows r * N .. r * N + N - 1 of the table for rank r. FP8 needs sf [P * N, H / 128]
        (the whole table's scaling factors, 4-byte float32 or int32 packs, every rank the
        same), bfloat16 none."""
        import torch
        r = self.rank_idx
        if not isinstance(storage, torch.Tensor) or storage.dim() != 2:
            raise Error(f"rank {r}: engram_write: storage must be a 2-D tensor [num_entries, hidden]",
                        "shape_mismatch", r)
        fp8 = _is_fp8(storage.dtype)
        if not fp8 and storage.dtype != torch.bfloat16:
            raise Error(f"rank {r}: engram_write: storage is {storage.dtype}, expected torch.bfloat16 or FP8 "
                        f"(torch.uint8 bits)", "dtype_mismatch", r)
        if fp8 != (sf is not None):
            raise Error(f"rank {r}: engram_write: sf must be given with FP8 storage and only then (storage is "
                        f"{storage.dtype}, sf {'given' if sf is not None else 'None'})", "invalid_argument", r)
        num_entries, hidden = storage.shape
        packs = 0
        if fp8:
            if sf.dim() != 2 or sf.element_size() != 4:
                raise Error(f"rank {r}: engram_write: sf must be 2-D [num_total_entries, num_sf_packs] of 4-byte "
                            f"packs, got {tuple(sf.shape)} {sf.dtype}", "shape_mismatch", r)
            packs = sf.shape[1]
            if hidden % 128 != 0 or packs != hidden // 128:
                raise Error(f"rank {r}: engram_write: {packs} scaling-factor packs per row of hidden {hidden}; epx "
                            f"keeps FP8 rows with hidden / 128 float32 factors each (hidden a multiple of 128): use "
                            f"one factor per 128 values, or bfloat16 storage", "unsupported", r)
        cpu_bytes = getattr(self, "num_cpu_bytes", 0) or 0
        nbytes = storage.numel() * storage.element_size()
        if nbytes > cpu_bytes:
            raise Error(f"rank {r}: engram_write: the storage's {nbytes} bytes exceed the buffer's num_cpu_bytes = "
                        f"{cpu_bytes} (size it with get_engram_storage_size_hint)", "capacity_exceeded", r)
        gpu_bytes = (getattr(self, "num_bytes", 0) or 0) - cpu_bytes
        rows = gpu_bytes // max(1, hidden * storage.element_size())
        if rows < 1:
            raise Error(f"rank {r}: engram_write: the buffer's GPU part (num_bytes - num_cpu_bytes = {gpu_bytes}) "
                        f"holds no fetched row of {hidden * storage.element_size()} bytes", "capacity_exceeded", r)
        key = (int(num_entries), int(hidden), fp8, int(packs), int(rows))
        if key != self._engram_key:
            self._make_engram(key)
        self._engram.write([storage.contiguous()], None if sf is None else [_as_f32(sf.contiguous())])
        self._engram_sf_dtype = None if sf is None else sf.dtype

    def engram_fetch(self, indices, num_qps=0, use_tma_aligned_col_major_sf=False):
        """Starts fetching rows indices [T, E] (int32; -1 gives a zero row) of the table;
        returns a hook that waits and gives (data [T, E * H], sf): sf [T, E * num_sf_packs]
        for FP8 (column-major, TMA-aligned, if asked), else None. The data is a view of the
        buffer, valid until the next fetch. num_qps: no effect on CPU."""
        import torch
        del num_qps
        r = self.rank_idx
        if self._engram is None:
            raise Error(f"rank {r}: engram_fetch: no table (call engram_write first)", "invalid_argument", r)
        if not isinstance(indices, torch.Tensor) or indices.dim() != 2:
            raise Error(f"rank {r}: engram_fetch: indices must be 2-D [num_tokens, num_entries_per_token]",
                        "shape_mismatch", r)
        if indices.dtype != torch.int32:
            raise Error(f"rank {r}: engram_fetch: indices are {indices.dtype}, expected torch.int32",
                        "dtype_mismatch", r)
        num_entries, hidden, fp8, packs, rows = self._engram_key
        t, e = indices.shape
        if t * e > rows:
            raise Error(f"rank {r}: engram_fetch: {t} x {e} rows of {hidden * (1 if fp8 else 2)} bytes exceed the "
                        f"buffer's GPU part (num_bytes - num_cpu_bytes holds {rows} rows)", "capacity_exceeded", r)
        total = num_entries * self.num_ranks
        bad = (indices < -1) | (indices >= total)
        if bool(bad.any()):
            tok, ent = (int(v) for v in bad.nonzero()[0])
            raise Error(f"rank {r}: engram_fetch: indices[{tok}, {ent}] = {int(indices[tok, ent])}, expected "
                        f"-1 or 0..{total - 1} ({self.num_ranks} ranks x {num_entries} entries)", "invalid_argument", r)
        hooks = self._engram.fetch(indices.contiguous().view(1, t * e, 1), use_tma_aligned_col_major_sf=False)
        return _Fetch(hooks[0], (t, e * hidden), (t, e * packs) if fp8 else None,
                      getattr(self, "_engram_sf_dtype", None), use_tma_aligned_col_major_sf)

    def _make_engram(self, key):
        """Collective (engram_write is): the EngramBuffer for this table and fetch area."""
        from .engram import EngramBuffer
        num_entries, hidden, fp8, packs, rows = key
        dtype = "fp8" if fp8 else "bf16"
        self._destroy_engram()
        nb, ns = EngramBuffer.get_storage_size_hint(self.num_ranks, [num_entries], hidden, rows, 1, dtype, packs)
        buf = EngramBuffer(self.group, num_bytes=nb, num_storage_bytes=ns, transport=self.transport_kind,
                           num_cpu_timeout_secs=self.num_cpu_timeout_secs)
        buf.set_config([num_entries], hidden, rows, 1, dtype, packs)
        self._engram, self._engram_key = buf, key

    def _destroy_engram(self):
        """Collective."""
        if self._engram is not None:
            e, self._engram = self._engram, None
            e.destroy()
        self._engram_key = None


def _as_f32(sf):
    """4-byte packs as float32 bits (the engine copies scaling factors bit for bit)."""
    import torch
    return sf if sf.dtype == torch.float32 else sf.view(torch.float32)
