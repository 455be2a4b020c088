"""epx.Buffer behaves as DeepEP V1's intranode Buffer, checked on 4 ranks against a numpy
model written here from DeepEP's semantics (each rank builds every rank's inputs from the
seed, so each can say what it must receive and get back):

- dispatch without topk_idx routes by is_token_in_rank alone, returns no top-k outputs and
  counts per local expert from num_tokens_per_expert summed over the ranks;
- the handle is DeepEP's 6-tuple (rank prefix matrix, channel prefix matrices, source
  token indices, is_token_in_rank, send heads) with DeepEP's shapes, dtypes and values,
  usable as a plain tuple too;
- FP8 scales may be column-major (DeepEP's test transposes them);
- combine's topk_weights add up the whole row every receiving rank passes back, every
  slot, in float32;
- is_sm90_compiled() says FP8 dispatch exists;
- num_worst_tokens, async_finish and previous_event, cached dispatch;
- a bad layout on one rank fails the call on every rank, naming that rank.
"""
import copy

import numpy as np
import pytest
import torch

import epx

P, E, K, H = 4, 8, 3, 256
L = E // P
TOKENS = [5, 7, 0, 6]
NUM_SMS = 6  # 3 channels: several tokens per channel, some channels empty on small ranks


def _rank_inputs(s, seed=11):
    """Rank s's tokens: x with small integer values (bf16 sums of up to P of them are exact),
    topk_idx with some -1 slots, weights, a free routing for layout-only dispatch, and a
    num_tokens_per_expert that is not the routing's (DeepEP takes the list from it)."""
    rng = np.random.default_rng(seed * 100 + s)
    S = TOKENS[s]
    x = rng.integers(-8, 9, (S, H)).astype(np.float32)
    idx = np.array([rng.permutation(E)[:K] for _ in range(S)], dtype=np.int64).reshape(S, K)
    idx[rng.random((S, K)) < 0.2] = -1
    w = rng.random((S, K)).astype(np.float32) + 0.5
    in_rank = rng.random((S, P)) < 0.5
    per_expert = rng.integers(0, 20, E).astype(np.int32)
    return x, idx, w, in_rank, per_expert


def _ranks_of(idx):
    """bool [S, P]: which ranks hold one of the token's experts."""
    out = np.zeros((idx.shape[0], P), dtype=bool)
    for t, row in enumerate(idx):
        for e in row:
            if e >= 0:
                out[t, e // L] = True
    return out


def _expected(d, routes):
    """What rank d receives when rank s sends token t where routes[s][t, d]: the (s, t) pairs
    in DeepEP's order (source rank, then token)."""
    return [(s, t) for s in range(P) for t in range(routes[s].shape[0]) if routes[s][t, d]]


def _bf16(a):
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).to(torch.bfloat16)


