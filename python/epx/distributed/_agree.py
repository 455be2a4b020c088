"""What every rank of a call learns from every other: small records, the call's outcome and
the check that the ranks called with the same tensor and op — each one all_gather of a few
bytes a rank through the group's window."""
import torch

from ._util import _DTYPES, _OPS, _code


class _Agreements:
    """Mixin of ProcessGroupEpx (it needs the group's _view, _bucket_call, _rank, _size)."""

    def _records(self, op, values):
        """Every rank's `values` (ints, as many on every rank), as a list of P lists: one
        all_gather through the window."""
        P, me, n = self._size, self._rank, len(values)
        k = -(-8 * n // 64) * 64
        mine = self._view(k, torch.uint8, me * k)
        mine[:8 * n].copy_(torch.tensor(values, dtype=torch.int64).view(torch.uint8))
        self._bucket_call(op, self._bucket.all_gather, [(mine.data_ptr(), k, 1)], [], 0)
        return self._view(k * P, torch.uint8).view(P, k)[:, :8 * n].contiguous().view(torch.int64).tolist()

    def _settle(self, op, problem, local=False):
        """At the end of a call (its messages all moved or drained, its reads done): every
        rank learns every rank's problem (a 256-byte text each, one BucketBuffer all_gather),
        so a mismatch is an error on every rank, naming the rank that saw it. A rank's own wrong arguments (`local`)
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

    def _check_heads(self, op, heads, flat, kind):
        """heads[r] = rank r's (dtype code + 256 x (op + 1), numel): raises, naming the first
        rank that differs from this one, unless every rank's is this rank's."""
        me = self._rank
        for r in range(self._size):
            if heads[r] != heads[me]:
                c_r, k_r = heads[r][0] % 256, heads[r][0] // 256
                if c_r == _code(flat.dtype) and heads[r][1] == flat.numel():
                    name = {int(o) + 1: n for o, n in _OPS.items()}
                    raise RuntimeError(f"epx backend: {op}: rank {r} reduces with {name.get(k_r, k_r)}, "
                                       f"rank {me} with {name.get(kind, kind)}")
                d_r = _DTYPES[c_r - 1] if 0 < c_r <= len(_DTYPES) else "?"
                raise RuntimeError(f"epx backend: {op}: rank {r}'s tensor is {d_r} x {heads[r][1]} "
                                   f"elements, rank {me}'s is {flat.dtype} x {flat.numel()}")
