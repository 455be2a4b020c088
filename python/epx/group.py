"""Groups: the bootstrap of a buffer from a torch.distributed ProcessGroup, the group's
transport that every buffer of the group shares, and epx.launch, which starts the ranks
itself."""
import atexit
import datetime
import os
import pickle
import queue
import tempfile
import time
import traceback

from .errors import Error


def _dist():
    import torch.distributed as dist
    return dist


def _healed(group):
    """The epx.heal.Group `group` is, or None (a torch.distributed group)."""
    from ._healed import Group
    return group if isinstance(group, Group) else None


def bootstrap_of(group, need_allgather=True):
    """(rank, size, allgather) over `group` (None: the default group). allgather(bytes) ->
    the concatenation of every rank's bytes (all the same length), by torch.distributed
    all_gather of uint8 tensors. A group of survivors (epx.agree_and_rebuild) has its
    transport already and no all-gather (torch.distributed is not used there)."""
    healed = _healed(group)
    if healed is not None:
        if need_allgather:
            raise Error(f"rank {healed.rank}: a group rebuilt after a lost rank has no torch.distributed "
                        "all-gather (its transport exists: epx.group.transport_of(group))", "unsupported", healed.rank)
        return healed.rank, healed.size, None
    dist = _dist()
    if not dist.is_available() or not dist.is_initialized():
        raise Error("EPBuffer: torch.distributed is not initialised (call init_process_group, run under torchrun, "
                    "or start the ranks with epx.launch)", "invalid_argument")
    if group is None:
        group = dist.group.WORLD
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    if not need_allgather:
        return rank, size, None
    import torch

    def allgather(data):
        # normal tensors also under torch.inference_mode(): gloo writes into them from its own
        # thread, where an inference tensor may not be updated in place
        with torch.inference_mode(False):
            mine = torch.frombuffer(bytearray(data), dtype=torch.uint8)
            parts = [torch.empty_like(mine) for _ in range(size)]
            dist.all_gather(parts, mine, group=group)
        return b"".join(p.numpy().tobytes() for p in parts)

    return rank, size, allgather


# (id(group), transport kind, timeout) -> (group, _epx.Transport). The group object is kept
# so that its id is not reused while the entry lives.
_transports = {}
atexit.register(_transports.clear)  # before the interpreter's teardown, with the GIL and torch alive


def transport_of(group=None, transport="auto", timeout_secs=300):
    """The epx transport of `group` (None: the default group) in this process: made on the
    first call for that group, kind ("auto" = shared memory when every rank is on this
    machine, else UCX, or OpenSHMEM when oshrun started the ranks) and timeout — collectively, so every rank of the group must make the same
    calls in the same order, as it does when it builds the same buffers — and shared by
    every buffer of the group afterwards (EPBuffer, BucketBuffer, ...), each on its own
    endpoint: an application may hold several buffers of several kinds on one group.

    A group of survivors (epx.agree_and_rebuild) has one transport, made by the rebuild: the
    kind of the group it was rebuilt from (shm on one machine, UCX across machines; "auto" or
    that kind ask for it) with that group's timeout (timeout_secs is not used there)."""
    healed = _healed(group)
    if healed is not None:
        kind = getattr(healed.transport, "name", "shm")
        if str(transport) not in ("auto", kind):
            raise Error(f"rank {healed.rank}: a group rebuilt after a lost rank runs on the {kind} transport, "
                        f"not {transport!r}", "unsupported", healed.rank)
        return healed.transport
    rank, size, allgather = bootstrap_of(group)
    from . import _epx
    g = group if group is not None else _dist().group.WORLD
    key = (id(g), str(transport), float(timeout_secs))
    hit = _transports.get(key)
    if hit is not None and hit[0] is g:
        return hit[1]
    t = _epx.Transport(rank, size, allgather, str(transport), float(timeout_secs))
    _transports[key] = (g, t)
    return t


def transports_of(group=None):
    """The epx transports this process made for torch.distributed `group` (None: the default
    group), one per kind and timeout its buffers asked for; [] if none (no torch needed then)."""
    import sys
    if group is None:
        if "torch.distributed" not in sys.modules or not _dist().is_initialized():
            return []
        group = _dist().group.WORLD
    return [t for (gid, _, _), (g, t) in list(_transports.items()) if gid == id(group) and g is group]


_TAIL_LINES = 12  # of a failed rank's traceback, carried to the caller of launch


