"""Runs torch 1.13's own distributed test suite (torch/testing/_internal/distributed/
distributed_test.py, DistributedTest._DistTestBase) on a backend, the way torch's
test/distributed/test_distributed_spawn.py does (that file is not installed).

    python3 torch_suite.py --backend gloo  [--world-size 3] [-k PATTERN ...] [--json out.json]
    python3 torch_suite.py --backend epx   ...   # epx in gloo's place (below)
    python3 torch_suite.py --backend epx-plugin ... # epx under its own name "epx"

The suite's skip decorators key on the backend's name (BACKEND == "gloo", ...), read when the
module is imported. `--backend epx` therefore runs the suite with BACKEND=gloo, so it picks
the tests it runs for gloo, and replaces the ProcessGroupGloo that torch's
_new_process_group_helper builds (every init_process_group / new_group of backend "gloo") with
epx's ProcessGroupEpx, in this process and in every spawned rank: each test that gloo runs
then runs on epx. The group reports the backend name "gloo" (torch keys its _pg_map on the
name it was asked for), so the suite's dist.get_backend() checks see "gloo".
`--backend epx-plugin` runs with BACKEND=epx instead: the suite then skips what it keys to
gloo / nccl by name.
"""
import argparse
import json
import os
import sys
import tempfile
import time
import unittest

_MODE = os.environ.get("EPX_TORCH_SUITE_MODE", "")
if _MODE in ("epx", "epx-plugin"):
    import epx.distributed  # noqa: F401  registers "epx"
if _MODE == "epx":
    import torch.distributed.distributed_c10d as _c10d
    from epx.distributed import ProcessGroupEpx

    class _EpxAsGloo(ProcessGroupEpx):
        def __init__(self, store, rank, size, timeout=_c10d.default_pg_timeout):
            super().__init__(store, rank, size, timeout)

    def _unwrapped(wrapped_pg, *args, **kwargs):
        # TORCH_DISTRIBUTED_DEBUG=DETAIL wraps each gloo or NCCL group in torch's C++ checking
        # wrapper, and no group of another backend: an epx group is not wrapped, as under its
        # own name (the wrapper's C++ calls, sequence numbers among them, do not reach a
        # Python ProcessGroup in torch 1.13)
        return wrapped_pg

    _c10d.ProcessGroupGloo = _EpxAsGloo
    _c10d._create_process_group_wrapper = _unwrapped
    os.environ["BACKEND"] = "gloo"
elif _MODE == "epx-plugin":
    os.environ["BACKEND"] = "epx"

