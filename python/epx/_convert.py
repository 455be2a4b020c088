"""Torch / numpy in and out: which flavour a call's inputs have, and how epx's DLPack
outputs become tensors of that flavour (zero-copy: the tensor owns epx's memory)."""
import sys

import numpy as np


def _torch():
    return sys.modules.get("torch")


_tensor_type = None  # torch.Tensor, once torch is imported (epx never imports it itself)


def is_torch(x):
    global _tensor_type
    if _tensor_type is None:
        t = _torch()
        if t is None:
            return False
        _tensor_type = t.Tensor
    return isinstance(x, _tensor_type)


def flavor_of(x):
    """'torch' if x (or the first element of an (data, scales) pair) is a torch.Tensor, else 'numpy'."""
    if isinstance(x, (tuple, list)) and x:
        x = x[0]
    return "torch" if is_torch(x) else "numpy"


def out(exported, flavor):
    """An epx output (or None) as a torch tensor or numpy array (the binding hands torch
    outputs out as tensors already)."""
    if exported is None or is_torch(exported):
        return exported
    if flavor == "torch":
        import torch.utils.dlpack
        return torch.utils.dlpack.from_dlpack(exported.__dlpack__())
    return np.asarray(exported)  # by __array_interface__: writable, zero-copy


def out_bool(exported, flavor):
    """A uint8 0/1 output viewed as bool (DLPack in torch 1.13 has no bool)."""
    t = out(exported, flavor)
    if flavor == "torch":
        import torch
        return t.view(torch.bool)
    return t.view(np.bool_)


def col_major(scales):
    """The same [N, C] values laid out column-major (strides (1, N))."""
    if is_torch(scales):
        return scales.t().contiguous().t()
    return np.asfortranarray(scales)


def zeros_f32(shape, like):
    if is_torch(like):
        import torch
        return torch.zeros(shape, dtype=torch.float32)
    return np.zeros(shape, dtype=np.float32)


def version_of(t):
    """torch's in-place modification counter; None where there is none: numpy, and tensors
    made under torch.inference_mode() (they track no version, and reading it raises)."""
    if not is_torch(t):
        return None
    try:
        return t._version
    except RuntimeError:
        return None


def normal_tensors():
    """A context in which torch makes normal tensors even under torch.inference_mode(): for
    torch.distributed setup traffic, whose gloo threads (outside the caller's inference mode)
    write into the tensors this thread makes, which they may not do to inference tensors."""
    import contextlib
    t = _torch()
    return t.inference_mode(False) if t is not None else contextlib.nullcontext()


_index_dtype = None


def index_dtype(flavor):
    """numpy dtype of DeepEP's int32 index tensors (recv_src_metadata, ...): int32, except on
    a torch that cannot index with int32 tensors (before 2.0), where int64."""
    global _index_dtype
    if flavor != "torch":
        return np.int32
    if _index_dtype is None:
        import torch
        try:
            torch.zeros(1)[torch.zeros(1, dtype=torch.int32)]
            _index_dtype = np.int32
        except (IndexError, RuntimeError):
            _index_dtype = np.int64
    return _index_dtype


def copy_of(t):
    """A copy of a tensor or array with its own memory (torch: clone, numpy: copy)."""
    if is_torch(t):
        return t.clone()
    return np.array(t, copy=True)


def plain(t):
    """A torch tensor without autograd history (the same memory: DLPack refuses tensors
    that require grad); anything else unchanged."""
    return t.detach() if is_torch(t) and t.requires_grad else t


def to_numpy(t):
    """A torch tensor (CPU) or array as numpy (bf16 as uint16 bits), sharing memory."""
    if is_torch(t):
        import torch
        t = t.detach()
        return t.view(torch.int16).numpy().view(np.uint16) if t.dtype == torch.bfloat16 else t.numpy()
    return np.asarray(t)


def from_numpy(a, flavor, bf16=False):
    """A numpy array in this flavour (torch: a tensor over the same memory; bf16: uint16 bits
    as torch.bfloat16)."""
    if flavor != "torch":
        return a
    import torch
    a = np.ascontiguousarray(a)
    return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16) if bf16 else torch.from_numpy(a)
