"""DeepEP code on CPU tensors with `import epx as deep_ep`: a script in
the style of DeepEP V2.5's README (EPBuffer sized without num_experts, num_experts with each
dispatch, the SM count asked for and passed back, async calls waited on, the backward
passes as the other call, a cached decode dispatch) and one in the style of DeepEP V1's
(Buffer sized by Config hints, get_dispatch_layout's event chained into dispatch,
async_finish), each checked against the numpy reference on 4 ranks."""
import numpy as np
import pytest
import torch
import torch.distributed as dist

import epx as deep_ep
import epx_ref
from epx_cases import check_dispatch, expert_y, inputs, make_case, np_of, same, to_flavor, with_x

P, E, K, H = 4, 8, 3, 256
TOKENS = [5, 7, 0, 6]


def _case():
    return make_case(P, E, K, H, TOKENS, seed=294)


def _weights_back_want(idx, w):
    """combine(topk_weights=2 * recv_topk_weights) at the source: 2 w where a slot has an
    expert, 0 where it has none."""
    return np.where(idx >= 0, 2 * w, 0).astype(np.float32)


# ---- V2.5 style ------------------------------------------------------------------------
_buffer, _num_sms = None, 0


def get_buffer(group, num_max_tokens_per_rank, hidden, num_topk, num_experts):
    global _buffer, _num_sms
    needed = deep_ep.EPBuffer.get_buffer_size_hint(group, num_max_tokens_per_rank, hidden, num_topk=num_topk,
                                                   use_fp8_dispatch=False)
    if _buffer is not None and _buffer.group == group and _buffer.num_bytes >= needed:
        return _buffer
    _buffer = deep_ep.EPBuffer(group, num_max_tokens_per_rank=num_max_tokens_per_rank, hidden=hidden,
                               num_topk=num_topk, use_fp8_dispatch=False)
    _num_sms = _buffer.get_theoretical_num_sms(num_experts, num_topk)
    return _buffer


def v25_dispatch(x, topk_idx, topk_weights, num_experts, num_max_tokens_per_rank, stats):
    return _buffer.dispatch(x, topk_idx=topk_idx, topk_weights=topk_weights, num_experts=num_experts,
                            num_max_tokens_per_rank=num_max_tokens_per_rank, expert_alignment=1,
                            cumulative_local_expert_recv_stats=stats, num_sms=_num_sms,
                            async_with_compute_stream=True)


