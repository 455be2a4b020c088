"""A rank of tests/multinode/test_heal_shmem.py, started by oshrun (2 namespace machines x 2
PEs, Open MPI told to let survivors live): heals from Python on the OpenSHMEM transport.

    oshrun ... -x EPX_HS_STORE=10.201.0.1:PORT -x EPX_HS_OUT=DIR python3 heal_shmem_rank.py

Its place in the job comes from Open MPI (OMPI_COMM_WORLD_RANK / _SIZE); torch.distributed
(gloo over a TCPStore that rank 0 holds at EPX_HS_STORE) only bootstraps the first group.

  * stage 0, 4 ranks: EPBuffer and BucketBuffer of the default group on its epx transport
    ("auto": OpenSHMEM, since oshrun started the ranks on two machines); a dispatch / combine
    through the live replicas of a redundant-slot mapping (epx.live_routing against
    epx_cases.hand_mask, then bit for bit against epx_ref) and an all_reduce; at the second
    pair rank VICTIM (machine 1) SIGKILLs itself between its dispatch and its combine,
    once the others are inside their combine (they say so in the store: no race on where
    they are when it dies);
  * the survivors' calls fail with a peer loss (is_peer_loss), epx.agree_and_rebuild agrees
    on who is left and rebuilds the group over the same transport;
  * stage 1, 3 ranks: the routing over the live replicas (the victim's experts through their
    slots, or dropped and counted: Group.sum) bit for bit, an all_reduce against a float32 sum
    over the survivors; then the buffers are destroyed, a barrier, and the interpreter exits
    normally: its exit must end the job (the shmem transport's exit handler: the survivors
    meet and rank 0 ends the job).

Each rank writes JSON lines into EPX_HS_OUT/rank<R>.jsonl (ending with {"exiting": true}).
"""
import datetime
import json
import os
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path[:0] = [os.path.join(REPO, "tests", "python"), os.path.join(REPO, "tests", "e2e")]

P0, L, B, H, K = 4, 2, 2, 128, 3
# Rank d's redundant slots hold logical experts MAPPING[d] (-1 unused); expert e's home is
# rank e // L. Rank 3 (home of 6 and 7) dies: 6 has a replica on rank 0, 7 none (dropped).
MAPPING = [[6, 2], [0, -1], [1, 5], [3, -1]]
TOKENS = [6, 5, 7, 4]
VICTIM, KILL_PAIR, PAIRS = 3, 1, 3
TIMEOUT = int(os.environ.get("EPX_HS_TIMEOUT", "6"))  # the group's timeout, seconds
NVALS = 1000


def values(who, stage, pair):
    """Rank `who`'s all_reduce values: signed powers of two times 1.x (float32)."""
    import numpy as np
    rng = np.random.default_rng(7919 * who + 101 * stage + pair)
    signs = rng.choice([-1.0, 1.0], NVALS)
    return (signs * np.ldexp(1.0 + rng.random(NVALS), rng.integers(-8, 9, NVALS))).astype(np.float32)


class Log:
    def __init__(self, rank):
        self.f = open(os.path.join(os.environ["EPX_HS_OUT"], f"rank{rank}.jsonl"), "a")
        self.rank = rank

    def say(self, **kv):
        self.f.write(json.dumps(dict(kv, who=self.rank, at=round(time.time(), 3))) + "\n")
        self.f.flush()


def all_reduce(bucket, survivors, me, stage, j):
    """An all_reduce of this rank's values against the float32 sum over `survivors` in
    ascending rank, bit for bit (as tests/multinode/test_elastic_ucx.py checks it)."""
    import numpy as np
    v = bucket.storage[:4 * NVALS].view(np.float32) if isinstance(bucket.storage, np.ndarray) else None
    if v is None:
        import torch
        v = bucket.storage[:4 * NVALS].view(torch.float32)
        v[:] = torch.from_numpy(values(me, stage, j))
    else:
        v[:] = values(me, stage, j)
    out = np.asarray(bucket.all_reduce(v).wait())
    want = values(survivors[0], stage, j)
    for r in survivors[1:]:
        want = (want + values(r, stage, j)).astype(np.float32)
    assert np.array_equal(out, want), f"rank {me}: all_reduce of stage {stage} pair {j} differs"


def pair(ep, bucket, group, stage, j, lost, me):
    """A dispatch / combine through the live replicas and an all_reduce, checked bit for bit;
    the group's dropped (token, k) pairs and tokens."""
    import epx_cases
    survivors = [r for r in range(P0) if r not in lost]
    logical = epx_cases.make_case(P0, P0 * L, K, H, TOKENS, seed=1000 * stage + j)
    masks, pairs, tokens = epx_cases.masked_pair(ep, group, logical, lost, me, MAPPING, L, j % 2 == 1)
    dropped = [sum(m[1] for m in masks), sum(m[2] for m in masks)]
    if group is not None:
        assert group.sum([pairs, tokens]) == dropped, f"rank {me}: Group.sum {group.sum([pairs, tokens])} != {dropped}"
    all_reduce(bucket, survivors, me, stage, j)
    return dropped


