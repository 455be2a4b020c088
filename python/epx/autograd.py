"""epx.autograd — dispatch and combine as torch.autograd.Functions (SPEC §4, "Backward").

    import epx, epx.autograd as ea

    recv_x, recv_idx, recv_w, handle, event = ea.dispatch(buf, x, topk_idx, topk_weights,
                                                          do_expand=True, expert_alignment=8)
    y = experts(recv_x) * recv_w[:, None]             # any differentiable torch code
    out = ea.combine(buf, y, handle, bias=shared_out) # [S, H]
    out.float().pow(2).sum().backward()               # x.grad, topk_weights.grad, ...

Both functions take the same arguments as `EPBuffer.dispatch` / `EPBuffer.combine` and
return the same tuple (combine: only `combined_x`). What is differentiable:

- `dispatch`: `recv_x` with respect to `x`, and `recv_topk_weights` with respect to
  `topk_weights`. Backward of `recv_x` is a combine of its gradient with the same handle
  (the transpose of dispatch: every row's gradient goes back to its source token and the
  rows of one token add up, in SPEC §4's fixed float32 order, rounded to bf16). Backward of
  `recv_topk_weights` is also a combine with the same handle: each row's weight gradient
  sits in its own columns of an [rows, H] bf16 tensor (float32 split exactly into three
  bf16 parts, so it arrives unrounded: every other row adds zeros there), which needs
  `H >= 3 K` (fewer parts, i.e. a rounded weight gradient, when `H < 3 K`; `H >= K`).
- `combine`: `combined_x` with respect to `x` (the expert output) and `bias` (a tensor or a
  pair). Backward of `x` is a cached dispatch of the output's gradient with the handle; its
  padding rows get zero gradient.
- FP8 (`use_fp8=True`): `x` is bf16/float32 and is cast to FP8 here (SPEC §5,
  `epx.cast_to_fp8`), dispatched as (data, scales), and `recv_x` is returned dequantized
  as float32 (exact: f32(q) * scale). The gradient treats the cast as the identity (straight-through) and is
  combined in bf16.

Collectiveness: every backward above is a collective epx call on the buffer, so every rank
must run backward over the same graph (as DDP requires), and the buffer must still be alive.
`topk_idx` is never differentiable. `async_with_compute_stream=True` is allowed on the
forward dispatch (the returned `event` must be waited on before `recv_x` is read, exactly
as with `EPBuffer.dispatch`); backward calls are synchronous.
"""

import torch

import epx

__all__ = ["dispatch", "combine", "Handle", "fp8_cast", "fp8_dequant"]

# Parts an exact float32 weight gradient is split into on its way back (bf16 has an 8-bit
# significand, float32 a 24-bit one).
_WEIGHT_PARTS = 3
_FP8_BLOCK = 128


def fp8_cast(x):
    """SPEC §5 per-token cast of `x` ([S, H], H % 128 == 0) by epx: (data uint8/float8, scales
    float32 [S, H/128])."""
    return epx.cast_to_fp8(x.detach().float().contiguous())


def fp8_dequant(data, scales, dtype=torch.float32):
    """f32(q) * scale per 128-column block, returned as `dtype` (`data` raw e4m3 bits)."""
    return epx.dequant_fp8(data, scales).to(dtype)


class _Spec:
    """The dispatch arguments a cached dispatch of the same handle must repeat."""

    def __init__(self, do_expand, expert_alignment, num_worst_tokens, do_zero_padding, extra):
        self.kwargs = dict(do_expand=do_expand, expert_alignment=expert_alignment,
                           num_worst_tokens=num_worst_tokens, do_zero_padding=do_zero_padding,
                           **extra)


def _padding_rows(handle):
    """bool [N]: rows of the handle's dispatch output that belong to no token."""
    return torch.as_tensor(handle.recv_src)[:, 0] < 0


def _split_f32(g, parts):
    """float32 g -> `parts` bf16 tensors whose float32 sum is g (exact for parts = 3 but in
    the subnormal range)."""
    out, rest = [], g.float()
    for _ in range(parts):
        p = rest.bfloat16()
        out.append(p)
        rest = rest - p.float()
    return out


