"""epx.Diagnose: which rank or link is slow, in a running job (DeepEP's Diagnose).

    diag = epx.Diagnose(buffer, interval=10)   # collective; or epx.Diagnose(group) + diag.watch(buffer)
    diag.start()                               # an exchange of the waits every `interval` s, in the background
    ...                                        # dispatch / combine as usual
    diag.stop()                                # collective: one last exchange, the thread ends
    diag.matrices()   # {"dispatch": [P, P] numpy array, "combine": ...}: matrix[src, dst], µs per call
    diag.diagnose()   # {"dispatch": {"abnormal_rows": [...], "abnormal_cols": [...],
                      #               "abnormal_points": [[src, dst, value, ratio], ...]}, "combine": {...}}
    diag.persistent() # the same keys: what the verdicts of `persist[1]` of the last `persist[0]` intervals named
    diag.persistent_ranks()  # {"ranks": [...], "links": [[src, dst, value, ratio]]}: the same, per rank and link, both ops

matrix[src, dst] is the average time per call, in microseconds, that rank dst waited for rank
src's header and rows during the last interval (every Buffer records it, always on). Rows
are sources (the ranks waited for), columns destinations (the ranks that waited). The
verdict keeps DeepEP's ratios and thresholds, against the others (never the value judged): a
row (slow source) or column (slow destination) whose mean is more than `thresholds["row"]` /
`["col"]` (3) times the mean of the OTHER rows' / columns' means, a point (slow link) more
than `thresholds["point"]` (5) times the typical link (the mean of the other off-diagonal
values outside the abnormal rows and columns, whose points are not listed again; it must
stand out of its own row and column the same way) — each also more than 50 µs per call
above the others' mean (`thresholds["floor_us"]`), and above the others' median by more
than that and by more than 5 robust deviations of the others (1.4826 x their median absolute
deviation; C++ `DiagnoseThresholds::spread`): a slow rank cannot hide in a mean it inflates,
and noise among the others does not make a rank stand out (docs/diagnose.md). A point which
alone makes its row and column abnormal is listed as the point (`thresholds["links"]`,
default True). Every rank holds the same matrices and verdicts.

That verdict is one interval's (DeepEP's). On a busy machine the scheduler can leave any rank
behind for a whole interval, as late as a stopped one; a fault stays over intervals, that does
not. `persistent()` names only what at least `need` of the last `of` intervals' verdicts
named (`persist=(of, need)`, default (5, 3)), each row, column and point counted on its own;
`persistent_ranks()` counts per rank (a row or column of either op) and per link (a point
that both ops name): a fault's evidence moves between ops and kinds from interval to
interval, so that is the verdict to act on.

With `log_dir` (default: $EPX_DIAGNOSE_LOG_PATH, else no log), rank 0 appends each exchange's
verdicts and matrices to log_dir/diagnose.log, rotated at `log_max_bytes` (.log.1, .log.2).
$EPX_DIAGNOSE_INTERVAL overrides `interval`, as DeepEP's DEEPEP_DIAGNOSE_INTERVAL does.
The exchange runs on a window of its own (never the buffer's); see docs/diagnose.md.
"""
import os
import weakref

import numpy as np

from . import _epx
from .errors import Error
from .group import transport_of

_OPS = ("dispatch", "combine")
_DEFAULT_THRESHOLDS = {"row": 3.0, "col": 3.0, "point": 5.0, "links": True, "floor_us": 50.0, "spread": 5.0}
_DEFAULT_PERSIST = (5, 3)  # named in 3 of the last 5 intervals (C++ DiagnosePersist)
_VERDICT_KEYS = ("abnormal_rows", "abnormal_cols", "abnormal_points")


def _persist(persist):
    try:
        of, need = (int(x) for x in persist)
    except (TypeError, ValueError):
        raise Error(f"Diagnose: persist must be (of, need), got {persist!r}", "invalid_argument") from None
    if not 1 <= need <= of:
        raise Error(f"Diagnose: persist (of, need) needs 1 <= need <= of, got ({of}, {need})", "invalid_argument")
    return of, need


