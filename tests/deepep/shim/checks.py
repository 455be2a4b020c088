"""The counter every rewritten `assert` of a DeepEP test file calls (see rewrite.py).

check(cond, msg, file, line, source): cond and msg are zero-argument callables (msg may be
None) so that, as with `assert`, the message is built only on failure. Each result is
appended as one JSON line to $EPX_DEEPEP_CHECKS_DIR/<pid>.jsonl, tagged with the rank
(torch.distributed's, once initialised). A failure raises AssertionError as the assert
did, unless EPX_DEEPEP_KEEP_GOING=1: then it is recorded and the test goes on (a condition
that raises is then recorded as a failure too).
"""
import json
import os

_file = None


def _rank():
    try:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank()
    except Exception:
        pass
    return "main"


def _record(entry):
    global _file
    d = os.environ.get("EPX_DEEPEP_CHECKS_DIR")
    if not d:
        return
    if _file is None:
        _file = open(os.path.join(d, f"{os.getpid()}.jsonl"), "a", buffering=1)
    _file.write(json.dumps(entry) + "\n")


def check(cond, msg, file, line, source):
    keep_going = os.environ.get("EPX_DEEPEP_KEEP_GOING") == "1"
    try:
        ok = bool(cond())
        why = None
    except Exception as e:
        if not keep_going:
            _record({"rank": _rank(), "ok": False, "where": f"{file}:{line}", "source": source,
                     "message": f"raised {type(e).__name__}: {e}"})
            raise
        ok, why = False, f"raised {type(e).__name__}: {e}"
    if ok:
        _record({"rank": _rank(), "ok": True, "where": f"{file}:{line}"})
        return
    if why is None:
        try:
            why = str(msg()) if msg is not None else ""
        except Exception as e:
            why = f"(the message raised {type(e).__name__}: {e})"
    _record({"rank": _rank(), "ok": False, "where": f"{file}:{line}", "source": source, "message": why})
    if not keep_going:
        raise AssertionError(why or f"{file}:{line}: assert {source}")
