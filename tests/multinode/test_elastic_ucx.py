# Losing and replacing a rank of a group whose transport is UCX, across two network-namespace
# "machines" (tests/multinode/machines.py through torchrun.py's Cluster), 2 x 2 ranks of one
# torch.distributed group (gloo over a TCPStore that machine 0's agent holds, as torchrun's
# agent would); every rank's EPBuffer and BucketBuffer share the group's epx transport, UCX
# between the machines (docs/reliability.md, "Elastic" and "Joins"):
#   * stage 0, 4 ranks: dispatch / combine through the replicas of a redundant-slot mapping
#     (epx.live_routing) and an all_reduce, bit for bit; at the second pair rank 3 (machine 1)
#     SIGKILLs itself inside the dispatch, where it waits for the others' rows (they send them
#     once its agent saw it dead);
#   * the 3 survivors get a peer loss naming rank 3, epx.agree_and_rebuild agrees through the
#     store and rebuilds both buffers' transport (UCX, bootstrapped through the store);
#   * stage 1, 3 ranks: the routing over the live replicas (rank 3's experts through their
#     slots, or dropped and counted: Group.sum) bit for bit against epx_ref, all_reduce
#     against a float32 sum over the survivors;
#   * machine 1's agent starts a replacement, which joins through the store (epx.heal.join);
#     the members admit it (rank 0 announced it: request_ranks); stage 2, 4 ranks: dispatch /
#     combine and all_reduce bit for bit again, on the grown group; then the replica plan is
#     recomputed for the 4 and every rank's experts (the replacement's too, across the
#     machines) receive their weights (epx.heal.plan_replicas / place_experts), checked bit
#     for bit, and a dispatch / combine through the plan's routing.
# Nothing is left in either machine's /dev/shm, no namespace or process is left. A second test,
# on this machine alone (no root needed), heals a rebuilt group again and abandons an
# admission whose joiner died.
#
#   /usr/bin/python3 -m pytest -q tests/multinode/test_elastic_ucx.py       (root; ~1-2 min)
#
# The epx package comes from build/python, or from EPX_TORCHRUN_PYTHONPATH (another build
# directory's python/), as in test_torchrun.py; it needs a build with the join and replica-plan
# bindings (_epx.plan_replicas).
#
# The same file is the agents' and ranks' program (python3 test_elastic_ucx.py agent|rank|joiner).
import datetime
import json
import os
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
PYTHON = "/usr/bin/python3"
PORT = 29517          # the store, on machine 0 (10.201.0.1): ports are per network namespace
P0, L, B, H, K = 4, 2, 2, 128, 3
# Rank d's redundant slots hold logical experts MAPPING[d] (-1 unused); expert e's home is
# rank e // L. Rank 3 (home of 6 and 7) dies: 6 has a replica on rank 0, 7 none (dropped).
MAPPING = [[6, 2], [0, -1], [1, 5], [3, -1]]
TOKENS = [6, 5, 7, 4]
VICTIM, KILL_PAIR, PAIRS = 3, 1, 3
TIMEOUT = 12          # the epx group's timeout, seconds
NVALS = 1000


# ---- the references (written apart from epx) ------------------------------------------------

def values(who, stage, pair):
    import numpy as np
    rng = np.random.default_rng(7919 * who + 101 * stage + pair)
    signs = rng.choice([-1.0, 1.0], NVALS)
    return (signs * np.ldexp(1.0 + rng.random(NVALS), rng.integers(-8, 9, NVALS))).astype(np.float32)


# ---- a rank ---------------------------------------------------------------------------------

def _paths():
    sys.path[:0] = [os.path.join(REPO, "tests", "python"), os.path.join(REPO, "tests", "e2e")]


def _store():
    import torch.distributed as dist
    return dist.TCPStore("10.201.0.1", PORT, is_master=False, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=120))


def _say(who, **kv):
    print(json.dumps(dict(kv, who=who)), flush=True)


