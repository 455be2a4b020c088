"""DeepEP's per_token_cast_to_fp8 / per_token_cast_back on epx's FP8 representation.

torch 1.13 has no float8 dtype; epx carries FP8 data as uint8 raw E4M3 bits with float32
per-128-column scales (docs/python.md), and the shim makes torch.float8_e4m3fn an alias
of torch.uint8. DeepEP's two casts do `.to(torch.float8_e4m3fn)` / `.to(torch.float32)`,
which on uint8 would be integer casts, so the runner replaces them with these, which do
the same arithmetic (per token and 128-column block: amax clamped to 1e-4, x * 448 / amax
rounded to E4M3, scale amax / 448) through epx's own conversion (epx.autograd.fp8_cast /
fp8_dequant). Same signatures, shapes, dtypes (uint8 for float8_e4m3fn) and padding rules.
"""
import torch
import torch.nn.functional as F

_BLOCK = 128


def _align(n):
    return (n + _BLOCK - 1) // _BLOCK * _BLOCK


def per_token_cast_to_fp8(x):
    from epx.autograd import fp8_cast
    if x.dim() != 2:
        raise AssertionError("per_token_cast_to_fp8: x must be 2-D")
    m, n = x.shape
    padded = F.pad(x.float(), (0, _align(n) - n), mode="constant", value=0)
    data, scales = fp8_cast(padded)
    return data[:, :n].contiguous(), scales.reshape(m, -1).contiguous()


def per_token_cast_back(x_fp8, x_scales):
    from epx.autograd import fp8_dequant
    if x_fp8.numel() == 0:
        return torch.empty(tuple(x_fp8.shape), dtype=torch.bfloat16)
    if x_fp8.dim() != 2:
        raise AssertionError("per_token_cast_back: x_fp8 must be 2-D")
    m, n = x_fp8.shape
    padded = F.pad(x_fp8, (0, _align(n) - n), mode="constant", value=0)
    if x_scales.dtype == torch.int:  # UE8M0: one exponent byte per block, four to an int
        x_scales = (x_scales.contiguous().view(torch.uint8).to(torch.int) << 23).view(torch.float)
    scales = x_scales.reshape(m, -1)[:, :padded.shape[1] // _BLOCK]
    return fp8_dequant(padded, scales).to(torch.bfloat16)[:, :n].contiguous()
