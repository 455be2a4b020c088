"""docs/deepep.md's table is what the package has: every name marked same / differs /
no effect / unsupported resolves on `epx`, every `missing` one does not; and the main
calls take DeepEP's parameters in DeepEP's order."""
import inspect
import os
import re

import pytest

import epx

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "deepep.md")
PRESENT = {"same", "differs", "no effect", "unsupported"}


def _rows():
    rows = []
    for line in open(DOC, encoding="utf-8"):
        m = re.match(r"\| `([\w.]+)` \| ([a-z ]+) \|", line)
        if m:
            rows.append((m.group(1), m.group(2).strip()))
    return rows


def _resolve(name):
    """getattr along the dotted name; a class's annotated instance fields count (EPHandle's)."""
    obj = epx
    for part in name.split("."):
        if not hasattr(obj, part):
            return part in getattr(obj, "__annotations__", {})
        obj = getattr(obj, part)
    return True


def test_the_table_is_read():
    rows = _rows()
    assert len(rows) > 50, rows
    assert {s for _, s in rows} <= PRESENT | {"missing", "in progress"}, {s for _, s in rows}


@pytest.mark.parametrize("name,status", [r for r in _rows() if r[1] != "in progress"])
def test_each_name_is_as_the_table_says(name, status):
    assert _resolve(name) == (status in PRESENT), f"docs/deepep.md says {name} is {status!r}"


# DeepEP's parameters, in order (deep_ep/buffers/ep.py of V2.5, buffers/legacy.py of V1).
DEEPEP = {
    "EPBuffer.__init__": "self group num_bytes num_max_tokens_per_rank hidden num_topk use_fp8_dispatch "
                         "lb_allocation_plan_or_num_bytes deterministic allow_hybrid_mode allow_multiple_reduction "
                         "prefer_overlap_with_compute sl_idx num_allocated_qps num_cpu_timeout_secs "
                         "num_gpu_timeout_secs explicitly_destroy",
    "EPBuffer.dispatch": "self x topk_idx topk_weights cumulative_local_expert_recv_stats num_experts "
                         "num_max_tokens_per_rank expert_alignment num_sms num_qps previous_event "
                         "async_with_compute_stream allocate_on_comm_stream handle do_handle_copy do_cpu_sync "
                         "do_expand do_zero_padding use_tma_aligned_col_major_sf defer_epilogue",
    "EPBuffer.combine": "self x handle topk_weights bias num_sms num_qps previous_event async_with_compute_stream "
                        "allocate_on_comm_stream defer_epilogue",
    "EPBuffer.get_buffer_size_hint": "group num_max_tokens_per_rank hidden num_topk use_fp8_dispatch "
                                     "allow_hybrid_mode allow_multiple_reduction",
    "EPBuffer.lb_prefetch_weights": "self redundant_expert_weights expert_weights redundancy_mapping num_sms "
                                    "previous_event",
    "EPBuffer.lb_reduce_grads": "self redundant_expert_grads expert_grads redundancy_mapping num_sms previous_event",
    "Buffer.__init__": "self group num_nvl_bytes num_rdma_bytes low_latency_mode num_qps_per_rank "
                       "allow_nvlink_for_low_latency_mode allow_mnnvl explicitly_destroy enable_shrink comm",
    "Buffer.get_dispatch_layout": "self topk_idx num_experts previous_event async_finish allocate_on_comm_stream",
    "Buffer.dispatch": "self x handle num_tokens_per_rank num_tokens_per_rdma_rank is_token_in_rank "
                       "num_tokens_per_expert topk_idx topk_weights expert_alignment num_worst_tokens config "
                       "previous_event async_finish allocate_on_comm_stream",
    "Buffer.combine": "self x handle topk_weights bias config previous_event async_finish allocate_on_comm_stream",
    "Config.__init__": "self num_sms num_max_nvl_chunked_send_tokens num_max_nvl_chunked_recv_tokens "
                       "num_max_rdma_chunked_send_tokens num_max_rdma_chunked_recv_tokens",
    "EventOverlap.__init__": "self event extra_tensors",
    "EventOverlap.current_stream_wait": "self release_handle",
}


@pytest.mark.parametrize("name", list(DEEPEP))
def test_deepeps_parameters_in_deepeps_order(name):
    cls, fn = name.split(".")
    params = inspect.signature(getattr(getattr(epx, cls), fn)).parameters.values()
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    assert positional == DEEPEP[name].split(), f"{name}: {positional}"