def _all_reduce(bucket, group_ranks, me, stage, j):
    """An all_reduce of this rank's values, against the float32 sum over `group_ranks` (each
    rank's values are its number in the first group's, or the joiner's own)."""
    import numpy as np
    import torch
    s = bucket.storage
    v = s[:4 * NVALS].view(np.float32) if isinstance(s, np.ndarray) else s[:4 * NVALS].view(torch.float32)
    v[:] = values(me, stage, j) if isinstance(v, np.ndarray) else torch.from_numpy(values(me, stage, j))
    out = np.asarray(bucket.all_reduce(v).wait())
    want = values(group_ranks[0], stage, j)
    for r in group_ranks[1:]:
        want = (want + values(r, stage, j)).astype(np.float32)
    assert np.array_equal(out, want), f"rank {me}: all_reduce of stage {stage} pair {j} differs"


def masked_pair(ep, bucket, group, stage, j, lost, orig):
    """Stage 0 / 1: a dispatch / combine through the live replicas and an all_reduce, checked
    bit for bit; the dropped (token, k) pairs of the group."""
    import epx_cases
    survivors = [r for r in range(P0) if r not in lost]
    logical = epx_cases.make_case(P0, P0 * L, K, H, TOKENS, seed=1000 * stage + j)
    masks, pairs, tokens = epx_cases.masked_pair(ep, group, logical, lost, orig, MAPPING, L, j % 2 == 1)
    dropped = [sum(m[1] for m in masks), sum(m[2] for m in masks)]
    if group is not None:  # the group's totals, through the store
        assert group.sum([pairs, tokens]) == dropped, f"rank {orig}: Group.sum"
    _all_reduce(bucket, survivors, orig, stage, j)
    return dropped


def grown_pair(ep, bucket, group, j, mine):
    """Stage 2, the grown group of 4: the plain routing over its 4 * L experts and an
    all_reduce, bit for bit (`mine`: this rank's values' number)."""
    from epx_cases import checked_pair
    checked_pair(ep, group.size, group.rank, L, K, H, TOKENS, 3000 + j, j % 2 == 1)
    _all_reduce(bucket, list(group.original_ranks), mine, 2, j)


# The plan and the weights after the admission (as tests/python/test_elastic_join_eplb.py on
# shm): 12 logical experts, 4 at home on each of the 3 members before (logical e on member
# e // 4), replanned for the 4 ranks (3 home experts and 2 redundant slots each) from a
# batch's routing; every rank's physical experts — the joiner's, on the other machine,
# included — receive their weights over the buffer's dispatch.
E_PLAN, L_OLD, L_NEW, B_NEW = 12, 4, 3, 2


def weights(e):
    """Logical expert e's two weight kinds, written apart from epx."""
    import numpy as np
    rng = np.random.default_rng([e, 77])
    return rng.standard_normal((5, 7)).astype(np.float32), rng.integers(-30000, 30000, 3).astype(np.int16)


def planned(group):
    """Every rank of the grown group: the plan, the weights placed and checked bit for bit,
    and a dispatch / combine through the plan's routing against epx_ref. The layout."""
    import epx
    import epx.heal as heal
    import epx_ref
    import numpy as np
    import torch
    from epx_cases import check_dispatch, expert_y, inputs, make_case, same
    me, n = group.rank, group.size
    case = make_case(n, E_PLAN, K, H, TOKENS, seed=4242)
    counts = np.zeros((n, E_PLAN), np.int64)
    for d in range(n):
        np.add.at(counts[d], case.topk_idx[d][case.topk_idx[d] >= 0], 1)
    plan = heal.plan_replicas(counts, n, L_NEW, B_NEW)
    ep = epx.EPBuffer(group, num_max_tokens_per_rank=max(TOKENS), hidden=H, num_topk=K,
                      num_experts=plan.num_experts, num_cpu_timeout_secs=TIMEOUT)
    if me < n - 1:  # a member: its home experts of the layout before
        ws = [weights(me * L_OLD + i) for i in range(L_OLD)]
        old = [np.stack([w[0] for w in ws]), np.stack([w[1] for w in ws])]
    else:  # the joiner held none: the contents are not read
        old = [np.zeros((L_OLD, 5, 7), np.float32), np.zeros((L_OLD, 3), np.int16)]
    mine = [np.zeros((L_NEW + B_NEW, 5, 7), np.float32), np.zeros((L_NEW + B_NEW, 3), np.int16)]
    heal.place_experts(ep, mine, old, plan)
    layout = plan.layout()
    assert (layout[:, L_NEW:] >= 0).any(), "the plan placed no replica: nothing checks the slots"
    for j, e in enumerate(layout[me]):
        want = weights(int(e)) if e >= 0 else (np.zeros((5, 7), np.float32), np.zeros(3, np.int16))
        assert mine[0][j].tobytes() == want[0].tobytes(), f"rank {me}: physical expert {j} (w1)"
        assert mine[1][j].tobytes() == want[1].tobytes(), f"rank {me}: physical expert {j} (w2)"
    routed = [plan.route(d, case.topk_idx[d]) for d in range(n)]
    physical = epx_ref.Case({"num_ranks": n, "num_experts": plan.num_experts, "hidden": H, "num_topk": K},
                            routed, case.topk_weights, x=case.x)
    res = epx_ref.compute(physical, layout="compact", alignment=1, deterministic=True, zero_padding=True)
    x, _, w = inputs(case, me, "torch")
    out = ep.dispatch(x, torch.from_numpy(routed[me].copy()), w, deterministic=True, do_zero_padding=True)
    check_dispatch(physical, res, me, out[:4], False, False)
    y = expert_y(physical, out[0], out[1], out[3], False)
    combined, _, _ = ep.combine(y, out[3])
    same("combined_x", combined, res.ranks[me]["combined_x"], me)
    ep.destroy()
    return [int(v) for v in layout.reshape(-1)]


