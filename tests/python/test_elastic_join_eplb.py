"""The replica plan and the expert weights on admission (epx.heal.plan_replicas /
place_experts; docs/reliability.md "Joins").

epx.launch, 3 ranks with 12 logical experts (4 home experts each) grow to 4 (no loss): rank 0
starts a joiner, every member admits it; the plan is recomputed for 4 ranks (3 home experts
and 2 redundant slots each, from the batch's routing) and every rank's physical experts —
the newcomer's included — receive their logical experts' weights (two kinds: float32 and
int16) over lb_prefetch_weights' path from where they lived before (logical e on old rank
e // 4). Checked: every physical expert's bytes equal the original weights of the logical
expert the plan puts there, bit for bit; the routing through the plan sends each (token, k)
to a physical expert holding the same logical expert; dispatch / combine over the plan's
routing bit for bit against epx_ref. Nothing is left in /dev/shm, no process is left."""
import multiprocessing as mp
import os
import time

import numpy as np

import epx
import epx.heal as heal
import epx_ref
from epx_cases import check_dispatch, expert_y, inputs, make_case, same

E_LOG, P_OLD, P_NEW, B = 12, 3, 4, 2
L_OLD, L_NEW = E_LOG // P_OLD, E_LOG // P_NEW
H, K = 128, 3
TOKENS = [6, 5, 7, 4]
TIMEOUT = 10


def weights(e):
    """Logical expert e's two weight kinds, written apart from epx."""
    rng = np.random.default_rng([e, 77])
    w1 = rng.standard_normal((5, 7)).astype(np.float32)
    w2 = rng.integers(-30000, 30000, 3).astype(np.int16)
    return w1, w2


def old_homes(rank):
    """The home experts a rank of the first group holds (zeros for a joiner: not read)."""
    if rank >= P_OLD:
        return np.zeros((L_OLD, 5, 7), np.float32), np.zeros((L_OLD, 3), np.int16)
    ws = [weights(rank * L_OLD + i) for i in range(L_OLD)]
    return np.stack([w[0] for w in ws]), np.stack([w[1] for w in ws])


def _shm():
    return {f for f in os.listdir("/dev/shm") if f.startswith("epx-")}


def grown(group):
    """Every rank of the grown group (the joiner too): plan, weights, routing."""
    me = group.rank
    case = make_case(P_NEW, E_LOG, K, H, TOKENS, seed=4242)
    counts = np.zeros((P_NEW, E_LOG), np.int64)
    for d in range(P_NEW):
        np.add.at(counts[d], case.topk_idx[d][case.topk_idx[d] >= 0], 1)
    plan = heal.plan_replicas(counts, P_NEW, L_NEW, B)
    ep = epx.EPBuffer(group, num_max_tokens_per_rank=max(TOKENS), hidden=H, num_topk=K,
                      num_experts=plan.num_experts, num_cpu_timeout_secs=TIMEOUT)
    ep.barrier()
    mine = [np.zeros((L_NEW + B, 5, 7), np.float32), np.zeros((L_NEW + B, 3), np.int16)]
    heal.place_experts(ep, mine, list(old_homes(group.original_ranks[me])), plan)
    layout = plan.layout()
    assert (layout[:, L_NEW:] >= 0).any(), "the plan placed no replica: nothing checks the slots"
    for j, e in enumerate(layout[me]):
        want = weights(int(e)) if e >= 0 else (np.zeros((5, 7), np.float32), np.zeros(3, np.int16))
        assert mine[0][j].view(np.uint32).tobytes() == want[0].view(np.uint32).tobytes(), f"rank {me}: expert {j} (w1)"
        assert mine[1][j].tobytes() == want[1].tobytes(), f"rank {me}: expert {j} (w2)"
    # the routing through the plan: each pair to a physical expert holding its logical expert
    routed = [plan.route(d, case.topk_idx[d]) for d in range(P_NEW)]
    flat = layout.reshape(-1)
    for d in range(P_NEW):
        logical, phys = case.topk_idx[d], routed[d]
        assert np.array_equal(phys < 0, logical < 0)
        assert np.array_equal(flat[phys[phys >= 0]], logical[logical >= 0]), f"rank {d}: a pair went to another expert"
    physical = epx_ref.Case({"num_ranks": P_NEW, "num_experts": plan.num_experts, "hidden": H, "num_topk": K},
                            routed, case.topk_weights, x=case.x)
    for expanded in (False, True):
        res = epx_ref.compute(physical, layout="expanded" if expanded else "compact", alignment=4 if expanded else 1,
                              deterministic=True, zero_padding=True)
        x, _, w = inputs(case, me, "torch")
        import torch
        out = ep.dispatch(x, torch.from_numpy(routed[me].copy()), w, do_expand=expanded,
                          expert_alignment=4 if expanded else 1, deterministic=True, do_zero_padding=True)
        check_dispatch(physical, res, me, out[:4], expanded, False)
        y = expert_y(physical, out[0], out[1], out[3], expanded)
        combined, _, _ = ep.combine(y, out[3])
        same("combined_x", combined, res.ranks[me]["combined_x"], me)
    ep.destroy()
    group.barrier("after the plan")
    heal.close_door(group)
    return [int(v) for v in layout.reshape(-1)], plan.replicas_used


def _joiner(group):
    assert group.rank == 3 and group.size == 4 and group.admission["tag"] == 5, group
    return grown(group)


def _member(rank, n):
    ep = epx.EPBuffer(None, num_max_tokens_per_rank=max(TOKENS), hidden=H, num_topk=K, num_experts=E_LOG,
                      num_cpu_timeout_secs=TIMEOUT)
    heal.open_door(None, seats=2)
    joiners = heal.request_ranks(None, 1, _joiner) if rank == 0 else []
    group = heal.admit(None, joiners=1, tag=5)
    assert group is not None and group.size == P_NEW and group.rank == rank, group
    heal._destroy_quietly(ep)
    result = grown(group)
    joined = joiners[0].result(timeout_secs=120) if rank == 0 else None
    return result, joined


def test_the_plan_is_recomputed_and_the_newcomer_gets_its_experts():
    before = _shm()
    out = epx.launch(_member, P_OLD, start_method="fork", timeout_secs=120)
    layout, used = out[0][0]
    assert used > 0
    assert all(out[r][0] == (layout, used) for r in range(P_OLD))
    assert out[0][1] == (layout, used)  # the joiner saw the same plan
    deadline = time.monotonic() + 5
    while _shm() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _shm() - before, f"left in /dev/shm: {_shm() - before}"
    assert not mp.active_children()
