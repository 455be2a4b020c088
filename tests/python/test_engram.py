"""epx.EngramBuffer from Python: every layer's output against the all-gathered table indexed
in numpy (bf16 with torch, FP8 with numpy; hooks in forward and reverse order; -1 padding);
bad indices and bad shards."""
import numpy as np
import pytest

import epx

P = 4
N = [37, 64]          # rows per rank, per layer
T, E = 9, 3


def launch(fn, *args):
    return epx.launch(fn, P, *args, start_method="fork", timeout_secs=120)


def shard(rank, layer, n, row_bytes):
    return np.random.default_rng([7, layer, rank]).integers(0, 256, (n, row_bytes), dtype=np.uint8)


def _gather(rank, size, fp8, order):
    import torch
    import torch.distributed as dist
    H = 256 if fp8 else 72
    dtype = "fp8" if fp8 else torch.bfloat16
    nb, ns = epx.EngramBuffer.get_storage_size_hint(None, N, H, T, E, dtype)
    buf = epx.EngramBuffer(None, nb, ns)
    buf.set_config(N, H, T, E, dtype)
    row = H * (1 if fp8 else 2)
    raw = [shard(rank, l, n, row) for l, n in enumerate(N)]
    sfs = [np.random.default_rng([9, l, rank]).random((n, H // 128), dtype=np.float32) + 0.5 for l, n in enumerate(N)]
    if fp8:
        buf.write(raw, sfs)  # numpy: FP8 as uint8 raw bits
    else:
        buf.write([torch.from_numpy(r.view(np.int16)).view(torch.bfloat16) for r in raw])
    # the whole table, all-gathered, then indexed in numpy
    tables, scales = [], []
    for l in range(len(N)):
        parts = [torch.empty_like(torch.from_numpy(raw[l])) for _ in range(size)]
        dist.all_gather(parts, torch.from_numpy(raw[l]))
        tables.append(torch.cat(parts).numpy())
        if fp8:  # (gloo cannot all-gather the empty [n, 0] scales of bf16)
            sparts = [torch.empty_like(torch.from_numpy(sfs[l])) for _ in range(size)]
            dist.all_gather(sparts, torch.from_numpy(sfs[l]))
            scales.append(torch.cat(sparts).numpy())
    for it in range(2):
        rng = np.random.default_rng([11, rank, it])
        idx = np.stack([rng.integers(-1, size * n, (T, E)) for n in N]).astype(np.int32)
        hooks = buf.fetch(idx if fp8 else torch.from_numpy(idx))
        for l in (range(len(N)) if order == "forward" else reversed(range(len(N)))):
            out = hooks[l]()
            data, sf = out if fp8 else (out, None)
            got = np.asarray(data).view(np.uint8) if fp8 else data.view(torch.int16).numpy().view(np.uint8)
            want = np.where((idx[l] >= 0)[..., None], tables[l][np.maximum(idx[l], 0)], 0).reshape(T, E * row)
            assert np.array_equal(got.reshape(T, E * row), want), f"rank {rank} layer {l} data"
            if fp8:
                w = np.where((idx[l] >= 0)[..., None], scales[l][np.maximum(idx[l], 0)], 0).reshape(T, -1)
                assert np.array_equal(np.asarray(sf), w), f"rank {rank} layer {l} scales"
        st = hooks.stats
        assert st["rows"] == len(N) * T * E and st["rows_local"] > 0 and st["path"] == buf.path
    buf.destroy()
    return True


@pytest.mark.parametrize("fp8,order", [(False, "forward"), (False, "reverse"), (True, "reverse")])
def test_gather_equals_the_all_gathered_table(fp8, order):
    assert launch(_gather, fp8, order) == [True] * P


def _errors(rank, size):
    import torch
    nb, ns = epx.EngramBuffer.get_storage_size_hint(None, N, 8, T, E, torch.bfloat16)
    buf = epx.EngramBuffer(None, nb, ns)
    buf.set_config(N, 8, T, E, torch.bfloat16)
    tables = [torch.zeros(n if not (rank == 2 and l == 1) else n - 1, 8, dtype=torch.bfloat16) for l, n in enumerate(N)]
    with pytest.raises(epx.Error) as e:
        buf.write(tables)
    assert e.value.origin_rank == 2 and "tables[1]" in str(e.value) and "rank 2" in str(e.value)
    with pytest.raises(epx.Error) as e:  # not a tensor on rank 1: every rank fails too
        buf.write([torch.zeros(n, 8, dtype=torch.bfloat16) if rank != 1 else "x" for n in N])
    assert e.value.origin_rank == 1
    buf.write([torch.zeros(n, 8, dtype=torch.bfloat16) for n in N])
    idx = torch.zeros(2, T, E, dtype=torch.int32)
    if rank == 3:
        idx[1, 4, 2] = size * N[1]
    if buf.path == "served":
        with pytest.raises(epx.Error):
            buf.fetch(idx)
    elif rank == 3:
        with pytest.raises(epx.Error) as e:
            buf.fetch(idx)
        assert "layer 1" in str(e.value) and "token 4" in str(e.value) and "entry 2" in str(e.value)
        assert f"= {size * N[1]}" in str(e.value)
    else:
        buf.fetch(idx)[1]()
    with pytest.raises(epx.Error) as e:
        buf.fetch(idx.to(torch.int64))
    buf.destroy()
    return True


def test_bad_shards_and_indices():
    assert launch(_errors) == [True] * P
