"""epx.autograd on 4 ranks (epx.launch) against dense math computed from the routing alone.

The experts are fixed functions (each row times a factor of its expert, or times its
routing weight), so out = combine(experts(dispatch(x))) and every gradient have a closed
form in terms of x, topk_idx, topk_weights and the cotangent `probe`. The data are small
integers and the weights dyadic, so bf16 and the float32 sums are exact and the comparisons
are bit for bit (tolerance 0), except `weights_exact`, which uses random float32 weights to
show their gradient comes back unrounded (relative 1e-6; one bf16 part would be 4e-3).
The combine gradient is checked by the adjoint identity <combine(y), p> == <y, grad_y>
summed over ranks (what gradcheck checks for a linear map), exact on integers.

All checks run in one launch (module fixture) to keep the suite fast; each test asserts
its part on every rank.
"""

import os
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD_PY = os.path.join(HERE, "..", "..", "build", "python")
if os.path.isdir(os.path.join(BUILD_PY, "epx")):  # this checkout's build first
    sys.path.insert(0, BUILD_PY)

import epx  # noqa: E402
import epx.autograd as ea  # noqa: E402

P, E, K, H = 4, 8, 3, 128
L = E // P
TOKENS = [6, 0, 5, 7]  # rank 1 has no tokens
C = max(TOKENS)


def routing(seed):
    """Every rank's topk_idx (distinct experts, some -1 slots) and dyadic weights."""
    g = torch.Generator().manual_seed(seed)
    idx, w = [], []
    for s in TOKENS:
        rows = [torch.randperm(E, generator=g)[:K] for _ in range(s)]
        t = torch.stack(rows) if rows else torch.zeros(0, K, dtype=torch.int64)
        drop = torch.rand(t.shape, generator=g) < 0.2
        drop[:, 0] = False
        idx.append(torch.where(drop, torch.full_like(t, -1), t))
        w.append(torch.randint(1, 5, t.shape, generator=g).float() / 4)
    return idx, w


def ints(shape, seed, lo=-3, hi=4):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(lo, hi, shape, generator=g).float()


def fp8_exact(shape, seed):
    """Values FP8 carries exactly (up to the float32 rounding of the scale 4/448, which a
    bf16 rounding removes): every 128-column block has amax 4, the rest in {0, +-1, +-2, +-4}."""
    g = torch.Generator().manual_seed(seed)
    vals = torch.tensor([-4.0, -2.0, -1.0, 0.0, 1.0, 2.0, 4.0])
    x = vals[torch.randint(0, len(vals), shape, generator=g)]
    x[:, ::128] = 4.0
    return x


def rel_err(got, want):
    if want.numel() == 0:
        return 0.0
    return (got.double() - want.double()).abs().max().item() / max(want.abs().max().item(), 1e-30)


def expected_dense(rank, idx, w, x, probe, use_weights):
    """out[t] = sum_k a_k x[t], a_k = w_k (use_weights) or factor(e_k); and the gradients of
    loss = sum(out * probe): grad_x[t] = sum_k a_k probe[t], grad_w[t,k] = <x[t], probe[t]>."""
    i, wt = idx[rank], w[rank]
    valid = i >= 0
    a = torch.where(valid, wt if use_weights else (i % L + 1).float(), torch.zeros_like(wt))
    s = a.sum(1, keepdim=True)
    out = s * x
    grad_x = s * probe
    grad_w = torch.where(valid, (x * probe).sum(1, keepdim=True).expand_as(wt),
                         torch.zeros_like(wt)) if use_weights else None
    return out, grad_x, grad_w


def local_factor_rows(handle, recv_idx, expanded):
    """Per received row, the factor of its expert(s) from what dispatch returned:
    expanded: the row's local expert (from expert_offsets); compact: sum over the row's
    valid local experts."""
    if expanded:
        off = list(handle.expert_offsets)
        f = torch.zeros(off[-1])
        for j in range(L):
            f[off[j]:off[j + 1]] = j + 1
        return f
    v = recv_idx >= 0
    return torch.where(v, recv_idx + 1, torch.zeros_like(recv_idx)).sum(1).float()


