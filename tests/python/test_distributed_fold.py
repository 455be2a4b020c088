"""epx.distributed's local sum of the peer-read paths (_reduce.py's _fold_into): the left fold
in rank order in float32 that the window's BucketBuffer computes, made in place in the rank's
own slice or the output. Checked bitwise against numpy's float32 left fold (each add correctly
rounded, as every IEEE add is) for every position of this rank among the parts."""
import numpy as np
import pytest
import torch

from epx.distributed._reduce import _fold_into


def _reference(parts, dtype, scale):
    acc = parts[0].float().numpy().astype(np.float32)
    for p in parts[1:]:
        acc = acc + p.float().numpy().astype(np.float32)
    if scale != 1.0:
        acc = acc * np.float32(scale)
    return torch.from_numpy(acc).to(dtype)


@pytest.mark.parametrize("P", [2, 3, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("avg", [False, True])
def test_fold_into_every_position_bitwise(P, dtype, avg):
    g = torch.Generator().manual_seed(P * 10 + avg)
    # magnitudes 1 .. 1e4 apart: the order of the adds changes the rounding
    parts = [(torch.randn(1000, generator=g) * 10.0 ** (i % 5)).to(dtype) for i in range(P)]
    scale = 1.0 / P if avg else 1.0
    want = _reference(parts, dtype, scale)
    for me in range(P):
        # an all_reduce: the result goes into this rank's own part, parts[0] is scratch unless me == 0
        ps = [p.clone() for p in parts]
        _fold_into(ps[me], ps, dtype, scale, ps[0] if me else None)
        assert torch.equal(ps[me].view(torch.uint8), want.view(torch.uint8)), (P, me)
        for r in range(P):  # only this rank's part (and the scratch) may change
            if r != me and not (r == 0 and me):
                assert torch.equal(ps[r], parts[r])
        # a reduce_scatter: into a separate output, the inputs untouched
        ps = [p.clone() for p in parts]
        out = torch.full_like(parts[0], -7)
        _fold_into(out, ps, dtype, scale, ps[0] if me else None)
        assert torch.equal(out.view(torch.uint8), want.view(torch.uint8))
        for r in range(1, P):
            assert torch.equal(ps[r], parts[r])