def _buffers(group, num_experts):
    import epx
    ep = epx.EPBuffer(group, num_max_tokens_per_rank=max(TOKENS), hidden=H, num_topk=K, num_experts=num_experts,
                      num_cpu_timeout_secs=TIMEOUT)
    if group is None:
        return ep, epx.BucketBuffer(None, 1 << 16, num_cpu_timeout_secs=TIMEOUT)
    return ep, epx.BucketBuffer(group, 1 << 16, transport_group=group)


def _stage2(group, store, who, mine):
    import epx
    import epx.heal as heal
    ep, bucket = _buffers(group, group.size * L)
    assert epx.group.transport_of(group).name == "ucx"
    for j in range(2):
        grown_pair(ep, bucket, group, j, mine)
        _say(who, stage=2, pair=j, ok=True, rank=group.rank, size=group.size)
    ep.destroy()
    bucket.destroy()
    _say(who, layout=planned(group))
    group.barrier("the end")
    heal.close_door(group)
    _finish(store, who)


def _finish(store, who):
    """Every rank past the last barrier before any leaves (its last signals are in), then out
    without torch's teardown (the torch group lost a rank)."""
    store.add("test/done", 1)
    deadline = time.monotonic() + 60
    while store.add("test/done", 0) < P0 and time.monotonic() < deadline:
        time.sleep(0.05)
    _say(who, done=True)
    sys.stdout.flush()
    os._exit(0)


