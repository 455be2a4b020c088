"""EPBuffer dispatch / combine on 4 ranks (epx.launch) against the numpy reference of docs/spec.md,
bit for bit: both layouts, bf16 and FP8, torch and numpy in/out, cached dispatch, worst
tokens, alignment, weighted and bias combine, async and deferred calls."""
import numpy as np
import pytest

import epx
import epx_ref
from epx_cases import check_dispatch, expert_y, inputs, make_case, np_of, same, to_flavor, with_x

P = 4
TOKENS = [9, 0, 14, 5]


def launch(fn, *args):
    return epx.launch(fn, P, *args, start_method="fork", timeout_secs=60)


def _round_trip(rank, n, expanded, fp8, flavor, alignment, worst, async_mode):
    H = 256
    case = make_case(n, 16, 4, H, TOKENS, seed=7 + expanded + 2 * fp8, fp8=fp8)
    layout = "expanded" if expanded else "compact"
    res = epx_ref.compute(case, layout=layout, alignment=alignment, worst=worst, deterministic=True, zero_padding=True)
    x, idx, w = inputs(case, rank, flavor)
    if flavor == "torch" and not fp8:
        w.requires_grad_(True)  # a model's tensors: epx reads them without their autograd history
    with epx.EPBuffer(None, num_max_tokens_per_rank=max(TOKENS), hidden=H, num_topk=4, num_experts=16) as buf:
        ntr, nte, inr = buf.get_dispatch_layout(idx)
        same("num_tokens_per_rank", ntr, res.ranks[rank]["num_tokens_per_rank"], rank)
        same("num_tokens_per_expert", nte, res.ranks[rank]["num_tokens_per_expert"], rank)
        same("is_token_in_rank", inr, res.ranks[rank]["is_token_in_rank"], rank)
        kw = dict(do_expand=expanded, expert_alignment=alignment, num_worst_tokens=worst, deterministic=True,
                  do_zero_padding=True)
        if async_mode == "async_with_compute_stream":
            # the tuple at once: outputs with their final shapes; the values after the wait
            got = buf.dispatch(x, idx, w, async_with_compute_stream=True, **kw)
            recv_x, recv_idx, recv_w, handle, ev = got
            rows = res.ranks[rank]["recv_x_fp8" if fp8 else "recv_x"].shape[0]
            assert (recv_x[0] if fp8 else recv_x).shape[0] == rows == handle.num_recv_rows
            assert list(handle.num_recv_tokens_per_expert) == list(res.ranks[rank]["num_recv_tokens_per_expert"])
            _refused_while_pending(buf, x, idx, w, rank)
            assert ev.wait() is None and ev.done()
        elif async_mode == "defer_epilogue":
            ev = buf.dispatch(x, idx, w, defer_epilogue=True, **kw)
            assert isinstance(ev, epx.EventOverlap)
            _refused_while_pending(buf, x, idx, w, rank)
            recv_x, recv_idx, recv_w, handle = ev.wait()  # DeepEP: the tuple without its event
        else:
            recv_x, recv_idx, recv_w, handle, _ = buf.dispatch(x, idx, w, **kw)
        flavor_type = np.ndarray if flavor == "numpy" else __import__("torch").Tensor
        assert isinstance(recv_x[0] if fp8 else recv_x, flavor_type)
        check_dispatch(case, res, rank, (recv_x, recv_idx, recv_w, handle), expanded, fp8)
        y = to_flavor(expert_y(case, recv_x, recv_idx, handle, expanded), flavor)
        if async_mode == "async_with_compute_stream":
            combined, cw, ev = buf.combine(y, handle, async_with_compute_stream=True)
            assert tuple(combined.shape) == tuple(res.ranks[rank]["combined_x"].shape)
            _refused_while_pending(buf, x, idx, w, rank)
            ev.current_stream_wait()
        elif async_mode == "defer_epilogue":
            combined, cw = buf.combine(y, handle, defer_epilogue=True).wait()
        else:
            combined, cw, _ = buf.combine(y, handle)
        same("combined_x", combined, res.ranks[rank]["combined_x"], rank)
        same("combined_topk_weights", cw, case.topk_weights[rank], rank)
    return True


@pytest.mark.parametrize("expanded", [False, True], ids=["compact", "expanded"])
@pytest.mark.parametrize("flavor", ["torch", "numpy"])
def test_dispatch_combine_bf16(expanded, flavor):
    assert launch(_round_trip, expanded, False, flavor, 4 if expanded else 1, 0, None) == [True] * P