if "BACKEND" in os.environ:  # the parent once its arguments are read, and every spawned rank
    try:
        import expecttest  # noqa: F401  torch's common_utils imports it (not packaged in Debian)
    except ImportError:  # only its TestCase base is used by the distributed suite
        import types
        _stub = types.ModuleType("expecttest")
        _stub.TestCase = unittest.TestCase
        _stub.ACCEPT = False
        sys.modules["expecttest"] = _stub
    import torch
    import torch.nn.parallel._replicated_tensor_ddp_utils as _rt
    # The suite turns on DDP's ReplicatedTensor path in every rank; it imports
    # torch.distributed._shard, which torch 1.13 cannot import on Python 3.11 (a dataclass with
    # a mutable default): DDP stays on its usual path, for gloo and epx alike.
    _rt._set_ddp_with_replicated_tensor = lambda value: None
    from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend

    torch.backends.cuda.matmul.allow_tf32 = False
    if _MODE == "epx":
        # torch's C++ Work records a profiler event per call ("gloo:all_reduce", asynchronous,
        # with input shapes) for its built-in backends; a Python backend cannot record such
        # events, so the epx run does not ask for them (as the suite does for other backends)
        import torch.testing._internal.distributed.distributed_test as _dt
        for _name in ("PROFILING_SUPPORTED_BACKENDS", "CUDA_PROFILING_SUPPORTED_BACKENDS",
                      "SEND_RECV_PROFILING_SUPPORTED_BACKENDS"):
            setattr(_dt, _name, [b for b in getattr(_dt, _name) if b != "gloo"])

    class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
        def setUp(self):
            super().setUp()
            # fork (as torch's former test_distributed_fork.py did for gloo): the ranks start
            # from this process, torch already imported, instead of a fresh interpreter each
            if os.environ.get("EPX_TORCH_SUITE_START", "fork") == "fork":
                self._start_processes(torch.multiprocessing.get_context("fork").Process)
            else:
                self._spawn_processes()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=["gloo", "epx", "epx-plugin"], required=True)
    ap.add_argument("--world-size", type=int, default=3)
    ap.add_argument("-k", action="append", default=[], help="run only tests whose name contains this")
    ap.add_argument("--tests", help="a file of test names, one a line")
    ap.add_argument("--json", help="write {test: outcome} here")
    ap.add_argument("--start", choices=["fork", "spawn"], default="fork", help="how each test starts its ranks")
    ap.add_argument("-v", action="store_true")
    a = ap.parse_args()
    env = {"EPX_TORCH_SUITE_MODE": a.backend if a.backend != "gloo" else "", "WORLD_SIZE": str(a.world_size),
           "BACKEND": "gloo" if a.backend != "epx-plugin" else "epx", "EPX_TORCH_SUITE_START": a.start}
    if "TEMP_DIR" not in os.environ:
        env["TEMP_DIR"] = tempfile.mkdtemp(prefix="epx-torch-suite-")
    os.environ.update(env)
    # re-run this file with the environment set (the module-level setup above reads it)
    if os.environ.get("_EPX_TORCH_SUITE_CHILD") != "1":
        os.environ["_EPX_TORCH_SUITE_CHILD"] = "1"
        os.execv(sys.executable, [sys.executable] + sys.argv)
    import __main__
    loader = unittest.TestLoader()
    names = loader.getTestCaseNames(__main__.TestDistBackendWithSpawn)
    if a.tests:
        wanted = [ln.strip() for ln in open(a.tests) if ln.strip() and not ln.startswith("#")]
        names = [n for n in names if n in wanted]
    if a.k:
        names = [n for n in names if any(k in n for k in a.k)]
    suite = unittest.TestSuite(__main__.TestDistBackendWithSpawn(n) for n in names)
    outcomes = {}

    class Result(unittest.TextTestResult):
        def startTest(self, test):
            self._t0 = time.time()
            super().startTest(test)

        def _note(self, test, what, detail=""):
            name = test.id().split(".")[-1]
            outcomes[name] = {"outcome": what, "seconds": round(time.time() - self._t0, 1), "detail": detail[-3000:]}
            if a.json:
                with open(a.json, "w") as f:
                    json.dump(outcomes, f, indent=1)

        def addSuccess(self, test):
            super().addSuccess(test)
            self._note(test, "pass")

        def addFailure(self, test, err):
            super().addFailure(test, err)
            self._note(test, "fail", self._exc_info_to_string(err, test))

        def addError(self, test, err):
            super().addError(test, err)
            self._note(test, "error", self._exc_info_to_string(err, test))

        def addSkip(self, test, reason):
            super().addSkip(test, reason)
            self._note(test, "skip", reason)

        def addExpectedFailure(self, test, err):
            super().addExpectedFailure(test, err)
            self._note(test, "xfail")

        def addUnexpectedSuccess(self, test):
            super().addUnexpectedSuccess(test)
            self._note(test, "xpass")

    r = unittest.TextTestRunner(resultclass=Result, verbosity=2 if a.v else 1).run(suite)
    counts = {}
    for o in outcomes.values():
        counts[o["outcome"]] = counts.get(o["outcome"], 0) + 1
    print(f"torch suite, backend {a.backend}, {a.world_size} ranks: {len(outcomes)} tests: "
          + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), flush=True)
    return 0 if r.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
