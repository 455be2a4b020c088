"""EPBuffer(output_pool_rows=R): the output pool sized for one output of R rows (an
expanded output has a row per slot, more than the auto pool's compact output holds).
Outputs stay bit for bit the reference's in both layouts, with a pool too small for any
output (copies) and one with room for the expanded one (one copy); the window grows by the pool's extra bytes and the
size hint with the same R is that window; a bad R is refused."""
import numpy as np
import pytest

import epx
import epx_ref
from epx_cases import check_dispatch, expert_y, inputs, make_case, same, to_flavor

P, E, K, H = 4, 8, 4, 128
TOKENS = [7, 4, 9, 2]
C = max(TOKENS)
MIB2 = 2 << 20


def _round_trips(rank, n, pool_rows):
    case = make_case(n, E, K, H, TOKENS, seed=61)
    x, idx, w = inputs(case, rank, "torch")
    with epx.EPBuffer(None, num_max_tokens_per_rank=C, hidden=H, num_topk=K, num_experts=E, deterministic=True,
                      output_pool_rows=pool_rows) as buf:
        for expanded in (True, False, True):  # each output dropped before the next dispatch
            layout = "expanded" if expanded else "compact"
            res = epx_ref.compute(case, layout=layout, deterministic=True, zero_padding=True)
            recv_x, recv_idx, recv_w, handle, _ = buf.dispatch(x, idx, w, do_expand=expanded)
            check_dispatch(case, res, rank, (recv_x, recv_idx, recv_w, handle), expanded, False)
            y = to_flavor(expert_y(case, recv_x, recv_idx, handle, expanded), "torch")
            same("combined_x (%s)" % layout, buf.combine(y, handle)[0], res.ranks[rank]["combined_x"], rank)
            del recv_x, recv_idx, recv_w, handle, y
        hint = epx.EPBuffer.get_buffer_size_hint(None, C, H, K, num_experts=E, output_pool_rows=pool_rows)
        return buf.window_bytes, hint


# 0: the auto pool (one compact output of P x C rows); 1: a pool too small for any output
# (every recv_x a copy); 4 P C K: room for the largest expanded output, and more.
@pytest.mark.parametrize("pool_rows", [1, 4 * P * C * K])
def test_outputs_and_window(pool_rows):
    auto = epx.launch(_round_trips, P, 0, start_method="fork")
    got = epx.launch(_round_trips, P, pool_rows, start_method="fork")
    for (w0, hint0), (w, hint) in zip(auto, got):
        assert hint0 == (w0 + MIB2 - 1) // MIB2 * MIB2 and hint == (w + MIB2 - 1) // MIB2 * MIB2, (w0, w, hint)
        extra = (pool_rows - P * C) * 2 * H  # bf16 rows: the bigger of a bf16 and an FP8 output
        assert abs((w - w0) - extra) < 3 * 4096, (w0, w, extra)  # (page-aligned pools and blocks)


def test_bad_output_pool_rows():
    def bad(rank, n):
        try:
            epx.EPBuffer(None, num_max_tokens_per_rank=C, hidden=H, num_topk=K, num_experts=E, output_pool_rows=-1)
        except epx.Error as e:
            return e.code, "output_pool_rows = -1" in str(e)
        return None
    assert epx.launch(bad, 2, start_method="fork") == [("invalid_argument", True)] * 2
