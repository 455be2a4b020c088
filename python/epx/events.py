"""EventOverlap and EventHandle: DeepEP's events, on CPU (``deep_ep.utils`` names them too).

An EventOverlap stands for a call in flight (``async_with_compute_stream``,
``defer_epilogue``) or a finished one; an EventHandle for "everything issued so far", which
on CPU has always happened.
"""


class EventHandle:
    """DeepEP's captured CUDA event (``EventHandle()``, ``EPBuffer.capture()``), on CPU: the
    work issued before it is done when it is made, so ``current_stream_wait()`` returns at
    once. Accepted wherever DeepEP takes a ``previous_event``."""

    def current_stream_wait(self):
        return None


class EventOverlap:
    """An asynchronous call in flight, or a finished one. ``current_stream_wait()`` (alias
    ``wait()``) blocks until the call finished (Ctrl-C ends the wait; a call that failed
    raises its epx.Error here, on every rank); after it the tensors the call returned hold
    their values. Waiting again returns at once. ``with event: ...`` waits at the end of
    the block (DeepEP's idiom); ``event(release_handle=True)`` is accepted.

    ``async_with_compute_stream=True``: the call already returned its tuple (the tensors with
    their final shapes) and this event in it; epx's threads carry the call on, and the wait
    returns None. With ``defer_epilogue=True`` the call returns only this event, and the wait
    runs the call's back half (completion and epilogue) on the waiting thread, then returns
    DeepEP's result: dispatch ``(recv_x, recv_topk_idx, recv_topk_weights, handle)``, combine
    ``(combined_x, combined_topk_weights)``. A hook registered with
    ``register_hook_after_wait(fn)`` runs after the wait, and the wait returns its value.

    ``EventOverlap(event=None, extra_tensors=None)``: DeepEP's constructor; ``event`` (e.g. an
    EventHandle) is waited on by ``current_stream_wait``, ``extra_tensors`` only kept alive.
    (No event refers to a tuple holding it: no reference cycle keeps a call's tensors, and
    their pooled memory, alive after the caller dropped them.)"""

    def __init__(self, event=None, extra_tensors=None):
        self.event, self.extra_tensors = event, extra_tensors
        self._pending = self._result = self._after = self._hook = None
        self._release = False

    @classmethod
    def _of(cls, pending=None, result=None):
        """An event over the binding's Pending call (None: finished) and its result."""
        ev = cls()
        ev._pending, ev._result = pending, result
        return ev

    def current_stream_wait(self, release_handle=False):
        if self._pending is not None:
            p, self._pending = self._pending, None
            p.wait()
            if self._after is not None:
                self._after()
        if self.event is not None and hasattr(self.event, "current_stream_wait"):
            self.event.current_stream_wait()
        result = self._result
        if self._hook is not None:
            hook, self._hook = self._hook, None
            result = hook()
        if release_handle:
            self.event = None
        return result

    def wait(self):
        return self.current_stream_wait()

    def done(self):
        """True when wait() would not block."""
        return self._pending is None or self._pending.done()

    def register_hook_after_wait(self, hook_after_wait):
        """DeepEP's: runs hook_after_wait() after the next wait (once); the wait then returns
        its value. One hook at a time (a second registration before the wait raises)."""
        if self._hook is not None:
            raise RuntimeError("EventOverlap: a hook is already registered on this EventOverlap")
        self._hook = hook_after_wait

    @property
    def hook_after_wait(self):
        """The registered hook (None: none, or it ran), DeepEP's attribute."""
        return self._hook

    @hook_after_wait.setter
    def hook_after_wait(self, hook):
        self._hook = hook

    def __call__(self, release_handle=False):
        self._release = release_handle
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.current_stream_wait(release_handle=self._release)
        self._release = False
        return False
