"""EPBuffer's DeepEP V2.5 sizing: num_experts with each dispatch
(one window per expert count), num_bytes as the budget (a num_bytes-only buffer learns its
shape from its first dispatch), the size hint without num_experts holding any expert count,
and the pre-V2.5 positional call refused with a hint."""
import pytest

import epx
import epx_ref
from epx_cases import check_dispatch, inputs, make_case

P, K, H = 4, 2, 128
TOKENS = [3, 4, 0, 2]
C = max(TOKENS)


def _outcome(fn):
    try:
        return fn()
    except epx.Error as e:
        return (e.code, e.origin_rank, str(e))


def _per_dispatch(rank, n):
    got = []
    with epx.EPBuffer(None, num_max_tokens_per_rank=C, hidden=H, num_topk=K) as buf:
        assert buf.window_bytes == 0 and buf.num_experts is None
        for E in (8, 16, 8):
            case = make_case(P, E, K, H, TOKENS, seed=298 + E)
            out = buf.dispatch(*inputs(case, rank, "numpy"), num_experts=E)
            check_dispatch(case, epx_ref.compute(case, layout="compact"), rank, out[:4], False, False)
            got.append(buf.window_bytes)
        hint = epx.EPBuffer.get_buffer_size_hint(None, C, H, K)
        hint8 = epx.EPBuffer.get_buffer_size_hint(None, C, H, K, num_experts=8)
        # the layout of the same routing, for either expert count
        case = make_case(P, 16, K, H, TOKENS, seed=314)
        per_rank = buf.get_dispatch_layout(inputs(case, rank, "numpy")[1], num_experts=16)[0]
    return got, hint, hint8, per_rank.tolist()


def test_num_experts_with_each_dispatch():
    for r, (windows, hint, hint8, per_rank) in enumerate(epx.launch(_per_dispatch, P, start_method="fork")):
        # one window per expert count: a second count adds one, the first again none
        assert 0 < windows[0] < windows[1] == windows[2], windows
        assert hint % (2 << 20) == 0 and hint >= hint8, (hint, hint8)
        assert len(per_rank) == P


def _budget(rank, n):
    hint8 = epx.EPBuffer.get_buffer_size_hint(None, C, H, K, num_experts=8)
    case8 = make_case(P, 8, K, H, TOKENS, seed=299)
    case16 = make_case(P, 16, K, H, TOKENS, seed=300)
    class Plan:  # DeepEP's BufferAllocator protocol: num_bytes, materialize(storage)
        num_bytes = 4096

        def materialize(self, storage):
            self.storage = storage

    plan = Plan()
    with epx.EPBuffer(None, num_bytes=hint8, lb_allocation_plan_or_num_bytes=plan) as buf:
        assert buf.lb_storage is plan.storage and buf.lb_storage.numel() == 4096 and buf.num_lb_bytes == 4096
        out = buf.dispatch(*inputs(case8, rank, "torch"), num_experts=8, num_max_tokens_per_rank=C)
        check_dispatch(case8, epx_ref.compute(case8, layout="compact"), rank, out[:4], False, False)
        learned = (buf.hidden, buf.num_topk, buf.num_max_tokens_per_rank)
        over = _outcome(lambda: buf.dispatch(*inputs(case16, rank, "torch"), num_experts=16))
        again = buf.dispatch(*inputs(case8, rank, "torch"), num_experts=8)[0].shape[0]
    return learned, over, again


def test_num_bytes_is_the_budget():
    got = epx.launch(_budget, P, start_method="fork")
    for r, (learned, over, again) in enumerate(got):
        assert learned == (H, K, C), learned
        assert over[0] == "capacity_exceeded" and "num_bytes" in over[2], over
        assert again == got[r][2]
    assert len({g[1] for g in got}) == 1, [g[1] for g in got]  # the same error on every rank


def _any_count_fits(rank, n):
    hint = epx.EPBuffer.get_buffer_size_hint(None, C, H, K)
    with epx.EPBuffer(None, num_max_tokens_per_rank=C, hidden=H, num_topk=K,
                      num_experts=P * epx.MAX_LOCAL_EXPERTS) as big:
        return hint, big.window_bytes, big.num_bytes


def test_size_hint_without_num_experts_holds_the_largest_count():
    for hint, window, num_bytes in epx.launch(_any_count_fits, P, start_method="fork"):
        assert window <= hint == num_bytes, (window, hint, num_bytes)


def test_the_old_positional_call_is_refused_with_a_hint():
    with pytest.raises(epx.Error) as info:
        epx.EPBuffer(None, 4, 128, 2, 8)  # epx < 0.1's (group, S, H, K, E): now num_bytes = 4
    e = info.value
    assert e.code == "invalid_argument" and "num_bytes = 4" in str(e) and "num_max_tokens_per_rank=S" in str(e), str(e)
    assert epx.get_num_allocation_alignment() == 2 << 20
