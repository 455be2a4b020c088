"""Padding rows: zero by default, kept by a cached dispatch.

Training runs each local expert over its whole aligned group (what a grouped GEMM does):
rows [expert_offsets[j], expert_offsets[j] + aligned[j]) times W_j, padding rows included.
Their recv_x must be zero, or the weight gradient X^T dY is NaN from the first step (X NaN,
dY 0). Each step first "poisons" the buffer's output memory: a dispatch whose recv_x is
filled with NaN and dropped, so the next dispatch of the same shape gets that block back.
"""
import pytest
import torch

import epx
import epx.autograd as ea
from epx_cases import inputs, make_case

P, E, K, H, A = 4, 8, 2, 256, 8  # recv_x > 4 KiB: its own size class in the output memory pool
L = E // P
TOKENS = [7, 5, 6, 4]
STEPS, LR = 3, 0.05


def launch(fn, *args):
    return epx.launch(fn, P, *args, start_method="fork", timeout_secs=120)


def _case():
    return make_case(P, E, K, H, TOKENS, seed=291)


def _x(case, r):
    return inputs(case, r, "torch")[0].float() / 4  # small values: bf16 keeps most bits


def _weights0():
    g = torch.Generator().manual_seed(292)
    return [torch.randn(H, H, generator=g) * 0.05 for _ in range(E)]


def _poison(buf, x, idx, w):
    """A dispatch of this shape whose recv_x goes back to the pool full of NaN."""
    recv_x = buf.dispatch(x, idx, w, do_expand=True, expert_alignment=A, do_zero_padding=False)[0]
    recv_x.view(torch.int16).fill_(0x7FC0)  # bf16 NaN


def _train(rank, n, zero_padding):
    case = _case()
    x, idx, w = inputs(case, rank, "torch")
    xf = _x(case, rank)
    probe = torch.linspace(-1, 1, xf.numel()).reshape(xf.shape)
    W = [w0[:, :].clone().requires_grad_() for w0 in _weights0()[rank * L:(rank + 1) * L]]
    kw = {} if zero_padding is None else {"do_zero_padding": zero_padding}
    grads, nan_padding = [], False
    with epx.EPBuffer(None, num_max_tokens_per_rank=max(TOKENS), hidden=H, num_topk=K, num_experts=E) as buf:
        for _ in range(STEPS):
            _poison(buf, xf.bfloat16(), idx, w)
            recv_x, _, _, handle, _ = ea.dispatch(buf, xf.bfloat16(), idx, w, do_expand=True, expert_alignment=A, **kw)
            offs, aligned = handle.expert_offsets, handle.num_recv_tokens_per_expert_aligned
            pad = torch.as_tensor(handle.recv_src)[:, 0] < 0
            nan_padding |= bool(torch.isnan(recv_x.float()[pad]).any())
            y = torch.cat([recv_x[offs[j]:offs[j] + aligned[j]].float() @ W[j] for j in range(L)])
            out = ea.combine(buf, y, handle)
            (out.float() * probe).sum().backward()
            grads.append([g.grad.clone() for g in W])
            with torch.no_grad():
                for g in W:
                    g -= LR * g.grad
                    g.grad = None
    return grads, nan_padding


def _reference():
    """The same training on one process: dense math from the routing alone."""
    case = _case()
    W = [w0.clone().requires_grad_() for w0 in _weights0()]
    grads = []
    for _ in range(STEPS):
        loss = 0
        for r in range(P):
            xf, idx = _x(case, r), torch.as_tensor(case.topk_idx[r])
            probe = torch.linspace(-1, 1, xf.numel()).reshape(xf.shape)
            out = torch.zeros_like(xf)
            for t in range(xf.shape[0]):
                for e in idx[t].tolist():
                    if e >= 0:
                        out[t] = out[t] + xf[t] @ W[e]
            loss = loss + (out * probe).sum()
        loss.backward()
        grads.append([g.grad.clone() for g in W])
        with torch.no_grad():
            for g in W:
                g -= LR * g.grad
                g.grad = None
    return grads


@pytest.fixture(scope="module")
def reference():
    return _reference()


@pytest.mark.parametrize("zero_padding", [None, True], ids=["default", "do_zero_padding"])
def test_training_through_aligned_groups_is_finite_and_right(reference, zero_padding):
    got = launch(_train, zero_padding)
    for r, (grads, nan_padding) in enumerate(got):
        assert not nan_padding, f"rank {r}: padding rows of recv_x hold NaN"
        for step, g in enumerate(grads):
            for j, gj in enumerate(g):
                want = reference[step][r * L + j]
                assert torch.isfinite(gj).all(), f"rank {r} step {step} expert {r * L + j}: gradient not finite"
                torch.testing.assert_close(gj, want, rtol=3e-2, atol=3e-2,
                                           msg=f"rank {r} step {step} expert {r * L + j}")


def test_opting_out_leaves_padding_unspecified():
    """do_zero_padding=False: the padding rows keep the poisoned bytes (so the tests above,
    which poison the same way, would see NaN without zero padding)."""
    got = launch(_opt_out)
    assert all(got), got


def _opt_out(rank, n):
    case = _case()
    x, idx, w = inputs(case, rank, "torch")
    with epx.EPBuffer(None, num_max_tokens_per_rank=max(TOKENS), hidden=H, num_topk=K, num_experts=E) as buf:
        _poison(buf, x, idx, w)
        recv_x, _, _, handle, _ = buf.dispatch(x, idx, w, do_expand=True, expert_alignment=A, do_zero_padding=False)
        pad = torch.as_tensor(handle.recv_src)[:, 0] < 0
        return bool(pad.any()) and bool(torch.isnan(recv_x.float()[pad]).all())


def _cached(rank, n):
    case = _case()
    x, idx, w = inputs(case, rank, "torch")
    with epx.EPBuffer(None, num_max_tokens_per_rank=max(TOKENS), hidden=H, num_topk=K, num_experts=E) as buf:
        recv_x, _, _, handle, _ = buf.dispatch(x, idx, w, do_expand=True, expert_alignment=A, do_zero_padding=True)
        pad = torch.as_tensor(handle.recv_src)[:, 0] < 0
        first = recv_x.clone()
        recv_x.view(torch.int16).fill_(0x7FC0)  # this block goes back to the pool full of NaN
        del recv_x
        again, _, _, h2, _ = buf.dispatch(x, handle=handle)  # no layout argument: all from the handle
        kept = (h2.do_expand, h2.expert_alignment, h2.do_zero_padding, h2.num_experts, h2.num_worst_tokens)
        return (bool(pad.any()), bool((again.view(torch.int16)[pad] == 0).all()),
                bool(torch.equal(again.view(torch.int16), first.view(torch.int16))), kept)


def test_cached_dispatch_keeps_the_handles_padding_and_layout():
    for r, (has_padding, zero, same, kept) in enumerate(launch(_cached)):
        assert has_padding, f"rank {r}: the case has no padding rows"
        assert zero, f"rank {r}: a cached dispatch of a zero-padded handle left garbage in its padding rows"
        assert same, f"rank {r}: the cached dispatch's recv_x differs from the first"
        assert kept == (True, A, True, E, 0), (r, kept)
