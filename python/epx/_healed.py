"""The group of ranks a heal made (epx.heal.Group: survivors of a lost rank, or a group an
admission grew), apart from heal.py so that the modules below it (group.py) and beside it
(heal_ucx.py) can know it without importing the heal itself."""
from .errors import Error


class Group:
    """An epx group over the survivors of a lost rank (made by agree_and_rebuild).

    rank, size: this rank and the number of ranks of this group.
    survivors, lost: ranks of the group it was rebuilt from (ascending); survivors[i] is rank i.
    round: the survivors' agreement it came from (1, 2, ... on the group it was rebuilt from).
    parent_size: the size of the group it was rebuilt from.
    original_ranks: the first group's rank (the torch.distributed group's, or epx.launch's)
        of each rank of this one; original_lost: the first group's ranks lost so far.
    transport: its epx transport (shared by every buffer built on the group): shm, or UCX
        for a group rebuilt or admitted across machines (a heal_ucx.StoreGroup).
    admission: for a group an admission made (admit, join), a dict of round, old_num_ranks,
        joined (its joiners are ranks old_num_ranks ..), new_rank and tag; else None.
    A joiner's group has original_ranks (the first group's ranks, then the joiners' numbers:
    the first group's size + the door seat each took) but no original_lost (it was not there).
    """
    admission = None

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

    @classmethod
    def _of(cls, transport, survivors, lost, round_, parent_size, original_ranks, original_lost, admission=None):
        g = cls.__new__(cls)
        g.transport = transport
        g.rank, g.size = transport.rank, transport.num_ranks
        g.survivors, g.lost, g.round, g.parent_size = tuple(survivors), tuple(lost), round_, parent_size
        g.original_ranks, g.original_lost = tuple(original_ranks), tuple(original_lost)
        g.admission = admission
        return g

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


def _destroy_quietly(buffer):
    """destroy() of a buffer of a retired group: the first call reports the retirement (and
    marks the buffer destroyed), a second one finishes the Python side."""
    for _ in range(2):
        try:
            buffer.destroy()
            return
        except Error:
            continue
