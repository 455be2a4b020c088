"""Going on without a lost rank, from Python (epx/elastic.hpp; docs/reliability.md, "Elastic").

    group = None                                    # the default torch.distributed group
    ep = epx.EPBuffer(group, num_max_tokens_per_rank=S, hidden=H, num_topk=K, num_experts=E)
    while True:
        try:
            ... ep.dispatch / ep.combine, bucket.all_reduce ...
            break
        except epx.Error as e:
            if not e.is_peer_loss:                  # a bad input is not a lost rank
                raise
            group = epx.agree_and_rebuild(group, buffers=[ep, bucket])
            ep = epx.EPBuffer(group, ..., num_experts=(E // group.parent_size) * group.size)
            bucket = epx.BucketBuffer(group, n, transport_group=group)

agree_and_rebuild is collective over the survivors of the group whose call raised: they agree
on who is left (the dead are not waited for; a rank that neither arrives nor is dead within
the transport's timeout is left out) and map a new epx group over them, ranks renumbered
densely in ascending old rank. It needs no torch.distributed (whose group is broken once a
rank died): the survivors agree through the old group's shared memory — or, for a group
whose transport is UCX (ranks on several machines), through the group's torch.distributed
store, which outlives a lost rank (epx/heal_ucx.py; the joins below too). The returned Group is
accepted by EPBuffer, BucketBuffer (with transport_group=group), PPBuffer and EngramBuffer
wherever they take a group, and can be healed again after a second loss.

On OpenSHMEM (ranks oshrun started on several machines; docs/reliability.md, "Across
machines: OpenSHMEM") the same calls heal, with Open MPI told to let survivors live
(`oshrun --mca orte_abort_on_non_zero_status 0`) and room kept in the symmetric heap
(EPX_SHMEM_ELASTIC_RESERVE): the survivors agree through words of their own in the heap
and the new group's windows reuse the blocks the old group's buffers gave back (a new
allocation would wait for the dead PEs), so the buffers passed here let go of their storage
and the new buffers must be no bigger; a view of an old buffer's storage the application
still holds keeps its block. The job then ends at the interpreter's normal exit (the
survivors meet there and rank 0 ends the job): a survivor that leaves by os._exit skips
that and leaves oshrun waiting.

Order: the rebuild retires the old group — every later call of a buffer built on it raises
epx.Error("bad_handle") naming the rebuild, never a wait on ranks that moved on — and then
destroys the `buffers` passed (quietly: their destroy would only report the retirement)
and drops their storage views. A buffer not passed keeps its memory until it is destroyed
or dropped.

Redundant experts: live_routing(topk_idx, mapping, home_experts, group) sends each (token, k)
of a logical routing to a live replica of its expert (its home rank's copy or a redundant
slot of EPBuffer.lb_prefetch_weights's mapping) and drops (-1) and counts the pairs whose
expert has none, as epx::map_to_live_replicas does for EPLB plans.

Ranks joining a running group (epx/elastic.hpp's request_ranks / admit / open_door /
join_door; docs/reliability.md, "Joins"): the members of a group (torch.distributed's, or
epx.launch's, or one agree_and_rebuild or admit returned) open a door once, a named
shared-memory segment whose name rank 0 publishes in the torch store; a process started
later joins through it, at a point every member agrees on:

    door = epx.heal.open_door(group)                # collective; rank 0 puts the name in the store
    ...
    if group.rank == 0:                             # a replacement, or one more
        joiners = epx.heal.request_ranks(group, 1, fn, *args)   # forked: fn(new_group, *args)
    bigger = epx.heal.admit(group, joiners=1, tag=step)         # every member, the same point
    if bigger is not None:                          # else the joiner died: the group as it was
        group = bigger                              # old ranks keep their numbers, joiners after
        ... new buffers on group (the old group is retired, as after a rebuild) ...
    ...
    epx.heal.close_door(group)                      # every member, at the end

    # a process started some other way: the group it joined, or None if it was not admitted
    group = epx.heal.join(store=store)              # or join(door_name)
"""
import os
import pickle
import signal

