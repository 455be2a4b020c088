"""The Work objects the backend returns."""
import datetime
import threading

import torch
from torch._C._distributed_c10d import Work

from ._util import _secs


class _P2PWork(Work):
    """The Work of a send or a receive: done when its thread has moved the bytes. wait(timeout)
    raises a RuntimeError after the timeout (the group's when none is given; the message stays
    queued, as gloo's does); exception() is the error or None; get_future() is completed with
    the tensors (or the error) from the group's thread."""

    def __init__(self, pg, what, tensors, peer):
        super().__init__()
        self._pg_timeout, self._rank = pg._timeout, pg._rank
        self._what, self._tensors, self._peer = what, tensors, peer
        self._event = threading.Event()
        self._error = None
        self._fut = torch.futures.Future()

    def _finish(self, error=None, src=None):
        if src is not None:
            self._peer = src
        self._error = error
        # The future first: a caller that returns from wait() may look at get_future().done()
        # at once (the event set first made that a race, seen as a failed check under load).
        if error is None:
            self._fut.set_result(self._tensors)
        else:
            self._fut.set_exception(error)
        self._event.set()

    def wait(self, timeout=datetime.timedelta(0)):
        secs = _secs(timeout, self._pg_timeout)
        if not self._event.wait(secs):
            peer = "" if self._peer is None else f" (rank {self._peer})"  # a collective's Work has no peer
            raise RuntimeError(f"epx backend: {self._what}: rank {self._rank}: Timed out waiting {secs:g} s for the "
                               f"{self._what}{peer} to complete")
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self):
        return self._event.is_set()

    def is_success(self):
        return self._error is None

    def exception(self):
        return self._error

    def get_future(self):
        return self._fut

    def result(self):
        return list(self._tensors)

    def synchronize(self):
        pass

    def source_rank(self):
        if not self._what.startswith("recv"):
            raise RuntimeError("epx backend: source_rank() is only defined for the Work of a receive")
        if not self._event.is_set():
            raise RuntimeError("epx backend: source_rank() before the receive completed (wait() first)")
        return self._peer

    _source_rank = source_rank



class _AsyncWork(_P2PWork):
    """The Work of a collective issued with async_op=True: done when the group's worker thread
    has run it (the group's collectives run there in issue order). wait(timeout) raises the
    call's error, or a RuntimeError after the timeout (the group's when none is given; the
    call still runs); get_future() is completed with the call's tensors or its error."""

    def __init__(self, pg, what):
        super().__init__(pg, what, [], None)

    def _done_with(self, result, error):
        self._tensors = result if result is not None else []
        self._finish(error)
