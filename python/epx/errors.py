"""epx.Error: the one exception type of epx (as epx::Error in C++)."""


class Error(RuntimeError):
    """A failure epx reports.

    ``code``: what kind of failure, the C++ ErrorCode's name ("invalid_argument",
    "shape_mismatch", "dtype_mismatch", "capacity_exceeded", "bad_handle", "timeout",
    "peer_failed", "unsupported", "io", "internal").
    ``origin_rank``: the rank at fault (whose input was bad, or the peer that died or timed
    out), -1 when no single rank is to blame. Collective calls raise on every rank.
    """

    def __init__(self, message, code="internal", origin_rank=-1):
        super().__init__(message)
        self.code = code
        self.origin_rank = origin_rank

    @property
    def is_peer_loss(self):
        """True for the errors a lost peer causes ("peer_failed", "timeout"), after which the
        survivors may go on without it (epx.agree_and_rebuild); a bad input
        ("invalid_argument", ...) is not one. As epx::is_peer_loss in C++."""
        return self.code in ("peer_failed", "timeout")

    def __reduce__(self):  # survives pickling (epx.launch carries errors back from the ranks), with
        # any attribute set on it (epx.launch's exc_type and rank_traceback, notes)
        return (Error, (str(self), self.code, self.origin_rank), dict(self.__dict__))
