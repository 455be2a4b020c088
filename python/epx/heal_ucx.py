"""Losing and adding ranks of a group whose transport is UCX (ranks on several machines): the
agreement, the rebuild and the joins of epx.heal, through the group's torch.distributed store
instead of shared memory (docs/reliability.md, "Elastic" and "Joins").

Used by epx.heal.agree_and_rebuild, open_door, close_door, request_ranks, admit and join
whenever the group's transport is not shm; nothing here is called directly.

Why a store: across machines there is no memory every rank maps, but a torch.distributed
group has a c10d store (a TCPStore that torchrun's agent, or rank 0, or the job's launcher
holds) that outlives a lost rank as long as its host does. Every step below is a few keys
under one namespace per group ("epx/elastic/<torchrun attempt>/world" for the default group, then
"<parent>/r<round>" for a group rebuilt by round `round` of its parent's agreement and
"<parent>/a<n>" for one its n-th admission made); presence is an int64 counter read with
add(key, 0), which never blocks (torch 1.13's stores have no check(), and a timed-out wait
leaves a TCPStore client out of step with its server).

The agreement (round g of a group of P ranks): each survivor writes which ranks its error
named as failed (peer_failed: the endpoint to that peer failed or, on its machine, its
process ended) and sets its bit in an arrival mask. A rank that sees every rank arrived or
named failed — or twice the group's timeout passed since it arrived — claims the decision
(the first add of the claim counter wins) and publishes the arrived ranks as the survivors;
the others adopt it. A rank not in it raises peer_failed ("left out"). The dead are not
waited for once an error named them; a rank neither arriving nor named is waited for up to
twice the timeout (a survivor still waiting, inside the failed call, for a rank that left
it arrives once that wait timed out), then left out.

The rebuild: a new UCX transport over the survivors (ranks renumbered densely in ascending
old rank) whose bootstrap all-gathers run through the store under the new group's
namespace; it is what every buffer built on the returned Group uses (its allocations
exchange their keys there too). A survivor lost during it makes the others' all-gather time
out naming it: they agree again (the next round), naming it failed, and retry.

Joins: the door is a namespace of the store ("<first group's namespace>/door"); rank 0
publishes "ucx:<that namespace>" under epx.heal.DOOR_KEY. A joiner takes a seat (a counter),
knocks, and waits for an invitation; the members' admit (rank 0 decides whom to invite)
builds the new UCX transport over members + joiners (old ranks keep their numbers, joiners
after them) through the store, then every rank of it votes whether its transport stood and
rank 0 publishes the verdict: only if every vote is yes does the new group stand, else every
rank drops it and admit returns None (the old group as it was).

Not as on shm: the old group is not retired (UCX transports have no retirement): a call of
a buffer of the old group after a rebuild fails on the lost peer (peer_failed) or times
out; build every buffer on the returned group. The buffers passed to agree_and_rebuild are
let go of locally (_drop), not destroyed collectively. Group.sum goes through the store.
"""
import atexit
import json
import os
import socket
import time

from .errors import Error
from ._healed import Group

_BITS = 60  # ranks per mask word (an int64 counter each rank adds its bit to once)
_missing = {}  # id(_StoreAllgather) -> ranks a failed all-gather waited for


def handles(transport):
    """True for a transport whose losses and joins go through the store (UCX)."""
    return transport.name == "ucx"


# ---- the store: presence counters, masks, waits ----------------------------------------------

def _count(store, key):
    return int(store.add(key, 0))


def _mask_add(store, key, rank):
    store.add(f"{key}/{rank // _BITS}", 1 << (rank % _BITS))