def rank_main(rank):
    _paths()
    import torch.distributed as dist
    import epx
    import epx.heal as heal
    who = f"rank {rank}"
    store = _store()
    dist.init_process_group("gloo", store=dist.PrefixStore("pg", store), rank=rank, world_size=P0,
                            timeout=datetime.timedelta(seconds=60))
    ep, bucket = _buffers(None, P0 * (L + B))
    assert epx.group.transport_of(None, "auto", TIMEOUT).name == "ucx", "the group's transport is not UCX"
    door = heal.open_door(None, seats=2, store=store)
    _say(who, door=door, transport="ucx")
    group, lost, completed = None, [], 0
    try:
        for j in range(PAIRS):
            if j == KILL_PAIR:
                if rank == VICTIM:  # dies inside the dispatch, where it waits for the others' rows
                    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGKILL)).start()
                else:  # which they send once its agent saw it dead: no race on where it dies
                    deadline = time.monotonic() + 60
                    while store.add("test/dead", 0) == 0 and time.monotonic() < deadline:
                        time.sleep(0.01)
            masked_pair(ep, bucket, None, 0, j, lost, rank)
            _say(who, stage=0, pair=j, ok=True)
            completed += 1
        raise AssertionError(f"rank {rank}: every pair of stage 0 completed: the death of rank {VICTIM} went unnoticed")
    except epx.Error as e:
        assert e.is_peer_loss, f"rank {rank}: not a peer loss: {e.code}: {e}"
        assert completed == KILL_PAIR, f"rank {rank}: failed after {completed} pairs: {e}"
        _say(who, loss=e.code, origin=e.origin_rank, message=str(e))
        t0 = time.monotonic()
        group = epx.agree_and_rebuild(None, buffers=[ep, bucket], store=store)
        _say(who, rebuilt=round(time.monotonic() - t0, 2), rank=group.rank, size=group.size,
             survivors=list(group.survivors), lost=list(group.lost), original_lost=list(group.original_lost),
             original_ranks=list(group.original_ranks), round=group.round)
    assert not ep._is_live() and not bucket._is_live()  # destroyed by agree_and_rebuild (buffers=)
    lost = [VICTIM]
    ep, bucket = _buffers(group, group.size * (L + B))
    assert epx.group.transport_of(group).name == "ucx"
    for j in range(2):
        dropped = masked_pair(ep, bucket, group, 1, j, lost, rank)
        _say(who, stage=1, pair=j, ok=True, dropped=dropped)
    if group.rank == 0:
        heal.request_ranks(group, 1)  # the replacement is on its way: admit waits for it
    bigger = heal.admit(group, joiners=1, tag=2)
    assert bigger is not None, f"rank {rank}: the replacement was not admitted"
    _say(who, admitted=True, rank=bigger.rank, size=bigger.size, original_ranks=list(bigger.original_ranks),
         admission=bigger.admission)
    heal._destroy_quietly(ep)
    heal._destroy_quietly(bucket)
    _stage2(bigger, store, who, rank)


def joiner_main():
    _paths()
    import epx.heal as heal
    who = "joiner"
    store = _store()
    t0 = time.monotonic()
    group = heal.join(store=store, timeout_secs=120)
    assert group is not None, "the joiner was not admitted"
    _say(who, joined=round(time.monotonic() - t0, 2), rank=group.rank, size=group.size,
         original_ranks=list(group.original_ranks), admission=group.admission)
    _stage2(group, store, who, P0)  # its values: the first group's size + its seat (0)


# ---- a machine's agent (as torchrun's: starts the ranks, holds the store on machine 0) ------

def agent_main(machine, out_dir, timeout):
    import torch.distributed as dist
    server = None
    if machine == 0:  # the job's store outlives every rank (a killed one included)
        server = dist.TCPStore("10.201.0.1", PORT, is_master=True, wait_for_workers=False,
                               timeout=datetime.timedelta(seconds=timeout))
    store = _store()

    def start(role, *args):
        name = f"{role}{''.join(str(a) for a in args)}"
        out = open(os.path.join(out_dir, name + ".out"), "w")
        err = open(os.path.join(out_dir, name + ".err"), "w")
        return name, subprocess.Popen([PYTHON, "-u", os.path.abspath(__file__), role] + [str(a) for a in args],
                                      stdout=out, stderr=err)

    procs = dict(start("rank", r) for r in (2 * machine, 2 * machine + 1))
    deadline = time.monotonic() + timeout
    codes = {}
    replaced = machine != 1
    while time.monotonic() < deadline and (len(codes) < len(procs) or not replaced):
        for name, p in list(procs.items()):
            if name not in codes and p.poll() is not None:
                codes[name] = p.returncode
                if name == f"rank{VICTIM}":
                    store.add("test/dead", 1)
                    name_j, pj = start("joiner")  # the replacement: started once the victim is gone
                    procs[name_j] = pj
                    replaced = True
        time.sleep(0.05)
    for name, p in procs.items():
        if p.poll() is None:
            p.kill()
            p.wait()
            codes.setdefault(name, "killed by the agent")
    if server is not None:  # machine 1's ranks may still read the store: until all said done
        while store.add("test/done", 0) < P0 and time.monotonic() < deadline:
            time.sleep(0.1)
    with open(os.path.join(out_dir, f"agent{machine}.json"), "w") as f:
        json.dump(codes, f)
    return 0


# ---- the test ---------------------------------------------------------------------------------

