"""The CPU device shim: DeepEP's tests ask for CUDA tensors, streams, events and an NCCL
group; here every one of them is its CPU (or gloo) counterpart, so the tests' own code runs
unchanged on a machine without a GPU.

install() is idempotent and runs in every process that imports deep_ep (and, through the
runner's sitecustomize, in every process the runner starts, before the test is imported).

What it does, and why:
- device "cuda" / "cuda:N" / torch.device("cuda") / an int ordinal -> "cpu" in torch's
  factory functions, Tensor.to / .cuda / .new_*; pin_memory is dropped (no pinned memory
  without CUDA).
- torch.cuda: synchronize / set_device / empty_cache are no-ops (epx calls are done when
  they return, or when their event is waited on); Event(enable_timing=True) times with the
  wall clock; Stream / current_stream / stream() are inert; get_device_properties reports
  an SM count (DeepEP sizes num_sms / num_qps from it; epx takes those as hints only);
  _sleep sleeps the wall-clock time the cycle count would take at ~2 GHz (capped).
- indexing with an int32 (int16, int8) index tensor (torch >= 2.0) works: the index is
  widened to int64 first (torch 1.13 takes only int64, bool and uint8 indices).
- torch.set_default_device (torch >= 2.0) is added: "cuda" and "cpu" both mean the CPU.
- torch.compile (torch >= 2.0) is the identity decorator.
- torch.dtype.itemsize (torch >= 2.1) is added (torch.dtype is an immutable C type: its
  type dict is written through gc, then PyType_Modified).
- torch.float8_e4m3fn (torch >= 2.1) is torch.uint8: epx carries FP8 data as raw E4M3
  bits in uint8 (docs/python.md); the casts DeepEP's tests use are replaced (fp8.py).
- torch.distributed: "nccl" -> "gloo"; all_gather_into_tensor / reduce_scatter_tensor,
  which gloo lacks in torch 1.13, are done with all_gather / all_reduce; bf16, which
  torch 1.13's gloo refuses ("Invalid scalar type"), moves as float16 bits copied as they
  are (all_gather, all_to_all_single, broadcast) and is reduced in float32 (all_reduce);
  outputs made under torch.inference_mode (DeepEP's test functions run in it) are
  staged through ordinary tensors, since gloo's threads write outside that mode.
- an allocation above EPX_SHIM_MAX_ALLOC_BYTES (default 128 MiB) by zeros/empty/ones is a
  broadcast view of one element: DeepEP's perf tests allocate multi-GiB tensors only to
  keep a GPU busy or flush its L2 cache, never to read them back.
"""
import functools
import os
import time
import types

_installed = False

#: SM count reported by torch.cuda.get_device_properties (an H800's).
SM_COUNT = int(os.environ.get("EPX_SHIM_SM_COUNT", "132"))
MAX_ALLOC = int(os.environ.get("EPX_SHIM_MAX_ALLOC_BYTES", str(128 << 20)))


def _cpu(d):
    """A device argument with CUDA mapped to the CPU."""
    import torch
    if d is None:
        return None
    if isinstance(d, torch.device):
        return torch.device("cpu") if d.type == "cuda" else d
    if isinstance(d, str):
        return "cpu" if d.split(":")[0] == "cuda" else d
    if isinstance(d, int):  # a CUDA ordinal
        return "cpu"
    return d


def _fix_kwargs(kw):
    if "device" in kw:
        kw["device"] = _cpu(kw["device"])
    if kw.get("pin_memory"):
        kw["pin_memory"] = False
    return kw


def _wrap_factory(fn, big_ok=False):
    @functools.wraps(fn)
    def wrapper(*args, **kw):
        _fix_kwargs(kw)
        if big_ok:
            small = _small_for_big(fn, args, kw)
            if small is not None:
                return small
        return fn(*args, **kw)
    wrapper._epx_shim = True
    return wrapper


def _small_for_big(fn, args, kw):
    """A broadcast view of one element for an allocation above MAX_ALLOC (module docstring)."""
    import torch
    size = args[0] if len(args) == 1 and isinstance(args[0], (tuple, list, torch.Size)) else args
    if "size" in kw:
        size = kw["size"]
    try:
        shape = tuple(int(s) for s in size)
    except (TypeError, ValueError):
        return None
    if not shape:
        return None
    numel = 1
    for s in shape:
        numel *= s
    dtype = kw.get("dtype") or torch.get_default_dtype()
    if numel * torch.empty((), dtype=dtype).element_size() <= MAX_ALLOC:
        return None
    one = fn(*([1] * len(shape)), **kw)
    return one.expand(shape)


class _Event:
    """torch.cuda.Event on the wall clock: record() stamps, elapsed_time() in ms."""

    def __init__(self, enable_timing=False, blocking=False, interprocess=False):
        self.t = None

    def record(self, stream=None):
        self.t = time.perf_counter()

    def wait(self, stream=None):
        pass

    def query(self):
        return True

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return (end.t - self.t) * 1e3