import numpy as np

from . import _convert as cv
from ._healed import Group, _destroy_quietly  # noqa: F401  (epx.heal.Group: the public name)
from .errors import Error


def _resolve(group_or_transport):
    """(transport, original ranks, original lost) of a Group, an _epx.Transport or a
    torch.distributed group (None: the default group) whose epx transport exists."""
    from . import _epx
    if isinstance(group_or_transport, Group):
        g = group_or_transport
        return g.transport, g.original_ranks, g.original_lost
    if isinstance(group_or_transport, _epx.Transport):
        t = group_or_transport
        return t, tuple(range(t.num_ranks)), ()
    from .group import transports_of
    found = transports_of(group_or_transport)
    if not found:
        raise Error("agree_and_rebuild: this process has no epx transport on this group (no epx buffer was built "
                    "on it): nothing to rebuild", "invalid_argument")
    if len(found) > 1:
        raise Error(f"agree_and_rebuild: this group has {len(found)} epx transports (buffers built with different "
                    "transport kinds or timeouts): pass the one to rebuild, epx.group.transport_of(group, kind, "
                    "timeout_secs)", "invalid_argument")
    t = found[0]
    return t, tuple(range(t.num_ranks)), ()


def agree_and_rebuild(group_or_transport=None, buffers=(), *, store=None, error=None):
    """Collective over the survivors, after a call on the group raised an epx.Error whose
    ``is_peer_loss`` is True: agree on the live ranks and return a new Group over them.

    group_or_transport: the group the failed call ran on — a torch.distributed group (None:
    the default group; the epx transport its buffers share is rebuilt), a Group this function
    returned (after a second loss), or an _epx.Transport. buffers: the buffers of that group
    to destroy once it is retired (errors there are the retirement's and are ignored).

    A group whose transport is UCX (ranks on several machines) agrees and rebuilds through
    a torch.distributed store instead of shared memory (epx/heal_ucx.py): `store` — the
    job's store, where every survivor meets (default: the torch.distributed default group's;
    a Group this function returned keeps the one it was made with); `error` — the epx.Error
    the failed call raised (default: the exception being handled, when called in an
    ``except`` block), whose peer_failed rank is known dead and not waited for. The store a
    group's first such call (this one, or open_door) used stays the group's. The new
    group's UCX transport is bootstrapped through the store; the old group is not retired
    there (a buffer of it fails on the lost peer or times out: build on the new group).

    A group whose transport is OpenSHMEM agrees and rebuilds as a shm group does, through
    its symmetric heap (see the module's text for what the launcher and the heap need).

    Raises epx.Error: "peer_failed" on a rank the others left out (it arrived after they
    decided), "timeout" if the agreement's deciding rank died while deciding, "unsupported"
    on a transport other than shm, OpenSHMEM and UCX (the message names it), "bad_handle" on
    a shm or OpenSHMEM group that was rebuilt already, "invalid_argument" on a UCX group
    without a store.
    A survivor that dies during the rebuild makes the others agree again (the next round)
    and retry, up to the group's size times."""
    transport, original_ranks, original_lost = _resolve(group_or_transport)
    if transport.name not in _HEALING:
        raise Error(f"rank {transport.rank}: agree_and_rebuild: the {transport.name} transport cannot heal from a lost "
                    f"rank (only {', '.join(_HEALING)} groups can)", "unsupported", transport.rank)
    if _by_store(transport):
        from . import heal_ucx
        if error is None:
            import sys
            error = sys.exc_info()[1]
        return heal_ucx.agree_and_rebuild(group_or_transport, transport, original_ranks, original_lost, buffers,
                                          store, error if isinstance(error, Error) else None)
    last = None
    for _ in range(max(1, transport.num_ranks)):
        membership = transport.agree_survivors()
        try:
            fresh = transport.rebuild(membership["round"], membership["old_num_ranks"], membership["survivors"],
                                      membership["lost"], membership["new_rank"])
            break
        except Error as e:
            if not e.is_peer_loss:
                raise
            last = e  # a survivor died or stopped during the rebuild: agree again without it
    else:
        raise last
    for b in buffers:
        _destroy_quietly(b)
        _drop_storage(b)
    return Group(fresh, membership, original_ranks, original_lost)