def test_ucx_group_loses_a_rank_on_the_other_machine_and_takes_a_replacement():
    sys.path.insert(0, HERE)
    import machines
    import torchrun
    assert torchrun.available() is None, torchrun.available()
    timeout = 240
    env = dict(os.environ)
    env["PYTHONPATH"] = os.environ.get("EPX_TORCHRUN_PYTHONPATH") or os.path.join(REPO, "build", "python")
    env["PYTHONUNBUFFERED"] = "1"
    with torchrun.Cluster(2) as c:
        out_dir = os.path.join(c.dir, "out")
        os.makedirs(out_dir)
        agents = []
        for i in range(2):
            log = open(os.path.join(out_dir, f"agent{i}.txt"), "w")
            argv = [PYTHON, "-u", os.path.abspath(__file__), "agent", str(i), out_dir, str(timeout - 30)]
            agents.append(subprocess.Popen(c.wrap(i, argv, timeout, os.path.join(out_dir, f"shm{i}.txt")),
                                           stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True))
        rcs = []
        for a in agents:
            try:
                rcs.append(a.wait(timeout=timeout + 30))
            except subprocess.TimeoutExpired:
                os.killpg(a.pid, signal.SIGKILL)
                rcs.append(a.wait())
        names = ["rank0", "rank1", "rank2", "rank3", "joiner"]
        outs = {n: machines.json_lines(os.path.join(out_dir, n + ".out")) for n in names}
        text = "\n".join(f"== {n} stdout:\n{machines.read_text(os.path.join(out_dir, n + '.out'))[-4000:]}\n== {n} stderr:\n"
                         f"{machines.read_text(os.path.join(out_dir, n + '.err'))[-4000:]}" for n in names)
        text += "".join(f"\n== agent {i}: rc {rcs[i]}\n{machines.read_text(os.path.join(out_dir, f'agent{i}.txt'))[-3000:]}"
                        f"\ncodes {machines.read_text(os.path.join(out_dir, f'agent{i}.json'))}" for i in range(2))
        shm = [machines.read_text(os.path.join(out_dir, f"shm{i}.txt")).split() for i in range(2)]
        codes = {}
        for i in range(2):
            try:
                with open(os.path.join(out_dir, f"agent{i}.json")) as f:
                    codes.update(json.load(f))
            except (OSError, ValueError):
                pass
    netns = torchrun.machines.sh("ip", "netns", "list").stdout.split()
    assert not [ns for ns in c.names if ns in netns], "namespaces left"
    assert not os.path.exists(c.dir), "the run's directory left"
    assert rcs == [0, 0], text
    assert codes == {"rank0": 0, "rank1": 0, "rank2": 0, "rank3": -signal.SIGKILL, "joiner": 0}, text
    assert shm == [[], []], f"left in the machines' /dev/shm: {shm}\n{text}"

    def find(n, key):
        return [d for d in outs[n] if key in d]

    # the victim: stage 0's first pair only, then killed inside the second pair's dispatch
    assert [(d["stage"], d["pair"]) for d in find("rank3", "stage")] == [(0, 0)], text
    total = {}
    for r in range(3):
        n = f"rank{r}"
        assert find(n, "door") and find(n, "door")[0]["door"].startswith("ucx:"), text
        assert [(d["stage"], d["pair"]) for d in find(n, "stage")] == [(0, 0), (1, 0), (1, 1), (2, 0), (2, 1)], text
        loss = find(n, "loss")
        assert len(loss) == 1, text
        # the error names the lost peer — or, for a survivor that waited inside the call for
        # another survivor that had left it on the loss, that survivor (a timeout)
        if loss[0]["loss"] == "peer_failed":
            assert loss[0]["origin"] == VICTIM and "rank 3 " in loss[0]["message"], text
        else:
            assert loss[0]["loss"] == "timeout" and loss[0]["origin"] in (0, 1, 2), text
            assert f"rank {loss[0]['origin']} " in loss[0]["message"], text
    assert sum(find(f"rank{r}", "loss")[0]["loss"] == "peer_failed" for r in range(3)) >= 1, text
    for r in range(3):
        n = f"rank{r}"
        rb = find(n, "rebuilt")[0]
        assert (rb["rank"], rb["size"], rb["survivors"], rb["lost"], rb["original_lost"], rb["original_ranks"],
                rb["round"]) == (r, 3, [0, 1, 2], [3], [3], [0, 1, 2], 1), text
        # rank 3 was named dead by the errors and not waited for (that is 2 x TIMEOUT); a survivor
        # may have waited for another one inside the failed call, at most TIMEOUT
        assert rb["rebuilt"] < 1.5 * TIMEOUT, f"rank {r}: the agreement took {rb['rebuilt']} s\n{text}"
        total[r] = [d["dropped"] for d in find(n, "stage") if d["stage"] == 1]
        ad = find(n, "admitted")[0]
        assert (ad["rank"], ad["size"], ad["original_ranks"]) == (r, 4, [0, 1, 2, 4]), text
        assert (ad["admission"]["joined"], ad["admission"]["old_num_ranks"], ad["admission"]["tag"]) == (1, 3, 2), text
        assert find(n, "done"), text
    # expert 7 (rank 3's) has no replica: its pairs were dropped and counted the same on every survivor
    assert total[0] == total[1] == total[2] and all(t[0] > 0 for t in total[0]), (total, text)
    j = find("joiner", "joined")
    assert j and (j[0]["rank"], j[0]["size"], j[0]["original_ranks"]) == (3, 4, [0, 1, 2, 4]), text
    assert j[0]["admission"]["tag"] == 2 and j[0]["admission"]["new_rank"] == 3, text
    assert [(d["stage"], d["pair"]) for d in find("joiner", "stage")] == [(2, 0), (2, 1)], text
    assert find("joiner", "done"), text
    losses = [(find(f"rank{r}", "loss")[0]["loss"], find(f"rank{r}", "loss")[0]["origin"]) for r in range(3)]
    print(f"losses: {losses}; "
          f"agreement + rebuild (s): {[find(f'rank{r}', 'rebuilt')[0]['rebuilt'] for r in range(3)]}; "
          f"joiner admitted after {j[0]['joined']} s")
    # the same plan on every rank of the grown group, its weights checked on each (planned())
    layouts = [find(n, "layout") for n in ("rank0", "rank1", "rank2", "joiner")]
    assert all(lay and lay[0]["layout"] == layouts[0][0]["layout"] for lay in layouts), text