def run_case(buf, rank, expanded, use_weights, alignment=1, worst=0, async_op=False,
             use_fp8=False, seed=0, cached=False):
    idx, w = routing(seed)
    x0 = (fp8_exact if use_fp8 else ints)((TOKENS[rank], H), seed + 10 + rank)
    probe = ints((TOKENS[rank], H), seed + 20 + rank, -2, 3)
    x = x0.clone().requires_grad_(True)
    wt = w[rank].clone().requires_grad_(True)
    xin = x if use_fp8 else x.bfloat16()
    kw = dict(do_expand=expanded, expert_alignment=alignment, num_worst_tokens=worst,
              do_zero_padding=True)
    got = ea.dispatch(buf, xin, idx[rank], wt, async_with_compute_stream=async_op == "async",
                      defer_epilogue=async_op == "defer", use_fp8=use_fp8, **kw)
    if async_op == "async":  # the tuple at once, its values after the wait
        assert isinstance(got, tuple) and got[0].shape[0] == got[3].num_recv_rows
        got[4].current_stream_wait()
    elif async_op == "defer":  # an event whose wait returns the tuple
        assert not isinstance(got, tuple)
        got = got.current_stream_wait()
    recv_x, recv_idx, recv_w, handle, _ = got
    if cached:  # a second, cached dispatch of the same x: its gradient must add up too
        recv_x2 = ea.dispatch(buf, xin, handle=handle, use_fp8=use_fp8)[0]
        recv_x = (recv_x.float() + recv_x2.float()) / 2
    if use_weights:
        a = recv_w if expanded else recv_w.sum(1)
    else:
        a = local_factor_rows(handle, recv_idx, expanded)
    y = (recv_x.float() * a[:, None]).bfloat16()
    out = ea.combine(buf, y, handle)
    (out.float() * probe).sum().backward()
    want_out, want_gx, want_gw = expected_dense(rank, idx, w, x0, probe, use_weights)
    res = {"out": rel_err(out, want_out), "grad_x": rel_err(x.grad, want_gx)}
    if use_weights:
        res["grad_w"] = rel_err(wt.grad, want_gw)
    return res


def weights_exact(buf, rank, expanded):
    """Random float32 weights: their gradient must come back to 1e-6 (three bf16 parts)."""
    idx, _ = routing(3)
    g = torch.Generator().manual_seed(40 + rank)
    wt = torch.rand(idx[rank].shape, generator=g).requires_grad_(True)
    x = ints((TOKENS[rank], H), 50 + rank).bfloat16()
    probe = torch.randn(TOKENS[rank], H, generator=g) / 3
    recv_x, _, recv_w, handle, _ = ea.dispatch(buf, x, idx[rank], wt, do_expand=expanded)
    a = recv_w if expanded else recv_w.sum(1)
    out = ea.combine(buf, (recv_x.float() * a[:, None]).bfloat16(), handle)
    (out.float() * probe).sum().backward()
    want = torch.where(idx[rank] >= 0,
                       (x.float() * probe.bfloat16().float()).sum(1, keepdim=True).expand_as(wt),
                       torch.zeros_like(wt))
    err = (wt.grad - want).abs().max().item() if want.numel() else 0.0
    scale = want.abs().max().item() if want.numel() else 1.0
    return {"rel": err / max(scale, 1e-30)}


