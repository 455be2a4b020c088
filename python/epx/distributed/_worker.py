"""A group's collectives on a thread of their own, in issue order.

torch does not tell a backend whether the caller waits: torch.distributed's functions call the
group and then wait on the Work unless async_op=True; DDP's reducer (C++, during the backward
pass) takes the Work's future and waits on it only when the backward pass ends. A collective
runs on the group's worker thread when the function that called it is torch.distributed's with
async_op=True, or when it was called from C++ in a backward pass (the last Python frame is
torch.autograd's); any other call runs on the calling thread once every collective issued
before it has run, and completes before it returns (its error raised at the call). The worker
waits inside epx with the GIL released, so the caller's Python (and the backward pass) goes on.
"""
import collections
import os
import threading
import traceback

import torch
from torch._C._distributed_c10d import _create_work_from_future

from ._work import _AsyncWork

_C10D = os.path.join("torch", "distributed", "distributed_c10d.py")
_AUTOGRAD = os.path.join("torch", "autograd", "")


def _mode(frame):
    """'async' (a Python Work), 'hook' (a C++ Work over a future: C++ takes it) or None (inline)."""
    if frame is None:
        return None
    name = frame.f_code.co_filename
    if name.endswith(_C10D):
        return "async" if frame.f_locals.get("async_op") else None
    if _AUTOGRAD in name:
        return "hook"
    return None


def _unpinned(e):
    """e with its traceback's frames cleared (the traceback stays printable): their locals
    include views of the group's window, which would keep it mapped as long as the Work (or
    its future) holds the error."""
    first, seen = e, set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        traceback.clear_frames(e.__traceback__)
        e = e.__cause__ or e.__context__
    return first


class _Worker:
    def __init__(self, rank):
        self.rank = rank
        self.cv = threading.Condition()
        self.jobs = collections.deque()  # (run, finish) in issue order
        self.busy = False
        self.closing = False
        self.thread = None

    def here(self):
        return self.thread is not None and threading.current_thread() is self.thread

    def drain(self):
        """Returns once every collective issued before has run (the caller's next one keeps
        the issue order)."""
        with self.cv:
            while self.jobs or self.busy:
                self.cv.wait()

    def submit(self, what, run, mode, pg):
        """Queues run() (which returns the call's tensors) and returns its Work."""
        if mode == "async":
            work = _AsyncWork(pg, what)
            finish = work._done_with
        else:
            fut = torch.futures.Future()
            work = _create_work_from_future(fut)

            def finish(result, error):
                fut.set_exception(error) if error is not None else fut.set_result(result)
        with self.cv:
            if self.closing:
                raise RuntimeError(f"epx backend: {what}: rank {self.rank}: the group was destroyed")
            self.jobs.append((run, finish))
            if self.thread is None:
                self.thread = threading.Thread(target=self._loop, daemon=True, name=f"epx-collectives-{self.rank}")
                self.thread.start()
            self.cv.notify_all()
        return work

    def _loop(self):
        while True:
            with self.cv:
                while not self.jobs and not self.closing:
                    self.cv.wait()
                if not self.jobs:
                    return
                run, finish = self.jobs.popleft()
                self.busy = True
            try:
                result, error = run(), None
            except Exception as e:  # noqa: BLE001  the Work's to raise
                result, error = None, _unpinned(e)
            try:
                finish(result, error)
            finally:
                del run, finish, result, error  # nothing of the call outlives it here
                with self.cv:
                    self.busy = False
                    self.cv.notify_all()

    def close(self, timeout=2.0):
        """Local: the collectives not yet started fail; the running one gets `timeout` seconds
        to end (its peers may be gone) before the thread is left to epx's own timeout."""
        with self.cv:
            self.closing = True
            doomed = list(self.jobs)
            self.jobs.clear()
            self.cv.notify_all()
        for _, finish in doomed:
            finish(None, RuntimeError(f"epx backend: rank {self.rank}: the group was destroyed before the "
                                      f"collective ran"))
        if self.thread is not None and not self.here():
            self.thread.join(timeout=timeout)