# The transports whose groups heal: shm and OpenSHMEM through their own memory, UCX through a store.
_HEALING = ("shm", "shmem", "ucx")


def _drop_storage(buffer):
    """A destroyed buffer's storage view (BucketBuffer, PPBuffer) keeps its block mapped; on
    OpenSHMEM the rebuilt group's windows can only reuse the old group's blocks, so a
    buffer agree_and_rebuild destroyed lets go of it."""
    if getattr(buffer, "storage", None) is not None and not buffer._is_live():
        buffer.storage = None


def _by_store(transport):
    """True if `transport`'s losses and joins go through a store (UCX: epx/heal_ucx.py)."""
    return transport.name == "ucx"


def live_routing(topk_idx, mapping, home_experts, group, prefer_own_rank=False):
    """A logical routing sent to live replicas after lost ranks (local, pure).

    topk_idx: [S, K] integer, logical experts of the first group in [-1, P0 * L) (expert e
    lives on rank e // L as its home expert e % L); mapping: [P0, B], the redundant slots of
    every rank of the first group (the logical expert each holds, -1 unused: EPBuffer's
    lb_prefetch_weights mapping); home_experts: L; group: the Group of the survivors
    (agree_and_rebuild), whose original_lost ranks are gone — or, before any loss, the
    torch.distributed group (None: the default group): every replica is live then.

    The physical experts of the survivors' group: its rank d holds L + B of them, its L home
    experts then its B slots, so dispatch the result with num_experts = size x (L + B); the
    receiving rank's local expert j < L is its home expert j, j >= L its slot j - L. The
    replicas of expert e, in order: its home copy, then the slots holding it by ascending
    global slot (rank x B + b); of those on live ranks, pair (t, k) takes the t-th (mod their
    count) — or, with prefer_own_rank, the t-th of those on this rank when it holds any. A pair
    whose expert has no live replica becomes -1 and is counted, never silently.

    Returns (topk_idx [S, K] int64 in the input's flavour, num_experts, dropped_pairs,
    dropped_tokens); group.sum([dropped_pairs, dropped_tokens]) gives the group's totals."""
    idx, m, L, rank, size, original_lost, original_ranks = _routing_inputs(topk_idx, mapping, home_experts, group)
    P0, B = int(m.shape[0]), int(m.shape[1])
    E = P0 * L
    table, count, own, own_count = _replica_tables(m, L, original_lost, original_ranks[rank], prefer_own_rank)
    S, K = idx.shape
    e = np.where(idx < 0, E, idx).astype(np.int64)
    t = np.arange(S, dtype=np.int64)[:, None]
    use_own = own_count[e] > 0
    n = np.where(use_own, own_count[e], count[e])
    pick = np.where(n > 0, t % np.maximum(n, 1), 0)
    out = np.where(use_own, own[e, pick], table[e, pick])
    out = np.where((idx >= 0) & (n > 0), out, -1).astype(np.int64)
    dropped = (idx >= 0) & (count[e] == 0)
    result = out if not cv.is_torch(topk_idx) else _torch_of(out)
    return result, size * (L + B), int(dropped.sum()), int(dropped.any(axis=1).sum())