def weighted_combine(buf, rank, mode):
    """A weighted combine (expanded; the weights are the handle's) of the identity expert:
    out[t] = sum_k w_k x[t], and the gradients of x and of topk_weights (passed to the
    combine) as in expected_dense, bit for bit; mode None, "async" or "defer"."""
    idx, w = routing(8)
    x0 = ints((TOKENS[rank], H), 100 + rank)
    probe = ints((TOKENS[rank], H), 110 + rank, -2, 3)
    x = x0.clone().requires_grad_(True)
    wt = w[rank].clone().requires_grad_(True)
    recv_x, _, _, handle, _ = ea.dispatch(buf, x.bfloat16(), idx[rank], wt, do_expand=True, expert_alignment=2,
                                          do_zero_padding=True)
    if mode == "async":  # combined_x at once, its values after the wait
        out, ev = ea.combine(buf, recv_x, handle, wt, weighted=True, async_with_compute_stream=True)
        assert tuple(out.shape) == (TOKENS[rank], H)
        ev.current_stream_wait()
    elif mode == "defer":
        out = ea.combine(buf, recv_x, handle, wt, weighted=True, defer_epilogue=True).wait()
    else:
        out = ea.combine(buf, recv_x, handle, wt, weighted=True)
    (out.float() * probe).sum().backward()
    want_out, want_gx, want_gw = expected_dense(rank, idx, w, x0, probe, True)
    return {"out": rel_err(out, want_out), "grad_x": rel_err(x.grad, want_gx), "grad_w": rel_err(wt.grad, want_gw)}


def combine_adjoint(buf, rank, expanded, alignment, worst):
    """<combine(y, bias), p> == <y, grad_y> + <bias, grad_bias> summed over ranks; padding
    rows of grad_y are zero; grad_bias == p."""
    idx, w = routing(5)
    x = ints((TOKENS[rank], H), 60 + rank).bfloat16()
    kw = dict(do_expand=expanded, expert_alignment=alignment, num_worst_tokens=worst,
              do_zero_padding=True)
    recv_x, _, _, handle, _ = ea.dispatch(buf, x, idx[rank], w[rank], **kw)
    n = recv_x.shape[0]
    y = ints((n, H), 70 + rank).bfloat16().requires_grad_(True)
    bias = ints((TOKENS[rank], H), 80 + rank).bfloat16().requires_grad_(True)
    p = ints((TOKENS[rank], H), 90 + rank, -2, 3)
    out = ea.combine(buf, y, handle, bias=bias)
    lhs = (out.double() * p.double()).sum()
    (out.float() * p).sum().backward()
    pad = torch.as_tensor(handle.recv_src)[:, 0] < 0
    y_real = y.detach().double().clone()
    y_real[pad] = 0  # combine ignores padding rows
    rhs = (y_real * y.grad.double()).sum() + (bias.double() * p.double()).sum()
    return {"lhs": lhs.item(), "rhs": rhs.item(), "pad_rows": int(pad.sum()),
            "pad_zero": bool((y.grad[pad] == 0).all()),
            "grad_bias": torch.equal(bias.grad.float(), p)}


CASES = {
    "compact_factor": dict(expanded=False, use_weights=False),
    "compact_weights": dict(expanded=False, use_weights=True),
    "expanded_factor": dict(expanded=True, use_weights=False, alignment=4),
    "expanded_weights": dict(expanded=True, use_weights=True, alignment=4),
    "expanded_worst": dict(expanded=True, use_weights=True, alignment=2, worst=40),
    "compact_worst": dict(expanded=False, use_weights=True, worst=24),
    "expanded_async": dict(expanded=True, use_weights=True, async_op="async"),
    "compact_fp8_async": dict(expanded=False, use_weights=True, use_fp8=True, async_op="async"),
    "expanded_defer": dict(expanded=True, use_weights=True, alignment=4, async_op="defer"),
    "compact_defer": dict(expanded=False, use_weights=False, async_op="defer"),
    "compact_fp8": dict(expanded=False, use_weights=True, use_fp8=True),
    "expanded_fp8": dict(expanded=True, use_weights=False, use_fp8=True, alignment=4),
    "expanded_cached": dict(expanded=True, use_weights=True, cached=True),
    "compact_cached_fp8": dict(expanded=False, use_weights=False, cached=True, use_fp8=True),
}


