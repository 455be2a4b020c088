"""Several buffers on one group (docs/buffers.md): every buffer of a torch.distributed group
shares the group's transport (epx.group.transport_of), each on its own endpoint, so two
EPBuffers of different shapes interleave their calls on the same ranks, bit-exact."""
import numpy as np

import epx
import epx_ref
from epx.group import transport_of
from epx_cases import check_dispatch, expert_y, inputs, make_case, same

P = 4
TOKENS = [9, 0, 14, 5]


def _round(buf, case, res, rank, expanded):
    x, idx, w = inputs(case, rank, "torch")
    recv_x, recv_idx, recv_w, handle, _ = buf.dispatch(x, idx, w, do_expand=expanded, expert_alignment=4 if expanded else 1,
                                                      deterministic=True, do_zero_padding=True)
    check_dispatch(case, res, rank, (recv_x, recv_idx, recv_w, handle), expanded, False)
    y = expert_y(case, recv_x, recv_idx, handle, expanded)
    combined, _, _ = buf.combine(y, handle)
    same("combined_x", combined, res.ranks[rank]["combined_x"], rank)


def _two_buffers(rank, n):
    a = make_case(n, 16, 4, 256, TOKENS, seed=31)
    b = make_case(n, 8, 2, 512, TOKENS, seed=32)
    ra = epx_ref.compute(a, layout="compact", alignment=1, deterministic=True, zero_padding=True)
    rb = epx_ref.compute(b, layout="expanded", alignment=4, deterministic=True, zero_padding=True)
    t = transport_of(None)
    assert transport_of(None) is t  # one transport per group
    first = epx.EPBuffer(None, max(TOKENS), 256, 4, 16)
    second = epx.EPBuffer(None, max(TOKENS), 512, 2, 8)
    assert transport_of(None) is t and first.window_bytes > 0 and second.window_bytes > 0
    for _ in range(2):
        _round(first, a, ra, rank, False)
        _round(second, b, rb, rank, True)
    first.destroy()  # the other goes on
    _round(second, b, rb, rank, True)
    third = epx.EPBuffer(None, max(TOKENS), 256, 4, 16)
    _round(third, a, ra, rank, False)
    _round(second, b, rb, rank, True)
    second.destroy()
    third.destroy()
    return True


def test_two_ep_buffers_share_one_group():
    assert epx.launch(_two_buffers, P, start_method="fork", timeout_secs=60) == [True] * P
