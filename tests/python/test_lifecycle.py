"""Every buffer kind of the Python package has one life cycle (epx/_lifecycle.py): `with`
destroys at the end of the block, destroy() is idempotent, a call after it raises epx.Error
naming the destruction, and a buffer made with explicitly_destroy=True that is dropped
without destroy() warns (ResourceWarning) while one that was destroyed does not."""
import gc
import warnings

import pytest
import torch

import epx

P, S, H, K, E = 2, 4, 128, 2, 8
KINDS = ["EPBuffer", "BucketBuffer", "PPBuffer", "EngramBuffer", "Buffer"]
# The code a call on a destroyed buffer raises: the DeepEP-style EP buffers say the handle
# of the call is dead, the others that the call is invalid.
DEAD_CODE = {"EPBuffer": "bad_handle", "Buffer": "bad_handle", "BucketBuffer": "invalid_argument",
             "PPBuffer": "invalid_argument", "EngramBuffer": "invalid_argument"}


def _inputs(rank):
    g = torch.Generator().manual_seed(11 + rank)
    x = torch.randn(S, H, generator=g).bfloat16()
    idx = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(S)])
    return x, idx, torch.rand(S, K, generator=g)


def _make(kind, n, **kw):
    if kind == "EPBuffer":
        return epx.EPBuffer(None, num_max_tokens_per_rank=S, hidden=H, num_topk=K, num_experts=E, **kw)
    if kind == "BucketBuffer":
        return epx.BucketBuffer([list(range(n))], 1 << 16, **kw)
    if kind == "PPBuffer":
        return epx.PPBuffer(None, 64, 1, **kw)
    if kind == "EngramBuffer":
        return epx.EngramBuffer(None, *epx.EngramBuffer.get_storage_size_hint(None, [3], H, 2, 1), **kw)
    return epx.Buffer(None, **kw)


def _call(kind, b, rank, n):
    """One collective call whose result is checked; returns True when it is right."""
    x, idx, w = _inputs(rank)
    if kind == "EPBuffer":
        recv_x = b.dispatch(x, topk_idx=idx, topk_weights=w, num_experts=E)[0]
        return recv_x.shape[1] == H
    if kind == "Buffer":
        layout = b.get_dispatch_layout(idx, E)
        recv_x = b.dispatch(x, topk_idx=idx, topk_weights=w, num_tokens_per_rank=layout[0],
                            num_tokens_per_expert=layout[2], is_token_in_rank=layout[3])[0]
        return recv_x.shape[1] == H
    if kind == "BucketBuffer":
        v = b._view(0, torch.empty(16))  # a view of the symmetric storage
        v[:] = float(rank + 1)
        b.all_reduce([v]).wait()
        return bool((v == float(n * (n + 1) // 2)).all())
    if kind == "PPBuffer":
        if rank == 0:
            b.send(torch.arange(4, dtype=torch.float32), 1)
            return True
        return bool((b.recv(torch.empty(4), 0) == torch.arange(4, dtype=torch.float32)).all())
    table = torch.arange(3 * H, dtype=torch.float32).reshape(3, H).bfloat16() + rank
    b.set_config([3], H, 2, 1)
    b.write([table])
    out = b.fetch(torch.tensor([[[3], [1]]], dtype=torch.int32))  # global rows 3 (rank 1's 0) and 1 (rank 0's 1)
    got = out[0]() if callable(out[0]) else out[0]
    got = got[0] if isinstance(got, (tuple, list)) else got
    want = torch.stack([torch.arange(H, dtype=torch.float32).bfloat16() + 1,
                        torch.arange(H, 2 * H, dtype=torch.float32).bfloat16()])
    return bool((got.reshape(2, H) == want).all())


def _with_block(rank, n, kind):
    with _make(kind, n) as b:
        ok = _call(kind, b, rank, n)
    b.destroy()  # idempotent after the block's destroy
    try:
        _call(kind, b, rank, n)
    except epx.Error as e:
        return ok, e.code, "destroy" in str(e)
    return ok, None, False


@pytest.mark.parametrize("kind", KINDS)
def test_with_destroys_and_a_later_call_is_an_error(kind):
    assert epx.launch(_with_block, P, kind, start_method="fork", timeout_secs=120) == [(True, DEAD_CODE[kind], True)] * P


def _dropped(rank, n, kind):
    seen = []
    for destroy in (False, True):
        b = _make(kind, n, explicitly_destroy=True)
        if destroy:
            b.destroy()
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            del b
            gc.collect()
        seen.append(any(issubclass(x.category, ResourceWarning) and kind in str(x.message) for x in w))
    return seen


@pytest.mark.parametrize("kind", KINDS)
def test_dropped_without_destroy_warns(kind):
    assert epx.launch(_dropped, P, kind, start_method="fork", timeout_secs=120) == [[True, False]] * P
