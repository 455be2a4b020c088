"""epx.autograd — dispatch and combine as torch.autograd.Functions (docs/spec.md §4, "Backward").

    import epx, epx.autograd as ea

    recv_x, _, recv_w, handle, _ = ea.dispatch(buf, x, topk_idx, topk_weights,
                                               do_expand=True, expert_alignment=8)
    y = experts(recv_x) * recv_w[:, None]              # any differentiable torch code
    out = ea.combine(buf, y, handle, bias=shared_out)  # [S, H] bf16
    out.float().pow(2).sum().backward()                # x.grad, topk_weights.grad, ...

Both take the arguments of `EPBuffer.dispatch` / `EPBuffer.combine` (the buffer first) and
return what those return (combine: only `combined_x`). What is differentiable:

- `dispatch`: `recv_x` with respect to `x`, and `recv_topk_weights` with respect to
  `topk_weights`. The backward of `recv_x` is a combine of its gradient with the same handle
  (the transpose of dispatch: each row's gradient goes back to its source token, where the
  rows of one token add up in docs/spec.md §4's fixed float32 order, rounded to bf16). The backward
  of `recv_topk_weights` is one more combine with the same handle: each row's weight
  gradients sit in columns of their own of an [rows, H] bf16 tensor, the float32 value
  split exactly into three bf16 parts, so they arrive unrounded (every other row adds
  zeros there). That needs H >= 3 K (with K <= H < 3 K fewer parts: a rounded gradient).
- `combine`: `combined_x` with respect to `x` (the expert output, any float dtype; sent as
  bf16) and `bias` (a tensor or a pair). The backward of `x` is a cached dispatch of the
  output's gradient with the handle (bf16); padding rows get zero gradient.
- FP8 (`use_fp8=True`): `x` (bf16 or float32) is cast here to FP8 as docs/spec.md §5 says
  (`fp8_cast`), dispatched as (data, scales), and `recv_x` comes back dequantized to float32
  (`fp8_dequant`, exact). The gradient takes the cast as the identity (straight-through)
  and is combined in bf16, as FP8 training recipes do.
- `async_with_compute_stream=True`: as with `EPBuffer.dispatch` / `combine`, the call returns
  once its puts are issued — dispatch its differentiable tuple, combine `(combined_x,
  event)` — the tensors with their final shapes; compute meanwhile, then
  `event.current_stream_wait()` (alias `wait()`) finishes the call (FP8: and fills the
  dequantized recv_x); use the tensors' values only after it. `defer_epilogue=True`: the
  call returns an event whose wait() finishes it and returns the differentiable tuple
  (combine: combined_x).
- Weighted combine (`weighted=True`, expanded layout): combined = sum over the token's rows
  of weight * row, the weights the handle's (its dispatch's topk_weights). Pass that
  dispatch's `topk_weights` as `topk_weights=` to get its gradient (the sum over the row's
  hidden values of row * grad, back to its (token, slot) through one more combine, as for
  dispatch's recv_topk_weights); the gradient of x is the cached dispatch of grad times
  each row's weight.

Collectiveness: every backward above is a collective epx call on the buffer, so every rank
must run backward over the same graph (as DDP requires) while the buffer is alive; the
backward calls are synchronous. `topk_idx` is never differentiable.
"""

import torch

from .events import EventOverlap

__all__ = ["dispatch", "combine", "fp8_cast", "fp8_dequant"]

_FP8_BLOCK, _FP8_MAX = 128, 448.0


# ----------------------------------------------------------------------------------------
# FP8 (docs/spec.md §5): torch 1.13 has no float8 dtype, so the data are uint8 raw E4M3 bits
# ----------------------------------------------------------------------------------------