def _thresholds(thresholds):
    t = dict(_DEFAULT_THRESHOLDS)
    for k, v in (thresholds or {}).items():
        if k not in t:
            raise Error(f"Diagnose: unknown threshold {k!r} (expected row, col, point, links, floor_us, spread)",
                        "invalid_argument")
        t[k] = bool(v) if k == "links" else float(v)
    return t


class Diagnose:
    """Diagnose(buffer_or_group=None, interval=10, *, thresholds=None, persist=(5, 3), log_dir=None,
             log_max_bytes=64 MiB, log_backups=2, transport="auto", timeout_secs=300)

    Collective. `buffer_or_group`: an EPBuffer (its waits are watched), or a
    torch.distributed group (None: the default group; watch(buffer) adds the buffers to
    watch). Either way the exchange runs on an endpoint of its own of the group's transport
    (`transport` and `timeout_secs` pick that transport for a group, as EPBuffer's do).
    `interval`: seconds between background exchanges. `thresholds`: {"row", "col",
    "point"}, DeepEP's 3, 3, 5 by default; "floor_us", the µs per call a row, column or point
    must also exceed its typical value by (50; 0: the ratios alone); "spread", the robust
    deviations (1.4826 x MAD) of the others it must also stand above their median by (5; 0:
    off); "links" (True). `persist`: (of, need), the persistent verdict's rule: named in
    `need` of the last `of` intervals."""

    def __init__(self, buffer_or_group=None, interval=10, *, thresholds=None, persist=_DEFAULT_PERSIST, log_dir=None,
                 log_max_bytes=64 << 20, log_backups=2, transport="auto", timeout_secs=300):
        from .buffer import EPBuffer
        interval = float(os.environ.get("EPX_DIAGNOSE_INTERVAL", interval))
        if log_dir is None:
            log_dir = os.environ.get("EPX_DIAGNOSE_LOG_PATH", "")
        self.thresholds = _thresholds(thresholds)
        self.persist = _persist(persist)
        self.interval = interval
        t = self.thresholds
        opts = (interval, t["row"], t["col"], t["point"], t["links"], t["floor_us"], t["spread"], *self.persist, str(log_dir),
                int(log_max_bytes), int(log_backups))
        self._d = None
        buf = buffer_or_group if isinstance(buffer_or_group, EPBuffer) else None
        if buf is not None:  # the group's transport, as the buffer's engines use it
            transport, timeout_secs = buf._opts[0], buf.num_cpu_timeout_secs
        t = transport_of(buf.group if buf is not None else buffer_or_group, transport, timeout_secs)
        self._d = _epx.Diagnose.over_transport(t, *opts)
        self.rank, self.group_size = t.rank, t.num_ranks
        if buf is not None:
            self.watch(buf)

    # -- life cycle ---------------------------------------------------------------------
    def watch(self, buffer):
        """Local: adds an EPBuffer's waits (of the same ranks) from now on — every engine it
        holds (one per expert count) and those it builds later. Every rank should watch the
        same buffers."""
        d = self._live()
        for engine in buffer._engines.values():
            d.watch(engine)
        buffer.__dict__.setdefault("_engine_watchers", []).append(weakref.WeakMethod(self._watch_engine))

    def _watch_engine(self, engine):
        if self._d is not None and not self._d.closed:
            self._d.watch(engine)

    def start(self):
        """Collective: the background exchange, every `interval` seconds. Once."""
        self._live().start()
        return self

    def stop(self):
        """Collective, idempotent: the background exchange's last round, then its thread ends."""
        if self._d is not None and not self._d.closed:
            self._d.stop()

    def exchange(self):
        """Collective: one exchange now (not while started); returns diagnose()."""
        self._live().exchange()
        return self.diagnose()

    def close(self):
        """Collective: stop(), then the exchange's window goes. Idempotent."""
        if self._d is not None and not self._d.closed:
            self._d.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # -- results ------------------------------------------------------------------------
    def report(self):
        """The latest exchange as a dict: "exchanges", "seconds", "error", "ranks" ([{rank,
        pid, node}]), "thresholds", "persist" ({"of", "need"}), "window" (the intervals the
        persistent verdict counted over so far), "text" (the log's text) and per op
        ("dispatch", "combine") matrix_us ([P, P] numpy), calls ([P]: calls each rank made in
        the interval), abnormal_rows, abnormal_cols, abnormal_points, point_nodes ([[src node,
        dst node]]) of the interval's verdict, and "persistent": the same four keys of the
        persistent verdict counted per op; "persistent_ranks": {"ranks", "links"}, the
        persistent verdict per rank and link over both ops (persistent_ranks())."""
        r = self._live().report()
        P = len(r["ranks"])
        r["persistent_ranks"]["links"] = [list(p) for p in r["persistent_ranks"]["links"]]
        for op in _OPS:
            r[op]["matrix_us"] = np.asarray(r[op]["matrix_us"], dtype=np.float64).reshape(P, P)
            for v in (r[op], r[op]["persistent"]):
                v["abnormal_points"] = [list(p) for p in v["abnormal_points"]]
                v["point_nodes"] = [list(p) for p in v["point_nodes"]]
        return r

    def matrices(self):
        """{"dispatch": [P, P], "combine": [P, P]}: µs per call, matrix[src, dst], of the last interval."""
        r = self.report()
        return {op: r[op]["matrix_us"] for op in _OPS}

    def diagnose(self):
        """{"dispatch": {...}, "combine": {...}}, each {"abnormal_rows", "abnormal_cols",
        "abnormal_points": [[src, dst, value, ratio], ...]} for the last interval."""
        r = self.report()
        return {op: {k: r[op][k] for k in _VERDICT_KEYS} for op in _OPS}

    def persistent(self):
        """{"dispatch": {...}, "combine": {...}} as diagnose(), of the persistent verdict: what
        the verdicts of at least `need` of the last `of` intervals named (`persist`)."""
        r = self.report()
        return {op: {k: r[op]["persistent"][k] for k in _VERDICT_KEYS} for op in _OPS}

    def persistent_ranks(self):
        """{"ranks": [...], "links": [[src, dst, value, ratio], ...]}: the persistent verdict
        per rank and link, both ops together — a rank named as a row or column of either op,
        a pair of ranks named as a point by both ops, in at least `need` of the last `of`
        intervals (docs/diagnose.md, "Over intervals"). The verdict to act on."""
        return self.report()["persistent_ranks"]

    def ranks(self):
        """[{"rank", "pid", "node"}] of every rank."""
        return self.report()["ranks"]

    @staticmethod
    def diagnose_matrix(mat, thres_col=3.0, thres_row=3.0, thres_point=5.0, links=True, floor_us=50.0, spread=5.0):
        """The verdict rule on any square matrix (the same C++ code as the exchange's verdicts;
        values in µs, `floor_us` the absolute floor, 0 for ratios alone; `spread` the robust
        deviations a value must stand above the others' median by, 0 to turn that off): {"abnormal_cols", "abnormal_rows",
        "abnormal_points": [[i, j, value, ratio], ...]}, ratio = value / the typical link.
        links=False: a point that alone makes its row and column abnormal is reported as that
        row and column, not as the point."""
        m = np.asarray(mat, dtype=np.float64)
        if m.ndim != 2 or m.shape[0] != m.shape[1]:
            raise Error(f"Diagnose.diagnose_matrix: expected a square matrix, got shape {m.shape}", "shape_mismatch")
        v = _epx.diagnose_matrix(m.ravel().tolist(), m.shape[0], float(thres_row), float(thres_col), float(thres_point),
                                 bool(links), float(floor_us), float(spread))
        return {"abnormal_cols": v["abnormal_cols"], "abnormal_rows": v["abnormal_rows"],
                "abnormal_points": [list(p) for p in v["abnormal_points"]]}

    def _live(self):
        if self._d is None or self._d.closed:
            raise Error("Diagnose: closed", "invalid_argument")
        return self._d
