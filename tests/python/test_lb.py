"""EPBuffer.lb_prefetch_weights / lb_reduce_grads (epx/lb.hpp from Python): the exact bytes
at every replica slot, and the gradient sum against a plain float32 loop in ascending global
slot order; a bad argument on one rank fails every rank naming it."""
import numpy as np
import pytest

import epx

P, L, B, H = 4, 2, 3, 128
# Slot (rank d, b) holds logical expert MAPPING[d][b] (-1 unused): an expert with several
# replicas (5: three), experts with none, one rank holding two replicas of one expert.
MAPPING = [[5, 1, -1], [7, 5, 0], [5, -1, 6], [6, 2, 2]]


def launch(fn, *args):
    return epx.launch(fn, P, *args, start_method="fork", timeout_secs=60)


def home_weights(rank, flavor, dtype):
    """Two weight kinds of different byte sizes (neither a multiple of 2 * H bytes)."""
    rng = np.random.default_rng(100 + rank)
    if dtype == "raw":
        w1 = rng.integers(0, 2**16, size=(L, 37, 11), dtype=np.uint16)   # bf16 bits, 814 B per expert
        w2 = rng.integers(0, 256, size=(L, 333), dtype=np.uint8)          # 333 B per expert
    else:
        w1 = rng.standard_normal((L, 37, 11)).astype(np.float32)
        w2 = (rng.standard_normal((L, 83)) * 2.0**rng.integers(-30, 30, size=(L, 83))).astype(np.float32)
    if flavor == "torch":
        import torch
        return [torch.from_numpy(w1.astype(np.int16) if w1.dtype == np.uint16 else w1),
                torch.from_numpy(w2)]
    return [w1, w2]


def _prefetch(rank, n, flavor):
    homes = home_weights(rank, flavor, "raw")
    slots = [np.zeros((B,) + tuple(h.shape[1:]), dtype=np.asarray(h).dtype) for h in homes]
    if flavor == "torch":
        import torch
        slots = [torch.from_numpy(s) for s in slots]
    with epx.EPBuffer(None, num_max_tokens_per_rank=16, hidden=H, num_topk=4, num_experts=P * L) as buf:
        buf.lb_prefetch_weights(slots, homes, np.array(MAPPING, dtype=np.int64))
    return [np.asarray(s).copy() for s in slots]


@pytest.mark.parametrize("flavor", ["numpy", "torch"])
def test_prefetch_lands_the_exact_bytes_at_every_replica(flavor):
    got = launch(_prefetch, flavor)
    homes = [[np.asarray(h) for h in home_weights(r, flavor, "raw")] for r in range(P)]
    for d in range(P):
        for b, e in enumerate(MAPPING[d]):
            for k in range(2):
                if e < 0:
                    assert not got[d][k][b].any(), (d, b, k)  # an unused slot is left alone
                else:
                    want = homes[e // L][k][e % L]
                    assert got[d][k][b].tobytes() == want.tobytes(), (d, b, k, e)


def slot_grads(rank):
    rng = np.random.default_rng(200 + rank)
    g1 = rng.standard_normal((B, 37, 11)).astype(np.float32)
    g2 = (rng.standard_normal((B, 83)) * 2.0**rng.integers(-30, 30, size=(B, 83))).astype(np.float32)
    return [g1, g2]


def _reduce(rank, n):
    homes = [np.asarray(h).copy() for h in home_weights(rank, "numpy", "f32")]
    with epx.EPBuffer(None, num_max_tokens_per_rank=16, hidden=H, num_topk=4, num_experts=P * L) as buf:
        buf.lb_reduce_grads(slot_grads(rank), homes, MAPPING)
    return homes


def test_reduce_equals_a_plain_float32_loop_in_ascending_slot_order():
    got = launch(_reduce)
    for r in range(P):
        for j in range(L):
            e = r * L + j
            for k in range(2):
                acc = np.asarray(home_weights(r, "numpy", "f32")[k][j]).copy()
                for d in range(P):          # ascending global slot d * B + b
                    for b in range(B):
                        if MAPPING[d][b] == e:
                            acc = (acc + slot_grads(d)[k][b]).astype(np.float32)
                assert got[r][k][j].tobytes() == acc.tobytes(), (r, j, k)


def _bad(rank, n, culprit):
    homes = [np.asarray(h).copy() for h in home_weights(rank, "numpy", "f32")]
    grads = slot_grads(rank)
    if rank == culprit:
        grads = [g.astype(np.float64) for g in grads]  # reduce_grads is float32 only
    with epx.EPBuffer(None, num_max_tokens_per_rank=16, hidden=H, num_topk=4, num_experts=P * L) as buf:
        try:
            buf.lb_reduce_grads(grads, homes, MAPPING)
        except epx.Error as e:
            return (e.code, e.origin_rank, str(e))
    return None


def test_a_bad_argument_fails_every_rank_naming_it():
    culprit = 1
    got = launch(_bad, culprit)
    for r, g in enumerate(got):
        assert g is not None, f"rank {r} did not fail"
        assert g[1] == culprit, (r, g)
    assert "must be float32" in got[culprit][2] and got[culprit][0] == "invalid_argument", got[culprit]