# ---- on one machine (no namespaces): a loss during the rebuild, a joiner dying, a loss after a join
# The same calls on a UCX group of 4 processes of this machine (transport="ucx"), a TCPStore
# held by the test: rank 3 dies inside a dispatch and rank 2 in the rebuild that follows (the
# others' all-gather times out naming it: they agree again and go on as 2); a joiner dies once
# invited (its transport never stands): admit returns None on both members, whose group and
# buffers go on as they were; a second joiner is admitted (2 -> 3); then rank 1 dies inside a
# dispatch and rank 0 and the joiner rebuild the admitted group. Every pair bit for bit
# against epx_ref.

LOCAL_TIMEOUT = 6


def _local_store(port, master=False):
    import torch.distributed as dist
    return dist.TCPStore("127.0.0.1", port, is_master=master, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=60))


def _local_buffers(group, n):
    import epx
    kind = {"transport": "ucx"} if group is None else {}
    ep = epx.EPBuffer(group, num_max_tokens_per_rank=max(TOKENS), hidden=H, num_topk=K, num_experts=n * L,
                      num_cpu_timeout_secs=LOCAL_TIMEOUT, **kind)
    if group is None:
        return ep, epx.BucketBuffer(None, 1 << 16, num_cpu_timeout_secs=LOCAL_TIMEOUT, **kind)
    return ep, epx.BucketBuffer(group, 1 << 16, transport_group=group)


def _local_pair(ep, bucket, ranks, me, stage, j):
    """A dispatch / combine over the group `ranks` (plain routing over its len * L experts)
    and an all_reduce of each rank's values, bit for bit."""
    import epx_ref
    from epx_cases import check_dispatch, expert_y, inputs, make_case, same
    n, i = len(ranks), ranks.index(me)
    case = make_case(n, n * L, K, H, TOKENS[:n], seed=5000 + 10 * stage + j)
    x, idx, w = inputs(case, i, "torch")
    res = epx_ref.compute(case, layout="compact", alignment=1, deterministic=True, zero_padding=True)
    out = ep.dispatch(x, idx, w, deterministic=True, do_zero_padding=True)
    check_dispatch(case, res, i, out[:4], False, False)
    y = expert_y(case, out[0], out[1], out[3], False)
    combined, _, _ = ep.combine(y, out[3])
    same("combined_x", combined, res.ranks[i]["combined_x"], me)
    _all_reduce(bucket, list(ranks), me, stage, j)