def _failure(rank, e, tb):
    """What a failed rank sends back: its epx.Error (code and origin kept), or an epx.Error
    naming its exception's type and message; either way with the last lines of its
    traceback, as ``.rank_traceback`` and as a note shown when the error is printed."""
    if isinstance(e, Error):
        err = e
    else:
        err = Error(f"rank {rank}: {type(e).__name__}: {e}", "internal", rank)
    err.exc_type = type(e).__name__
    lines = "".join(tb).rstrip("\n").split("\n")
    err.rank_traceback = "\n".join(lines[-_TAIL_LINES:])
    return err


def _rank_main(payload, rank, num_ranks, store_path, results, timeout_secs):
    dist = _dist()
    try:
        try:  # spawn: unpickled here, not by multiprocessing, so that a failure is reported
            fn, args = pickle.loads(payload) if isinstance(payload, bytes) else payload
        except Exception as e:  # noqa: BLE001
            raise Error(f"rank {rank}: could not load the function to run ({type(e).__name__}: {e}); "
                        f"{_SPAWN_HINT}", "invalid_argument", rank) from e
        dist.init_process_group("gloo", init_method="file://" + store_path, rank=rank, world_size=num_ranks,
                                timeout=datetime.timedelta(seconds=timeout_secs))
        value = fn(rank, num_ranks, *args)
        # pickled here with the plain pickler: torch tensors travel as copies, not as shared
        # memory whose file descriptors vanish with this process
        results.put((rank, True, pickle.dumps(value)))
    except BaseException as e:  # noqa: BLE001 - every failure goes back to the launcher
        err = _failure(rank, e, traceback.format_exception(type(e), e, e.__traceback__))
        results.put((rank, False, pickle.dumps(err)))
    finally:
        try:
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass


_SPAWN_HINT = ("a spawned rank imports the function by its module and name, so it must be defined at module "
               "level in an importable file (not in `python -c`, an interactive session or a notebook, nor "
               "nested in another function); or pass start_method=\"fork\", which runs closures too")


def _check_spawnable(fn):
    """Refuses, before any process starts, a function a spawned rank cannot import."""
    import sys
    main = sys.modules.get("__main__")
    where = getattr(fn, "__module__", None)
    name = getattr(fn, "__qualname__", "")
    if where == "__main__" and not getattr(main, "__file__", None):
        raise Error(f"epx.launch: {name or fn!r} is defined in the __main__ of `python -c` or an interactive "
                    f"session; {_SPAWN_HINT}", "invalid_argument")
    if "<locals>" in name or "<lambda>" in name:
        raise Error(f"epx.launch: {name} is a nested function or lambda; {_SPAWN_HINT}", "invalid_argument")


def _exit_words(code):
    """"exit code 1", "killed by SIGKILL"."""
    import signal
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class LaunchResult(list):
    """epx.launch's return value: fn's values by rank (None for a lost rank), with ``.lost``,
    the ranks an elastic launch lost (ascending; [] otherwise)."""
    lost = ()