def _weights_back(buffer, handle, grad_w, num_topk, hidden, expanded):
    """Sends every row's weight gradient back to its source slot by a combine with the same
    handle: grad_w is [N, K] (compact, 0 where the slot is not on this rank) or [N]
    (expanded, the row of slot (s, t, k)); returns the [S, K] float32 gradient."""
    parts = min(_WEIGHT_PARTS, hidden // num_topk)
    if parts < 1:
        raise ValueError("epx.autograd: a topk_weights gradient needs hidden >= num_topk "
                         "(hidden %d, num_topk %d)" % (hidden, num_topk))
    n = grad_w.shape[0]
    packed = torch.zeros(n, hidden, dtype=torch.bfloat16)
    if expanded:
        src = torch.as_tensor(handle.recv_src)
        real = src[:, 0] >= 0
        rows = torch.nonzero(real).flatten()
        k = src[rows, 2]
        for p, part in enumerate(_split_f32(grad_w[rows], parts)):
            packed[rows, p * num_topk + k] = part
    else:
        for p, part in enumerate(_split_f32(grad_w, parts)):
            packed[:, p * num_topk:(p + 1) * num_topk] = part
    combined = buffer.combine(packed, handle)[0].float()
    return sum(combined[:, p * num_topk:(p + 1) * num_topk] for p in range(parts))


class _Dispatch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, buffer, spec, use_fp8, x, topk_idx, topk_weights, handle, async_op):
        payload = fp8_cast(x) if use_fp8 else x.detach()
        w = None if topk_weights is None else topk_weights.detach()
        recv_x, recv_idx, recv_w, new_handle, event = buffer.dispatch(
            payload, topk_idx, w, handle=handle, async_with_compute_stream=async_op,
            **spec.kwargs)
        if use_fp8:
            if event is not None and async_op:
                event.current_stream_wait()  # the dequant below reads recv_x
                event = None
            recv_x = fp8_dequant(recv_x[0], recv_x[1])
        ctx.buffer, ctx.spec, ctx.handle = buffer, spec, new_handle
        ctx.x_dtype, ctx.hidden = x.dtype, x.shape[1]
        ctx.recv_idx = recv_idx  # compact: which recv_topk_weights are copies of a weight
        ctx.w_shape = None if topk_weights is None else topk_weights.shape
        ctx.mark_non_differentiable(*[t for t in (recv_idx,) if t is not None])
        return recv_x, recv_idx, recv_w, new_handle, event

    @staticmethod
    def backward(ctx, grad_recv_x, grad_recv_idx, grad_recv_w, grad_handle, grad_event):
        buffer, handle = ctx.buffer, ctx.handle
        grad_x = grad_w = None
        if ctx.needs_input_grad[3]:
            g = torch.zeros(0) if grad_recv_x is None else grad_recv_x
            g = g.to(torch.bfloat16).contiguous()
            grad_x = buffer.combine(g, handle)[0].to(ctx.x_dtype)
        if ctx.needs_input_grad[5]:
            expanded = ctx.spec.kwargs["do_expand"]
            g = grad_recv_w.float()
            if not expanded:  # the zeros of slots on other ranks are constants
                g = torch.where(ctx.recv_idx >= 0, g, torch.zeros_like(g))
            grad_w = _weights_back(buffer, handle, g, ctx.w_shape[1], ctx.hidden, expanded)
        return None, None, None, grad_x, None, grad_w, None, None


class _Combine(torch.autograd.Function):
    @staticmethod
    def forward(ctx, buffer, spec, x, handle, bias0, bias1):
        bias = None
        if bias0 is not None or bias1 is not None:
            bias = (bias0.detach() if bias0 is not None else None,
                    bias1.detach() if bias1 is not None else None)
            bias = bias[0] if bias[1] is None else bias
        combined, _, _ = buffer.combine(x.detach().to(torch.bfloat16).contiguous(), handle,
                                        bias=bias)
        ctx.buffer, ctx.spec, ctx.handle, ctx.x_dtype = buffer, spec, handle, x.dtype
        ctx.bias_dtypes = (None if bias0 is None else bias0.dtype,
                           None if bias1 is None else bias1.dtype)
        return combined

    @staticmethod
    def backward(ctx, grad_out):
        g = grad_out.to(torch.bfloat16).contiguous()
        grad_x = None
        if ctx.needs_input_grad[2]:
            recv = ctx.buffer.dispatch(g, handle=ctx.handle, **ctx.spec.kwargs)[0]
            recv[_padding_rows(ctx.handle)] = 0
            grad_x = recv.to(ctx.x_dtype)
        grads_b = [None if dt is None else grad_out.to(dt) for dt in ctx.bias_dtypes]
        return None, None, grad_x, None, grads_b[0], grads_b[1]


class Handle:
    """What `epx.autograd.dispatch` returns as the handle: the `EPHandle` (`.handle`, for
    the plain `EPBuffer` calls) and the layout arguments its backward calls repeat.
    `num_recv_tokens_per_expert`, `expert_offsets`, `recv_src` read through to the EPHandle.
    Pass it to `epx.autograd.combine` or back to `epx.autograd.dispatch` (cached)."""

    def __init__(self, handle, spec):
        self.handle, self.spec = handle, spec

    def __getattr__(self, name):
        return getattr(self.__dict__["handle"], name)


def dispatch(buffer, x, topk_idx=None, topk_weights=None, *, handle=None, expert_alignment=1,
             num_worst_tokens=0, do_expand=False, do_zero_padding=False,
             async_with_compute_stream=False, use_fp8=False, **kwargs):
    """Differentiable `buffer.dispatch` (module docstring). Returns
    (recv_x, recv_topk_idx, recv_topk_weights, handle, event), `handle` an
    `epx.autograd.Handle`; `handle=` takes one for a cached dispatch."""
    spec = _Spec(do_expand, expert_alignment, num_worst_tokens, do_zero_padding, kwargs)
    raw = handle.handle if isinstance(handle, Handle) else handle
    recv_x, recv_idx, recv_w, new_handle, event = _Dispatch.apply(
        buffer, spec, use_fp8, x, topk_idx, topk_weights, raw, async_with_compute_stream)
    return recv_x, recv_idx, recv_w, Handle(new_handle, spec), event


def combine(buffer, x, handle, bias=None):
    """Differentiable `buffer.combine(x, handle, bias=bias)` (module docstring): returns
    combined_x [S, H] bf16. `handle` is the `epx.autograd.Handle` of the dispatch whose
    rows `x` holds (its backward repeats that dispatch's layout)."""
    if not isinstance(handle, Handle):
        raise TypeError("epx.autograd.combine: handle must be the epx.autograd.Handle "
                        "epx.autograd.dispatch returned, got %s" % type(handle).__name__)
    b0, b1 = (bias if isinstance(bias, tuple) else (bias, None))
    return _Combine.apply(buffer, handle.spec, x, handle.handle, b0, b1)
