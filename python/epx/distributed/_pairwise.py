"""broadcast, all_to_all and scatter: pieces moved between pairs on the group's PPBuffer."""
import torch

from ._util import _DTYPES, _PP_BYTES, _code, _flat, _is, _u8, _with_rank


class _Pairwise:
    # -- pairwise: broadcast, all_to_all, scatter ---------------------------------------
    # Every message of a pairwise call is a 16-byte header (bytes, dtype code) and then its
    # bytes in chunks of at most `cap`: a receiver whose tensor does not match drains the
    # sender's chunks and raises, so that neither side waits for the other and the pair's
    # queue stays in step for the next call.
    def _send(self, pp, src_u8, peer, cap, code=0):
        head = torch.tensor([src_u8.numel(), code], dtype=torch.int64)
        pp.send(head.data_ptr(), 16, peer)
        for s in range(0, src_u8.numel(), cap):
            piece = src_u8[s:s + cap]
            pp.send(piece.data_ptr(), piece.numel(), peer)

    def _recv_head(self, pp, peer):
        head = torch.empty(2, dtype=torch.int64)
        pp.recv(head.data_ptr(), 16, peer)
        return int(head[0]), int(head[1])

    def _drain(self, pp, peer, nbytes, cap):
        for _ in range(0, nbytes, cap):
            pp.release(pp.recv_view(peer, -1))

    def _mismatch(self, op, peer, got, want):
        def words(h):
            return f"{h[0]} bytes" + (f" of {_DTYPES[h[1] - 1]}" if 0 < h[1] <= len(_DTYPES) else "")
        e = RuntimeError(f"epx backend: {op}: rank {peer} sends {words(got)}, rank {self._rank} expects "
                         f"{words(want)}")
        e.epx_mismatch = True  # the pair stayed in step: the call settles (_settle) instead of failing here
        return e

    def _recv(self, pp, dst_u8, peer, cap, code=0, op="recv"):
        got = self._recv_head(pp, peer)
        if got[0] != dst_u8.numel() or (code and got[1] and got[1] != code):
            self._drain(pp, peer, got[0], cap)
            raise self._mismatch(op, peer, got, (dst_u8.numel(), code))
        for s in range(0, dst_u8.numel(), cap):
            piece = dst_u8[s:s + cap]
            pp.recv(piece.data_ptr(), piece.numel(), peer)

    def _pp_call(self, op, fn, *args):
        try:
            return fn(*args)
        except RuntimeError as e:
            if str(e).startswith("epx backend:"):
                raise
            what = "Timed out waiting for the other ranks: " if _is(e, "timeout") else ""
            raise RuntimeError(f"epx backend: {op}: {what}{_with_rank(str(e), self._rank)}") from e

    def broadcast(self, tensors, opts=None):
        self._alive("broadcast")
        root = opts.rootRank if opts is not None else 0
        for t in tensors:
            flat, back = _flat(t)
            u8 = _u8(flat)
            problem = None
            if self._rank == root:
                for peer in range(self._size):
                    if peer != root:
                        self._pp_call("broadcast", self._send, self._pp, u8, peer, _PP_BYTES, _code(t.dtype))
            else:
                try:
                    self._pp_call("broadcast", self._recv, self._pp, u8, root, _PP_BYTES, _code(t.dtype), "broadcast")
                except RuntimeError as e:
                    if not getattr(e, "epx_mismatch", False):
                        raise
                    problem = e
            self._settle("broadcast", problem)
            back()
        return list(tensors)

    def _exchange(self, op, sends, recvs):
        """Pairwise exchange: sends[p] / recvs[p] are flat uint8 tensors to / from rank p.
        First every peer gets its header and first chunk (the pair's two slots: this never
        waits on this call's peers, so a small exchange is not held in lockstep); then step s
        receives from rank-s and sends the rest to rank+s, chunk by chunk alternately (a
        sender is at most two messages ahead of its receiver: no cycle of full queues). A
        size that does not match is raised after every step, so the peers never wait."""
        P, me, cap, pp = self._size, self._rank, _PP_BYTES, self._pp
        recvs[me].copy_(sends[me])
        for s in range(1, P):
            dst = (me + s) % P
            out = sends[dst]
            head = torch.tensor([out.numel(), 0], dtype=torch.int64)
            pp.send(head.data_ptr(), 16, dst)
            if out.numel():
                piece = out[:cap]
                pp.send(piece.data_ptr(), piece.numel(), dst)
        problem = None
        for s in range(1, P):
            dst, src = (me + s) % P, (me - s) % P
            out, inp = sends[dst], recvs[src]
            got = self._recv_head(pp, src)
            ok = got[0] == inp.numel()
            if not ok and problem is None:
                problem = self._mismatch(op, src, got, (inp.numel(), 0))
            ns, nr = -(-out.numel() // cap), -(-got[0] // cap)
            for k in range(max(ns, nr)):
                if 0 < k < ns:
                    piece = out[k * cap:(k + 1) * cap]
                    pp.send(piece.data_ptr(), piece.numel(), dst)
                if k < nr:
                    if ok:
                        piece = inp[k * cap:(k + 1) * cap]
                        pp.recv(piece.data_ptr(), piece.numel(), src)
                    else:
                        pp.release(pp.recv_view(src, -1))
        return problem

    def _settle(self, op, problem, local=False):
        """After a pairwise call (its messages all moved or drained): every rank learns every
        rank's problem (a 256-byte text each, one BucketBuffer all_gather), so a mismatch is an
        error on every rank, naming the rank that saw it. A rank's own wrong arguments (`local`)
        come first: the size mismatches they cause on its peers follow from them."""
        P, me, k = self._size, self._rank, 256
        mine = self._view(k, torch.uint8, me * k)
        mine.zero_()
        if problem is not None:
            text = (("!" if local else "?") + str(problem)).encode()[:k]
            mine[:len(text)].copy_(torch.frombuffer(bytearray(text), dtype=torch.uint8))
        self._bucket_call(op, self._bucket.all_gather, [(mine.data_ptr(), k, 1)], [], 0)
        texts = [bytes(self._view(k, torch.uint8, r * k).numpy()).rstrip(b"\0").decode(errors="replace")
                 for r in range(P)]
        if problem is not None and local:
            raise problem
        for mark in "!?":
            if problem is not None and mark == "?":
                raise problem
            for r, text in enumerate(texts):
                if text.startswith(mark):
                    raise RuntimeError(f"epx backend: {op}: rank {me}: the call failed on rank {r}: {text[1:]}")

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        self._alive("alltoall_base")
        P = self._size
        if output.dtype != input.dtype:
            raise RuntimeError(f"epx backend: all_to_all_single: rank {self._rank}: output is {output.dtype}, "
                               f"input {input.dtype}")
        of, back = _flat(output)
        inf, _ = _flat(input)
        rows_o = output.shape[0] if output.dim() else 1
        rows_i = input.shape[0] if input.dim() else 1
        row_o = of.numel() // rows_o if rows_o else 0
        row_i = inf.numel() // rows_i if rows_i else 0

        problem = None

        def splits(given, rows, what):
            nonlocal problem
            if not given:
                if rows % P and problem is None:
                    problem = RuntimeError(f"epx backend: all_to_all_single: rank {self._rank}: {what} has {rows} "
                                           f"rows, not divisible by {P} ranks")
                return [rows // P] * P
            if (len(given) != P or sum(given) != rows) and problem is None:
                problem = RuntimeError(f"epx backend: all_to_all_single: rank {self._rank}: {what} split sizes "
                                       f"{list(given)} do not cover its {rows} rows in {P} parts")
            return list(given)

        so, si = splits(output_split_sizes, rows_o, "output"), splits(input_split_sizes, rows_i, "input")
        if problem is None and so[self._rank] * row_o != si[self._rank] * row_i:
            problem = RuntimeError(f"epx backend: all_to_all_single: rank {self._rank}: sends itself "
                                   f"{si[self._rank]} rows but expects {so[self._rank]}")
        if problem is None:
            uo, ui = _u8(of), _u8(inf)
            bo, bi = row_o * of.element_size(), row_i * inf.element_size()
            offs_o = [sum(so[:p]) * bo for p in range(P)]
            offs_i = [sum(si[:p]) * bi for p in range(P)]
            recvs = [uo[offs_o[p]:offs_o[p] + so[p] * bo] for p in range(P)]
            sends = [ui[offs_i[p]:offs_i[p] + si[p] * bi] for p in range(P)]
        else:  # this rank's arguments are wrong: it still takes part, moving nothing
            sends = recvs = [torch.empty(0, dtype=torch.uint8)] * P
        seen = self._pp_call("all_to_all_single", self._exchange, "all_to_all_single", sends, recvs)
        self._settle("all_to_all_single", problem or seen, local=problem is not None)
        back()
        return [output]

    def alltoall(self, output_tensors, input_tensors, opts=None):
        self._alive("alltoall")
        P = self._size
        if len(output_tensors) != P or len(input_tensors) != P:
            raise RuntimeError(f"epx backend: all_to_all: rank {self._rank}: expected {P} input and output tensors")
        flats = [_flat(o) for o in output_tensors]
        recvs = [_u8(f) for f, _ in flats]
        sends = [_u8(_flat(i)[0]) for i in input_tensors]
        problem = None
        if recvs[self._rank].numel() != sends[self._rank].numel():
            problem = RuntimeError(f"epx backend: all_to_all: rank {self._rank}: its own input and output differ "
                                   f"in size")
            sends = recvs = [torch.empty(0, dtype=torch.uint8)] * P
        seen = self._pp_call("all_to_all", self._exchange, "all_to_all", sends, recvs)
        self._settle("all_to_all", problem or seen, local=problem is not None)
        for _, back in flats:
            back()
        return list(output_tensors)

    def scatter(self, output_tensors, input_tensors, opts=None):
        self._alive("scatter")
        root = opts.rootRank if opts is not None else 0
        out = output_tensors[0]
        of, back = _flat(out)
        if self._rank == root:
            ins = input_tensors[0]
            for peer in range(self._size):
                if peer != root:
                    self._pp_call("scatter", self._send, self._pp, _u8(_flat(ins[peer])[0]), peer, _PP_BYTES,
                                  _code(ins[peer].dtype))
            of.copy_(ins[root].reshape(-1))
            problem = None
        else:
            try:
                self._pp_call("scatter", self._recv, self._pp, _u8(of), root, _PP_BYTES, _code(out.dtype), "scatter")
                problem = None
            except RuntimeError as e:
                if not getattr(e, "epx_mismatch", False):
                    raise
                problem = e
        self._settle("scatter", problem)
        back()
        return [out]
