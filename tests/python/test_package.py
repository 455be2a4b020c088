"""The package itself: `import epx` from any directory (installed: with no environment at all;
from a build tree: with PYTHONPATH naming it, and nothing written into the system Python),
and epx.Error's fields surviving a trip between processes."""
import os
import pickle
import subprocess
import sys

import epx


# Installed (tests/packaging/check_install.sh): the venv's Python, whose package is the
# installed one and needs no environment; else Debian's, given this build tree's package
# directory (the one conftest.py put first) as its only PYTHONPATH.
INSTALLED = bool(os.environ.get("EPX_TEST_INSTALLED"))
PYTHON = sys.executable if INSTALLED else "/usr/bin/python3"
ENV = {} if INSTALLED else {"PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(epx.__file__)))}


def test_import_from_any_directory():
    r = subprocess.run([PYTHON, "-c", "import epx, sys; print(epx.EPBuffer.__name__, epx.__version__, epx.__file__)"],
                       cwd="/", env=ENV, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    name, version, where = r.stdout.split()
    assert name == "EPBuffer" and version == epx.__version__, r.stdout
    assert os.path.abspath(where) == os.path.abspath(epx.__file__), (where, epx.__file__)


def test_build_writes_nothing_into_the_system_python():
    # An older build wrote epx.pth into the site directory, re-pointing every `import epx` on
    # the machine at the last checkout built; no path file there may name this tree.
    import glob
    import sysconfig
    tree = os.path.dirname(os.path.dirname(os.path.abspath(epx.__file__)))
    for key in ("purelib", "platlib"):
        for pth in glob.glob(os.path.join(sysconfig.get_path(key), "*.pth")):
            with open(pth, encoding="utf-8", errors="replace") as f:
                assert tree not in f.read(), f"{pth} names {tree}: a build must write nothing into the system Python"


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