@pytest.mark.parametrize("expanded", [False, True], ids=["compact", "expanded"])
def test_dispatch_combine_fp8(expanded):
    assert launch(_round_trip, expanded, True, "torch", 1, 0, None) == [True] * P


@pytest.mark.parametrize("expanded", [False, True], ids=["compact", "expanded"])
def test_worst_tokens(expanded):
    assert launch(_round_trip, expanded, False, "numpy", 2 if expanded else 1, 120, None) == [True] * P


def _refused_while_pending(buf, x, idx, w, rank):
    """Any other call on the buffer while one is pending: epx.Error naming it, on this rank only."""
    with pytest.raises(epx.Error, match="still pending") as e:
        buf.dispatch(x, idx, w)
    assert e.value.code == "invalid_argument" and e.value.origin_rank == rank


@pytest.mark.parametrize("mode", ["async_with_compute_stream", "defer_epilogue"])
@pytest.mark.parametrize("expanded", [False, True], ids=["compact", "expanded"])
def test_async_and_deferred(mode, expanded):
    assert launch(_round_trip, expanded, False, "torch", 4 if expanded else 1, 0, mode) == [True] * P


@pytest.mark.parametrize("mode", ["async_with_compute_stream", "defer_epilogue"])
def test_async_and_deferred_fp8_numpy(mode):
    assert launch(_round_trip, True, True, "numpy", 2, 0, mode) == [True] * P


def _cached(rank, n, expanded, flavor):
    H = 128
    case = make_case(n, 8, 3, H, [6, 11, 3, 0], seed=31)
    case2 = with_x(case, seed=32)
    layout = "expanded" if expanded else "compact"
    res2 = epx_ref.compute(case2, layout=layout, alignment=2, deterministic=True, zero_padding=True)
    x, idx, w = inputs(case, rank, flavor)
    x2, _, _ = inputs(case2, rank, flavor)
    with epx.EPBuffer(None, num_max_tokens_per_rank=11, hidden=H, num_topk=3, num_experts=8, deterministic=True) as buf:
        _, _, _, handle, _ = buf.dispatch(x, idx, w, do_expand=expanded, expert_alignment=2, do_zero_padding=True)
        out = buf.dispatch(x2, handle=handle, do_zero_padding=True)  # layout options from the handle
        check_dispatch(case2, res2, rank, out[:4], expanded, False)
        y = to_flavor(expert_y(case2, out[0], out[1], out[3], expanded), flavor)
        combined, _, _ = buf.combine(y, out[3])
        same("combined_x (cached)", combined, res2.ranks[rank]["combined_x"], rank)
    return True


@pytest.mark.parametrize("expanded", [False, True], ids=["compact", "expanded"])
def test_cached_dispatch(expanded):
    assert launch(_cached, expanded, "torch") == [True] * P


def _weighted_and_bias(rank, n):
    import torch
    H = 128
    case = make_case(n, 8, 4, H, [7, 4, 9, 2], seed=41)
    res = epx_ref.compute(case, layout="expanded", deterministic=True, zero_padding=True, weighted=True)
    x, idx, w = inputs(case, rank, "torch")
    with epx.EPBuffer(None, num_max_tokens_per_rank=9, hidden=H, num_topk=4, num_experts=8, deterministic=True) as buf:
        recv_x, _, recv_w, handle, _ = buf.dispatch(x, idx, w, do_expand=True)
        y = to_flavor(expert_y(case, recv_x, None, handle, True), "torch")
        combined, _, _ = buf.combine(y, handle, weighted=True)
        same("combined_x (weighted)", combined, res.ranks[rank]["combined_x"], rank)
        # bias: with all-zero expert rows, out = bf16(f32(bias0) + f32(bias1)) exactly (docs/spec.md §4)
        S = case.S[rank]
        rng = np.random.default_rng(100 + rank)
        b0 = ((rng.integers(120, 132, (S, H)) << 7) | rng.integers(0, 128, (S, H))).astype(np.uint16)
        b1 = ((1 << 15) | (rng.integers(118, 130, (S, H)) << 7) | rng.integers(0, 128, (S, H))).astype(np.uint16)
        zeros = torch.zeros(recv_x.shape, dtype=torch.bfloat16)
        got, _, _ = buf.combine(zeros, handle, bias=(to_flavor(b0, "torch"), to_flavor(b1, "torch")))
        want = epx_ref.f32_to_bf16(epx_ref.bf16_to_f32(b0) + epx_ref.bf16_to_f32(b1))
        same("combined_x (bias pair)", got, want, rank)
        got1, _, _ = buf.combine(zeros, handle, bias=to_flavor(b0, "torch"))
        same("combined_x (one bias)", got1, b0, rank)
    return True


