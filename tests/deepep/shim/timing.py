"""DeepEP's timing helpers (deep_ep.utils.testing) on the wall clock.

bench / bench_kineto time a function with CUDA events or the kineto profiler; they check
nothing. Here they call the function the same way (once to warm up, then a few timed
calls, with the same barriers between calls when asked), fewer times
(EPX_SHIM_BENCH_ITERS, default 3: a CPU run of DeepEP's 50-100 calls per config would take
the suite's whole time budget), and return wall-clock seconds in the same shapes.
Every rank makes the same number of calls, so collective functions stay matched.
"""
import os
import time

import numpy as np

ITERS = max(2, int(os.environ.get("EPX_SHIM_BENCH_ITERS", "3")))


def flush_l2_cache(enabled=True):
    """No GPU L2 cache to flush."""


def bench(fn, num_warmups=50, num_tests=50, post_fn=None, flush_l2=True):
    fn()
    times = []
    for _ in range(max(2, min(num_tests, ITERS))):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if post_fn is not None:
            post_fn()
    times = np.array(times[1:])
    return np.average(times), np.min(times), np.max(times)


def bench_kineto(fn, kernel_names, num_tests=30, suppress_kineto_output=False, trace_path=None, flush_l2=True,
                 barrier_comm_profiling=False, num_kernels_per_period=1, barrier=None):
    if not isinstance(kernel_names, (str, tuple)):
        raise AssertionError("bench_kineto: kernel_names must be a str or a tuple")
    is_tuple = isinstance(kernel_names, tuple)
    if int(os.environ.get("EP_USE_NVIDIA_TOOLS", 0)):
        return (1, ) * len(kernel_names) if is_tuple else 1
    fn()
    barrier_comm_profiling &= int(os.environ.get("EP_DISABLE_BARRIER_PROFILING", 0)) == 0
    dummy = None
    total, n = 0.0, max(1, min(num_tests, ITERS))
    for _ in range(n):
        if barrier_comm_profiling:
            if barrier is None:
                import torch
                import torch.distributed as dist
                dummy = torch.ones(1, dtype=torch.float) if dummy is None else dummy
                dist.all_reduce(dummy)
            else:
                barrier()
        t0 = time.perf_counter()
        fn()
        total += time.perf_counter() - t0
    t = total / n
    names = kernel_names if is_tuple else (kernel_names, )
    per = [t if num_kernels_per_period <= 1 else [t / num_kernels_per_period] * num_kernels_per_period
           for _ in names]
    return per if is_tuple else per[0]
