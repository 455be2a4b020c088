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
rank died): the survivors agree through the old group's shared memory. The returned Group is
accepted by EPBuffer, BucketBuffer (with transport_group=group), PPBuffer and EngramBuffer
wherever they take a group, and can be healed again after a second loss.

Order: the rebuild retires the old group — every later call of a buffer built on it raises
epx.Error("bad_handle") naming the rebuild, never a wait on ranks that moved on — and then
destroys the `buffers` passed (quietly: their destroy would only report the retirement).
A buffer not passed keeps its memory until it is destroyed or dropped.

Redundant experts: live_routing(topk_idx, mapping, home_experts, group) sends each (token, k)
of a logical routing to a live replica of its expert (its home rank's copy or a redundant
slot of EPBuffer.lb_prefetch_weights's mapping) and drops (-1) and counts the pairs whose
expert has none, as epx::map_to_live_replicas does for EPLB plans.

Ranks joining a running group (epx::request_ranks / epx::admit in C++) work for groups of a
C++ epx::launch only; from Python (connect()-ed groups: torch.distributed, epx.launch) a group
can shrink, not grow yet (docs/reliability.md, "Joins").
"""
import numpy as np

from . import _convert as cv
from .errors import Error


class Group:
    """An epx group over the survivors of a lost rank (made by agree_and_rebuild).

    rank, size: this rank and the number of ranks of this group.
    survivors, lost: ranks of the group it was rebuilt from (ascending); survivors[i] is rank i.
    round: the survivors' agreement it came from (1, 2, ... on the group it was rebuilt from).
    parent_size: the size of the group it was rebuilt from.
    original_ranks: the first group's rank (the torch.distributed group's, or epx.launch's)
        of each rank of this one; original_lost: the first group's ranks lost so far.
    transport: its epx transport (shared by every buffer built on the group).
    """

    def __init__(self, transport, membership, parent_original_ranks, parent_original_lost):
        self.transport = transport
        self.rank, self.size = transport.rank, transport.num_ranks
        self.survivors = tuple(membership["survivors"])
        self.lost = tuple(membership["lost"])
        self.round = membership["round"]
        self.parent_size = membership["old_num_ranks"]
        self.original_ranks = tuple(parent_original_ranks[r] for r in self.survivors)
        self.original_lost = tuple(sorted(tuple(parent_original_lost) + tuple(parent_original_ranks[r]
                                                                               for r in self.lost)))

    @property
    def original_size(self):
        """The size of the first group."""
        return len(self.original_ranks) + len(self.original_lost)

    def barrier(self, phase="Group.barrier"):
        """Collective: a barrier over the group (its shared memory)."""
        self.transport.barrier(str(phase))

    def sum(self, values):
        """Collective: the element-wise sum over the group of 1 to 4 ints (e.g. the dropped
        pairs and tokens of live_routing): epx::sum_over_group."""
        return list(self.transport.sum([int(v) for v in values]))

    def __repr__(self):
        return (f"epx.heal.Group(rank={self.rank}, size={self.size}, round={self.round}, survivors={list(self.survivors)}, "
                f"lost={list(self.lost)}, original_ranks={list(self.original_ranks)})")


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


def agree_and_rebuild(group_or_transport=None, buffers=()):
    """Collective over the survivors, after a call on the group raised an epx.Error whose
    ``is_peer_loss`` is True: agree on the live ranks and return a new Group over them.

    group_or_transport: the group the failed call ran on — a torch.distributed group (None:
    the default group; the epx transport its buffers share is rebuilt), a Group this function
    returned (after a second loss), or an _epx.Transport. buffers: the buffers of that group
    to destroy once it is retired (errors there are the retirement's and are ignored).

    Raises epx.Error: "peer_failed" on a rank the others left out (it arrived after they
    decided), "timeout" if the agreement's deciding rank died while deciding, "unsupported"
    on a transport other than shm (OpenSHMEM, UCX: the message names it), "bad_handle" on a
    group that was rebuilt already. A survivor that dies during the rebuild makes the others
    agree again (the next round) and retry, up to the group's size times."""
    transport, original_ranks, original_lost = _resolve(group_or_transport)
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
    return Group(fresh, membership, original_ranks, original_lost)


def _destroy_quietly(buffer):
    """destroy() of a buffer of a retired group: the first call reports the retirement (and
    marks the buffer destroyed), a second one finishes the Python side."""
    for _ in range(2):
        try:
            buffer.destroy()
            return
        except Error:
            continue


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
    idx = np.asarray(topk_idx.detach().cpu().numpy() if cv.is_torch(topk_idx) else topk_idx)
    m = np.asarray(mapping.detach().cpu().numpy() if cv.is_torch(mapping) else mapping)
    L = int(home_experts)
    if idx.ndim != 2 or not np.issubdtype(idx.dtype, np.integer):
        raise Error(f"live_routing: topk_idx must be an integer [S, K] array, got {idx.dtype} {list(idx.shape)}",
                    "invalid_argument")
    if m.ndim != 2 or not np.issubdtype(m.dtype, np.integer):
        raise Error(f"live_routing: mapping must be an integer [P, B] array, got {m.dtype} {list(m.shape)}",
                    "invalid_argument")
    P0, B = int(m.shape[0]), int(m.shape[1])
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
    lost = np.zeros(P0, dtype=bool)
    lost[list(original_lost)] = True
    new_rank = np.cumsum(~lost) - 1  # first-group rank -> rank of the survivors' group
    me = original_ranks[rank]
    per = L + B
    # replicas of each expert in order: home, then the slots by ascending global slot
    replicas = [[(e // L, e % L)] for e in range(E)]
    for d in range(P0):
        for b in range(B):
            if m[d, b] >= 0:
                replicas[int(m[d, b])].append((d, L + b))
    width = max(len(r) for r in replicas)
    table = np.full((E + 1, width), -1, dtype=np.int64)      # row E: the -1 of an empty pair
    own = np.full((E + 1, width), -1, dtype=np.int64)
    count = np.zeros(E + 1, dtype=np.int64)
    own_count = np.zeros(E + 1, dtype=np.int64)
    for e, reps in enumerate(replicas):
        live = [int(new_rank[d]) * per + j for d, j in reps if not lost[d]]
        mine = [int(new_rank[d]) * per + j for d, j in reps if not lost[d] and d == me]
        table[e, :len(live)], count[e] = live, len(live)
        if prefer_own_rank and mine and len(mine) < len(live):
            own[e, :len(mine)], own_count[e] = mine, len(mine)
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
    return result, size * per, int(dropped.sum()), int(dropped.any(axis=1).sum())


def _torch_of(a):
    import torch
    return torch.from_numpy(a)
