"""ElasticBuffer's pp methods (DeepEP 2.1.0's names), as a mixin over the buffer kind epx
already has. Relies on what ElasticBuffer.__init__ sets before anything else: self.group
(the torch.distributed group, None = default), self.rank_idx, self.num_ranks,
self.num_bytes, self.num_cpu_bytes, self.num_cpu_timeout_secs, self.transport_kind
("auto" unless given); ElasticBuffer.destroy() calls self._destroy_pp().

The sends and receives run on an epx.PPBuffer over the group's transport, linked as a ring
(each rank talks to its previous and next rank only, as DeepEP's PP), made by
pp_set_config, collectively, as DeepEP's call is a barrier. The k-th pp_recv from a peer
gets the k-th pp_send to this rank from it; a send waits while num_max_inflight_tensors of
its messages to that peer are not received yet.
"""
from .errors import Error
from ._sizes import align as _align

_ALIGNMENT = 2 << 20  # DeepEP's buffer alignment



class PPMixin:
    _pp = None
    _pp_max_tensor_bytes = 0

    @staticmethod
    def get_pp_buffer_size_hint(num_max_tensor_bytes, num_max_inflight_tensors):
        """num_bytes for pp_set_config(num_max_tensor_bytes, num_max_inflight_tensors): a send
        and a receive side for the previous and the next rank (2 MiB aligned)."""
        return _align(_align(int(num_max_tensor_bytes), 32) * int(num_max_inflight_tensors) * 2 * 2, _ALIGNMENT)

    def pp_set_config(self, num_max_tensor_bytes, num_max_inflight_tensors):
        """Collective: the largest tensor one send moves and how many may be in flight per
        peer (within the buffer's num_bytes: bytes * in flight * 4). Makes the ring anew;
        what was in flight before is dropped."""
        r = self.rank_idx
        nb, k = int(num_max_tensor_bytes), int(num_max_inflight_tensors)
        if nb <= 0 or k <= 0:
            raise Error(f"rank {r}: pp_set_config: num_max_tensor_bytes = {nb} and num_max_inflight_tensors = {k}, "
                        f"expected both > 0", "invalid_argument", r)
        budget = getattr(self, "num_bytes", None)
        if budget is not None and nb * k * 2 * 2 > budget:
            raise Error(f"rank {r}: pp_set_config: {nb} bytes x {k} in flight x 4 = {nb * k * 4} exceeds the "
                        f"buffer's num_bytes = {budget} (size it with get_pp_buffer_size_hint)",
                        "capacity_exceeded", r)
        self._destroy_pp()
        from .pp import PPBuffer
        size = _align(nb, 32)
        self._pp = PPBuffer(self.group, size, k, links="ring", transport=self.transport_kind,
                            num_cpu_timeout_secs=self.num_cpu_timeout_secs)
        self._pp_max_tensor_bytes = size

    def pp_send(self, t, dst_rank_idx, num_sms=0):
        """Sends t (contiguous, at most num_max_tensor_bytes) to the previous or next rank of
        the ring; returns once it is in the peer's slot. num_sms: no effect on CPU."""
        del num_sms
        self._pp_check("pp_send", t, dst_rank_idx, "dst_rank_idx")
        self._pp.send(t, int(dst_rank_idx))

    def pp_recv(self, t, src_rank_idx, num_sms=0):
        """Receives into t the next tensor the previous or next rank of the ring sent here
        (the same number of bytes as t). num_sms: no effect on CPU."""
        del num_sms
        self._pp_check("pp_recv", t, src_rank_idx, "src_rank_idx")
        self._pp.recv(t, int(src_rank_idx))

    def _pp_check(self, call, t, peer, name):
        r, n = self.rank_idx, self.num_ranks
        if self._pp is None:
            raise Error(f"rank {r}: {call}: PP is not configured (call pp_set_config first)", "invalid_argument", r)
        if not hasattr(t, "is_contiguous") or not t.is_contiguous():
            raise Error(f"rank {r}: {call}: the tensor is not contiguous", "invalid_argument", r)
        nb = t.numel() * t.element_size()
        if nb > self._pp_max_tensor_bytes:
            raise Error(f"rank {r}: {call}: a tensor of {nb} bytes, more than num_max_tensor_bytes = "
                        f"{self._pp_max_tensor_bytes}", "capacity_exceeded", r)
        prev, nxt = (r - 1) % n, (r + 1) % n
        if int(peer) not in (prev, nxt):
            raise Error(f"rank {r}: {call}: {name} = {peer}, expected the previous ({prev}) or the next ({nxt}) "
                        f"rank of the ring", "invalid_argument", r)

    def _destroy_pp(self):
        """Collective."""
        if self._pp is not None:
            pp, self._pp = self._pp, None
            pp.destroy()
        self._pp_max_tensor_bytes = 0