def _routing_inputs(topk_idx, mapping, home_experts, group):
    """live_routing's arguments as numpy arrays and the group's view, checked."""
    idx = np.asarray(topk_idx.detach().cpu().numpy() if cv.is_torch(topk_idx) else topk_idx)
    m = np.asarray(mapping.detach().cpu().numpy() if cv.is_torch(mapping) else mapping)
    L = int(home_experts)
    if idx.ndim != 2 or not np.issubdtype(idx.dtype, np.integer):
        raise Error(f"live_routing: topk_idx must be an integer [S, K] array, got {idx.dtype} {list(idx.shape)}",
                    "invalid_argument")
    if m.ndim != 2 or not np.issubdtype(m.dtype, np.integer):
        raise Error(f"live_routing: mapping must be an integer [P, B] array, got {m.dtype} {list(m.shape)}",
                    "invalid_argument")
    P0 = int(m.shape[0])
    if L < 1:
        raise Error(f"live_routing: home_experts = {L}: expected >= 1", "invalid_argument")
    if isinstance(group, Group):
        rank, size, original_lost, original_ranks = group.rank, group.size, group.original_lost, group.original_ranks
    else:  # the first group (a torch.distributed group; None: the default one): nothing lost yet
        from .group import bootstrap_of
        rank, size, _ = bootstrap_of(group, need_allgather=False)
        original_lost, original_ranks = (), tuple(range(size))
    if len(original_ranks) + len(original_lost) != P0:
        raise Error(f"rank {rank}: live_routing: mapping has {P0} ranks, the first group had "
                    f"{len(original_ranks) + len(original_lost)}", "invalid_argument", rank)
    E = P0 * L
    bad = (idx < -1) | (idx >= E) | ((m < -1) | (m >= E)).any()
    if np.any(bad):
        where = np.argwhere((idx < -1) | (idx >= E))
        what = (f"topk_idx[{where[0][0]}, {where[0][1]}] = {idx[tuple(where[0])]}" if len(where)
                else "a mapping value")
        raise Error(f"rank {rank}: live_routing: {what} is outside [-1, {E})", "invalid_argument", rank)
    return idx, m, L, rank, size, original_lost, original_ranks