def _die_in_rebuild():
    """This rank dies once the agreement included it, before the new group's transport stands."""
    import epx.heal_ucx as heal_ucx
    heal_ucx._connect = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)


def _last_stage(group, ep, bucket, ranks, me, pid_dir, store):
    """On the admitted group [0, 1, 5]: rank 1 dies inside a dispatch; rank 0 and the joiner
    rebuild the admitted group and go on. The log of this rank's pairs."""
    import epx
    from epx_cases import wait_until_dead
    log = []
    try:
        for j in range(2):
            if j == 1:
                if me == 1:
                    threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGKILL)).start()
                else:
                    wait_until_dead(pid_dir, 1)
            _local_pair(ep, bucket, ranks, me, 4, j)
            log.append((4, j))
        raise AssertionError(f"rank {me}: the death of rank 1 went unnoticed")
    except epx.Error as e:
        assert e.is_peer_loss, f"rank {me}: {e.code}: {e}"
        smaller = epx.agree_and_rebuild(group, buffers=[ep, bucket], store=store)
    ranks = [r for r in ranks if r != 1]
    assert (smaller.size, smaller.lost, list(smaller.original_ranks)) == (2, (1,), ranks), smaller
    ep, bucket = _local_buffers(smaller, 2)
    _local_pair(ep, bucket, ranks, me, 5, 0)
    log.append((5, 0))
    ep.destroy()
    bucket.destroy()
    smaller.barrier("the end")
    import epx.heal as heal
    heal.close_door(smaller)
    return log


def _local_member(rank, port, pid_dir):
    import torch.distributed as dist
    import epx
    import epx.heal as heal
    from epx_cases import wait_until_dead
    with open(os.path.join(pid_dir, f"pid{rank}"), "w") as f:
        f.write(str(os.getpid()))
    store = _local_store(port)
    dist.init_process_group("gloo", store=dist.PrefixStore("pg", store), rank=rank, world_size=P0,
                            timeout=datetime.timedelta(seconds=60))
    ep, bucket = _local_buffers(None, P0)
    assert epx.group.transport_of(None, "ucx", LOCAL_TIMEOUT).name == "ucx"
    heal.open_door(None, seats=4, store=store)
    ranks, log = [0, 1, 2, 3], []
    # rank 3 dies inside a dispatch; rank 2 dies in the rebuild that follows: the others'
    # all-gather times out naming it, they agree again (round 2, without waiting for it)
    try:
        for j in range(2):
            if j == 1:
                if rank == 3:  # dies inside the dispatch, where it waits for the others' rows
                    threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGKILL)).start()
                else:
                    wait_until_dead(pid_dir, 3)
            _local_pair(ep, bucket, ranks, rank, 0, j)
            log.append((0, j))
        raise AssertionError(f"rank {rank}: the death of rank 3 went unnoticed")
    except epx.Error as e:
        assert e.is_peer_loss, f"rank {rank}: {e.code}: {e}"
        if rank == 2:
            _die_in_rebuild()
        t0 = time.monotonic()
        group = epx.agree_and_rebuild(None, buffers=[ep, bucket], store=store)
        took = time.monotonic() - t0
    ranks = [0, 1]
    want = (2, rank, 2, (2, 3), [2, 3])
    assert (group.size, group.rank, group.round, group.lost, list(group.original_lost)) == want, group
    assert epx.group.transport_of(group).name == "ucx"
    # the first round's rebuild waited one timeout for rank 2; the second did not wait for it
    assert LOCAL_TIMEOUT <= took < 2 * LOCAL_TIMEOUT, f"rank {rank}: the agreement and rebuilds took {took:.1f} s"
    ep, bucket = _local_buffers(group, group.size)
    _local_pair(ep, bucket, ranks, rank, 1, 0)
    log.append((1, 0))
    # a joiner that dies once invited: the admission is abandoned, the group goes on as it was
    if group.rank == 0:
        heal.request_ranks(group, 1)
        store.add("test/admit", 1)  # the test starts the dying joiner now
    assert heal.admit(group, joiners=1, tag=8) is None, f"rank {rank}: an admission whose joiner died stood"
    _local_pair(ep, bucket, ranks, rank, 2, 0)
    log.append((2, 0))
    # a second joiner is admitted: 2 -> 3
    if group.rank == 0:
        heal.request_ranks(group, 1)
        store.add("test/admit", 1)
    bigger = heal.admit(group, joiners=1, tag=9)
    assert bigger is not None and bigger.size == 3 and bigger.rank == group.rank, bigger
    assert list(bigger.original_ranks) == ranks + [P0 + 1], bigger  # seat 1 (seat 0: the joiner that died)
    heal._destroy_quietly(ep)
    heal._destroy_quietly(bucket)
    ep, bucket = _local_buffers(bigger, 3)
    ranks = ranks + [P0 + 1]
    _local_pair(ep, bucket, ranks, rank, 3, 0)
    log.append((3, 0))
    return log + _last_stage(bigger, ep, bucket, ranks, rank, pid_dir, store)


