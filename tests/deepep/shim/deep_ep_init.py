"""deep_ep on CPU: epx's objects under DeepEP 2.1.0's names, and DeepEP's own utils
modules (deep_ep.utils.*) with their GPU-only pieces replaced (FP8 casts, timing). Made
by tests/deepep/run_deepep.py in its temporary directory; not a copy of DeepEP."""
from epx_deepep_shim import cpu_device as _cpu_device

_cpu_device.install()

import os as _os  # noqa: E402

import epx as _epx  # noqa: E402
import torch as _torch  # noqa: E402


def _missing(name):
    """A stand-in for a DeepEP name epx lacks: importing it works, using it raises."""
    text = f"deep_ep.{name}: epx has no {name}"

    class _Meta(type):
        def __getattr__(cls, attr):
            if attr.startswith("__"):
                raise AttributeError(attr)
            raise NotImplementedError(f"{text} (asked for {name}.{attr})")

    class Missing(metaclass=_Meta):
        def __init__(self, *args, **kwargs):
            raise NotImplementedError(text)

    Missing.__name__ = Missing.__qualname__ = name
    return Missing


def _missing_function(name):
    def missing(*args, **kwargs):
        raise NotImplementedError(f"deep_ep.{name}: epx has no {name}")
    missing.__name__ = name
    return missing


for _name in ("Buffer", "ElasticBuffer", "EPHandle", "EventOverlap", "EventHandle", "Config"):
    globals()[_name] = getattr(_epx, _name) if hasattr(_epx, _name) else _missing(_name)
for _name in ("get_physical_domain_size", "get_logical_domain_size"):
    globals()[_name] = getattr(_epx, _name) if hasattr(_epx, _name) else _missing_function(_name)
topk_idx_t = getattr(_epx, "topk_idx_t", _torch.int64)
__version__ = "2.1.0"

# DeepEP's own utils, with the GPU-only helpers swapped for CPU ones
from . import utils  # noqa: E402,F401  (deep_ep.utils, as DeepEP's package imports it)
from .utils import envs as _envs, math as _math, testing as _testing  # noqa: E402
from epx_deepep_shim import fp8 as _fp8, timing as _timing  # noqa: E402

_math.per_token_cast_to_fp8 = _fp8.per_token_cast_to_fp8
_math.per_token_cast_back = _fp8.per_token_cast_back
_testing.flush_l2_cache = _timing.flush_l2_cache
_testing.bench = _timing.bench
_testing.bench_kineto = _timing.bench_kineto
# no nvidia-smi / ibstat here: nominal link speeds (they scale perf prints and sleeps only)
_envs.get_nvlink_gbs = lambda factor=0.9: float(_os.environ.get("EPX_SHIM_NVLINK_GBS", "400"))
_envs.get_rdma_gbs = lambda nic_name=None: float(_os.environ.get("EPX_SHIM_RDMA_GBS", "50"))
for _name in ("get_physical_domain_size", "get_logical_domain_size"):
    if hasattr(_epx, _name):
        setattr(_envs, _name, getattr(_epx, _name))
