"""The package itself: `import epx` from anywhere with Debian's Python and no environment,
and epx.Error's fields surviving a trip between processes."""
import os
import pickle
import subprocess
import sys

import epx


# Installed (tests/packaging/check_install.sh): the venv's Python, whose package is the
# installed one; else Debian's, which the build's epx.pth points at this checkout's build.
INSTALLED = bool(os.environ.get("EPX_TEST_INSTALLED"))
PYTHON = sys.executable if INSTALLED else "/usr/bin/python3"


def test_import_from_any_directory_without_environment():
    r = subprocess.run([PYTHON, "-c", "import epx, sys; print(epx.EPBuffer.__name__, epx.__version__, epx.__file__)"],
                       cwd="/", env={}, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    name, version, where = r.stdout.split()
    assert name == "EPBuffer" and version == epx.__version__, r.stdout
    assert where == epx.__file__ or not INSTALLED, (where, epx.__file__)


def test_error_keeps_code_and_origin_rank_through_pickle():
    e = pickle.loads(pickle.dumps(epx.Error("rank 3: bad", "bad_handle", 3)))
    assert isinstance(e, epx.Error) and isinstance(e, RuntimeError)
    assert (str(e), e.code, e.origin_rank) == ("rank 3: bad", "bad_handle", 3)


def test_buffer_needs_a_group():
    import torch.distributed as dist
    assert not dist.is_initialized()
    try:
        epx.EPBuffer(None, num_max_tokens_per_rank=4, hidden=128, num_topk=2, num_experts=8)
    except epx.Error as e:
        assert e.code == "invalid_argument" and "init_process_group" in str(e)
    else:
        raise AssertionError("EPBuffer without torch.distributed did not fail")