def _local_joiner(port, die, pid_dir):
    import epx.heal as heal
    store = _local_store(port)
    if die:  # invited, then dies before its transport stands
        _die_in_rebuild()
    group = heal.join(store=store, timeout_secs=60)
    assert group is not None and group.size == 3 and group.rank == 2 and group.admission["tag"] == 9, group
    ep, bucket = _local_buffers(group, 3)
    ranks = list(group.original_ranks)
    _local_pair(ep, bucket, ranks, ranks[2], 3, 0)
    return [(3, 0)] + _last_stage(group, ep, bucket, ranks, ranks[2], pid_dir, store)


def test_one_machine_ucx_group_a_loss_in_the_rebuild_a_dying_joiner_and_a_loss_after_a_join(tmp_path, monkeypatch):
    _paths()
    # the ranks are forked from this process: they find epx where the machines' ranks do
    monkeypatch.syspath_prepend(os.environ.get("EPX_TORCHRUN_PYTHONPATH") or os.path.join(REPO, "build", "python"))
    from epx_cases import run_ranks
    master = _local_store(0, master=True)
    before = set(os.listdir("/dev/shm"))
    # the joiners start when rank 0 announces each (a process started later, as torchrun's next worker)
    def joiner_when(n, die):
        def target(port, die_):
            s = _local_store(port)
            deadline = time.monotonic() + 120
            while s.add("test/admit", 0) < n and time.monotonic() < deadline:
                time.sleep(0.05)
            return _local_joiner(port, die_, str(tmp_path))
        return (P0 + n, target, (master.port, die))
    results, codes = run_ranks([(r, _local_member, (r, master.port, str(tmp_path))) for r in range(P0)]
                               + [joiner_when(1, True), joiner_when(2, False)], expect=2, timeout=240)
    assert all(ok for ok, _ in results.values()), results
    assert sorted(results) == [0, P0 + 2], results
    assert results[0][1] == [(0, 0), (1, 0), (2, 0), (3, 0), (4, 0), (5, 0)], results
    assert results[P0 + 2][1] == [(3, 0), (4, 0), (5, 0)], results
    assert [codes[r] for r in (1, 2, 3, P0)] == [-signal.SIGKILL] * 4, codes
    deadline = time.monotonic() + 5
    while set(os.listdir("/dev/shm")) - before and time.monotonic() < deadline:
        time.sleep(0.05)
    left = {f for f in set(os.listdir("/dev/shm")) - before if not f.startswith("sem.mp-")}
    assert not left, f"left in /dev/shm: {left}"


if __name__ == "__main__":
    role = sys.argv[1]
    if role == "agent":
        sys.exit(agent_main(int(sys.argv[2]), sys.argv[3], float(sys.argv[4])))
    elif role == "rank":
        rank_main(int(sys.argv[2]))
    elif role == "joiner":
        joiner_main()
    else:
        sys.exit(f"unknown role {role}")
