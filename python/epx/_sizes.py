"""Byte arithmetic every buffer front shares: rounding up to an alignment, a dtype's size."""


def align(x, a):
    """x rounded up to a multiple of a (a > 0)."""
    return (x + a - 1) // a * a


def itemsize(dtype):
    """Bytes per element of a torch dtype (torch 1.13's dtypes have no .itemsize)."""
    import torch
    return torch.empty(0, dtype=dtype).element_size()
