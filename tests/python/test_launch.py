"""epx.launch: what reaches its caller when a rank fails — the
exception's type, message and the last lines of its traceback; a function a spawned rank
cannot import is refused at once, saying what to do; tensors come back from the ranks."""
import os
import signal
import subprocess
import sys

import pytest
import torch

import epx


def _raises(rank, n):
    if rank == 1:
        raise ValueError(f"boom on rank {rank}")
    return rank


def test_a_ranks_exception_reaches_the_caller():
    with pytest.raises(epx.Error) as info:
        epx.launch(_raises, 2, start_method="fork", timeout_secs=60)
    e = info.value
    assert e.origin_rank == 1 and e.exc_type == "ValueError", (e.origin_rank, e.exc_type)
    assert "rank 1: ValueError: boom on rank 1" in str(e), str(e)
    assert "_raises" in e.rank_traceback and 'raise ValueError(f"boom' in e.rank_traceback, e.rank_traceback
    assert any("rank 1's traceback" in n for n in getattr(e, "__notes__", [])), getattr(e, "__notes__", None)
    assert e.values == {0: 0}, e.values


def _killed(rank, n):
    if rank == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    return rank


def test_a_killed_rank_is_named_with_its_signal():
    with pytest.raises(epx.Error) as info:
        epx.launch(_killed, 2, start_method="fork", timeout_secs=60)
    assert info.value.origin_rank == 0 and "killed by SIGKILL" in str(info.value), str(info.value)


def _tensor(rank, n):
    return torch.full((3,), float(rank))


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_ranks_return_tensors(start_method):
    got = epx.launch(_tensor, 2, start_method=start_method, timeout_secs=120)
    assert [t.tolist() for t in got] == [[0.0] * 3, [1.0] * 3]


_DASH_C = """
import epx
def f(rank, n):
    return rank
try:
    print(epx.launch(f, 2, start_method=METHOD))
except epx.Error as e:
    print(e.code)
    print(e)
"""


def _dash_c(method):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    return subprocess.run([sys.executable, "-c", _DASH_C.replace("METHOD", repr(method))], env=env,
                          capture_output=True, text=True, timeout=120)


def test_spawn_from_dash_c_says_what_to_do():
    r = _dash_c("spawn")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("invalid_argument\n"), r.stdout
    assert "python -c" in r.stdout and "module level" in r.stdout and 'start_method="fork"' in r.stdout, r.stdout


def test_fork_from_dash_c_runs():
    r = _dash_c("fork")
    assert r.returncode == 0 and r.stdout.strip() == "[0, 1]", (r.stdout, r.stderr)


def test_closures_are_refused_for_spawn():
    with pytest.raises(epx.Error) as info:
        epx.launch(lambda rank, n: rank, 2)
    assert info.value.code == "invalid_argument" and "lambda" in str(info.value), str(info.value)