def _stopped(pid):
    """True if process `pid` is stopped (SIGSTOP: state T or t in /proc/<pid>/stat)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


def launch(fn, num_ranks, *args, timeout_secs=300, start_method="spawn", elastic=False):
    """Runs fn(rank, num_ranks, *args) on `num_ranks` processes of this machine and returns
    the list of fn's return values by rank. Each rank starts with torch.distributed
    initialised — a gloo process group over a FileStore in a temporary directory, so
    ``dist.is_initialized()`` is True in fn, which must not initialise it again — and
    EPBuffer(None, ...) there uses that default group.

    If any rank fails, the others get `timeout_secs` to end (epx errors are collective; a
    dead rank makes its peers fail within a second), stragglers are killed, and an
    epx.Error is raised: the rank at fault's own epx.Error (code and origin rank kept), or
    for any other exception an epx.Error "rank r: TypeName: message" (``.exc_type`` the
    type's name). Either carries the last lines of that rank's traceback
    (``.rank_traceback``, also printed with it as a note) and every rank's outcome
    (``.errors``: rank -> Error, ``.values``: rank -> fn's value).

    start_method "spawn" (default: safe with torch's thread pools) imports fn in each rank by
    its module and name, so fn must be a module-level function of an importable file —
    not one defined under ``python -c`` or in an interactive session, nor a closure or
    lambda (refused at once, saying so); "fork" is faster to start and runs any fn.

    elastic=True: a rank that dies (a signal, os._exit: it reports nothing) does not end the
    job; the others' epx calls raise an epx.Error whose ``is_peer_loss`` is True, and they go
    on without it (epx.agree_and_rebuild, docs/reliability.md). A rank still stopped
    (SIGSTOP) once every other rank has ended is killed and lost too. The result's ``.lost``
    lists the lost ranks (their values are None). A rank that raises still fails the launch."""
    import multiprocessing as mp
    _dist()  # imported once here: forked ranks inherit torch instead of each importing it
    if start_method != "fork":
        _check_spawnable(fn)
    try:
        payload = pickle.dumps((fn, args)) if start_method != "fork" else None
    except Exception as e:  # noqa: BLE001
        raise Error(f"epx.launch: cannot send the function or its arguments to the ranks ({type(e).__name__}: "
                    f"{e}); {_SPAWN_HINT}", "invalid_argument") from e
    ctx = mp.get_context(start_method)
    with tempfile.TemporaryDirectory(prefix="epx-launch-") as d:
        results = ctx.Queue()
        procs = [ctx.Process(target=_rank_main, args=(payload if payload is not None else (fn, args), r, num_ranks,
                                                      os.path.join(d, "store"), results, timeout_secs), daemon=True)
                 for r in range(num_ranks)]
        for p in procs:
            p.start()
        out = _Outcomes(procs, results, timeout_secs, elastic)
        try:
            out.collect()
        finally:
            for p in procs:
                p.join(timeout=5 if not out.errors else 1)
                if p.is_alive():
                    p.kill()
                    p.join()
            results.close()
    values, errors, lost = out.values, out.errors, out.lost
    if errors:
        err = _pick_error(errors, values)
        err.lost = sorted(lost)
        raise err
    result = LaunchResult(values.get(r) for r in range(num_ranks))
    result.lost = sorted(lost)
    return result


class _Outcomes:
    """What launch learns of its ranks: fn's values, the errors, the ranks an elastic launch
    lost, and once a rank has failed, the time the others have left to end."""

    def __init__(self, procs, results, timeout_secs, elastic):
        self.procs, self.results, self.timeout_secs, self.elastic = procs, results, timeout_secs, elastic
        self.values, self.errors, self.lost = {}, {}, set()
        self.deadline = None

    def pending(self, r):
        return r not in self.values and r not in self.errors and r not in self.lost

    def take(self, rank, ok, v):
        (self.values if ok else self.errors)[rank] = pickle.loads(v)

    def collect(self):
        """Until every rank has a value, an error or is lost; or, after a failure, until the
        deadline (the ranks still running then count as failed)."""
        while len(self.values) + len(self.errors) + len(self.lost) < len(self.procs):
            try:
                rank, ok, v = self.results.get(timeout=0.1)
                self.take(rank, ok, v)
                if not ok and self.deadline is None:
                    self.deadline = time.monotonic() + self.timeout_secs
                continue
            except queue.Empty:
                pass
            self._ended()
            if self.elastic:
                self._lose_stopped()
            if self.deadline is not None and time.monotonic() > self.deadline:
                for r in range(len(self.procs)):
                    if self.pending(r):
                        self.errors[r] = Error(f"rank {r} did not end after another rank failed and was killed",
                                               "peer_failed", -1)
                break

    def _ended(self):
        """Ranks whose process ended: their last message read, else lost (elastic) or failed."""
        for r, p in enumerate(self.procs):
            if self.pending(r) and p.exitcode is not None:
                time.sleep(0.2)  # its last message may still be in the pipe
                try:
                    while True:
                        self.take(*self.results.get_nowait())
                except queue.Empty:
                    pass
                if r not in self.values and r not in self.errors and self.elastic:
                    self.lost.add(r)  # the survivors go on without it
                elif r not in self.values and r not in self.errors:
                    self.errors[r] = Error(f"rank {r} died ({_exit_words(p.exitcode)}) without reporting an error: "
                                           "its own output (stderr) above says why", "peer_failed", r)
                    self.deadline = self.deadline or time.monotonic() + self.timeout_secs

    def _lose_stopped(self):
        waiting = [r for r in range(len(self.procs)) if self.pending(r)]
        if waiting and len(waiting) < len(self.procs) and all(_stopped(self.procs[r].pid) for r in waiting):
            for r in waiting:  # stopped while every other rank ended: lost as well
                self.procs[r].kill()
                self.procs[r].join()
                self.lost.add(r)


def _pick_error(errors, values):
    """The error launch raises: the rank that blames itself first, else the lowest rank's;
    every rank's outcome rides along (.errors: rank -> Error, .values: rank -> fn's value),
    and its rank's traceback tail is a note of it (shown when it is printed)."""
    rank, pick = next(((r, e) for r, e in sorted(errors.items()) if getattr(e, "origin_rank", -1) == r),
                      min(errors.items()))
    pick.errors, pick.values = errors, values
    tail = getattr(pick, "rank_traceback", None)
    if tail and hasattr(pick, "add_note") and not getattr(pick, "_noted", False):
        pick.add_note(f"rank {rank}'s traceback (last lines):\n{tail}")
        pick._noted = True
    return pick
