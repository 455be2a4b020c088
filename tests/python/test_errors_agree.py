"""One failure, one error: whichever check fails — the binding's
(dtype, strides, device, handles, argument shapes) or the engine's (routing, capacity,
shapes, layout, stale handles) — every rank raises the same code, the same origin_rank (the
culprit) and the same message (the culprit's words); and when every rank fails the same
check, the error says so ("every rank: ...", origin -1) instead of blaming rank 0.
After each failure the buffer still works."""
import pytest
import torch

import epx
from epx_cases import inputs, make_case

P, E, K, H, S = 3, 6, 2, 128, 4
CULPRIT = 1


def _buf(**kw):
    return epx.EPBuffer(None, num_max_tokens_per_rank=S, hidden=H, num_topk=K, num_experts=E, **kw)


def _fp8(x):
    return (torch.zeros(x.shape, dtype=torch.uint8), torch.ones(x.shape[0], H // 128))


# name -> (code, call(buf, x, idx, w, bad)); `bad` is True on the culprit (or on every rank
# for the "every rank" cases). Each call is one collective step on every rank.
def _cases():
    def dispatch(**kw):
        return lambda b, x, i, w, bad: b.dispatch(x, i, w, **(kw if bad else {}))

    def with_x(f):
        return lambda b, x, i, w, bad: b.dispatch(f(x) if bad else x, i, w)

    def with_idx(f):
        return lambda b, x, i, w, bad: b.dispatch(x, f(i) if bad else i, w)

    def cached(**kw):
        def call(b, x, i, w, bad):
            h = b.dispatch(x, i, w)[3]
            b.dispatch(x, handle=h, **(kw if bad else {}))
        return call

    def combine(f, **kw):
        def call(b, x, i, w, bad):
            recv_x, _, recv_w, h, _ = b.dispatch(x, i, w)
            y, h2 = (f(recv_x, h, recv_w) if bad else (recv_x, h))
            b.combine(y, h2, **(kw if bad else {}))
        return call

    def stale_topk(b, x, i, w, bad):
        h = b.dispatch(x, i, w)[3]
        if bad:
            i.add_(0)  # in place: torch's version counter moves
        b.dispatch(x, handle=h)

    def foreign(b, x, i, w, bad):
        with _buf() as other:
            h = other.dispatch(x, i, w)[3]
            mine = b.dispatch(x, i, w)[3]
            b.dispatch(x, handle=h if bad else mine)

    def stale_engine_handle(b, x, i, w, bad):
        h1 = b.dispatch(x, i, w)[3]
        h2 = b.dispatch(x, i, w)[3]
        b.dispatch(x, handle=h1 if bad else h2)

    def lb(b, x, i, w, bad):
        home, slots = torch.zeros(E // P, 8), torch.zeros(1, 8)
        mapping = torch.full((P, 1), -1) if not bad else torch.full((P, 2, 1), -1)
        b.lb_prefetch_weights([slots], [home], mapping)

    def out_of_range(i):
        i = i.clone()
        i[0, 0] = E
        return i

    return {
        # the binding's checks
        "x_dtype": ("dtype_mismatch", with_x(lambda x: x.to(torch.float16))),
        "x_strides": ("shape_mismatch", with_x(lambda x: x.t().contiguous().t())),
        "x_device": ("unsupported", with_x(lambda x: torch.empty(x.shape, dtype=x.dtype, device="meta"))),
        "topk_idx_dtype": ("dtype_mismatch", with_idx(lambda i: i.int())),
        "fp8_pair_of_three": ("invalid_argument", with_x(lambda x: _fp8(x) + (None,))),
        "stats_shape": ("shape_mismatch", dispatch(cumulative_local_expert_recv_stats=torch.zeros(5, dtype=torch.int32))),
        "stats_dtype": ("dtype_mismatch", dispatch(cumulative_local_expert_recv_stats=torch.zeros(E // P))),
        "do_handle_copy": ("invalid_argument", dispatch(do_handle_copy=True)),
        "tokens_over_dispatch_cap": ("capacity_exceeded", dispatch(num_max_tokens_per_rank=S + 1)),
        "stale_topk_idx": ("bad_handle", stale_topk),
        "foreign_handle": ("bad_handle", foreign),
        "cached_num_experts": ("bad_handle", cached(num_experts=2 * E)),
        "combine_not_a_handle": ("bad_handle", combine(lambda y, h, w: (y, ("not", "a", "handle")))),
        "combine_bias_pair": ("invalid_argument", combine(lambda y, h, w: (y, h), bias=(None,))),
        "combine_weights_shape": ("shape_mismatch", combine(lambda y, h, w: (y, h), topk_weights=torch.zeros(1, K))),
        "lb_mapping": ("invalid_argument", lb),
        # the engine's checks
        "topk_out_of_range": ("invalid_argument", with_idx(out_of_range)),
        "x_hidden": ("shape_mismatch", with_x(lambda x: torch.zeros(x.shape[0], H + 1, dtype=x.dtype))),
        "too_many_tokens": ("capacity_exceeded", lambda b, x, i, w, bad: b.dispatch(
            *((torch.cat([x, x]), torch.cat([i, i]), torch.cat([w, w])) if bad else (x, i, w)))),
        "worst_too_small": ("capacity_exceeded", dispatch(num_worst_tokens=1)),
        "cached_layout_differs": ("bad_handle", cached(expert_alignment=4)),
        "stale_engine_handle": ("bad_handle", stale_engine_handle),
        "weighted_compact_combine": ("invalid_argument", combine(lambda y, h, w: (y, h), weighted=True)),
        "combine_rows": ("shape_mismatch", combine(lambda y, h, w: (torch.cat([y, y[:1]]), h))),
    }


EVERY_RANK = {"x_strides": "x: expected a C-contiguous", "cached_layout_differs": "cached dispatch: layout"}


def _run(rank, n):
    case = make_case(P, E, K, H, [S] * P, seed=293)
    out = {}
    for name, (_, call) in _cases().items():
        for every in (False, True) if name in EVERY_RANK else (False,):
            x, idx, w = inputs(case, rank, "torch")
            with _buf() as buf:
                try:
                    call(buf, x, idx, w, every or rank == CULPRIT)
                    got = None
                except epx.Error as e:
                    got = (e.code, e.origin_rank, str(e))
                x, idx, w = inputs(case, rank, "torch")
                recv = buf.dispatch(x, idx, w)[0]  # still usable
            out[(name, every)] = (got, int(recv.shape[0]))
    return out


@pytest.fixture(scope="module")
def outcomes():
    return epx.launch(_run, P, start_method="fork", timeout_secs=240)


@pytest.mark.parametrize("name", list(_cases()))
def test_every_rank_gets_the_culprits_error(outcomes, name):
    code = _cases()[name][0]
    got = [outcomes[r][(name, False)][0] for r in range(P)]
    assert all(g is not None for g in got), (name, got)
    assert {g[0] for g in got} == {code}, (name, got)
    assert {g[1] for g in got} == {CULPRIT}, (name, got)
    assert len({g[2] for g in got}) == 1, f"{name}: the ranks' messages differ: {got}"
    assert got[0][2].startswith(f"rank {CULPRIT}: "), got[0][2]


@pytest.mark.parametrize("name", list(EVERY_RANK))
def test_the_same_mistake_on_every_rank_is_said_so(outcomes, name):
    got = [outcomes[r][(name, True)][0] for r in range(P)]
    want = f"every rank: {EVERY_RANK[name]}"
    for r, g in enumerate(got):
        assert g is not None and g[1] == -1 and g[2].startswith(want), (r, g)
        assert g[0] == _cases()[name][0], (r, g)


def test_buffer_works_after_each_failure(outcomes):
    case = make_case(P, E, K, H, [S] * P, seed=293)
    import epx_ref
    want = epx_ref.compute(case, layout="compact")
    for r in range(P):
        for key, (_, rows) in outcomes[r].items():
            assert rows == want.ranks[r]["recv_x"].shape[0], (r, key, rows)

