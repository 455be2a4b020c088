"""epx.ElasticBuffer, DeepEP 2.1.0's class: its signatures, its dispatch / combine on 4 ranks
(under torch.inference_mode(), as DeepEP's tests run) against the numpy reference of
docs/spec.md (tests/e2e/epx_ref.py), and DeepEP 2.1.0's handle fields against a small
single-process numpy reference of the routing written here; handle copies, cached
dispatches, failed calls leaving nothing pending, the events' hooks."""
import inspect

import numpy as np
import pytest
import torch
import torch.distributed as dist

import epx
import epx_ref
from epx_cases import check_dispatch, expert_y, inputs, make_case, np_of, same, to_flavor

P, E, K, H = 4, 8, 3, 256
L = E // P
TOKENS = [5, 7, 0, 6]
C = 8  # num_max_tokens_per_rank
A = 4  # expert_alignment


def _case(seed=811):
    return make_case(P, E, K, H, TOKENS, seed=seed)


def _align(n, a):
    return (n + a - 1) // a * a


def deepep_fields(case, r):
    """DeepEP 2.1.0's handle fields on rank r, from every rank's topk_idx alone: the tokens
    received (a token once), by source rank then token; each local expert's slots in the
    same order."""
    tokens, per_src = [], np.zeros(P, np.int64)
    slots = [[] for _ in range(L)]  # per local expert: (s, t, k)
    for s in range(P):
        idx = case.topk_idx[s]
        for t in range(idx.shape[0]):
            here = [k for k in range(K) if idx[t, k] >= 0 and idx[t, k] // L == r]
            if here:
                tokens.append((s, t, here))
                per_src[s] += 1
            for k in here:
                slots[idx[t, k] % L].append((s, t, k))
    n = np.array([len(v) for v in slots], np.int64)
    aligned = np.array([_align(c, A) for c in n], np.int64)
    starts = np.concatenate([[0], np.cumsum(aligned)[:-1]])
    row_of = {}
    for j in range(L):
        for i, (s, t, k) in enumerate(slots[j]):
            row_of[(s, t, k)] = starts[j] + i
    compact = np.full((len(tokens), 2 + K), -1, np.int64)
    expanded = compact.copy()
    for i, (s, t, here) in enumerate(tokens):
        for m in (compact, expanded):
            m[i, 0], m[i, 1] = s * C + t, s * K + min(here)
        for k in here:
            expanded[i, 2 + k] = row_of[(s, t, k)]
    # the sending side: slot k of token t -> t's position among r's tokens bound for that rank
    idx = case.topk_idx[r]
    slot = np.full(idx.shape, -1, np.int64)
    seen = np.zeros(P, np.int64)
    for t in range(idx.shape[0]):
        dests = sorted({int(e) // L for e in idx[t] if e >= 0})
        for k in range(K):
            if idx[t, k] >= 0:
                slot[t, k] = seen[idx[t, k] // L]
        for d in dests:
            seen[d] += 1
    return dict(compact_meta=compact, expanded_meta=expanded, psum_rank=np.cumsum(per_src), counts=n,
                psum_expert_compact=np.cumsum(aligned), psum_expert_expanded=starts + n,
                num_recv_tokens=len(tokens), num_expanded_tokens=int(aligned.sum()), dst_slot=slot)


def _check_fields(h, want, expanded, r):
    same("recv_src_metadata", h.recv_src_metadata, want["expanded_meta" if expanded else "compact_meta"], r)
    assert h.recv_src_metadata.dtype in (torch.int32, torch.int64)
    same("psum_num_recv_tokens_per_scaleup_rank", h.psum_num_recv_tokens_per_scaleup_rank, want["psum_rank"], r)
    same("psum_num_recv_tokens_per_expert", h.psum_num_recv_tokens_per_expert,
         want["psum_expert_expanded" if expanded else "psum_expert_compact"], r)
    same("num_unaligned_recv_tokens_per_expert", h.num_unaligned_recv_tokens_per_expert, want["counts"], r)
    for name in ("psum_num_recv_tokens_per_scaleup_rank", "psum_num_recv_tokens_per_expert",
                 "num_unaligned_recv_tokens_per_expert"):
        assert getattr(h, name).dtype == torch.int32, name
    same("dst_buffer_slot_idx", h.dst_buffer_slot_idx, want["dst_slot"], r)
    assert h.num_recv_tokens == want["num_recv_tokens"] and h.num_expanded_tokens == want["num_expanded_tokens"]
    assert h.num_recv_tokens_per_expert_list == [_align(c, A) for c in want["counts"]]
    assert h.token_metadata_at_forward is None and h.channel_linked_list is None  # one domain
    assert h.cached_recv_src_metadata_before_sort is None


def _dispatch_combine(rank, n):
    group = dist.new_group(list(range(n)))
    case = _case()
    compact, expanded = epx_ref.compute(case, layout="compact", alignment=A), \
        epx_ref.compute(case, layout="expanded", alignment=A, zero_padding=True)
    want = deepep_fields(case, rank)
    x, idx, w = inputs(case, rank, "torch")
    with torch.inference_mode():  # DeepEP's tests run so; inference tensors have no version counter
        x, idx, w = x.clone(), idx.clone(), w.clone()
        buf = epx.ElasticBuffer(group, num_max_tokens_per_rank=C, hidden=H, explicitly_destroy=True)
        assert (buf.rank_idx, buf.num_ranks, buf.num_scaleout_ranks, buf.num_scaleup_ranks) == (rank, n, 1, n)
        assert (buf.scaleout_rank_idx, buf.scaleup_rank_idx) == (0, rank)
        assert (buf.num_rdma_ranks, buf.num_nvlink_ranks) == epx.get_physical_domain_size(group) == (1, n)
        for copy in (True, False):
            for asy in (False, True):
                def wait(out):
                    if asy:
                        out[-1].current_stream_wait()
                    return out
                stats = torch.zeros(L, dtype=torch.int32)
                rx, ri, rw, h, _ = wait(buf.dispatch(x, idx, w, stats, num_experts=E, expert_alignment=A,
                                                     do_handle_copy=copy, async_with_compute_stream=asy))
                check_dispatch(case, compact, rank, (rx, ri, rw, h), False, False)
                _check_fields(h, want, False, rank)
                same("cumulative stats", stats, want["counts"], rank)
                # do_handle_copy: the handle keeps a copy of topk_idx (or the caller's tensor)
                assert (h.topk_idx is not idx) == copy and torch.equal(h.topk_idx, idx)
                if copy and idx.numel():
                    assert h.topk_idx.data_ptr() != idx.data_ptr()
                ex, ei, ew, eh, _ = wait(buf.dispatch(x, idx, w, num_experts=E, expert_alignment=A, do_expand=True,
                                                      do_zero_padding=True, do_handle_copy=copy,
                                                      async_with_compute_stream=asy))
                assert ei is None
                check_dispatch(case, expanded, rank, (ex, ei, ew, eh), True, False)
                _check_fields(eh, want, True, rank)
                # a cached dispatch returns its handle, the same rows; no weights asked, none given
                cx, ci, cw, ch, _ = wait(buf.dispatch(x, handle=h, async_with_compute_stream=asy))
                assert ch is h and cw is None and torch.equal(cx, rx) and torch.equal(ci, ri)
                zx, _, zw, zh, _ = wait(buf.dispatch(x, handle=eh, topk_weights=w, do_expand=True,
                                                     do_zero_padding=True, async_with_compute_stream=asy))
                assert zh is eh and torch.equal(zx, ex) and torch.equal(zw, ew)
                # combine: the reference's sums; weights back only when given
                y = to_flavor(expert_y(case, rx, ri, h, False), "torch")
                cx_, cw_, _ = wait(buf.combine(y, h, async_with_compute_stream=asy))
                same("combined_x", cx_, compact.ranks[rank]["combined_x"], rank)
                assert cw_ is None
                ey = to_flavor(expert_y(case, ex, None, eh, True), "torch")
                cx_, cw_, _ = wait(buf.combine(ey, eh, topk_weights=ew, async_with_compute_stream=asy))
                same("combined_x (expanded)", cx_, expanded.ranks[rank]["combined_x"], rank)
                same("combined_topk_weights", cw_, np.where(case.topk_idx[rank] >= 0, case.topk_weights[rank], 0), rank)
        buf.destroy()
        buf.destroy()  # idempotent
    return True


def test_dispatch_combine_and_deepep_fields():
    assert epx.launch(_dispatch_combine, P, start_method="fork", timeout_secs=180) == [True] * P


def _failures(rank, n):
    group = dist.new_group(list(range(n)))
    case = _case(812)
    x, idx, w = inputs(case, rank, "torch")
    buf = epx.ElasticBuffer(group, num_max_tokens_per_rank=C, hidden=H, num_topk=K)
    ref = epx_ref.compute(case, layout="compact")
    # A dispatch that fails after its rows went out (here: stats made under inference mode
    # cannot be added to outside it) leaves nothing pending: the next dispatch runs.
    with torch.inference_mode():
        stats = torch.zeros(L, dtype=torch.int32)
    # The error is kept (its traceback holds the failed call's frames), as a caller's handler may.
    with pytest.raises(RuntimeError, match="nference") as kept:
        buf.dispatch(x, idx, w, stats, num_experts=E, async_with_compute_stream=True)
    rx, ri, rw, h, ev = buf.dispatch(x, idx, w, num_experts=E, async_with_compute_stream=True)
    ev.current_stream_wait()
    assert kept.value is not None
    check_dispatch(case, ref, rank, (rx, ri, rw, h), False, False)
    # a cached dispatch's weights must be [S, K]: every rank fails, naming rank 1
    mine = w[:, :2] if rank == 1 else w
    with pytest.raises(epx.Error) as info:
        buf.dispatch(x, handle=h, topk_weights=mine)
    assert info.value.code == "shape_mismatch" and info.value.origin_rank == 1, info.value
    # a cached dispatch with another expert_alignment than its handle's: bad_handle everywhere
    with pytest.raises(epx.Error) as info:
        buf.dispatch(x, handle=h, expert_alignment=2 if rank == 2 else None)
    assert info.value.code == "bad_handle" and info.value.origin_rank == 2, info.value
    # the buffer still works, and so does EPBuffer under inference mode (its window built there)
    cx, _, cw, ch, _ = buf.dispatch(x, handle=h, topk_weights=w)
    assert ch is h and torch.equal(cx, rx) and torch.equal(cw, rw)
    with torch.inference_mode():
        ep = epx.EPBuffer(group, num_max_tokens_per_rank=C, hidden=H, num_topk=K)
        out = ep.dispatch(x.clone(), idx.clone(), w.clone(), num_experts=E, async_with_compute_stream=True)
        out[-1].current_stream_wait()
        check_dispatch(case, ref, rank, out[:4], False, False)
        with pytest.raises(epx.Error, match="do_handle_copy"):  # EPBuffer keeps DeepEP V2.5's rule
            ep.dispatch(x, idx, w, num_experts=E, do_handle_copy=True)
        ep.destroy()
    buf.barrier(use_comm_stream=False, with_cpu_sync=True, sequential=False)
    buf.destroy()
    with pytest.raises(epx.Error):
        buf.dispatch(x, idx, w, num_experts=E)
    return True


def test_failures_leave_the_buffer_usable():
    assert epx.launch(_failures, P, start_method="fork", timeout_secs=180) == [True] * P


def _new_weights(rank, n):
    """A cached dispatch with new topk_weights delivers them as a fresh dispatch of them would
    (the reference: the same routing with those weights), exactly, in both layouts."""
    group = dist.new_group(list(range(n)))
    case = _case(816)
    rng = np.random.default_rng(900)
    w2 = [(rng.standard_normal(i.shape) * 3).astype(np.float32) for i in case.topk_idx]  # every rank's
    case2 = epx_ref.Case(case.meta, case.topk_idx, w2, x=case.x)
    x, idx, w = inputs(case, rank, "torch")
    buf = epx.ElasticBuffer(group, num_max_tokens_per_rank=C, hidden=H)
    for expanded in (False, True):
        ref = epx_ref.compute(case2, layout="expanded" if expanded else "compact", alignment=A, zero_padding=True)
        _, _, _, h, _ = buf.dispatch(x, idx, None if expanded else w, num_experts=E, expert_alignment=A,
                                     do_expand=expanded, do_zero_padding=expanded)
        for asy in (False, True):
            out = buf.dispatch(x, handle=h, topk_weights=torch.from_numpy(w2[rank]), async_with_compute_stream=asy)
            out[-1].current_stream_wait()
            assert out[3] is h
            check_dispatch(case2, ref, rank, out[:4], expanded, False)
    buf.destroy()
    return True


def test_cached_dispatch_with_new_weights():
    assert epx.launch(_new_weights, P, start_method="fork", timeout_secs=120) == [True] * P


def _fp8(rank, n):
    """FP8 input, scales column-major (use_tma_aligned_col_major_sf): an asynchronous dispatch's
    scales hold their values after the wait, with an earlier output still held."""
    group = dist.new_group(list(range(n)))
    case = make_case(P, E, K, H, TOKENS, seed=814, fp8=True)
    ref = epx_ref.compute(case, layout="expanded", alignment=A, zero_padding=True)
    x, idx, w = inputs(case, rank, "torch")
    buf = epx.ElasticBuffer(group, num_max_tokens_per_rank=C, hidden=H, use_fp8_dispatch=True)
    held = []
    for asy in (False, True, True):
        out = buf.dispatch(x, idx, w, num_experts=E, expert_alignment=A, do_expand=True, do_zero_padding=True,
                           use_tma_aligned_col_major_sf=True, async_with_compute_stream=asy)
        if asy:
            out[-1].current_stream_wait()
        scales = out[0][1]
        assert scales.stride() == (1, scales.shape[0]) or scales.shape[0] <= 1
        check_dispatch(case, ref, rank, out[:4], True, True)
        held.append(out)
    buf.destroy()
    return True


def test_fp8_column_major_scales():
    assert epx.launch(_fp8, P, start_method="fork", timeout_secs=120) == [True] * P


def _once_reduced_want(case, r, b0, b1):
    """allow_multiple_reduction=False's expanded combine at source rank r, from the case alone:
    bf16(f32(b0) + f32(b1) + y_0 + y_1 + ...), one float32 sum over the token's slots in slot
    order, y_k the fixed expert function of docs/spec.md §7 (of local expert e % L) on x[t]."""
    idx, x = case.topk_idx[r], case.x[r]
    acc = (epx_ref.bf16_to_f32(b0) + epx_ref.bf16_to_f32(b1)).astype(np.float32)
    for t in range(idx.shape[0]):
        for k in range(K):
            if idx[t, k] >= 0:
                y = epx_ref._expert(x[t], None, epx_ref.expert_factor(int(idx[t, k]) % L))
                acc[t] = (acc[t] + epx_ref.bf16_to_f32(y)).astype(np.float32)
    return epx_ref.f32_to_bf16(acc)


def _once(rank, n):
    group = dist.new_group(list(range(n)))
    case = _case(815)
    x, idx, w = inputs(case, rank, "torch")
    rng = np.random.default_rng(100 + rank)
    b0, b1 = (epx_ref.f32_to_bf16(rng.standard_normal((TOKENS[rank], H)).astype(np.float32)) for _ in range(2))
    want = _once_reduced_want(case, rank, b0, b1)
    res = []
    for multiple in (False, True):
        buf = epx.ElasticBuffer(group, num_max_tokens_per_rank=C, hidden=H, allow_multiple_reduction=multiple)
        ex, _, ew, eh, _ = buf.dispatch(x, idx, w, num_experts=E, expert_alignment=A, do_expand=True)
        y = to_flavor(expert_y(case, ex, None, eh, True), "torch")
        got, gw, ev = buf.combine(y, eh, topk_weights=ew, bias=(to_flavor(b0, "torch"), to_flavor(b1, "torch")))
        ev.current_stream_wait()
        same("combined_topk_weights", gw, np.where(case.topk_idx[rank] >= 0, case.topk_weights[rank], 0), rank)
        res.append(np_of(got))
        buf.destroy()
    same("combined_x (allow_multiple_reduction=False)", res[0], want, rank)
    return bool(np.any(res[0] != res[1]))  # the per-rank partials' rounding shows somewhere


def test_allow_multiple_reduction_false_reduces_once():
    differs = epx.launch(_once, P, start_method="fork", timeout_secs=120)
    assert any(differs), "the test's data should tell one reduction from two"


def _sort(rank, n):
    """deterministic_sort puts rows received in another order back into DeepEP's (by global
    source index); epx's own outputs are in that order already, so they stay as they are."""
    group = dist.new_group(list(range(n)))
    case = _case(813)
    x, idx, w = inputs(case, rank, "torch")
    buf = epx.ElasticBuffer(group, num_max_tokens_per_rank=C, hidden=H, deterministic=True)
    rx, ri, rw, h, _ = buf.dispatch(x, idx, w, num_experts=E)
    want = [t.clone() for t in (rx, ri, rw, h.recv_src_metadata)]
    assert torch.equal(h.cached_recv_src_metadata_before_sort, want[3])  # as after DeepEP's sort
    h.deterministic_sort(True, False, rx, None, ri, rw, None)
    assert all(torch.equal(a, b) for a, b in zip(want, (rx, ri, rw, h.recv_src_metadata)))
    assert torch.equal(h.cached_recv_src_metadata_before_sort, want[3])
    perm = torch.from_numpy(np.random.default_rng(rank).permutation(rx.shape[0]))
    for t in (rx, ri, rw, h.recv_src_metadata):
        t.copy_(t[perm].clone())
    h.deterministic_sort(True, False, rx, None, ri, rw, None)
    assert all(torch.equal(a, b) for a, b in zip(want, (rx, ri, rw, h.recv_src_metadata)))
    # expanded: each expert's rows are sorted, the metadata's row pointers follow
    ex, _, ew, eh, _ = buf.dispatch(x, idx, w, num_experts=E, expert_alignment=A, do_expand=True, do_zero_padding=True)
    ewant = [t.clone() for t in (ex, ew, eh.recv_src_metadata)]
    meta = eh.recv_src_metadata
    offs, counts = eh.expert_offsets, eh.num_recv_tokens_per_expert
    perm = torch.arange(ex.shape[0])
    for j in range(L):  # reverse each expert's real rows
        perm[offs[j]:offs[j] + counts[j]] = perm[offs[j]:offs[j] + counts[j]].flip(0)
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.shape[0])
    ex.copy_(ex[perm].clone())
    ew.copy_(ew[perm].clone())
    valid = meta[:, 2:] >= 0
    meta[:, 2:][valid] = inv[meta[:, 2:][valid].long()].to(meta.dtype)
    eh.deterministic_sort(True, False, ex, None, None, ew, None)
    assert all(torch.equal(a, b) for a, b in zip(ewant, (ex, ew, eh.recv_src_metadata)))
    buf.destroy()
    return True


def test_deterministic_sort():
    assert epx.launch(_sort, P, start_method="fork", timeout_secs=120) == [True] * P


# DeepEP 2.1.0's parameters, in order (deep_ep/buffers/elastic.py)
DEEPEP_210 = {
    "__init__": "self group num_bytes num_cpu_bytes num_max_tokens_per_rank hidden num_topk use_fp8_dispatch "
                "deterministic allow_hybrid_mode allow_multiple_reduction prefer_overlap_with_compute sl_idx "
                "num_allocated_qps num_cpu_timeout_secs num_gpu_timeout_secs explicitly_destroy",
    "dispatch": "self x topk_idx topk_weights cumulative_local_expert_recv_stats num_experts num_max_tokens_per_rank "
                "expert_alignment num_sms num_qps previous_event previous_event_before_epilogue "
                "async_with_compute_stream allocate_on_comm_stream handle do_handle_copy do_cpu_sync do_expand "
                "do_zero_padding use_tma_aligned_col_major_sf",
    "combine": "self x handle topk_weights bias num_sms num_qps previous_event previous_event_before_epilogue "
               "async_with_compute_stream allocate_on_comm_stream",
    "barrier": "self use_comm_stream with_cpu_sync sequential",
    "get_buffer_size_hint": "group num_max_tokens_per_rank hidden num_topk use_fp8_dispatch allow_hybrid_mode "
                            "allow_multiple_reduction",
    "get_theoretical_num_sms": "self num_experts num_topk num_scaleout_topk rdma_gbs nvlink_gbs sm_read_gbs "
                               "sm_write_gbs",
    "get_theoretical_num_qps": "self num_sms",
}


@pytest.mark.parametrize("name", sorted(DEEPEP_210))
def test_deepep_210_parameters_in_order(name):
    params = [p for p in inspect.signature(getattr(epx.ElasticBuffer, name)).parameters.values()
              if p.kind is not p.KEYWORD_ONLY]
    assert [p.name for p in params] == DEEPEP_210[name].split()


def test_defaults_and_names():
    d = inspect.signature(epx.ElasticBuffer.dispatch).parameters
    assert d["do_handle_copy"].default is True and d["do_zero_padding"].default is False
    assert d["do_expand"].default is False
    assert inspect.signature(epx.ElasticBuffer).parameters["sl_idx"].default == 3
    assert epx.ElasticBuffer is not epx.EPBuffer and issubclass(epx.ElasticBuffer, epx.EPBuffer)
    for name in ("get_physical_domain_size", "get_logical_domain_size"):
        assert name in epx.__all__ and callable(getattr(epx, name))
    # DeepEP's static hints, each a multiple of 2 MiB where DeepEP's is
    mib2 = 2 << 20
    assert epx.ElasticBuffer.get_pp_buffer_size_hint(1000, 3) == mib2  # 1024 x 3 x 4 bytes, rounded up
    assert epx.ElasticBuffer.get_pp_buffer_size_hint(mib2, 2) == 8 * mib2
    assert epx.ElasticBuffer.get_engram_storage_size_hint(4096, 7168, 256) == (2 * mib2, 28 * mib2)
    assert epx.ElasticBuffer.get_agrs_buffer_size_hint(None, mib2 + 1) == 2 * mib2


def test_event_hooks():
    ev = epx.EventOverlap(epx.EventHandle())
    ran = []
    ev.register_hook_after_wait(lambda: ran.append(1))
    assert ev.hook_after_wait is not None
    with pytest.raises(RuntimeError):
        ev.register_hook_after_wait(lambda: None)
    ev.current_stream_wait()
    ev.current_stream_wait()  # once
    assert ran == [1] and ev.hook_after_wait is None
    with epx.EventOverlap(epx.ElasticBuffer.capture())(release_handle=True) as e:
        e.register_hook_after_wait(lambda: ran.append(2))
    assert ran == [1, 2] and e.event is None