def fp8_cast(x):
    """docs/spec.md §5 per-token cast (DeepEP's per_token_cast_to_fp8) of x [S, H], H % 128 == 0:
    per row and 128-column block amax = max|x| (at least 1e-4), q = e4m3(x * (448 / amax))
    rounded to nearest even and saturated, scale = amax / 448. Returns (data uint8 [S, H]
    raw E4M3 bits, scales float32 [S, H/128])."""
    S, H = x.shape
    if H % _FP8_BLOCK:
        raise ValueError("fp8_cast: hidden %% 128 == 0 needed, got %d" % H)
    v = x.detach().float().reshape(S, H // _FP8_BLOCK, _FP8_BLOCK)
    amax = v.abs().amax(-1, keepdim=True).clamp_min(1e-4)
    v = (v * (_FP8_MAX / amax)).clamp(-_FP8_MAX, _FP8_MAX)
    a = v.abs()
    # E4M3: 3 mantissa bits; normals from 2^-6, subnormals in steps of 2^-9
    _, e = torch.frexp(a.clamp_min(2.0 ** -6))          # a = m 2^e, m in [0.5, 1)
    q = torch.round(a * torch.pow(2.0, (4 - e).float()))  # round half to even, in [0, 16]
    e = e + (q == 16).int()                                # rounded up into the next binade
    q = torch.where(q == 16, torch.full_like(q, 8), q)
    normal = q >= 8                                        # a >= 2^-6
    bits = torch.where(normal, ((e + 6) << 3).float() + q - 8, q)  # exponent field e - 1 + 7
    bits = bits.to(torch.uint8) | (torch.signbit(v).to(torch.uint8) << 7)
    return bits.reshape(S, H), (amax / _FP8_MAX).reshape(S, H // _FP8_BLOCK)


def _e4m3_values():
    b = torch.arange(256)
    exp, man = (b >> 3) & 0xF, (b & 7).float()
    mag = torch.where(exp == 0, man / 8 * 2.0 ** -6, (1 + man / 8) * torch.pow(2.0, (exp - 7).float()))
    mag = torch.where((exp == 15) & (man == 7), torch.full_like(mag, float("nan")), mag)
    return torch.where(b >= 128, -mag, mag)


_E4M3 = _e4m3_values()


def fp8_dequant(data, scales):
    """f32(q) * scale per 128-column block: data uint8 raw E4M3 bits [N, H], scales float32
    [N, H/128] (any strides) -> float32 [N, H]."""
    N, H = data.shape
    v = _E4M3[data.long()].reshape(N, H // _FP8_BLOCK, _FP8_BLOCK)
    return (v * scales.reshape(N, H // _FP8_BLOCK, 1)).reshape(N, H)


# ----------------------------------------------------------------------------------------
# The Functions
# ----------------------------------------------------------------------------------------

def _result_of(r):
    """The finished result tuple of an EPBuffer call with its event: its tuple (waited on:
    the event of a synchronous call is done already), or what its event's wait returns
    (defer_epilogue: DeepEP's tuple without the event), a finished event appended."""
    if isinstance(r, tuple):
        r[-1].wait()
        return r
    return tuple(r.wait()) + (EventOverlap(),)


def _padding_rows(handle):
    """bool [N]: rows of the handle's dispatch output that belong to no token."""
    return torch.as_tensor(handle.recv_src)[:, 0] < 0


def _weights_back(buffer, handle, grad_w, num_topk, hidden, expanded):
    """Every row's weight gradient back to its source slot, by a combine with the same
    handle (EPBuffer._weights_back, epx/_weights.py): grad_w is [N, K] (compact; slots not
    on this rank count as 0) or [N] (expanded: the row of slot (s, t, k)). [S, K] float32."""
    return buffer._weights_back(handle, grad_w.float().contiguous(), "torch")


class _Dispatch(torch.autograd.Function):
    """forward(finish, ...): `finish()` completes an issued EPBuffer.dispatch and returns
    its tuple (so an async dispatch's Function runs at the wait)."""

    @staticmethod
    def forward(ctx, buffer, finish, use_fp8, x, topk_weights):
        recv_x, recv_idx, recv_w, handle, event = finish()
        if use_fp8:
            if event.done():
                recv_x = fp8_dequant(*recv_x)
            else:  # async: dequantized into the output once the rows are there
                data, scales = recv_x
                recv_x = torch.empty(data.shape, dtype=torch.float32)
                out, after = recv_x, event._after

                def fill():
                    if after is not None:
                        after()
                    with torch.no_grad():  # the values only: the graph stays this Function's
                        out.copy_(fp8_dequant(data, scales))

                event._after = fill
        ctx.buffer, ctx.handle = buffer, handle
        ctx.x_dtype, ctx.hidden = x.dtype, x.shape[1]
        ctx.num_topk = None if topk_weights is None else topk_weights.shape[1]
        ctx.recv_idx = recv_idx  # compact: which recv_topk_weights are copies of a weight
        if recv_idx is not None:
            ctx.mark_non_differentiable(recv_idx)
        return recv_x, recv_idx, recv_w, handle, event

    @staticmethod
    def backward(ctx, grad_recv_x, grad_recv_idx, grad_recv_w, grad_handle, grad_event):
        buffer, handle = ctx.buffer, ctx.handle
        grad_x = grad_w = None
        if ctx.needs_input_grad[3]:
            g = grad_recv_x.to(torch.bfloat16).contiguous()
            grad_x = _result_of(buffer.combine(g, handle))[0].to(ctx.x_dtype)
        if ctx.needs_input_grad[4] and grad_recv_w is not None:
            g = grad_recv_w.float()
            expanded = ctx.recv_idx is None
            if not expanded:  # the zeros of slots on other ranks are constants
                g = torch.where(ctx.recv_idx >= 0, g, torch.zeros_like(g))
            grad_w = _weights_back(buffer, handle, g, ctx.num_topk, ctx.hidden, expanded)
        return None, None, None, grad_x, grad_w


class _Combine(torch.autograd.Function):
    """forward(issue, ...): `issue()` makes the EPBuffer.combine call and returns its
    result (a tuple, or an event with defer_epilogue); the Function returns combined_x."""

    @staticmethod
    def forward(ctx, buffer, issue, handle, weighted, x, topk_weights, bias0, bias1):
        r = issue(_bf16(x), _bias(bias0, bias1))
        combined = (r.wait() if not isinstance(r, tuple) else r)[0]
        ctx.buffer, ctx.handle, ctx.x_dtype, ctx.weighted = buffer, handle, x.dtype, weighted
        ctx.bias_dtypes = [None if b is None else b.dtype for b in (bias0, bias1)]
        ctx.num_topk = None if topk_weights is None else topk_weights.shape[1]
        if weighted and ctx.needs_input_grad[5]:
            ctx.save_for_backward(_bf16(x))  # the rows as combine read them
        ctx.event = r[-1] if isinstance(r, tuple) else None
        return combined

    @staticmethod
    def backward(ctx, grad_out):
        grad_x = grad_w = None
        if ctx.event is not None:
            ctx.event.wait()  # an async combine never waited on: finish it first
        if ctx.needs_input_grad[4] or ctx.needs_input_grad[5]:
            g = grad_out.to(torch.bfloat16).contiguous()
            recv = _result_of(ctx.buffer.dispatch(g, handle=ctx.handle))[0]
            recv[_padding_rows(ctx.handle)] = 0
            if ctx.weighted:
                w = torch.as_tensor(ctx.handle._recv_weights).float()  # [rows], 0 on padding
                if ctx.needs_input_grad[5]:
                    (y,) = ctx.saved_tensors
                    dots = (y.float() * recv.float()).sum(dim=1)
                    grad_w = _weights_back(ctx.buffer, ctx.handle, dots, ctx.num_topk, y.shape[1], True)
                grad_x = (recv.float() * w[:, None]).to(ctx.x_dtype) if ctx.needs_input_grad[4] else None
            elif ctx.needs_input_grad[4]:
                grad_x = recv.to(ctx.x_dtype)
        gb = [None if dt is None else grad_out.to(dt) for dt in ctx.bias_dtypes]
        return None, None, None, None, grad_x, grad_w, gb[0], gb[1]


def _bias(bias0, bias1):
    if bias1 is not None:
        return (None if bias0 is None else _bf16(bias0), _bf16(bias1))
    return None if bias0 is None else _bf16(bias0)


def _bf16(t):
    return t.detach().to(torch.bfloat16).contiguous()


class _AsyncDispatch:
    """What `epx.autograd.dispatch` / `combine` return with defer_epilogue=True:
    `current_stream_wait()` (alias `wait()`) finishes the call and returns the
    differentiable result."""

    def __init__(self, run):
        self._run, self._result = run, None

    def current_stream_wait(self):
        if self._result is None:
            self._result = self._run()
            self._run = None
        return self._result

    wait = current_stream_wait


def dispatch(buffer, x, topk_idx=None, topk_weights=None, *, use_fp8=False,
             async_with_compute_stream=False, defer_epilogue=False, **kwargs):
    """Differentiable `buffer.dispatch(x, topk_idx, topk_weights, **kwargs)` (module
    docstring): returns (recv_x, recv_topk_idx, recv_topk_weights, handle, event), or with
    async_with_compute_stream / defer_epilogue an event whose current_stream_wait()
    returns that tuple."""
    payload = fp8_cast(x) if use_fp8 else x.detach()
    w = None if topk_weights is None else topk_weights.detach()
    issued = buffer.dispatch(payload, topk_idx, w, async_with_compute_stream=async_with_compute_stream,
                             defer_epilogue=defer_epilogue, **kwargs)
    if defer_epilogue:
        return _AsyncDispatch(lambda: _Dispatch.apply(buffer, lambda: _result_of(issued), use_fp8, x, topk_weights))
    return _Dispatch.apply(buffer, lambda: issued, use_fp8, x, topk_weights)


def combine(buffer, x, handle, topk_weights=None, bias=None, *, weighted=False, async_with_compute_stream=False,
            defer_epilogue=False):
    """Differentiable `buffer.combine(x, handle, bias=bias, weighted=weighted)` (module
    docstring): returns combined_x [S, H] bf16; with async_with_compute_stream the pair
    (combined_x, event), with defer_epilogue an event whose wait() returns combined_x.
    `handle`: the handle of the dispatch whose rows `x` holds; `topk_weights`: that
    dispatch's weights, for their gradient through a weighted combine."""
    b0, b1 = bias if isinstance(bias, (tuple, list)) else (bias, None)

    def issue(y, b):
        return buffer.combine(y, handle, bias=b, weighted=weighted, async_with_compute_stream=async_with_compute_stream,
                              defer_epilogue=defer_epilogue)

    if defer_epilogue:
        return _AsyncDispatch(lambda: _Combine.apply(buffer, issue, handle, weighted, x, topk_weights, b0, b1))
    if async_with_compute_stream:
        box = []

        def issue_async(y, b):
            box.append(issue(y, b))
            return box[0]

        out = _Combine.apply(buffer, issue_async, handle, weighted, x, topk_weights, b0, b1)
        return out, box[0][-1]
    return _Combine.apply(buffer, issue, handle, weighted, x, topk_weights, b0, b1)