def buffers(group, num_experts):
    import epx
    ep = epx.EPBuffer(group, num_max_tokens_per_rank=max(TOKENS), hidden=H, num_topk=K, num_experts=num_experts,
                      num_cpu_timeout_secs=TIMEOUT)
    if group is None:
        return ep, epx.BucketBuffer(None, 1 << 16, num_cpu_timeout_secs=TIMEOUT)
    return ep, epx.BucketBuffer(group, 1 << 16, transport_group=group)


def die_before_combine(ep, store):
    """The victim: its next combine waits until every survivor is inside its own combine
    (where they send it rows and wait for its), then SIGKILLs this process. A survivor whose
    combine is still probing the victim's heap (the shmem transport's timed quiet) must see
    the death announced and come to the agreement at once: otherwise it arrives a whole
    timeout after the others, who must still wait for it and not agree without it."""
    def combine(*args, **kwargs):
        deadline = time.monotonic() + 60
        while store.add("test/combining", 0) < P0 - 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGKILL)
    ep.combine = combine


def announce_combine(ep, store):
    """A survivor: its next combine says so in the store first."""
    real = ep.combine

    def combine(*args, **kwargs):
        ep.combine = real
        store.add("test/combining", 1)
        return real(*args, **kwargs)
    ep.combine = combine


def stage0(ep, bucket, rank, store, log):
    """Stage 0's pairs until the loss; the loss's error."""
    import epx
    completed = 0
    try:
        for j in range(PAIRS):
            if j == KILL_PAIR:
                (die_before_combine if rank == VICTIM else announce_combine)(ep, store)
            pair(ep, bucket, None, 0, j, [], rank)
            log.say(stage=0, pair=j, ok=True)
            completed += 1
    except epx.Error as e:
        assert e.is_peer_loss, f"rank {rank}: not a peer loss: {e.code}: {e}"
        assert completed == KILL_PAIR, f"rank {rank}: failed after {completed} pairs: {e}"
        log.say(loss=e.code, origin=e.origin_rank, message=str(e))
        return e
    raise AssertionError(f"rank {rank}: every pair of stage 0 completed: the death of rank {VICTIM} went unnoticed")


def main():
    import torch.distributed as dist
    rank, size = int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"])
    assert size == P0, f"rank {rank}: started as one of {size} ranks, the test needs {P0}"
    log = Log(rank)
    host, port = os.environ["EPX_HS_STORE"].rsplit(":", 1)
    store = dist.TCPStore(host, int(port), world_size=P0, is_master=rank == 0, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=P0, timeout=datetime.timedelta(seconds=60))
    import epx
    ep, bucket = buffers(None, P0 * (L + B))
    kind = epx.group.transport_of(None, "auto", TIMEOUT).name
    log.say(transport=kind, pid=os.getpid())
    assert kind == "shmem", f"rank {rank}: the group's transport is {kind}, not shmem"
    stage0(ep, bucket, rank, store, log)
    t0 = time.monotonic()
    group = epx.agree_and_rebuild(None, buffers=[ep, bucket])
    log.say(rebuilt=round(time.monotonic() - t0, 2), rank=group.rank, size=group.size, survivors=list(group.survivors),
            lost=list(group.lost), original_lost=list(group.original_lost), original_ranks=list(group.original_ranks),
            round=group.round)
    assert not ep._is_live() and not bucket._is_live(), f"rank {rank}: agree_and_rebuild left a buffer of the old group"
    # The new buffers are built while the old Python objects still exist: on OpenSHMEM their
    # windows reuse the blocks the old ones gave back, which agree_and_rebuild's destroy
    # (storage views dropped) made free.
    ep, bucket = buffers(group, group.size * (L + B))
    kind = epx.group.transport_of(group).name
    assert kind == "shmem", f"rank {rank}: the rebuilt group's transport is {kind}"
    for j in range(2):
        dropped = pair(ep, bucket, group, 1, j, [VICTIM], rank)
        log.say(stage=1, pair=j, ok=True, dropped=dropped)
    ep.destroy()
    bucket.destroy()
    group.barrier("the end")
    log.say(exiting=True)
    # a normal interpreter exit (atexit, torch's and numpy's teardown, then exit()): the
    # shmem transport's exit handler ends the job


if __name__ == "__main__":
    main()
