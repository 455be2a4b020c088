"""all_reduce, reduce_scatter and reduce: the BucketBuffer's float32 sums for SUM / AVG of
float32, bfloat16 and float16 (chunked through the window; from 1 MiB on one machine the same
fold over the peers' tensors read in place, _peer_read.py), every other op and dtype a local
left fold in rank order over an all_gather."""
import numpy as np
import torch

from ._peer_read import _PeerReads
from ._util import _FAST, _WINDOW, R, _code, _flat, _op_of, _reduce_local, _signature

# From this many bytes a float32 / bf16 / fp16 sum on one machine reads the peers' tensors
# (_peer_read.py) instead of staging through the window; below, the window's one call is faster.
_READ_SUM_BYTES = 1 << 20
_READ_CHUNK = 1 << 18  # elements summed at a time: the parts of a chunk stay in cache


def _fold(parts, dtype, scale):
    """The BucketBuffer's sum: a left fold in rank order in float32, times `scale` (AVG), in
    the input's dtype (bf16 / fp16 rounded once): the same bits as the window's."""
    acc = parts[0].float() if parts[0].dtype != torch.float32 else parts[0].clone()
    for p in parts[1:]:
        acc.add_(p if p.dtype == torch.float32 else p.float())
    if scale != 1.0:
        acc.mul_(scale)
    return acc.to(dtype)


def _fold_into(out, parts, dtype, scale, spare):
    """out = _fold(parts, dtype, scale), made in place where it can be: in float32 the first
    add writes `out` (each element's p0 + p1 in float32, as the clone and add_ make it) and the
    others add into it, so there is no accumulator to copy; `out` may be parts[0] or parts[1]
    (an element is read before it is written). When `out` is a later part (this rank's slice of
    an all_reduce, still to be added), the fold runs in `spare` (a part this rank read and owns:
    it is overwritten) and is copied out once."""
    if dtype != torch.float32 or len(parts) < 2:
        out.copy_(_fold(parts, dtype, scale))
        return
    later = any(p.data_ptr() == out.data_ptr() for p in parts[2:])
    acc = spare if later else out
    torch.add(parts[0], parts[1], out=acc)
    for p in parts[2:]:
        acc.add_(p)
    if scale != 1.0:
        acc.mul_(scale)
    if later:
        out.copy_(acc)


