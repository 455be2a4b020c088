"""broadcast, all_to_all and scatter: pieces moved between pairs on the group's PPBuffer, or,
when every rank is on this machine, read by each receiver out of its peers' tensors (_peer_read.py)."""
import torch

from ._peer_read import _PeerReads
from ._util import _DTYPES, _PP_BYTES, _code, _flat, _is, _u8, _with_rank


def _words(nbytes, code):
    return f"{nbytes} bytes" + (f" of {_DTYPES[code - 1]}" if 0 < code <= len(_DTYPES) else "")


class _Pairwise(_PeerReads):
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

    def _mismatch(self, op, peer, got, want, receiver=None):
        receiver = self._rank if receiver is None else receiver
        e = RuntimeError(f"epx backend: {op}: rank {peer} sends {_words(*got)}, rank {receiver} expects {_words(*want)}")
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
            if self._peer_pids() is not None:
                self._broadcast_by_reads(u8, root, _code(t.dtype))
                back()
                continue
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

    def _broadcast_by_reads(self, u8, root, code):
        """broadcast on one machine: every rank reads the root's tensor (_peer_read.py). A rank
        whose tensor differs from the root's in size or dtype fails the call on every rank."""
        op = "broadcast"
        recs = self._records(op, [u8.numel(), code, u8.data_ptr()])
        n, c, addr = recs[root]
        for r, (nr, cr, _) in enumerate(recs):
            if nr != n or (c and cr and cr != c):
                raise self._mismatch(op, root, (n, c), (nr, cr), receiver=r)
        problem = None
        if self._rank != root:
            problem = self._read_pieces(op, self._peer_pids(), [(root, addr, u8)])
        self._settle(op, problem)

    def _exchange_by_reads(self, op, sends, recvs, problem):
        """_exchange on one machine: each rank reads its pieces out of its peers' send tensors
        (_peer_read.py). Every rank sees every rank's sizes first, so a piece whose sender and
        receiver disagree on its size raises on every rank, naming both, before anything moves;
        a rank whose own arguments were wrong (`problem`) fails the call on every rank."""
        P, me = self._size, self._rank
        recs = self._records(op, [int(problem is not None)] + [s.data_ptr() if s.numel() else 0 for s in sends]
                             + [s.numel() for s in sends] + [r.numel() for r in recvs])
        if any(rec[0] for rec in recs):
            self._settle(op, problem, local=problem is not None)
            return
        for r in range(P):
            for s in range(P):
                got, want = recs[s][1 + P + r], recs[r][1 + 2 * P + s]
                if got != want:
                    raise self._mismatch(op, s, (got, 0), (want, 0), receiver=r)
        recvs[me].copy_(sends[me])
        order = [(me + k) % P for k in range(1, P)]  # each source is read by one rank at a time, at first
        self._settle(op, self._read_pieces(op, self._peer_pids(), [(s, recs[s][1 + me], recvs[s]) for s in order]))

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
        if self._peer_pids() is not None:
            self._exchange_by_reads("all_to_all_single", sends, recvs, problem)
            back()
            return [output]
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
        if self._peer_pids() is not None:
            self._exchange_by_reads("all_to_all", sends, recvs, problem)
        else:
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