def test_weighted_and_bias_combine():
    assert launch(_weighted_and_bias) == [True] * P


def _col_major_scales(rank, n):
    H = 256
    case = make_case(n, 8, 2, H, [5, 6, 7, 8], seed=51, fp8=True)
    res = epx_ref.compute(case, layout="compact", zero_padding=True)
    x, idx, w = inputs(case, rank, "torch")
    with epx.EPBuffer(None, num_max_tokens_per_rank=8, hidden=H, num_topk=2, num_experts=8, use_fp8_dispatch=True) as buf:
        (data, scales), _, _, handle, _ = buf.dispatch(x, idx, w, use_tma_aligned_col_major_sf=True)
        N = data.shape[0]
        assert scales.shape == (N, H // 128) and (N <= 1 or scales.stride() == (1, N)), scales.stride()
        same("recv_x scales (column-major)", scales.contiguous(), res.ranks[rank]["recv_x_scales"], rank)
    return True


def test_fp8_column_major_scales():
    assert launch(_col_major_scales) == [True] * P


def _explicit_group(rank, n):
    import torch.distributed as dist
    group = dist.new_group(list(range(n)))
    case = make_case(n, 8, 2, 128, [3, 3, 3, 3], seed=61)
    x, idx, w = inputs(case, rank, "torch")
    buf = epx.EPBuffer(group, num_max_tokens_per_rank=3, hidden=128, num_topk=2, num_experts=8, explicitly_destroy=True)
    out = buf.dispatch(x, idx, w)
    check_dispatch(case, epx_ref.compute(case, layout="compact", zero_padding=True), rank, out[:4], False, False)
    buf.destroy()
    return buf.transport


def test_explicit_group():
    assert launch(_explicit_group) == ["shm"] * P


def _numpy_readonly_in_writable_out(rank, n):
    case = make_case(n, 8, 2, 128, [4, 3, 5, 2], seed=81)
    res = epx_ref.compute(case, layout="compact", zero_padding=True)
    x, idx, w = inputs(case, rank, "numpy")
    for a in (x, idx, w):
        a.flags.writeable = False  # numpy's own DLPack export refuses these
    with epx.EPBuffer(None, num_max_tokens_per_rank=5, hidden=128, num_topk=2, num_experts=8) as buf:
        recv_x, recv_idx, recv_w, handle, _ = buf.dispatch(x, idx, w)
        check_dispatch(case, res, rank, (recv_x, recv_idx, recv_w, handle), False, False)
        assert recv_x.flags.writeable and recv_x.dtype == np.uint16
        y = expert_y(case, recv_x, recv_idx, handle, False)
        recv_x[...] = y  # the experts write their output over the received rows in place
        combined, _, _ = buf.combine(recv_x, handle)
        same("combined_x", combined, res.ranks[rank]["combined_x"], rank)
    return True


def test_numpy_read_only_inputs_and_writable_outputs():
    assert launch(_numpy_readonly_in_writable_out) == [True] * P


def _outputs_outlive_destroy(rank, n, flavor):
    # recv_x is a block of the window's output pool (one copy): after destroy(), and while a
    # second buffer on the same ranks moves other rows, the held outputs keep their bytes.
    H = 256
    case = make_case(n, 16, 4, H, TOKENS, seed=11)
    res = epx_ref.compute(case, layout="compact", deterministic=True, zero_padding=True)
    x, idx, w = inputs(case, rank, flavor)
    buf = epx.EPBuffer(None, num_max_tokens_per_rank=max(TOKENS), hidden=H, num_topk=4, num_experts=16, explicitly_destroy=True)
    held = [buf.dispatch(x, idx, w) for _ in range(3)]
    buf.destroy()
    other = make_case(n, 16, 4, H, TOKENS, seed=12)
    x2, idx2, w2 = inputs(other, rank, flavor)
    with epx.EPBuffer(None, num_max_tokens_per_rank=max(TOKENS), hidden=H, num_topk=4, num_experts=16) as buf2:
        for _ in range(2):
            buf2.dispatch(x2, idx2, w2)
    for recv_x, recv_idx, recv_w, handle, _ in held:
        check_dispatch(case, res, rank, (recv_x, recv_idx, recv_w, handle), False, False)
    return True


@pytest.mark.parametrize("flavor", ["torch", "numpy"])
def test_outputs_outlive_destroy(flavor):
    assert launch(_outputs_outlive_destroy, flavor) == [True] * P
