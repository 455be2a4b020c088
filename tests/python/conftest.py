# tests/python: the epx package under pytest (Debian's /usr/bin/python3 -m pytest -q tests/python).
# The numpy reference of docs/spec.md (tests/e2e/epx_ref.py) is importable as `epx_ref`.
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "e2e"))
sys.path.insert(0, os.path.dirname(__file__))
# This checkout's build first (a build writes nothing into the system Python), for this
# process and for the processes the tests start (examples, `python -c`, launchers).
_build = os.path.join(os.path.dirname(__file__), "..", "..", "build", "python")
if os.path.isdir(os.path.join(_build, "epx")):
    _build = os.path.abspath(_build)
    sys.path.insert(0, _build)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_build, os.environ.get("PYTHONPATH")) if p)
