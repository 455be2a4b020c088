"""docs/deepep.md's two tables (DeepEP 2.1.0, DeepEP-Ascend's V2.5) are what the package
has: every name marked same / differs / no effect / unsupported resolves on `epx`, every
`missing` one does not; and the main calls of both dialects take DeepEP's parameters in
DeepEP's order."""
import inspect
import os
import re

import pytest

import epx

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "deepep.md")
PRESENT = {"same", "differs", "no effect", "unsupported"}


DIALECTS = ("DeepEP 2.1.0", "DeepEP-Ascend (V2.5)")


def _sections():
    """{dialect: [(name, status)]}, from the rows under each '## The table: <dialect>'."""
    sections, current = {}, None
    for line in open(DOC, encoding="utf-8"):
        if line.startswith("## "):
            title = line[3:].strip()
            current = title[len("The table: "):] if title.startswith("The table: ") else None
            if current is not None:
                sections[current] = []
            continue
        m = re.match(r"\| `([\w.]+)` \| ([a-z ]+) \|", line)
        if m and current is not None:
            sections[current].append((m.group(1), m.group(2).strip()))
    return sections


def _rows():
    return [row for rows in _sections().values() for row in rows]


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
    assert {s for _, s in rows} <= PRESENT | {"missing", "in progress"}, {s for _, s in rows}
    sections = _sections()
    assert sorted(sections) == sorted(DIALECTS), sorted(sections)
    names = {d: {n for n, _ in sections[d]} for d in DIALECTS}
    # each dialect's own classes are in its table, and no name is listed twice
    assert {"ElasticBuffer", "ElasticBuffer.dispatch", "ElasticBuffer.all_gather", "ElasticBuffer.pp_send",
            "ElasticBuffer.engram_fetch", "EPHandle.recv_src_metadata", "Buffer", "Buffer.dispatch"} <= names[DIALECTS[0]]
    assert {"EPBuffer", "EPBuffer.dispatch", "BucketBuffer", "PPBuffer", "EngramBuffer",
            "BufferAllocator"} <= names[DIALECTS[1]]
    assert len(rows) == len({n for n, _ in rows}), [n for n, _ in rows if [m for m, _ in rows].count(n) > 1]


@pytest.mark.parametrize("name,status", [r for r in _rows() if r[1] != "in progress"])
def test_each_name_is_as_the_table_says(name, status):
    assert _resolve(name) == (status in PRESENT), f"docs/deepep.md says {name} is {status!r}"


# DeepEP's parameters, in order (DeepEP 2.1.0's deep_ep/buffers/elastic.py and legacy.py,
# utils/event.py; DeepEP-Ascend's deep_ep/buffers/ep.py of V2.5). Static methods without self.
ELASTIC = "ElasticBuffer."
DEEPEP = {
    ELASTIC + "__init__": "self group num_bytes num_cpu_bytes num_max_tokens_per_rank hidden num_topk "
                          "use_fp8_dispatch deterministic allow_hybrid_mode allow_multiple_reduction "
                          "prefer_overlap_with_compute sl_idx num_allocated_qps num_cpu_timeout_secs "
                          "num_gpu_timeout_secs explicitly_destroy",
    ELASTIC + "dispatch": "self x topk_idx topk_weights cumulative_local_expert_recv_stats num_experts "
                          "num_max_tokens_per_rank expert_alignment num_sms num_qps previous_event "
                          "previous_event_before_epilogue async_with_compute_stream allocate_on_comm_stream "
                          "handle do_handle_copy do_cpu_sync do_expand do_zero_padding use_tma_aligned_col_major_sf",
    ELASTIC + "combine": "self x handle topk_weights bias num_sms num_qps previous_event "
                         "previous_event_before_epilogue async_with_compute_stream allocate_on_comm_stream",
    ELASTIC + "get_buffer_size_hint": "group num_max_tokens_per_rank hidden num_topk use_fp8_dispatch "
                                      "allow_hybrid_mode allow_multiple_reduction",
    ELASTIC + "get_engram_storage_size_hint": "num_entries hidden num_max_tokens_per_rank dtype",
    ELASTIC + "get_pp_buffer_size_hint": "num_max_tensor_bytes num_max_inflight_tensors",
    ELASTIC + "get_agrs_num_max_session_bytes": "group shapes dtype",
    ELASTIC + "get_agrs_buffer_size_hint": "group num_max_session_bytes",
    ELASTIC + "barrier": "self use_comm_stream with_cpu_sync sequential",
    ELASTIC + "engram_write": "self storage sf",
    ELASTIC + "engram_fetch": "self indices num_qps use_tma_aligned_col_major_sf",
    ELASTIC + "pp_set_config": "self num_max_tensor_bytes num_max_inflight_tensors",
    ELASTIC + "pp_send": "self t dst_rank_idx num_sms",
    ELASTIC + "pp_recv": "self t src_rank_idx num_sms",
    ELASTIC + "create_agrs_session": "self",
    ELASTIC + "destroy_agrs_session": "self",
    ELASTIC + "agrs_new_session": "self enabled",
    ELASTIC + "agrs_set_config": "self num_max_session_bytes num_max_all_gathers_per_session",
    ELASTIC + "agrs_get_inplace_tensor": "self shapes dtype",
    ELASTIC + "all_gather": "self t",
    ELASTIC + "get_theoretical_num_sms": "self num_experts num_topk num_scaleout_topk rdma_gbs nvlink_gbs "
                                         "sm_read_gbs sm_write_gbs",
    ELASTIC + "get_theoretical_num_qps": "self num_sms",
    "EPHandle.deterministic_sort": "self do_cpu_sync is_cached_dispatch recv_x recv_sf recv_topk_idx "
                                   "recv_topk_weights channel_linked_list",
    "EventOverlap.register_hook_after_wait": "self hook_after_wait",
    "Buffer.is_sm90_compiled": "",
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


@pytest.mark.parametrize("name,params", [("get_physical_domain_size", "group"),
                                         ("get_logical_domain_size", "group allow_hybrid_mode")])
def test_deepep_2_1_top_level_functions(name, params):
    positional = [p.name for p in inspect.signature(getattr(epx, name)).parameters.values()]
    assert positional == params.split(), f"{name}: {positional}"