def _mask_read(store, key, size):
    """The ranks in [0, size) whose bit is set."""
    out = set()
    for w in range((size + _BITS - 1) // _BITS):
        v = _count(store, f"{key}/{w}")
        for b in range(_BITS):
            if v >> b & 1:
                out.add(w * _BITS + b)
    return {r for r in out if r < size}


def _sleep(tries):
    time.sleep(min(0.02, 0.0005 * (1 << min(tries, 6))))


def _wait_mask(store, key, size, deadline):
    """Until every rank of [0, size) set its bit, or the deadline: the ranks missing (empty
    when complete)."""
    tries = 0
    while True:
        missing = sorted(set(range(size)) - _mask_read(store, key, size))
        if not missing or time.monotonic() > deadline:
            return missing
        tries += 1
        _sleep(tries)


def _delete(store, key):
    try:
        store.delete_key(key)
    except (RuntimeError, AttributeError):  # a store without deletion (FileStore): it stays
        pass


def _ranks_text(ranks):
    return "rank " + str(ranks[0]) if len(ranks) == 1 else "ranks " + ", ".join(str(r) for r in ranks)


class _StoreAllgather:
    """The bootstrap all-gather of a UCX transport made here: each call, every rank's bytes
    through `store` under `ns`/<call number>; waits at most `timeout_s` for the others."""

    def __init__(self, store, ns, rank, size, timeout_s):
        self.store, self.ns, self.rank, self.size, self.timeout_s = store, ns, rank, size, timeout_s
        self.seq = 0

    def __call__(self, data):
        self.seq += 1
        base = f"{self.ns}/{self.seq}"
        self.store.set(f"{base}/{self.rank}", bytes(data))
        _mask_add(self.store, f"{base}/in", self.rank)
        missing = _wait_mask(self.store, f"{base}/in", self.size, time.monotonic() + self.timeout_s)
        if missing:
            _missing[id(self)] = missing
            raise Error(f"rank {self.rank}: the store's all-gather {self.seq} of the group '{self.ns}' got nothing "
                        f"from {_ranks_text(missing)} within {self.timeout_s:g} s (lost, or not there yet)",
                        "timeout", missing[0])
        parts = [bytes(self.store.get(f"{base}/{p}")) for p in range(self.size)]
        if self.seq > 1:  # every rank is past the previous call: it read this rank's bytes there
            _delete(self.store, f"{self.ns}/{self.seq - 1}/{self.rank}")
        return b"".join(parts)


def _connect(store, ns, rank, size, timeout_s):
    """Collective over the ranks of the new group: its UCX transport, bootstrapped through
    the store. Raises epx.Error (is_peer_loss) if a rank is missing; `.missing` then names
    the ranks (of the new group) the all-gather waited for."""
    from . import _epx
    boot = _StoreAllgather(store, ns + "/boot", rank, size, timeout_s)
    try:
        return _epx.Transport(rank, size, boot, "ucx", float(timeout_s))
    except Error as e:
        missing = _missing.pop(id(boot), [])
        if not missing:
            raise
        # the all-gather's own words (the binding's wrapping adds the Python traceback)
        err = Error(f"rank {rank}: building the group '{ns}' ({size} ranks) through the store: "
                    f"{_ranks_text(missing)} of it did not arrive within {timeout_s:g} s (lost during the rebuild?)",
                    "timeout", missing[0])
        err.missing = missing
        raise err from e
    finally:
        _missing.pop(id(boot), None)


# ---- what a group's line of descent keeps -----------------------------------------------------

class _Line:
    """A group's place in the store: its namespace, the job's (the first group's: the door
    lives there), the store, and how many agreements, admissions and sums it ran (the same
    on every rank, as they run them in the same order)."""

    def __init__(self, store, ns, root, timeout_s, first_size):
        self.store, self.ns, self.root, self.timeout_s, self.first_size = store, ns, root, timeout_s, first_size
        self.rounds = self.admits = self.sums = 0

    def child(self, ns):
        return _Line(self.store, ns, self.root, self.timeout_s, self.first_size)

    @property
    def door(self):
        return f"{self.root}/door"


_first_lines = {}  # id(transport of a torch.distributed group) -> (transport, _Line)
_open_doors = {}   # door namespace -> the store it is in (doors this process opened or joined through)
# The transports held here go before the interpreter's teardown (with the GIL and torch
# alive), as epx.group's cache does: registered after it, so run before it.
atexit.register(_first_lines.clear)


def _torch_ns(group):
    import torch.distributed as dist
    # a torchrun restart reuses its agent's store: each attempt has its own keys
    job = "epx/elastic/" + os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") + "/"
    if group is None or group is dist.group.WORLD:
        return job + "world"
    try:
        ranks = dist.get_process_group_ranks(group)
    except AttributeError:
        from torch.distributed import distributed_c10d as c10d
        ranks = [c10d._get_global_rank(group, r) for r in range(dist.get_world_size(group))]
    return job + "g" + "-".join(str(r) for r in ranks)


def _line_of(group_or_transport, transport, store, what):
    """The _Line of a StoreGroup, or of the first group (a torch.distributed group's
    transport, or an _epx.Transport): made on first use, with `store` or the default group's."""
    if isinstance(group_or_transport, StoreGroup):
        return group_or_transport._line
    hit = _first_lines.get(id(transport))
    if hit is not None and hit[0] is transport:
        return hit[1]
    if store is None and not isinstance(group_or_transport, Group):
        import sys
        if "torch.distributed" in sys.modules:
            import torch.distributed as dist
            if dist.is_initialized():
                from torch.distributed import distributed_c10d as c10d
                store = c10d._get_default_store()
    if store is None or store is False:
        raise Error(f"rank {transport.rank}: {what}: the group's transport is '{transport.name}', whose losses and "
                    "joins go through a torch.distributed store: pass store= (the job's TCPStore), or call it on "
                    "a torch.distributed group (its store is used)", "invalid_argument", transport.rank)
    from . import _epx
    ns = "epx/elastic/transport" if isinstance(group_or_transport, _epx.Transport) else _torch_ns(group_or_transport)
    line = _Line(store, ns, ns, transport.timeout_s, transport.num_ranks)
    _first_lines[id(transport)] = (transport, line)
    return line


class StoreGroup(Group):
    """An epx.heal.Group whose transport is UCX, agreed and bootstrapped through a store (the
    same attributes; sum goes through the store)."""

    def sum(self, values):
        """Collective: the element-wise sum over the group of 1 to 4 ints, through the store."""
        vals = [int(v) for v in values]
        if not 1 <= len(vals) <= 4:
            raise Error(f"rank {self.rank}: Group.sum takes 1 to 4 values, got {len(vals)}", "invalid_argument",
                        self.rank)
        line = self._line
        line.sums += 1
        base = f"{line.ns}/sum{line.sums}"
        line.store.set(f"{base}/{self.rank}", json.dumps(vals))
        _mask_add(line.store, f"{base}/in", self.rank)
        missing = _wait_mask(line.store, f"{base}/in", self.size, time.monotonic() + line.timeout_s)
        if missing:
            raise Error(f"rank {self.rank}: Group.sum: {_ranks_text(missing)} did not arrive within "
                        f"{line.timeout_s:g} s (through the store)", "timeout", missing[0])
        got = [json.loads(bytes(line.store.get(f"{base}/{p}"))) for p in range(self.size)]
        if any(len(g) != len(vals) for g in got):
            raise Error(f"rank {self.rank}: Group.sum: the ranks passed different numbers of values "
                        f"({[len(g) for g in got]})", "invalid_argument", self.rank)
        if line.sums > 1:
            _delete(line.store, f"{line.ns}/sum{line.sums - 1}/{self.rank}")
        return [sum(g[i] for g in got) for i in range(len(vals))]


def _group(transport, line, survivors, lost, round_, parent_size, original_ranks, original_lost, admission=None):
    g = StoreGroup._of(transport, survivors, lost, round_, parent_size, original_ranks, original_lost, admission)
    g._line = line
    return g


# ---- losing ranks -----------------------------------------------------------------------------

def _named_failed(error, size, me):
    """The ranks an error of a call on the group named as failed (peer_failed with a rank)."""
    if error is None or getattr(error, "code", None) != "peer_failed":
        return set()
    r = getattr(error, "origin_rank", -1)
    return {r} if isinstance(r, int) and 0 <= r < size and r != me else set()


def _agree(line, transport, failed):
    """One round of the agreement: (round, survivors, lost) the same on every survivor."""
    store, P, me = line.store, transport.num_ranks, transport.rank
    line.rounds += 1
    g = line.rounds
    base = f"{line.ns}/agree{g}"
    who = f"rank {me}: agree_and_rebuild (round {g} of the group '{line.ns}', through the store)"
    store.set(f"{base}/rec{me}", json.dumps(sorted(failed)))
    _mask_add(store, f"{base}/here", me)
    # A survivor may still be inside the failed call, waiting for one that left it (UCX has
    # no word that ends a peer's wait when a rank leaves a call): it times out within the
    # timeout of its wait and arrives then. So a rank no error named is waited for twice the
    # timeout before it is left out.
    deadline = time.monotonic() + 2 * line.timeout_s
    records, tries = {}, 0
    while _count(store, f"{base}/decided") == 0:
        here = _mask_read(store, f"{base}/here", P)
        for p in here - set(records):
            records[p] = set(json.loads(bytes(store.get(f"{base}/rec{p}"))))
        named = set().union(*records.values()) if records else set()
        if all(p in here or p in named for p in range(P)) or time.monotonic() > deadline:
            if store.add(f"{base}/claim", 1) == 1:  # this rank decides
                store.set(f"{base}/decision", json.dumps(sorted(here | {me})))
                store.add(f"{base}/decided", 1)
            break
        tries += 1
        _sleep(tries)
    deadline = time.monotonic() + line.timeout_s
    tries = 0
    while _count(store, f"{base}/decided") == 0:
        if time.monotonic() > deadline:
            raise Error(f"{who}: no survivor published the decision within {line.timeout_s:g} s (the deciding rank "
                        "died while deciding?)", "timeout", -1)
        tries += 1
        _sleep(tries)
    survivors = json.loads(bytes(store.get(f"{base}/decision")))
    if me not in survivors:
        raise Error(f"{who}: this rank was left out of the survivors {survivors} (it arrived after the others "
                    "decided without it)", "peer_failed", me)
    return g, survivors, [p for p in range(P) if p not in survivors]


def agree_and_rebuild(group_or_transport, transport, original_ranks, original_lost, buffers, store, error):
    """epx.heal.agree_and_rebuild on a UCX group (see there)."""
    line = _line_of(group_or_transport, transport, store, "agree_and_rebuild")
    failed = _named_failed(error, transport.num_ranks, transport.rank)
    last = None
    for _ in range(max(1, transport.num_ranks)):
        g, survivors, lost = _agree(line, transport, failed)
        new_rank = survivors.index(transport.rank)
        ns = f"{line.ns}/r{g}"
        try:
            fresh = _connect(line.store, ns, new_rank, len(survivors), line.timeout_s)
            break
        except Error as e:
            if not e.is_peer_loss:
                raise
            # a survivor died or stopped during the rebuild: agree again, naming it (and the
            # ranks this round left out, which will not come either)
            last = e
            failed = set(lost) | {survivors[r] for r in getattr(e, "missing", []) if r < len(survivors)}
    else:
        raise last
    for b in buffers:
        _drop(b)
    membership = {"survivors": survivors, "lost": lost, "round": g, "old_num_ranks": transport.num_ranks}
    g_new = StoreGroup(fresh, membership, original_ranks, original_lost)
    g_new._line = line.child(ns)
    return g_new


def _drop(buffer):
    """A buffer of the group that lost a rank, let go of locally: its destroy() is a
    collective round over that group, which a survivor can be left waiting in for a timeout
    (its puts to a dead peer on its own machine are copies that succeed, so it goes on to wait
    for a survivor that failed on the dead one's endpoint before signalling). The C++ buffer
    goes with its last reference instead (its destructor is local); the Python object is
    marked destroyed, so a later call says so."""
    if hasattr(buffer, "_engines"):      # EPBuffer
        buffer._engines, buffer._destroyed = {}, True
    elif hasattr(buffer, "runtime"):     # BucketBuffer
        buffer.runtime = None
    elif hasattr(buffer, "_runtime"):    # PPBuffer, EngramBuffer
        buffer._destroyed = True
    else:
        from ._healed import _destroy_quietly
        _destroy_quietly(buffer)


# ---- joins -------------------------------------------------------------------------------------

DOOR_PREFIX = "ucx:"


def open_door(group, transport, original_ranks, original_lost, seats, store, key):
    """epx.heal.open_door on a UCX group: the door is a namespace of the store (collective:
    every member learns it; rank 0 sets it up and publishes its name under `key`)."""
    if not 1 <= int(seats) <= 64:
        raise Error(f"rank {transport.rank}: open_door: seats = {seats}: expected 1 to 64", "invalid_argument",
                    transport.rank)
    line = _line_of(group, transport, store if store is not False else None, "open_door")
    door = line.door
    name = DOOR_PREFIX + door
    if door in _open_doors:
        return name
    s = line.store
    if transport.rank == 0:
        if _count(s, f"{door}/opened") == 0:
            s.set(f"{door}/seats", str(int(seats)))
            s.set(f"{door}/first", str(len(original_ranks) + len(original_lost)))
            s.add(f"{door}/opened", 1)
        if key is not None and store is not False:
            s.set(key, name)
    transport.barrier("open_door")  # every member returns once the door is set up
    _open_doors[door] = s
    return name


def close_door(group, transport):
    """Local: joiners still waiting at the door leave; this process forgets it."""
    hit = _first_lines.get(id(transport))
    line = group._line if isinstance(group, StoreGroup) else hit[1] if hit and hit[0] is transport else None
    if line is None or line.door not in _open_doors:
        return
    line.store.add(f"{line.door}/closed", 1)
    del _open_doors[line.door]


def request_ranks(group, transport, count):
    """Local: `count` joiners are on their way (started by the caller): admit waits for them."""
    line = _line_of(group, transport, None, "request_ranks")
    if line.door not in _open_doors:
        raise Error(f"rank {transport.rank}: request_ranks: this group's door is not open (epx.heal.open_door)",
                    "unsupported", transport.rank)
    seats = int(bytes(line.store.get(f"{line.door}/seats")))
    if _count(line.store, f"{line.door}/requested") + int(count) > seats:
        raise Error(f"rank {transport.rank}: request_ranks: {count} more joiners exceed the door's {seats} seats",
                    "invalid_argument", transport.rank)
    line.store.add(f"{line.door}/requested", int(count))


def _choose(line, joiners, wait_s):
    """Rank 0: the seats to invite (knocking ones, in order), waiting for the joiners asked for."""
    s, door = line.store, line.door
    invited = _count(s, f"{door}/invited")  # seats below this were invited or passed over before
    want = min(int(joiners), max(0, _count(s, f"{door}/requested") - _count(s, f"{door}/admitted")))
    deadline = time.monotonic() + (wait_s if wait_s > 0 else line.timeout_s)
    tries = 0
    while True:
        taken = _count(s, f"{door}/taken")
        knocking = [seat for seat in range(invited, taken) if _count(s, f"{door}/knocked{seat}") > 0]
        if len(knocking) >= want or time.monotonic() > deadline:
            return knocking[:int(joiners)]
        tries += 1
        _sleep(tries)


def admit(group, transport, original_ranks, original_lost, joiners, wait_s, tag):
    """epx.heal.admit on a UCX group (see there)."""
    line = _line_of(group, transport, None, "admit")
    if line.door not in _open_doors:
        raise Error(f"rank {transport.rank}: admit: this group's door is not open (epx.heal.open_door)",
                    "unsupported", transport.rank)
    s, door, P, me = line.store, line.door, transport.num_ranks, transport.rank
    line.admits += 1
    a = line.admits
    base = f"{line.ns}/admit{a}"
    ns = f"{line.ns}/a{a}"
    if me == 0:
        seats = _choose(line, joiners, wait_s)
        first = int(bytes(s.get(f"{door}/first")))
        plan = {"seats": seats, "tag": int(tag), "ns": ns, "old_num_ranks": P, "round": a,
                "original_ranks": list(original_ranks) + [first + seat for seat in seats],
                "timeout_s": line.timeout_s}
        s.set(f"{base}/plan", json.dumps(plan))
        s.add(f"{base}/planned", 1)
        if seats:
            s.add(f"{door}/invited", max(seats) + 1 - _count(s, f"{door}/invited"))
            s.add(f"{door}/admitted", len(seats))
        for i, seat in enumerate(seats):
            s.set(f"{door}/invite{seat}", json.dumps(dict(plan, new_rank=P + i, base=base)))
            s.add(f"{door}/invitation{seat}", 1)
    else:
        deadline, tries = time.monotonic() + line.timeout_s, 0
        while _count(s, f"{base}/planned") == 0:
            if time.monotonic() > deadline:
                raise Error(f"rank {me}: admit (admission {a} of the group '{line.ns}'): rank 0 published no plan "
                            f"within {line.timeout_s:g} s (lost?)", "timeout", 0)
            tries += 1
            _sleep(tries)
        plan = json.loads(bytes(s.get(f"{base}/plan")))
    J = len(plan["seats"])
    how = {"round": a, "old_num_ranks": P, "joined": J, "new_rank": me, "tag": plan["tag"]}
    if J == 0:
        return None
    fresh = _stand(s, base, plan, me, P + J, line.timeout_s, member=True)
    if fresh is None:
        return None
    g = _group(fresh, line.child(ns), range(P), (), a, P, plan["original_ranks"], original_lost, how)
    return g


def _stand(s, base, plan, rank, size, timeout_s, member):
    """Every rank of the new group: builds its transport, votes, and waits for rank 0's
    verdict; the transport if the group stands, else None. A member raises a peer loss
    when a member's vote never comes."""
    try:
        fresh = _connect(s, plan["ns"], rank, size, timeout_s)
    except Error as e:
        if not e.is_peer_loss:
            raise
        fresh = None
    s.set(f"{base}/vote{rank}", "1" if fresh is not None else "0")
    _mask_add(s, f"{base}/voted", rank)
    P = plan["old_num_ranks"]
    if rank == 0:
        missing = _wait_mask(s, f"{base}/voted", size, time.monotonic() + timeout_s)
        votes = [bytes(s.get(f"{base}/vote{r}")) == b"1" if r not in missing else False for r in range(size)]
        s.set(f"{base}/verdict", "stands" if all(votes) else "abandoned")
        s.add(f"{base}/decided", 1)
        lost_members = [r for r in missing if r < P]
        if lost_members:
            raise Error(f"rank 0: admit: member {_ranks_text(lost_members)} did not vote within {timeout_s:g} s "
                        "(lost during the admission): the admission is abandoned", "timeout", lost_members[0])
    else:
        deadline, tries = time.monotonic() + 2 * timeout_s, 0
        while _count(s, f"{base}/decided") == 0:
            if time.monotonic() > deadline:
                if member:
                    raise Error(f"rank {rank}: admit: rank 0 published no verdict within {2 * timeout_s:g} s (lost?)",
                                "timeout", 0)
                return None
            tries += 1
            _sleep(tries)
    if bytes(s.get(f"{base}/verdict")) != b"stands":
        return None  # dropped: the old group goes on
    return fresh


def join(door_name, store, timeout_s):
    """epx.heal.join through a UCX group's door (its name "ucx:<namespace>" in `store`)."""
    if store is None:
        raise Error(f"join: the door {door_name!r} is a UCX group's: pass store= (the job's store, where the "
                    "members agree)", "invalid_argument")
    door = door_name[len(DOOR_PREFIX):]
    deadline = time.monotonic() + float(timeout_s)
    tries = 0
    while _count(store, f"{door}/opened") == 0:
        if time.monotonic() > deadline:
            raise Error(f"join: no door {door_name!r} in the store (open_door first)", "invalid_argument")
        tries += 1
        _sleep(tries)
    seats = int(bytes(store.get(f"{door}/seats")))
    seat = int(store.add(f"{door}/taken", 1)) - 1
    if seat >= seats:
        raise Error(f"join: the door {door_name!r} has no free seat (its {seats} seats are taken)", "invalid_argument")
    store.set(f"{door}/knock{seat}", json.dumps({"host": socket.gethostname(), "pid": os.getpid()}))
    store.add(f"{door}/knocked{seat}", 1)
    tries = 0
    while _count(store, f"{door}/invitation{seat}") == 0:
        if time.monotonic() > deadline or _count(store, f"{door}/closed") > 0:
            return None, None  # not invited in time, or the door closed
        tries += 1
        _sleep(tries)
    inv = json.loads(bytes(store.get(f"{door}/invite{seat}")))
    size = inv["old_num_ranks"] + len(inv["seats"])
    fresh = _stand(store, inv["base"], inv, inv["new_rank"], size, inv["timeout_s"], member=False)
    if fresh is None:
        return None, None
    _open_doors[door] = store
    P = inv["old_num_ranks"]
    how = {"round": inv["round"], "old_num_ranks": P, "joined": len(inv["seats"]), "new_rank": inv["new_rank"],
           "tag": inv["tag"]}
    root = door[:-len("/door")]
    line = _Line(store, inv["ns"], root, inv["timeout_s"], None)
    return _group(fresh, line, range(P), (), inv["round"], P, inv["original_ranks"], (), how), how
