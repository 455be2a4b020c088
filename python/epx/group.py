"""Groups: the bootstrap of a buffer from a torch.distributed ProcessGroup, the group's
transport that every buffer of the group shares, and epx.launch, which starts the ranks
itself."""
import atexit
import datetime
import os
import queue
import tempfile
import time
import traceback

from .errors import Error


def _dist():
    import torch.distributed as dist
    return dist


def bootstrap_of(group, need_allgather=True):
    """(rank, size, allgather) over `group` (None: the default group). allgather(bytes) ->
    the concatenation of every rank's bytes (all the same length), by torch.distributed
    all_gather of uint8 tensors."""
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
    machine) and timeout — collectively, so every rank of the group must make the same
    calls in the same order, as it does when it builds the same buffers — and shared by
    every buffer of the group afterwards (EPBuffer, BucketBuffer, ...), each on its own
    endpoint: an application may hold several buffers of several kinds on one group."""
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


def _rank_main(fn, rank, num_ranks, store_path, args, results, timeout_secs):
    dist = _dist()
    try:
        dist.init_process_group("gloo", init_method="file://" + store_path, rank=rank, world_size=num_ranks,
                                timeout=datetime.timedelta(seconds=timeout_secs))
        value = fn(rank, num_ranks, *args)
        results.put((rank, True, value))
    except BaseException as e:  # noqa: BLE001 - every failure goes back to the launcher
        if isinstance(e, Error):
            err = e
        else:
            err = Error(f"rank {rank}: {type(e).__name__}: {e}\n{traceback.format_exc()}", "internal", rank)
        results.put((rank, False, err))
    finally:
        try:
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass


def launch(fn, num_ranks, *args, timeout_secs=300, start_method="spawn"):
    """Runs fn(rank, num_ranks, *args) on `num_ranks` processes of this machine, each with
    torch.distributed initialised (gloo, a FileStore in a temporary directory), so that
    EPBuffer() there uses the default group. Returns the list of fn's return values by
    rank. If any rank fails, the others get `timeout_secs` to end (epx errors are
    collective; a dead rank makes its peers fail within a second), stragglers are
    killed, and the error of the rank at fault is raised (an epx.Error keeps its code and
    origin rank, and carries .errors and .values: every rank's outcome). start_method "spawn" (default: safe with torch's thread pools) or
    "fork" (faster to start; fn may be a closure)."""
    import multiprocessing as mp
    _dist()  # imported once here: forked ranks inherit torch instead of each importing it
    ctx = mp.get_context(start_method)
    with tempfile.TemporaryDirectory(prefix="epx-launch-") as d:
        results = ctx.Queue()
        procs = [ctx.Process(target=_rank_main, args=(fn, r, num_ranks, os.path.join(d, "store"), args, results,
                                                      timeout_secs), daemon=True)
                 for r in range(num_ranks)]
        for p in procs:
            p.start()
        values, errors = {}, {}
        deadline = None
        try:
            while len(values) + len(errors) < num_ranks:
                try:
                    rank, ok, v = results.get(timeout=0.1)
                    (values if ok else errors)[rank] = v
                    if not ok and deadline is None:
                        deadline = time.monotonic() + timeout_secs
                    continue
                except queue.Empty:
                    pass
                for r, p in enumerate(procs):
                    if r not in values and r not in errors and p.exitcode is not None:
                        time.sleep(0.2)  # its last message may still be in the pipe
                        try:
                            while True:
                                rank, ok, v = results.get_nowait()
                                (values if ok else errors)[rank] = v
                        except queue.Empty:
                            pass
                        if r not in values and r not in errors:
                            errors[r] = Error(f"rank {r} died (exit code {p.exitcode})", "peer_failed", r)
                            deadline = deadline or time.monotonic() + timeout_secs
                if deadline is not None and time.monotonic() > deadline:
                    for r in range(num_ranks):
                        if r not in values and r not in errors:
                            errors[r] = Error(f"rank {r} did not end after another rank failed and was killed",
                                              "peer_failed", -1)
                    break
        finally:
            for p in procs:
                p.join(timeout=5 if not errors else 1)
                if p.is_alive():
                    p.kill()
                    p.join()
            results.close()
    if errors:
        # the rank that blames itself first, else the lowest rank's error; every rank's
        # outcome rides along (.errors: rank -> Error, .values: rank -> fn's value)
        pick = next((e for r, e in sorted(errors.items()) if getattr(e, "origin_rank", -1) == r), None)
        pick = pick if pick is not None else errors[min(errors)]
        pick.errors, pick.values = errors, values
        raise pick
    return [values[r] for r in range(num_ranks)]
