"""all_gather in its forms and gather: the BucketBuffer's all_gather through the window, or, when
every rank is on this machine, each rank reading every peer's tensor into its output (_peer_read.py)."""
import torch

from ._peer_read import _PeerReads
from ._util import _WINDOW, _code, _flat, _u8


class _Gathers(_PeerReads):
    # -- all_gather -----------------------------------------------------------------------
    def _gather_all(self, flat, op, kind=0):
        """Every rank's `flat` (contiguous, same dtype and size on every rank), by rank:
        the BucketBuffer's all_gather, chunked; the first chunk carries a 16-byte header
        (dtype code, numel) whose copies name the first rank that differs."""
        out = [torch.empty_like(flat) for _ in range(self._size)]
        self._gather_into(flat, [o for o in out], op, kind)
        return out

    def _gather_by_reads(self, flat, outs, op, kind):
        """_gather_into on one machine: each rank reads every peer's tensor straight into its
        output (_peer_read.py); the record exchange carries the same header as the window's."""
        me, src = self._rank, _u8(flat)
        recs = self._records(op, [_code(flat.dtype) + 256 * kind, flat.numel(), src.data_ptr()])
        self._check_heads(op, [r[:2] for r in recs], flat, kind)
        dst = [_u8(o) for o in outs]
        dst[me].copy_(src)
        order = [(me + k) % self._size for k in range(1, self._size)]
        self._settle(op, self._read_pieces(op, self._peer_pids(), [(r, recs[r][2], dst[r]) for r in order]))

    def _gather_into(self, flat, outs, op, kind=0):
        """all_gather of flat (contiguous 1-D) into outs[r] (contiguous 1-D, flat's size)."""
        if self._peer_pids() is not None:
            self._gather_by_reads(flat, outs, op, kind)
            return
        P, me = self._size, self._rank
        src = _u8(flat)
        dst = [_u8(o) for o in outs]
        nbytes, hdr = src.numel(), 16
        cap = (_WINDOW // P - hdr) // 64 * 64
        # (dtype code + 256 x the reduction's op + 1, numel): the ranks agree on all three
        header = torch.tensor([_code(flat.dtype) + 256 * kind, flat.numel()], dtype=torch.int64).view(torch.uint8)
        start, first = 0, True
        while first or start < nbytes:
            m = min(cap, nbytes - start)
            k = m + (hdr if first else 0)
            mine = self._view(k, torch.uint8, me * k)  # this rank's piece in place
            if first:
                mine[:hdr].copy_(header)
                mine[hdr:].copy_(src[:m])
            else:
                mine.copy_(src[start:start + m])
            whole = self._view(k * P, torch.uint8)
            self._bucket_call(op, self._bucket.all_gather, [(mine.data_ptr(), k, 1)], [], 0)
            pieces = whole.view(P, k)
            if first:
                self._check_heads(op, pieces[:, :hdr].contiguous().view(torch.int64).view(P, 2).tolist(), flat, kind)
                for r in range(P):
                    dst[r][:m].copy_(pieces[r, hdr:])
            else:
                for r in range(P):
                    dst[r][start:start + m].copy_(pieces[r])
            start += m
            first = False

    def allgather(self, output_tensor_lists, input_tensors, opts=None):
        self._alive("allgather")
        for outs, inp in zip(output_tensor_lists, input_tensors):
            if len(outs) != self._size:
                raise RuntimeError(f"epx backend: allgather: rank {self._rank}: {len(outs)} output tensors, expected "
                                   f"{self._size}")
            for o in outs:
                if o.numel() != inp.numel() or o.dtype != inp.dtype:
                    raise RuntimeError(f"epx backend: allgather: rank {self._rank}: an output tensor is {o.dtype} x "
                                       f"{o.numel()}, expected {inp.dtype} x {inp.numel()} as the input")
            flat, _ = _flat(inp)
            tmp = [o.view(-1) if o.is_contiguous() else torch.empty(o.numel(), dtype=o.dtype) for o in outs]
            self._gather_into(flat, tmp, "allgather")
            for o, t in zip(outs, tmp):
                if not o.is_contiguous():
                    o.copy_(t.view(o.shape))
        return [o for outs in output_tensor_lists for o in outs]

    def allgather_coalesced(self, output_tensor_lists, input_tensors, opts=None):
        """output_tensor_lists[r][i] = rank r's input_tensors[i]: one all_gather of the inputs
        laid end to end (torch checks that they share one dtype)."""
        self._alive("allgather_coalesced")
        me, P = self._rank, self._size
        if len(output_tensor_lists) != P:
            raise RuntimeError(f"epx backend: allgather_coalesced: rank {me}: {len(output_tensor_lists)} output lists, "
                               f"expected {P}")
        for outs in output_tensor_lists:
            if len(outs) != len(input_tensors) or any(o.numel() != i.numel() or o.dtype != i.dtype
                                                      for o, i in zip(outs, input_tensors)):
                raise RuntimeError(f"epx backend: allgather_coalesced: rank {me}: each output list must match the "
                                   f"inputs {[(i.dtype, tuple(i.shape)) for i in input_tensors]}")
        if len({i.dtype for i in input_tensors}) > 1:
            raise RuntimeError(f"epx backend: allgather_coalesced: rank {me}: the inputs differ in dtype")
        flat = torch.cat([i.reshape(-1) for i in input_tensors]) if input_tensors else torch.empty(0)
        parts = self._gather_all(flat, "allgather_coalesced")
        for r, outs in enumerate(output_tensor_lists):
            off = 0
            for o in outs:
                o.copy_(parts[r][off:off + o.numel()].view(o.shape))
                off += o.numel()
        return [o for outs in output_tensor_lists for o in outs]

    def _allgather_base(self, output, input, opts=None):
        self._alive("_allgather_base")
        if output.numel() != input.numel() * self._size or output.dtype != input.dtype:
            raise RuntimeError(f"epx backend: all_gather_into_tensor: rank {self._rank}: output is {output.dtype} x "
                               f"{output.numel()}, expected {input.dtype} x {input.numel() * self._size}")
        out, back = _flat(output)
        flat, _ = _flat(input)
        n = flat.numel()
        self._gather_into(flat, [out[r * n:(r + 1) * n] for r in range(self._size)], "all_gather_into_tensor")
        back()
        return [output]


    def gather(self, output_tensors, input_tensors, opts=None):
        self._alive("gather")
        root = opts.rootRank if opts is not None else 0
        flat, _ = _flat(input_tensors[0])
        parts = self._gather_all(flat, "gather")
        if self._rank == root:
            for o, p in zip(output_tensors[0], parts):
                o.copy_(p.view(o.shape))
        return list(output_tensors[0]) if self._rank == root else []
