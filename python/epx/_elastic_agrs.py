"""ElasticBuffer's agrs methods (DeepEP 2.1.0's names), as a mixin over the buffer kind epx
already has. Relies on what ElasticBuffer.__init__ sets before anything else: self.group
(the torch.distributed group, None = default), self.rank_idx, self.num_ranks,
self.num_bytes, self.num_cpu_bytes, self.num_cpu_timeout_secs, self.transport_kind
("auto" unless given); ElasticBuffer.destroy() calls self._destroy_agrs()."""


class AgrsMixin:
    def _destroy_agrs(self):
        pass