def _replica_tables(m, L, original_lost, me, prefer_own_rank):
    """Per logical expert (row E: an empty pair's -1), its live replicas as physical experts of
    the survivors' group, in order (home, then slots by ascending global slot), and their
    count; with prefer_own_rank, those on first-group rank `me` when it holds some, not all."""
    P0, B = int(m.shape[0]), int(m.shape[1])
    E, per = P0 * L, L + B
    lost = np.zeros(P0, dtype=bool)
    lost[list(original_lost)] = True
    new_rank = np.cumsum(~lost) - 1  # first-group rank -> rank of the survivors' group
    replicas = [[(e // L, e % L)] for e in range(E)]
    for d in range(P0):
        for b in range(B):
            if m[d, b] >= 0:
                replicas[int(m[d, b])].append((d, L + b))
    width = max(len(r) for r in replicas)
    table = np.full((E + 1, width), -1, dtype=np.int64)
    own = np.full((E + 1, width), -1, dtype=np.int64)
    count = np.zeros(E + 1, dtype=np.int64)
    own_count = np.zeros(E + 1, dtype=np.int64)
    for e, reps in enumerate(replicas):
        live = [int(new_rank[d]) * per + j for d, j in reps if not lost[d]]
        mine = [int(new_rank[d]) * per + j for d, j in reps if not lost[d] and d == me]
        table[e, :len(live)], count[e] = live, len(live)
        if prefer_own_rank and mine and len(mine) < len(live):
            own[e, :len(mine)], own_count[e] = mine, len(mine)
    return table, count, own, own_count


def _torch_of(a):
    import torch
    return torch.from_numpy(a)


# ---- joins --------------------------------------------------------------------------------

DOOR_KEY = "epx/door"
_door = [None]  # the name of the door this process opened or joined through last


def _default_store(group):
    """The torch.distributed store of the default group, or None (no torch group there)."""
    import sys
    if isinstance(group, Group) or "torch.distributed" not in sys.modules:
        return None
    import torch.distributed as dist
    if not dist.is_initialized():
        return None
    from torch.distributed import distributed_c10d as c10d
    return c10d._get_default_store()


def open_door(group=None, seats=8, store=None, key=DOOR_KEY):
    """Collective over the group's members: opens the job's door (epx::open_door), a
    shared-memory segment that a process started later joins through (join), with `seats`
    seats (the joins it can take over its life). Returns its name, the same on every member;
    rank 0 also puts it in `store` under `key` — store: a torch.distributed Store, None: the
    default group's store when the group is a torch.distributed one (none is used for a
    Group, whose torch group may be broken: pass the store), False: publish nothing. The door
    follows the job: after a rebuild or an admission the same door serves the new group.

    On a UCX group (ranks on several machines) the door is a namespace of the store
    (default: the default group's; a Group keeps the store it was made with) and its name
    "ucx:<namespace>"; joiners pass that store to join.

    Raises epx.Error "unsupported" on a transport other than shm and UCX, "io" if the
    segment cannot be made (on every member alike)."""
    transport, original_ranks, original_lost = _resolve(group)
    if _by_store(transport):
        from . import heal_ucx
        name = heal_ucx.open_door(group, transport, original_ranks, original_lost, seats,
                                  None if store is None else store, key)
        _door[0] = name
        return name
    name = transport.open_door(int(seats))
    _door[0] = name
    if store is None:
        store = _default_store(group)
    if store is not False and store is not None and transport.rank == 0:
        store.set(key, name)
    return name


def close_door(group=None):
    """Local, on every member at the end: closes the job's door (joiners still waiting there
    leave), unlinks its name and unmaps it. Nothing if it is not open in this process."""
    transport, _, _ = _resolve(group)
    if _by_store(transport):
        from . import heal_ucx
        return heal_ucx.close_door(group, transport)
    transport.close_door()


class Joiner:
    """A joiner process request_ranks started: ``pid``; ``result(timeout_secs)`` waits for it
    to end and returns fn's value, None if it was not admitted, or raises its error (an
    epx.Error "peer_failed" naming the signal if it died)."""

    def __init__(self, pid, read_fd):
        self.pid, self._fd, self._done, self._value = pid, read_fd, False, None

    def result(self, timeout_secs=120):
        if not self._done:
            import select
            import time
            data, deadline = b"", time.monotonic() + timeout_secs
            while True:
                left = deadline - time.monotonic()
                ready, _, _ = select.select([self._fd], [], [], max(0.0, left))
                if not ready:
                    os.kill(self.pid, signal.SIGKILL)
                    os.waitpid(self.pid, 0)
                    os.close(self._fd)
                    self._done = True
                    self._value = (False, Error(f"joiner (pid {self.pid}) did not end within {timeout_secs} s: "
                                                "killed", "timeout"))
                    break
                chunk = os.read(self._fd, 1 << 16)
                if not chunk:
                    break
                data += chunk
            if not self._done:
                os.close(self._fd)
                _, status = os.waitpid(self.pid, 0)
                self._done = True
                if data:
                    self._value = pickle.loads(data)
                else:
                    how = (f"killed by {signal.Signals(os.WTERMSIG(status)).name}" if os.WIFSIGNALED(status)
                           else f"exit code {os.WEXITSTATUS(status)}")
                    self._value = (False, Error(f"joiner (pid {self.pid}) died ({how}) without reporting",
                                                "peer_failed"))
        ok, value = self._value
        if not ok:
            raise value
        return value


def request_ranks(group, count, fn=None, *args, door=None, env=None, timeout_secs=60):
    """Local: says that `count` joiners are coming, so that the members' next admit waits
    for them (epx::request_ranks; at most the door's seats over its life), and, with `fn`,
    starts them: `count` processes forked from this one, each joining through the door
    (join(door, timeout_secs=timeout_secs); door: its name, default the one this process
    opened) and, once admitted, running fn(group, *args) on the group it joined. env: extra
    environment variables of the joiners. Returns a Joiner per process (its result), [] without fn.

    The members must call admit at a point they agree on; a joiner not admitted within
    timeout_secs ends with the value None."""
    transport, _, _ = _resolve(group)
    if _by_store(transport):
        if fn is not None:
            raise Error(f"rank {transport.rank}: request_ranks: on a UCX group the joiners are started by the job "
                        "(on any machine: torchrun's next worker, a script) and call epx.heal.join(store=...); "
                        "call request_ranks(group, count) without fn to announce them", "unsupported", transport.rank)
        from . import heal_ucx
        heal_ucx.request_ranks(group, transport, int(count))
        return []
    transport.request_ranks(int(count))
    if fn is None:
        return []
    if door is None:
        door = _door[0]
        if door is None:
            raise Error(f"rank {transport.rank}: request_ranks: no door open in this process (open_door first)",
                        "invalid_argument", transport.rank)
    joiners = []
    for _ in range(int(count)):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the joiner: reports through the pipe and never returns into the caller's code
            os.close(r)
            code = 0
            try:
                for k, v in (env or {}).items():
                    os.environ[str(k)] = str(v)
                try:
                    g = join(door, timeout_secs=timeout_secs)
                    out = (True, None if g is None else fn(g, *args))
                except BaseException as e:  # noqa: BLE001 - every failure goes back to the requester
                    out = (False, e if isinstance(e, Error) else Error(f"joiner: {type(e).__name__}: {e}", "internal"))
                data = pickle.dumps(out)
                while data:
                    data = data[os.write(w, data):]
            except BaseException:  # noqa: BLE001
                code = 1
            finally:
                os._exit(code)
        os.close(w)
        joiners.append(Joiner(pid, r))
    return joiners


def admit(group=None, joiners=1, wait_secs=0, tag=0):
    """Collective over the group's members, at a point they agree on (e.g. the same step):
    up to `joiners` processes knocking at the job's door (open_door) join; every member and
    joiner maps the new group (old ranks keep their numbers, joiners are ranks group.size ..).
    Rank 0 waits at most wait_secs (0: the group's timeout) for the joiners request_ranks
    announced. Returns the new Group (its ``admission``; the old group is retired, as after
    agree_and_rebuild: build new buffers on the new one), or None if nobody was admitted or
    the admission was abandoned because a joiner died or never arrived — the old group and its
    buffers then go on exactly as they were. tag: an int the joiners get (admission["tag"]).

    Raises epx.Error with is_peer_loss if a member is lost meanwhile (agree_and_rebuild on the
    old group then), "unsupported" if the group's door is not open."""
    transport, original_ranks, original_lost = _resolve(group)
    if _by_store(transport):
        from . import heal_ucx
        return heal_ucx.admit(group, transport, original_ranks, original_lost, int(joiners), float(wait_secs),
                              int(tag))
    fresh, how = transport.admit(int(joiners), float(wait_secs), int(tag))
    if fresh is None:
        return None
    roots = tuple(fresh.root_ranks)
    P = how["old_num_ranks"]
    return Group._of(fresh, range(P), (), how["round"], P, tuple(original_ranks) + roots[P:], original_lost, how)


def join(door=None, *, store=None, key=DOOR_KEY, timeout_secs=60):
    """A process outside the group: joins it through its door (epx::join_door) — door: the
    name open_door returned, or None to read it from `store` (a torch.distributed Store, e.g.
    a TCPStore or FileStore over the members' rendezvous) under `key`. A UCX group's door
    ("ucx:<namespace>", members on several machines) is a namespace of that store: pass the
    store the members use (the joiner may run on any machine that reaches it). Waits at most
    timeout_secs to be admitted. Returns the Group it joined (``admission``, ``rank`` =
    admission["new_rank"]), or None if it was not admitted (the door closed, no admission in
    time, or the members abandoned it). Raises epx.Error "invalid_argument" if there is no
    such door or no free seat."""
    from . import _epx
    if door is None:
        if store is None:
            raise Error("join: pass the door's name or the store it was published in", "invalid_argument")
        door = bytes(store.get(key)).decode()
    from . import heal_ucx
    if str(door).startswith(heal_ucx.DOOR_PREFIX):  # a UCX group's door: a namespace of the store
        g, _ = heal_ucx.join(str(door), store, timeout_secs)
        if g is not None:
            _door[0] = str(door)
        return g
    fresh, how = _epx.join_door(str(door), float(timeout_secs))
    if fresh is None:
        return None
    _door[0] = str(door)
    P = how["old_num_ranks"]
    return Group._of(fresh, range(P), (), how["round"], P, tuple(fresh.root_ranks), (), how)


# ---- the replica plan of a group of a new size, and the weights moved to it ------------------

class ReplicaPlan:
    """The lb layer's replica plan (epx/lb.hpp, plan_dynamic_replicas) over a group of `ranks`
    ranks with `home_experts` (L) logical experts each and `slots` (B) redundant slots each:
    rank d holds physical experts d*(L+B) .. d*(L+B)+L+B-1, its L home experts (logical
    d*L + i) then its B slots (``mapping[d]``, -1 unused). Dispatch ``route(rank, topk_idx)``
    with ``num_experts``."""

    def __init__(self, raw):
        self._raw = raw
        self.ranks, self.home_experts, self.slots = raw.ranks, raw.home_experts, raw.slots
        self.mapping = np.asarray(raw.mapping, dtype=np.int64).reshape(self.ranks, self.slots)
        self.num_experts = self.ranks * (self.home_experts + self.slots)
        self.replicas_used = raw.replicas_used  # slots the plan filled, over all ranks
        self.rows_with = list(raw.rows_with)  # rows each rank's experts get through the plan
        self.rows_without = list(raw.rows_without)  # and through its home experts only

    def route(self, rank, topk_idx):
        """Rank `rank`'s logical routing [S, K] (the one its counts came from) as physical
        experts of the plan (int64 numpy)."""
        idx = np.asarray(topk_idx.detach().cpu().numpy() if cv.is_torch(topk_idx) else topk_idx, dtype=np.int64)
        S, K = idx.shape
        return np.asarray(self._raw.route(int(rank), idx.reshape(-1).tolist(), int(K)), dtype=np.int64).reshape(S, K)

    def layout(self):
        """[P, L + B]: the logical expert each rank's physical experts hold (-1: an unused slot)."""
        L = self.home_experts
        homes = np.arange(self.ranks * L, dtype=np.int64).reshape(self.ranks, L)
        return np.concatenate([homes, self.mapping], axis=1)


def plan_replicas(counts, num_ranks, home_experts, slots_per_rank):
    """The replica plan for a group of num_ranks ranks (e.g. the one admit returned) from
    `counts` [num_ranks, num_ranks * home_experts]: the (t, k) pairs each rank routes to each
    logical expert, the same on every rank (local, pure, deterministic)."""
    from . import _epx
    c = np.asarray(counts, dtype=np.int64)
    return ReplicaPlan(_epx.plan_replicas(c.reshape(-1).tolist(), int(num_ranks), int(home_experts),
                                          int(slots_per_rank)))


def place_experts(ep, experts, old_homes, plan):
    """Collective over the group of EPBuffer `ep` (the group of the plan's size): every rank's
    `experts` [L + B, ...] (its physical experts under `plan`: home experts, then slots)
    receive bitwise copies of their logical experts' weights from where they are now —
    `old_homes` [L0, ...], every rank's home experts of the layout before (logical e on rank
    e // L0: the members before an admission keep their ranks; a joiner passes a tensor of that
    shape whose contents are not read) — over lb_prefetch_weights' path (the buffer's own
    dispatch). Unused slots are left alone. Any dtype, several weight kinds as lists."""
    ep.lb_prefetch_weights(experts, old_homes, plan.layout())