def _worker(rank, num_ranks):
    torch.set_num_threads(1)
    out = {}
    with epx.EPBuffer(None, num_max_tokens_per_rank=C, hidden=H, num_topk=K,
                      num_experts=E, use_fp8_dispatch=True) as buf:
        for name, kw in CASES.items():
            out[name] = run_case(buf, rank, seed=len(out), **kw)
        out["weights_exact_compact"] = weights_exact(buf, rank, False)
        out["weights_exact_expanded"] = weights_exact(buf, rank, True)
        out["adjoint_compact"] = combine_adjoint(buf, rank, False, 1, 0)
        out["adjoint_expanded"] = combine_adjoint(buf, rank, True, 4, 0)
        out["adjoint_expanded_worst"] = combine_adjoint(buf, rank, True, 2, 40)
        for mode in (None, "async", "defer"):
            out["weighted_%s" % mode] = weighted_combine(buf, rank, mode)
    return out


@pytest.fixture(scope="module")
def results():
    return epx.launch(_worker, P, start_method="fork", timeout_secs=60)


@pytest.mark.parametrize("name", sorted(CASES))
def test_dispatch_combine_gradients_match_dense(results, name):
    # bit for bit, but the FP8 weight gradient: <f32(q) * scale, probe> is summed at the
    # destination, where f32(q) * scale is x up to the float32 rounding of the scale
    tol = {"grad_w": 1e-6} if CASES[name].get("use_fp8") else {}
    for rank in range(P):
        for what, err in results[rank][name].items():
            assert err <= tol.get(what, 0.0), (rank, name, what, err)


@pytest.mark.parametrize("layout", ["compact", "expanded"])
def test_weight_gradient_is_unrounded(results, layout):
    for rank in range(P):
        assert results[rank]["weights_exact_" + layout]["rel"] <= 1e-6, rank


@pytest.mark.parametrize("mode", [None, "async", "defer"], ids=["sync", "async", "defer"])
def test_weighted_combine_gradients_match_dense(results, mode):
    for rank in range(P):
        for what, err in results[rank]["weighted_%s" % mode].items():
            assert err == 0.0, (rank, mode, what, err)


@pytest.mark.parametrize("case", ["compact", "expanded", "expanded_worst"])
def test_combine_backward_is_the_adjoint(results, case):
    lhs = sum(results[r]["adjoint_" + case]["lhs"] for r in range(P))
    rhs = sum(results[r]["adjoint_" + case]["rhs"] for r in range(P))
    assert lhs == rhs
    for r in range(P):
        assert results[r]["adjoint_" + case]["pad_zero"], r
        assert results[r]["adjoint_" + case]["grad_bias"], r
    if case != "compact":
        assert sum(results[r]["adjoint_" + case]["pad_rows"] for r in range(P)) > 0


def test_fp8_cast_matches_an_independent_rounding():
    """fp8_cast decoded with the numpy reference's E4M3 table == the torch rounding of
    examples/moe_layer.py (round half to even, saturation, subnormals), bit for bit."""
    sys.path.insert(0, os.path.join(HERE, "..", "e2e"))
    sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))
    import epx_ref
    import moe_layer
    g = torch.Generator().manual_seed(7)
    x = torch.randn(9, 2 * H, generator=g) * torch.logspace(-6, 3, 9)[:, None]
    x[0, :128] = 0
    x[1, 5] = 1e-12  # a subnormal after scaling
    data, scales = ea.fp8_cast(x)
    assert data.dtype == torch.uint8 and scales.shape == (9, 2)
    decoded = torch.from_numpy(epx_ref.fp8_to_f32(data.numpy()))
    assert torch.equal(decoded, ea.fp8_dequant(data, torch.ones(9, 2)))
    deq = (decoded.reshape(9, 2, 128) * scales[:, :, None]).reshape(9, 2 * H)
    assert torch.equal(deq, moe_layer._fp8_roundtrip_ref(x))