class _Reductions(_PeerReads):
    # -- all_reduce ---------------------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        op, opname = _op_of(opts if opts is not None else R.SUM)
        self._alive("allreduce")
        if isinstance(tensors, torch.Tensor):  # pg.allreduce(tensor, op), c10d's third overload
            tensors = [tensors]
        for t in tensors:
            self._allreduce_one(t, op, opname)
        return list(tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        return _Reductions.allreduce(self, tensors, opts)

    def _allreduce_one(self, t, op, opname):
        if t.is_sparse:
            self._allreduce_sparse(t, op, opname)
            return
        if t.is_complex() and op in (R.SUM, R.AVG):
            self._allreduce_one(torch.view_as_real(t), op, opname)
            return
        if t.dtype in _FAST and op in (R.SUM, R.AVG):
            if t.numel() * t.element_size() >= _READ_SUM_BYTES and self._peer_pids() is not None:
                self._sum_by_reads(t, op, opname)
            else:
                self._sum_fast(t, op, opname)
            return
        flat, back = _flat(t)
        parts = self._gather_all(flat, f"allreduce({opname})", int(op) + 1)
        flat.copy_(_reduce_local(parts, op, t.dtype))
        back()

    def _allreduce_sparse(self, t, op, opname):
        """A sparse COO tensor (gloo's SUM): every rank's indices and values, gathered padded to
        the largest count, summed by coalescing; the result replaces t's contents."""
        if op != R.SUM:
            raise RuntimeError(f"epx backend: allreduce: rank {self._rank}: a sparse tensor takes SUM only, "
                               f"not {opname}")
        c = t.coalesce()
        idx, val = c.indices(), c.values()
        counts = self._gather_all(torch.tensor([idx.shape[1]], dtype=torch.int64), "allreduce(sparse counts)")
        most = max(int(n) for n in counts)
        pad_i = torch.zeros(idx.shape[0], most, dtype=torch.int64)
        pad_i[:, :idx.shape[1]] = idx
        pad_v = torch.zeros((most,) + tuple(val.shape[1:]), dtype=val.dtype)
        pad_v[:val.shape[0]] = val
        all_i = self._gather_all(pad_i.reshape(-1), "allreduce(sparse indices)")
        all_v = self._gather_all(pad_v.reshape(-1), "allreduce(sparse values)")
        ii = torch.cat([a.view(idx.shape[0], most)[:, :int(n)] for a, n in zip(all_i, counts)], 1)
        vv = torch.cat([a.view((most,) + tuple(val.shape[1:]))[:int(n)] for a, n in zip(all_v, counts)], 0)
        t.copy_(torch.sparse_coo_tensor(ii, vv, t.shape).coalesce())

    def _sum_fast(self, t, op, opname):
        """float32 (bf16 and fp16 through float32 staging) SUM / AVG on the BucketBuffer,
        chunked; the first chunk carries two float32 slots (c, c^2) of this rank's dtype and
        op code whose sums tell every rank alike whether the ranks agree."""
        n, cap = t.numel(), _WINDOW // 4 - 2
        scale = 1.0 / self._size if op == R.AVG else 1.0
        sig = _signature(t.dtype, op)
        if n <= cap and t.dtype == torch.float32 and t.is_contiguous():
            self._sum_small(t, n, scale, sig, opname)
            return
        flat, back = _flat(t)
        start, first = 0, True
        while first or start < n:
            m = min(cap, n - start)
            extra = 2 if first else 0
            stage = self._view((m + extra) * 4, torch.float32)
            stage[:m].copy_(flat[start:start + m])
            if first:
                stage[m] = sig
                stage[m + 1] = sig * sig
            self._bucket_call(f"allreduce({opname})", self._bucket.all_reduce, [(stage.data_ptr(), (m + extra) * 4, 4)],
                              1.0, 0)
            if first:
                self._agree("allreduce", (float(stage[m]), float(stage[m + 1])), (self._size * sig, self._size * sig * sig),
                            f"{t.dtype}, {opname}, {n} elements")
            if scale != 1.0:
                stage[:m].mul_(scale)
            flat[start:start + m].copy_(stage[:m])
            start += m
            first = False
        back()

    def _sum_by_reads(self, t, op, opname):
        """all_reduce on one machine (_peer_read.py): rank r sums the r-th of P slices of every
        rank's tensor, read out of their tensors (the window's order: left fold in rank order,
        float32) and writes it into its own; then every rank reads the other sums from their
        owners. Each phase ends with every rank's outcome (_settle): no tensor changes while a
        peer may still read it."""
        P, me, call = self._size, self._rank, f"allreduce({opname})"
        flat, back = _flat(t)
        n, esz = flat.numel(), flat.element_size()
        recs = self._records(call, [_code(t.dtype) + 256 * (int(op) + 1), n, flat.data_ptr()])
        self._check_heads(call, [r[:2] for r in recs], flat, int(op) + 1)
        cut = [n * r // P for r in range(P + 1)]
        pids, scale = self._peer_pids(), 1.0 / P if op == R.AVG else 1.0
        problem, parts = None, [torch.empty(min(_READ_CHUNK, cut[me + 1] - cut[me]), dtype=t.dtype) for _ in range(P)]
        for lo in range(cut[me], cut[me + 1], _READ_CHUNK):
            m = min(_READ_CHUNK, cut[me + 1] - lo)
            views = [flat[lo:lo + m] if s == me else parts[s][:m] for s in range(P)]
            problem = self._read_pieces(call, pids, [(s, recs[s][2] + lo * esz, views[s].view(torch.uint8))
                                                     for s in range(P) if s != me])
            if problem is not None:
                break
            _fold_into(flat[lo:lo + m], views, t.dtype, scale, views[0] if me else None)
        self._settle(call, problem)
        self._settle(call, self._read_pieces(call, pids, [(s, recs[s][2] + cut[s] * esz,
                                                          flat[cut[s]:cut[s + 1]].view(torch.uint8))
                                                         for s in range(P) if s != me]))
        back()

    def _reduce_scatter_by_reads(self, of, ins, op, opname):
        """reduce_scatter on one machine (_peer_read.py): this rank reads its part of every
        rank's input and folds them as the window does; the closing _settle keeps every input
        as it is until its readers are done."""
        P, me, call = self._size, self._rank, f"reduce_scatter({opname})"
        n, esz = of.numel(), of.element_size()
        mine = [i.contiguous() for i in ins]  # kept alive until the peers have read them
        recs = self._records(call, [_code(of.dtype) + 256 * (int(op) + 1), n] + [i.data_ptr() for i in mine])
        self._check_heads(call, [r[:2] for r in recs], of, int(op) + 1)
        pids, scale = self._peer_pids(), 1.0 / P if op == R.AVG else 1.0
        parts, problem = [torch.empty(min(_READ_CHUNK, n), dtype=of.dtype) for _ in range(P)], None
        for lo in range(0, n, _READ_CHUNK):
            m = min(_READ_CHUNK, n - lo)
            views = [mine[me][lo:lo + m] if s == me else parts[s][:m] for s in range(P)]
            problem = self._read_pieces(call, pids, [(s, recs[s][2 + me] + lo * esz, views[s].view(torch.uint8))
                                                     for s in range(P) if s != me])
            if problem is not None:
                break
            _fold_into(of[lo:lo + m], views, of.dtype, scale, views[0] if me else None)
        self._settle(call, problem)

    def _agree(self, call, got, want, detail):
        """The (c, c^2) slots' sums against what they are when every rank has this rank's
        code (_signature): else the ranks took the call with different dtypes or ops."""
        if got[0] != want[0] or got[1] != want[1]:
            raise RuntimeError(f"epx backend: {call}: rank {self._rank}: the ranks differ in dtype or op "
                               f"(this rank: {detail})")

    def _sum_small(self, t, n, scale, sig, opname):
        """One window's worth of contiguous float32: numpy on the window (a small call is
        mostly its Python, and numpy's element access costs a fraction of torch's); the
        scale is the BucketBuffer's one multiply at the end."""
        f = self._f32
        src = t.detach().numpy().reshape(-1)
        f[:n] = src
        f[n] = sig
        f[n + 1] = sig * sig
        self._bucket_call(f"allreduce({opname})", self._bucket.all_reduce, [(self._base, (n + 2) * 4, 4)], scale, 0)
        want = self._want.get((sig, scale))
        if want is None:  # the sums of (c, c^2) when every rank has c, scaled as float32 does
            P = np.float32(self._size)
            want = [np.float32(P * np.float32(sig)), np.float32(P * np.float32(sig * sig))]
            if scale != 1.0:
                want = [w * np.float32(scale) for w in want]
            self._want[(sig, scale)] = want
        self._agree("allreduce", (f[n], f[n + 1]), want, f"{t.dtype}, {opname}, {n} elements")
        src[:] = f[:n]


    # -- reduce_scatter -------------------------------------------------------------------
    def reduce_scatter(self, output_tensors, input_tensor_lists, opts=None):
        op, opname = _op_of(opts if opts is not None else R.SUM)
        self._alive("reduce_scatter")
        for out, ins in zip(output_tensors, input_tensor_lists):
            if len(ins) != self._size or any(i.numel() != out.numel() or i.dtype != out.dtype for i in ins):
                raise RuntimeError(f"epx backend: reduce_scatter: rank {self._rank}: expected {self._size} inputs of "
                                   f"{out.dtype} x {out.numel()} (the output's)")
            self._reduce_scatter_one(out, [i.reshape(-1) for i in ins], op, opname)
        return list(output_tensors)

    def _reduce_scatter_base(self, output, input, opts=None):
        op, opname = _op_of(opts if opts is not None else R.SUM)
        self._alive("_reduce_scatter_base")
        if input.numel() != output.numel() * self._size or input.dtype != output.dtype:
            raise RuntimeError(f"epx backend: reduce_scatter_tensor: rank {self._rank}: input is {input.dtype} x "
                               f"{input.numel()}, expected {output.dtype} x {output.numel() * self._size}")
        flat, _ = _flat(input)
        n = output.numel()
        self._reduce_scatter_one(output, [flat[r * n:(r + 1) * n] for r in range(self._size)], op, opname)
        return [output]

    def _reduce_scatter_one(self, out, ins, op, opname):
        P, me = self._size, self._rank
        of, back = _flat(out)
        if (out.dtype in _FAST and op in (R.SUM, R.AVG) and of.numel() * of.element_size() * P >= _READ_SUM_BYTES
                and self._peer_pids() is not None):
            self._reduce_scatter_by_reads(of, ins, op, opname)
        elif out.dtype in _FAST and op in (R.SUM, R.AVG):
            n = of.numel()
            cap = _WINDOW // (4 * P) - 2
            scale = 1.0 / P if op == R.AVG else 1.0
            sig = _signature(out.dtype, op)
            start, first = 0, True
            while first or start < n:
                m = min(cap, n - start)
                row = m + 2  # each shard's row ends with the (c, c^2) slots
                stage = self._view(row * P * 4, torch.float32).view(P, row)
                for r in range(P):
                    stage[r, :m].copy_(ins[r][start:start + m])
                stage[:, m] = sig
                stage[:, m + 1] = sig * sig
                ev = self._bucket_call(f"reduce_scatter({opname})", self._bucket.reduce_scatter,
                                       [(stage.data_ptr(), row * P * 4, 4)], "fp32", 1.0, 0)
                (ptr, nb), = ev.results()
                shard = self._view(nb, torch.float32, ptr - self._bucket.storage_ptr)
                if first:
                    self._agree("reduce_scatter", (float(shard[m]), float(shard[m + 1])), (P * sig, P * sig * sig),
                                f"{out.dtype}, {opname}, {n} elements per rank")
                if scale != 1.0:
                    shard[:m].mul_(scale)
                of[start:start + m].copy_(shard[:m])
                start += m
                first = False
        else:
            whole = torch.cat([i.reshape(-1) for i in ins]) if ins else of.new_empty(0)
            parts = self._gather_all(whole, f"reduce_scatter({opname})", int(op) + 1)
            n = of.numel()
            of.copy_(_reduce_local([p[me * n:(me + 1) * n] for p in parts], op, out.dtype))
        back()


    def reduce(self, tensors, opts=None):
        self._alive("reduce")
        root = opts.rootRank if opts is not None else 0
        op, opname = _op_of(opts if opts is not None else R.SUM)
        for t in tensors:
            tmp = t.clone()
            self._allreduce_one(tmp, op, opname)
            if self._rank == root:
                t.copy_(tmp)
        return list(tensors)

    def barrier(self, opts=None):
        self._alive("barrier")
        stage = self._view(4, torch.float32)
        stage.zero_()
        self._bucket_call("barrier", self._bucket.all_reduce, [(stage.data_ptr(), 4, 4)], 1.0, 0)
        return []
