"""epx: MoE expert-parallel dispatch and combine on CPU, for PyTorch and NumPy, with DeepEP's
Python API (2.1.0's ElasticBuffer, V2.5's EPBuffer, V1's Buffer): `import epx as deep_ep` runs DeepEP code on CPU
tensors.

    import epx
    buf = epx.EPBuffer(group, num_max_tokens_per_rank=S, hidden=H, num_topk=K)
    recv_x, recv_topk_idx, recv_topk_weights, handle, event = buf.dispatch(x, topk_idx, topk_weights,
                                                                           num_experts=E)
    combined_x, combined_topk_weights, event = buf.combine(y, handle)

    bucket = epx.BucketBuffer(group, num_bytes)          # all_gather / reduce_scatter / all_reduce
    bucket.all_reduce(grads, scale=1 / world).wait()

Every buffer kind (EPBuffer, ElasticBuffer, BucketBuffer, PPBuffer, EngramBuffer, and Buffer,
DeepEP V1's API, also named LegacyBuffer) is built as Kind(group, sizes..., explicitly_destroy=False,
*, options) and has one life cycle: `with buf:`, destroy() (collective, idempotent) and an end
without destroy() when the object goes (epx/_lifecycle.py).

See ElasticBuffer, EPBuffer, EPHandle, EventOverlap, Buffer, BucketBuffer, BufferAllocator, PPBuffer,
EngramBuffer, launch and Error; the README's "Python" section, docs/python.md ("Names": the
concept -> C++ -> Python -> DeepEP table), and docs/deepep.md (every DeepEP call and its status here).
"""
from ._version import __version__
from . import utils
from .bucket import BucketBuffer, BucketSession, BufferAllocator
from .buffer import EPBuffer, EPHandle, MAX_LOCAL_EXPERTS, get_num_allocation_alignment
from .diagnose import Diagnose
from .elastic import ElasticBuffer, get_logical_domain_size, get_physical_domain_size
from .errors import Error
from .events import EventHandle, EventOverlap
from .engram import EngramBuffer
from .group import launch
from .heal import admit, agree_and_rebuild, close_door, join, live_routing, open_door, request_ranks
from .pp import PPBuffer, PPView
from .legacy import Buffer, Config, LegacyBuffer, LegacyConfig

__all__ = ["EPBuffer", "ElasticBuffer", "EPHandle", "EventOverlap", "EventHandle", "Buffer", "Config", "LegacyBuffer",
           "LegacyConfig", "Diagnose", "Error", "launch",
           "get_num_allocation_alignment", "MAX_LOCAL_EXPERTS", "topk_idx_t", "__version__",
           "BucketBuffer", "BucketSession", "BufferAllocator", "PPBuffer", "PPView", "EngramBuffer",
           "get_physical_domain_size", "get_logical_domain_size", "agree_and_rebuild", "live_routing",
           "open_door", "close_door", "request_ranks", "admit", "join"]


def __getattr__(name):
    if name == "topk_idx_t":  # DeepEP's dtype of topk_idx (epx never imports torch itself)
        import torch
        return torch.int64
    raise AttributeError(f"module 'epx' has no attribute {name!r}")