def _v25(rank, n):
    global _buffer
    _buffer = None
    group = dist.new_group(list(range(n)))
    case, res = _case(), epx_ref.compute(_case(), layout="compact")
    x, idx, w = inputs(case, rank, "torch")
    buf = get_buffer(group, max(TOKENS), H, K, E)
    assert get_buffer(group, max(TOKENS), H, K, E) is buf  # reused: num_bytes holds the hint
    stats = torch.zeros(E // P, dtype=torch.int32)
    recv_x, recv_idx, recv_w, handle, event = v25_dispatch(x, idx, w, E, max(TOKENS), stats)
    event.current_stream_wait()
    check_dispatch(case, res, rank, (recv_x, recv_idx, recv_w, handle), False, False)
    assert list(handle.num_recv_tokens_per_expert_list) == list(res.ranks[rank]["num_recv_tokens_per_expert"])
    # forward combine, overlapped with "compute", then waited on
    y = to_flavor(expert_y(case, recv_x, recv_idx, handle, False), "torch")
    combined_x, _, event = _buffer.combine(y, handle=handle, num_sms=_num_sms, async_with_compute_stream=True)
    with event:
        pass
    same("combined_x", combined_x, res.ranks[rank]["combined_x"], rank)
    # dispatch backward = combine with the weights' gradient; combine backward = cached dispatch
    _, grad_w, event = _buffer.combine(y, handle=handle, topk_weights=recv_w * 2, num_sms=_num_sms,
                                       async_with_compute_stream=True, previous_event=_buffer.capture())
    event.current_stream_wait()
    same("combined topk_weights", grad_w, _weights_back_want(case.topk_idx[rank], case.topk_weights[rank]), rank)
    case2 = with_x(case, 295)
    res2 = epx_ref.compute(case2, layout="compact")
    grad_x, _, _, _, event = _buffer.dispatch(inputs(case2, rank, "torch")[0], handle=handle, num_sms=_num_sms,
                                              async_with_compute_stream=True, previous_event=event)
    event.current_stream_wait()
    same("cached recv_x", grad_x, res2.ranks[rank]["recv_x"], rank)
    # decode: a cached handle keeps its topk_idx; the stats count both fresh dispatches
    recv2, _, _, h2, event = v25_dispatch(x, idx, w, E, max(TOKENS), stats)
    event.current_stream_wait()
    assert h2.topk_idx is idx
    assert stats.tolist() == [2 * c for c in handle.num_recv_tokens_per_expert], stats
    _buffer.destroy()
    return True


def test_deepep_v25_style_script():
    assert deep_ep.launch(_v25, P, start_method="fork", timeout_secs=120) == [True] * P


# ---- V1 style --------------------------------------------------------------------------
_v1_buffer = None


def get_v1_buffer(group, hidden_bytes):
    global _v1_buffer
    nvl, rdma = 0, 0
    for config in (deep_ep.Buffer.get_dispatch_config(group.size()), deep_ep.Buffer.get_combine_config(group.size())):
        nvl = max(config.get_nvl_buffer_size_hint(hidden_bytes, group.size()), nvl)
        rdma = max(config.get_rdma_buffer_size_hint(hidden_bytes, group.size()), rdma)
    if (_v1_buffer is None or _v1_buffer.group != group or _v1_buffer.num_nvl_bytes < nvl
            or _v1_buffer.num_rdma_bytes < rdma):
        _v1_buffer = deep_ep.Buffer(group, nvl, rdma)
    return _v1_buffer


def v1_dispatch(buffer, x, topk_idx, topk_weights, num_experts, previous_event=None):
    n_rank, n_rdma, n_expert, in_rank, event = buffer.get_dispatch_layout(
        topk_idx, num_experts, previous_event=previous_event, async_finish=True,
        allocate_on_comm_stream=previous_event is not None)
    return buffer.dispatch(x, topk_idx=topk_idx, topk_weights=topk_weights, num_tokens_per_rank=n_rank,
                           num_tokens_per_rdma_rank=n_rdma, is_token_in_rank=in_rank,
                           num_tokens_per_expert=n_expert, previous_event=event, async_finish=True,
                           allocate_on_comm_stream=True)


def _v1(rank, n):
    global _v1_buffer
    _v1_buffer = None
    deep_ep.Buffer.set_num_sms(24)
    group = dist.new_group(list(range(n)))
    case, res = _case(), epx_ref.compute(_case(), layout="compact")
    x, idx, w = inputs(case, rank, "torch")
    buffer = get_v1_buffer(group, x.size(1) * max(x.element_size(), 2))
    recv_x, recv_idx, recv_w, counts, handle, event = v1_dispatch(buffer, x, idx, w, E)
    event.current_stream_wait()
    check_dispatch(case, res, rank, (recv_x, recv_idx, recv_w, handle), False, False)
    assert counts == list(res.ranks[rank]["num_recv_tokens_per_expert"]), counts
    y = to_flavor(expert_y(case, recv_x, recv_idx, handle, False), "torch")
    combined_x, combined_w, event = buffer.combine(y, handle, async_finish=True)
    event.current_stream_wait()
    same("combined_x", combined_x, res.ranks[rank]["combined_x"], rank)
    assert combined_w is None
    _, grad_w, event = buffer.combine(y, handle, topk_weights=recv_w * 2, async_finish=True)
    event.current_stream_wait()
    same("combined topk_weights", grad_w, _weights_back_want(case.topk_idx[rank], case.topk_weights[rank]), rank)
    case2 = with_x(case, 296)
    grad_x, none_idx, none_w, none_counts, none_handle, event = buffer.dispatch(
        inputs(case2, rank, "torch")[0], handle=handle, async_finish=True)
    event.current_stream_wait()
    assert (none_idx, none_w, none_counts, none_handle) == (None, None, None, None)
    same("cached recv_x", grad_x, epx_ref.compute(case2, layout="compact").ranks[rank]["recv_x"], rank)
    # more tokens than the Buffer was built for: rebuilt on every rank, still exact
    big = make_case(P, E, K, H, [5, 7, 90, 6], seed=297)
    bx, bidx, bw = inputs(big, rank, "torch")
    out = v1_dispatch(buffer, bx, bidx, bw, E)
    out[-1].current_stream_wait()
    check_dispatch(big, epx_ref.compute(big, layout="compact"), rank, (out[0], out[1], out[2], out[4]), False, False)
    buffer.destroy()
    return True


def test_deepep_v1_style_script():
    assert deep_ep.launch(_v1, P, start_method="fork", timeout_secs=120) == [True] * P


def test_v1_names():
    deep_ep.Buffer.set_num_sms(22)
    assert deep_ep.Buffer.get_combine_config(8).num_sms == 22
    deep_ep.Buffer.set_num_sms(20)
    cfg = deep_ep.Buffer.get_dispatch_config(8)
    assert cfg.get_nvl_buffer_size_hint(7168 * 2, 8) % (2 << 20) == 0 and cfg.get_rdma_buffer_size_hint(14336, 8) == 0
    with pytest.raises(deep_ep.Error):
        deep_ep.Buffer.set_num_sms(3)
    assert deep_ep.topk_idx_t is torch.int64
    assert deep_ep.utils.EventOverlap is deep_ep.EventOverlap
    # DeepEP 2.1.0's ElasticBuffer is its own class (its constructor order), on EPBuffer's engine
    assert issubclass(deep_ep.ElasticBuffer, deep_ep.EPBuffer) and deep_ep.ElasticBuffer is not deep_ep.EPBuffer
