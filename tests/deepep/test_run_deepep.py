"""run_deepep.py itself, on a small made-up DeepEP checkout (no DeepEP sources needed): the
asserts are counted per rank with DeepEP's line numbers, --keep-going goes on past a
failure, --patch edits one line, a failure without it stops the rank, a hung test is killed at --timeout with its
ranks, and the CPU device shim is in every rank (cuda tensors, nccl, torch 2 names).

    /usr/bin/python3 -m pytest -q tests/deepep/test_run_deepep.py
"""
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

RUNNER = Path(__file__).resolve().parent / "run_deepep.py"

ENVS = '''
import os
import torch
import torch.distributed as dist


def init_dist(local_rank, num_local_ranks, seed=0):
    dist.init_process_group(backend="nccl", init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}",
                            world_size=num_local_ranks, rank=local_rank)
    torch.set_default_dtype(torch.bfloat16)
    torch.set_default_device("cuda")
    torch.cuda.set_device(local_rank)
    return dist.get_rank(), dist.get_world_size(), dist.new_group(list(range(num_local_ranks)))
'''

MATH = '''
import torch


@torch.compile(dynamic=True)
def per_token_cast_to_fp8(x):
    raise RuntimeError("replaced by the runner")


def per_token_cast_back(x, s):
    raise RuntimeError("replaced by the runner")
'''

TESTING = '''
def bench(fn, num_warmups=50, num_tests=50, post_fn=None, flush_l2=True):
    raise RuntimeError("replaced by the runner")


def bench_kineto(fn, kernel_names, **kw):
    raise RuntimeError("replaced by the runner")


def flush_l2_cache(enabled=True):
    raise RuntimeError("replaced by the runner")
'''

TEST = '''
import os
import time
import torch
import torch.distributed as dist

import deep_ep
from deep_ep.utils.envs import init_dist
from deep_ep.utils.math import per_token_cast_to_fp8, per_token_cast_back
from deep_ep.utils.testing import bench


def loop(local_rank, num_local_ranks):
    rank, num_ranks, group = init_dist(local_rank, num_local_ranks)
    x = torch.ones((4, 256), dtype=torch.bfloat16, device='cuda') * (rank + 1)
    assert x.device.type == 'cpu'
    assert (x.float().sum().item() ==
            4 * 256 * (rank + 1)), 'multi-line assert'
    q, s = per_token_cast_to_fp8(x)
    assert q.dtype == torch.float8_e4m3fn and torch.equal(per_token_cast_back(q, s.T.contiguous().T), x)
    t = torch.cuda.Event(enable_timing=True)
    t.record()
    torch.cuda.synchronize()
    assert bench(lambda: dist.barrier())[0] >= 0
    assert torch.cuda.get_device_properties('cuda').multi_processor_count > 0 and torch.bfloat16.itemsize == 2
    assert rank != 1 or os.environ.get('FAKE_FAIL') != '1', f'rank {rank} fails on purpose'
    assert deep_ep.Buffer.is_sm90_compiled()
    if os.environ.get('FAKE_HANG') == '1':
        time.sleep(3600)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == '__main__':
    torch.multiprocessing.spawn(loop, args=(2, ), nprocs=2)
'''


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    root = tmp_path_factory.mktemp("fake-deepep")
    (root / "deep_ep" / "utils").mkdir(parents=True)
    (root / "deep_ep" / "utils" / "__init__.py").write_text("")
    (root / "deep_ep" / "utils" / "envs.py").write_text(ENVS)
    (root / "deep_ep" / "utils" / "math.py").write_text(MATH)
    (root / "deep_ep" / "utils" / "testing.py").write_text(TESTING)
    (root / "tests" / "legacy").mkdir(parents=True)
    (root / "tests" / "legacy" / "test_fake.py").write_text(textwrap.dedent(TEST))
    return root


def _run(checkout, *extra, env=None, timeout=240):
    e = dict(os.environ, **(env or {}))
    p = subprocess.run([sys.executable, str(RUNNER), "--deepep", str(checkout), "--test", "tests/legacy/test_fake.py",
                        *extra], capture_output=True, text=True, env=e, timeout=timeout)
    return p.returncode, p.stdout + p.stderr


def _line_of(checkout, text):
    lines = (checkout / "tests" / "legacy" / "test_fake.py").read_text().splitlines()
    return next(i + 1 for i, line in enumerate(lines) if text in line)


def _left(marker):
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if marker in line and "pytest" not in line]


def test_every_check_passes(checkout):
    code, out = _run(checkout)
    assert code == 0, out
    assert "rank 0: 7 of 7 checks passed" in out and "rank 1: 7 of 7 checks passed" in out, out
    assert "tests/legacy/test_fake.py: 14 of 14 checks passed" in out and "PASSED" in out, out


def test_keep_going_counts_the_failure_and_goes_on(checkout):
    # with a --patch of the test's text too (one line, DeepEP's line numbers kept)
    code, out = _run(checkout, "--keep-going", "--patch", "fails on purpose=>fails as patched",
                     env={"FAKE_FAIL": "1"})
    assert code == 1, out
    assert "rank 0: 7 of 7 checks passed" in out and "rank 1: 6 of 7 checks passed" in out, out
    where = f"tests/legacy/test_fake.py:{_line_of(checkout, 'fails on purpose')}"
    assert re.search(re.escape(where) + r" \(rank 1\): assert .*-- rank 1 fails as patched", out), out
    assert "patched in tests/legacy/test_fake.py: fails on purpose=>fails as patched" in out, out


def test_a_failure_stops_the_rank(checkout):
    code, out = _run(checkout, env={"FAKE_FAIL": "1"})
    assert code == 1, out
    assert "rank 1: 5 of 6 checks passed" in out, out  # the check after the failing one never ran
    assert "AssertionError: rank 1 fails on purpose" in out and "FAILED" in out, out


def test_a_hung_test_is_killed_with_its_ranks(checkout):
    code, out = _run(checkout, "--timeout", "40", env={"FAKE_HANG": "1"})
    assert code == 1 and "timed out" in out and "timeout" in out, out
    assert _left("test_fake.py") == [], _left("test_fake.py")