def _channels(n):
    per = -(-n // (NUM_SMS // 2)) if n else 1
    return np.arange(n) // per


def _check_handle(handle, d, routes, worst=0):
    """The 6-tuple against DeepEP's definitions."""
    assert isinstance(handle, tuple) and len(handle) == 6
    rank_prefix, channel_prefix, recv_channel_prefix, recv_src_idx, in_rank, send_head = handle
    C = NUM_SMS // 2
    counts = np.array([[int(routes[s][:, r].sum()) for r in range(P)] for s in range(P)])
    assert rank_prefix.dtype == torch.int32 and rank_prefix.tolist() == np.cumsum(counts, axis=0).tolist()
    mine = routes[d]
    assert channel_prefix.dtype == torch.int32 and tuple(channel_prefix.shape) == (P, C)
    assert recv_channel_prefix.dtype == torch.int32 and tuple(recv_channel_prefix.shape) == (P, C)
    assert send_head.dtype == torch.int32 and tuple(send_head.shape) == (TOKENS[d], P)
    for r in range(P):
        # channel c holds a contiguous token range; inclusive prefix of tokens to r
        want = [int(mine[_channels(TOKENS[d]) <= c, r].sum()) for c in range(C)]
        assert channel_prefix[r].tolist() == want, (r, channel_prefix[r].tolist(), want)
        # receiver side: tokens from source r in the source's channels before c
        src = routes[r][:, d]
        want = [int(src[_channels(TOKENS[r]) < c].sum()) for c in range(C)]
        assert recv_channel_prefix[r].tolist() == want
        for t in range(TOKENS[d]):
            if mine[t, r]:
                ch = _channels(TOKENS[d])
                pos = int(mine[(ch == ch[t]) & (np.arange(TOKENS[d]) < t), r].sum())
                assert send_head[t, r].item() == pos
            else:
                assert send_head[t, r].item() == -1
    pairs = _expected(d, routes)
    want_src = [t for _, t in pairs] + [-1] * max(0, worst - len(pairs))
    assert recv_src_idx.dtype == torch.int32 and recv_src_idx.tolist() == want_src
    assert in_rank.dtype == torch.bool and in_rank.numpy().tolist() == mine.tolist()


# -- layout-only dispatch, the handle, cached dispatch, combine -------------------------
def _layout_only(rank, n):
    data = [_rank_inputs(s) for s in range(P)]
    x, _, _, in_rank, per_expert = data[rank]
    routes = [dt[3] for dt in data]
    buffer = epx.Buffer(None, int(2e9), 0, explicitly_destroy=True)
    config = epx.Config(NUM_SMS, 8, 256)
    recv_x, recv_idx, recv_w, counts, handle, event = buffer.dispatch(
        _bf16(x), num_tokens_per_rank=torch.from_numpy(in_rank.sum(0).astype(np.int32)),
        is_token_in_rank=torch.from_numpy(in_rank), num_tokens_per_expert=torch.from_numpy(per_expert),
        config=config)
    pairs = _expected(rank, routes)
    assert recv_idx is None and recv_w is None
    want_x = np.stack([data[s][0][t] for s, t in pairs]) if pairs else np.zeros((0, H), np.float32)
    assert recv_x.float().numpy().tolist() == want_x.tolist()
    assert counts == [int(sum(data[s][4][rank * L + j] for s in range(P))) for j in range(L)]
    _check_handle(handle, rank, routes)
    assert handle[0][P - 1][rank].item() == len(pairs)  # DeepEP's test indexes it so
    assert copy.copy(handle) is handle and copy.deepcopy(handle) is handle  # immutable routing
    # cached dispatch: same routing, new x, the plain tuple as the handle
    x2 = -x + 1
    recv2, *rest = buffer.dispatch(_bf16(x2), handle=tuple(handle), config=config)
    assert rest[:4] == [None, None, None, None]
    want2 = np.stack([data[s][0][t] * -1 + 1 for s, t in pairs]) if pairs else np.zeros((0, H), np.float32)
    assert recv2.float().numpy().tolist() == want2.tolist()
    # combine: each token comes back as the sum over the ranks it went to
    combined, combined_w, _ = buffer.combine(recv_x, handle, config=config)
    assert combined_w is None
    assert combined.float().numpy().tolist() == (x * in_rank.sum(1, keepdims=True)).tolist()
    with pytest.raises(epx.Error) as e:
        buffer.dispatch(_bf16(x), handle=handle, topk_idx=torch.zeros((TOKENS[rank], K), dtype=torch.int64))
    assert e.value.code == "invalid_argument"
    buffer.destroy()
    return True


def test_layout_only_dispatch_handle_cached_and_combine():
    assert epx.launch(_layout_only, P, start_method="fork", timeout_secs=120) == [True] * P


# -- with top-k: outputs, weights back, worst tokens, async / previous_event ----------------
def _with_topk(rank, n):
    data = [_rank_inputs(s, seed=12) for s in range(P)]
    x, idx, w, _, _ = data[rank]
    routes = [_ranks_of(dt[1]) for dt in data]
    buffer = epx.Buffer(None, int(2e9), 0)
    n_rank, n_rdma, n_expert, in_rank, _ = buffer.get_dispatch_layout(torch.from_numpy(idx), E)
    assert n_rdma is None and in_rank.numpy().tolist() == routes[rank].tolist()
    args = dict(x=_bf16(x), topk_idx=torch.from_numpy(idx), topk_weights=torch.from_numpy(w),
                num_tokens_per_rank=n_rank, is_token_in_rank=in_rank, num_tokens_per_expert=n_expert,
                config=epx.Config(NUM_SMS, 8, 256), async_finish=True, previous_event=buffer.capture())
    recv_x, recv_idx, recv_w, counts, handle, event = buffer.dispatch(**args)
    event.current_stream_wait()
    pairs = _expected(rank, routes)
    N = len(pairs)
    want_idx = np.full((N, K), -1, dtype=np.int64)
    want_w = np.zeros((N, K), dtype=np.float32)
    for row, (s, t) in enumerate(pairs):
        for k, e in enumerate(data[s][1][t]):
            if e >= 0 and e // L == rank:
                want_idx[row, k], want_w[row, k] = e - rank * L, data[s][2][t, k]
    assert recv_idx.tolist() == want_idx.tolist() and recv_w.numpy().tolist() == want_w.tolist()
    assert counts == [sum(int((dt[1] == rank * L + j).sum()) for dt in data) for j in range(L)]
    _check_handle(handle, rank, routes)

    # weights back, DeepEP's way: every receiving rank's whole row (every slot) is summed at
    # the source. Each rank passes its own arbitrary rows (the non-local slots non-zero too).
    def back_rows(d):
        return (np.arange(len(_expected(d, routes)) * K, dtype=np.float32).reshape(-1, K) * 0.37 + d + 0.1)
    _, combined_w, event = buffer.combine(recv_x, handle, topk_weights=torch.from_numpy(back_rows(rank)),
                                          async_finish=True, previous_event=buffer.capture())
    event.current_stream_wait()
    want = np.zeros((TOKENS[rank], K), dtype=np.float64)
    for d in range(P):
        for row, (s, t) in enumerate(_expected(d, routes)):
            if s == rank:
                want[t] += back_rows(d)[row]
    assert combined_w.dtype == torch.float32
    assert np.allclose(combined_w.numpy(), want, rtol=1e-6, atol=0), (combined_w, want)
    # ones in every slot: a token sent to r ranks gets r back in every slot (not only where
    # the receiving rank holds the slot's expert)
    _, ones_back, _ = buffer.combine(recv_x, handle, topk_weights=torch.ones((N, K), dtype=torch.float32))
    assert ones_back.numpy().tolist() == np.repeat(routes[rank].sum(1, keepdims=True), K, 1).astype(
        np.float32).tolist()

    # num_worst_tokens: W rows, the real ones first, padding idx -1 / weight 0, empty list
    W = sum(TOKENS)
    worst = buffer.dispatch(**dict(args, num_worst_tokens=W, async_finish=False, previous_event=None))
    wx, widx, ww, wcounts, whandle, _ = worst
    assert wcounts == [] and wx.shape[0] == widx.shape[0] == ww.shape[0] == W
    assert torch.equal(wx[:N], recv_x) and torch.equal(widx[:N], recv_idx) and torch.equal(ww[:N], recv_w)
    assert bool((widx[N:] == -1).all()) and bool((ww[N:] == 0).all())
    _check_handle(whandle, rank, routes, worst=W)
    buffer.destroy()
    return True


def test_topk_dispatch_weights_back_worst_async():
    assert epx.launch(_with_topk, P, start_method="fork", timeout_secs=120) == [True] * P


# -- FP8 with column-major scales ------------------------------------------------------------
def _fp8_col_major(rank, n):
    from epx.autograd import fp8_cast, fp8_dequant
    data = [_rank_inputs(s, seed=13) for s in range(P)]
    routes = [_ranks_of(dt[1]) for dt in data]
    casts = [fp8_cast(torch.from_numpy(dt[0]).float()) for dt in data]
    q, scales = casts[rank]
    scales_cm = scales.T.contiguous().T  # DeepEP's test: column-major strides
    assert torch.equal(scales_cm, scales)
    if TOKENS[rank] > 1:
        assert scales_cm.stride() == (1, TOKENS[rank])
    idx = torch.from_numpy(data[rank][1])
    buffer = epx.Buffer(None)
    assert epx.Buffer.is_sm90_compiled() is True
    n_rank, _, n_expert, in_rank, _ = buffer.get_dispatch_layout(idx, E)
    for with_topk in (False, True):
        extra = dict(topk_idx=idx, topk_weights=torch.from_numpy(data[rank][2])) if with_topk else {}
        (rq, rs), *_rest, handle, _ = buffer.dispatch((q, scales_cm), num_tokens_per_rank=n_rank,
                                                      is_token_in_rank=in_rank, num_tokens_per_expert=n_expert, **extra)
        pairs = _expected(rank, routes)
        want_q = [casts[s][0][t].tolist() for s, t in pairs]
        want_s = [casts[s][1][t].tolist() for s, t in pairs]
        assert rq.dtype == torch.uint8 and rq.tolist() == want_q
        assert rs.dtype == torch.float32 and rs.tolist() == want_s
        # the cached dispatch takes the column-major scales too
        (cq, cs), *_ = buffer.dispatch((q, scales_cm), handle=handle)
        assert torch.equal(cq, rq) and torch.equal(cs, rs)
        # back: dequantized rows summed at the source
        y = fp8_dequant(rq, rs).to(torch.bfloat16)
        combined, _, _ = buffer.combine(y, handle)
        want = fp8_dequant(q, scales).to(torch.bfloat16).float() * torch.from_numpy(
            routes[rank].sum(1, keepdims=True).astype(np.float32))
        assert torch.allclose(combined.float(), want, rtol=2 ** -7, atol=0)
    buffer.destroy()
    return True


def test_fp8_column_major_scales():
    assert epx.launch(_fp8_col_major, P, start_method="fork", timeout_secs=120) == [True] * P


# -- a bad layout on one rank fails every rank --------------------------------------------
def _bad_layout(rank, n):
    x, _, _, in_rank, per_expert = _rank_inputs(rank)
    if rank == 2:
        in_rank = np.ones((TOKENS[rank] + 1, P), dtype=bool)  # one row too many
    buffer = epx.Buffer(None)
    try:
        buffer.dispatch(_bf16(x), num_tokens_per_rank=torch.zeros(P, dtype=torch.int32),
                        is_token_in_rank=torch.from_numpy(in_rank), num_tokens_per_expert=torch.from_numpy(per_expert))
    except epx.Error as e:
        return e.code, e.origin_rank, "is_token_in_rank" in str(e)
    finally:
        buffer.destroy()
    return None


def test_bad_layout_on_one_rank_fails_every_rank():
    assert epx.launch(_bad_layout, P, start_method="fork", timeout_secs=120) == [("shape_mismatch", 2, True)] * P


def test_is_sm90_compiled_is_a_staticmethod():
    assert epx.Buffer.is_sm90_compiled() is True
    assert isinstance(epx.Buffer.__dict__["is_sm90_compiled"], staticmethod)
