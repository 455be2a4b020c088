"""epx: MoE expert-parallel dispatch and combine on CPU, for PyTorch and NumPy.

    import epx
    buf = epx.EPBuffer(group, num_max_tokens_per_rank=S, hidden=H, num_topk=K, num_experts=E)
    recv_x, recv_topk_idx, recv_topk_weights, handle, event = buf.dispatch(x, topk_idx, topk_weights)
    combined_x, combined_topk_weights, event = buf.combine(y, handle)

See EPBuffer, EPHandle, EventOverlap, launch and Error; the README's "Python" section.
"""
from .buffer import EPBuffer, EPHandle, EventOverlap
from .diagnose import Diagnose
from .errors import Error
from .group import launch

__all__ = ["EPBuffer", "EPHandle", "EventOverlap", "Diagnose", "Error", "launch"]