class _Stream:
    """An inert torch.cuda.Stream: work on the CPU is done when its call returns."""

    def __init__(self, device=None, priority=0, **kw):
        self.device = "cpu"

    def wait_stream(self, other):
        pass

    def wait_event(self, event):
        pass

    def record_event(self, event=None):
        event = event or _Event()
        event.record()
        return event

    def synchronize(self):
        pass

    def query(self):
        return True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_DEFAULT_STREAM = _Stream()


class _StreamContext:
    def __init__(self, stream):
        self.stream = stream

    def __enter__(self):
        return self.stream

    def __exit__(self, *exc):
        return False


def _sleep(cycles):
    time.sleep(min(max(int(cycles), 0) / 2e9, 0.05))


def _props(device=None):
    return types.SimpleNamespace(name="CPU (epx DeepEP shim)", multi_processor_count=SM_COUNT,
                                 total_memory=16 << 30, major=9, minor=0, L2_cache_size=50 << 20)


def install():
    global _installed
    if _installed:
        return
    _installed = True
    import torch
    import torch.distributed as dist

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))

    # factories
    big = {"zeros", "empty", "ones"}
    for name in ("tensor", "as_tensor", "zeros", "ones", "empty", "full", "rand", "randn", "randint", "randperm",
                 "arange", "range", "linspace", "logspace", "eye", "zeros_like", "ones_like", "empty_like",
                 "full_like", "rand_like", "randn_like", "randint_like", "empty_strided", "tril_indices",
                 "triu_indices", "normal", "scalar_tensor"):
        fn = getattr(torch, name, None)
        if fn is not None and not getattr(fn, "_epx_shim", False):
            setattr(torch, name, _wrap_factory(fn, big_ok=name in big))

    T = torch.Tensor
    orig_to = T.to

    def to(self, *args, **kw):
        args = tuple(_cpu(a) if isinstance(a, (str, torch.device)) else a for a in args)
        _fix_kwargs(kw)
        return orig_to(self, *args, **kw)

    T.to = to
    small_ints = (torch.int32, torch.int16, torch.int8)

    def long_index(key):
        if isinstance(key, torch.Tensor) and key.dtype in small_ints:
            return key.long()
        if isinstance(key, tuple) and any(isinstance(k, torch.Tensor) and k.dtype in small_ints for k in key):
            return tuple(long_index(k) for k in key)
        return key

    orig_getitem, orig_setitem = T.__getitem__, T.__setitem__
    T.__getitem__ = lambda self, key: orig_getitem(self, long_index(key))
    T.__setitem__ = lambda self, key, value: orig_setitem(self, long_index(key), value)
    T.cuda = lambda self, device=None, non_blocking=False, **kw: self
    T.pin_memory = lambda self, *a, **k: self
    T.record_stream = lambda self, stream: None
    for name in ("new_zeros", "new_ones", "new_empty", "new_full", "new_tensor", "new_empty_strided"):
        orig = getattr(T, name, None)
        if orig is not None:
            def method(self, *args, _orig=orig, **kw):
                return _orig(self, *args, **_fix_kwargs(kw))
            setattr(T, name, method)

    # torch.cuda
    c = torch.cuda
    c.synchronize = lambda device=None: None
    c._sleep = _sleep
    c.set_device = lambda device: None
    c.current_device = lambda: 0
    c.device_count = lambda: max(1, int(os.environ.get("EPX_SHIM_NUM_DEVICES", "8")))
    c.get_device_name = lambda device=None: "CPU (epx DeepEP shim)"
    c.get_device_properties = _props
    c.get_device_capability = lambda device=None: (9, 0)
    c.Event = _Event
    c.Stream = _Stream
    c.current_stream = lambda device=None: _DEFAULT_STREAM
    c.default_stream = lambda device=None: _DEFAULT_STREAM
    c.stream = _StreamContext
    c.empty_cache = lambda: None
    c.memory_allocated = lambda device=None: 0
    c.max_memory_allocated = lambda device=None: 0
    c.reset_peak_memory_stats = lambda device=None: None
    c.is_initialized = lambda: True
    c.init = lambda: None

    # torch >= 2 names
    if not hasattr(torch, "set_default_device") or getattr(torch.set_default_device, "_epx_shim", False):
        def set_default_device(device):
            if _cpu(device) not in ("cpu", torch.device("cpu"), None):
                raise RuntimeError(f"epx DeepEP shim: set_default_device({device!r}): only the CPU exists here")
        set_default_device._epx_shim = True
        torch.set_default_device = set_default_device
    if not hasattr(torch, "compile"):
        def compile(model=None, **kw):
            return model if model is not None else (lambda fn: fn)
        torch.compile = compile
    if not hasattr(torch.bfloat16, "itemsize"):
        import ctypes
        import gc
        gc.get_referents(torch.dtype.__dict__)[0]["itemsize"] = property(
            lambda dt: torch.empty((), dtype=dt).element_size())
        ctypes.pythonapi.PyType_Modified(ctypes.py_object(torch.dtype))
    if not hasattr(torch, "float8_e4m3fn"):
        torch.float8_e4m3fn = torch.uint8  # raw E4M3 bits, as epx carries FP8

    # torch.distributed on gloo
    orig_init = dist.init_process_group

    @functools.wraps(orig_init)
    def init_process_group(backend=None, *args, **kw):
        if backend in (None, "nccl", "cuda:nccl", "cpu:gloo,cuda:nccl"):
            backend = "gloo"
        kw.pop("device_id", None)
        return orig_init(backend, *args, **kw)

    dist.init_process_group = init_process_group

    orig_new_group = dist.new_group

    @functools.wraps(orig_new_group)
    def new_group(*args, **kw):
        if kw.get("backend") in ("nccl", "cuda:nccl"):
            kw["backend"] = "gloo"
        return orig_new_group(*args, **kw)

    dist.new_group = new_group

    def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
        n = dist.get_world_size(group)
        outs = list(output_tensor.view(n, *input_tensor.shape).unbind(0)) if output_tensor.is_contiguous() else None
        tmp = [torch.empty_like(input_tensor) for _ in range(n)]
        dist.all_gather(tmp, input_tensor.contiguous(), group=group)
        if outs is not None:
            for o, t in zip(outs, tmp):
                o.copy_(t)
        else:
            output_tensor.copy_(torch.cat(tmp).view(output_tensor.shape))
        return _Done() if async_op else None

    def reduce_scatter_tensor(output, input, op=dist.ReduceOp.SUM, group=None, async_op=False):
        n, r = dist.get_world_size(group), dist.get_rank(group)
        full = input.clone()
        dist.all_reduce(full, op=op, group=group)
        output.copy_(full.view(n, *output.shape)[r])
        return _Done() if async_op else None

    def raw(t):  # bf16 -> the same bits as float16 (gloo moves those as they are), the same memory
        return t.view(torch.float16) if isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16 else t

    orig_all_gather, orig_a2a, orig_bcast, orig_all_reduce = (dist.all_gather, dist.all_to_all_single,
                                                              dist.broadcast, dist.all_reduce)

    def staged(outs, run):
        """run(outs') on ordinary tensors when an output is an inference tensor (made under
        torch.inference_mode, as DeepEP's test functions run): gloo's worker threads copy
        into outputs outside inference mode, which torch refuses for such tensors. The
        results are copied back here, in the caller's mode."""
        if not any(t.is_inference() for t in outs):
            return run(outs)
        with torch.inference_mode(False):
            tmp = [torch.empty_like(t) for t in outs]
            work = run(tmp)
            if work is not None:
                work.wait()
        for t, o in zip(outs, tmp):
            t.copy_(o)
        return _Done() if work is not None else None

    @functools.wraps(orig_all_gather)
    def all_gather(tensor_list, tensor, *args, **kw):
        src = raw(tensor)
        return staged([raw(t) for t in tensor_list], lambda outs: orig_all_gather(outs, src, *args, **kw))

    @functools.wraps(orig_a2a)
    def all_to_all_single(output, input, *args, **kw):
        src = raw(input)
        return staged([raw(output)], lambda outs: orig_a2a(outs[0], src, *args, **kw))

    @functools.wraps(orig_bcast)
    def broadcast(tensor, *args, **kw):
        t = raw(tensor)
        if not t.is_inference():
            return orig_bcast(t, *args, **kw)
        with torch.inference_mode(False):
            tmp = t.clone()
            work = orig_bcast(tmp, *args, **kw)
            if work is not None:
                work.wait()
        t.copy_(tmp)
        return _Done() if work is not None else None

    @functools.wraps(orig_all_reduce)
    def all_reduce(tensor, *args, **kw):
        if tensor.dtype != torch.bfloat16 and not tensor.is_inference():
            return orig_all_reduce(tensor, *args, **kw)
        with torch.inference_mode(False):
            f = tensor.float() if tensor.dtype == torch.bfloat16 else tensor.clone()
            work = orig_all_reduce(f, *args, **kw)
            if work is not None:
                work.wait()
        tensor.copy_(f)
        return _Done() if work is not None else None

    dist.all_gather, dist.all_to_all_single, dist.broadcast, dist.all_reduce = (all_gather, all_to_all_single,
                                                                                broadcast, all_reduce)
    dist.all_gather_into_tensor = all_gather_into_tensor
    dist.reduce_scatter_tensor = reduce_scatter_tensor


class _Done:
    def wait(self, *a, **k):
        return True

    def is_completed(self):
        return True
