"""Shared by tests/python/test_buffer*.py, test_heal.py and test_elastic_join.py: random dispatch /
combine problems (every rank builds the same one from the seed), the fixed expert function of
docs/spec.md §7 applied to epx's outputs, comparisons against the numpy reference
(tests/e2e/epx_ref.py), bit for bit, and one checked dispatch / combine of a group; for the
elastic tests a routing masked to live replicas written apart from epx; for tests that start
their own ranks: running them and collecting their answers, waiting for a killed rank's
process to end, the epx segments left in /dev/shm."""
import multiprocessing as mp
import os
import queue as queue_module
import time

import numpy as np

import epx_ref


def make_case(P, E, K, H, tokens, seed, fp8=False, mask_prob=0.15):
    rng = np.random.default_rng(seed)
    idx, w, x, xq, xs = [], [], [], [], []
    for r in range(P):
        S = tokens[r]
        t = np.array([rng.permutation(E)[:K] for _ in range(S)], dtype=np.int64).reshape(S, K)
        t[rng.random((S, K)) < mask_prob] = -1
        idx.append(t)
        w.append((rng.integers(1, 1 << 24, (S, K)) / float(1 << 24)).astype(np.float32))
        # finite bf16: sign, exponent 2^-12..2^4, random mantissa
        bits = (rng.integers(0, 2, (S, H)) << 15) | (rng.integers(127 - 12, 127 + 5, (S, H)) << 7) | rng.integers(0, 128, (S, H))
        x.append(bits.astype(np.uint16))
        q = rng.integers(0, 256, (S, H)).astype(np.uint8)
        q[(q & 0x7F) == 0x7F] = 0  # no NaN
        xq.append(q)
        xs.append((2.0 ** rng.integers(-8, 8, (S, H // 128))).astype(np.float32) if H % 128 == 0 else None)
    meta = {"num_ranks": P, "num_experts": E, "hidden": H, "num_topk": K}
    if fp8:
        return epx_ref.Case(meta, idx, w, x_fp8=xq, x_scales=xs)
    return epx_ref.Case(meta, idx, w, x=x)


def with_x(case, seed):
    """The same routing with new activations (a cached dispatch's input)."""
    rng = np.random.default_rng(seed)
    xs = [((rng.integers(0, 2, a.shape) << 15) | (rng.integers(120, 132, a.shape) << 7) | rng.integers(0, 128, a.shape)).astype(np.uint16)
          for a in case.x]
    return epx_ref.Case(case.meta, case.topk_idx, case.topk_weights, x=xs)


def np_of(t):
    """A torch tensor or numpy array as numpy (bf16 as uint16 raw bits, bool as uint8)."""
    if isinstance(t, np.ndarray):
        return t.view(np.uint8) if t.dtype == np.bool_ else t
    import torch
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    if t.dtype == torch.bool:
        return t.to(torch.uint8).numpy()
    return t.numpy()


def inputs(case, r, flavor):
    """Rank r's (x, topk_idx, topk_weights) as torch tensors or numpy arrays."""
    x = (case.x_fp8[r], case.x_scales[r]) if case.fp8 else case.x[r]
    idx, w = case.topk_idx[r], case.topk_weights[r]
    if flavor == "numpy":
        return x, idx.copy(), w.copy()
    import torch
    if case.fp8:
        tx = (torch.from_numpy(x[0].copy()), torch.from_numpy(x[1].copy()))
    else:
        tx = torch.from_numpy(x.view(np.int16).copy()).view(torch.bfloat16)
    return tx, torch.from_numpy(idx.copy()), torch.from_numpy(w.copy())


def to_flavor(bits, flavor):
    """bf16 raw bits (uint16) as this flavour's bf16 tensor."""
    if flavor == "numpy":
        return np.ascontiguousarray(bits)
    import torch
    return torch.from_numpy(np.ascontiguousarray(bits).view(np.int16)).view(torch.bfloat16)


def expert_y(case, recv_x, recv_idx, handle, expanded):
    """docs/spec.md §7's fixed expert function on epx's dispatch output (numpy uint16 [N, H])."""
    if case.fp8:
        data, scales = np_of(recv_x[0]), np.ascontiguousarray(np_of(recv_x[1]))
    else:
        data, scales = np_of(recv_x), None
    src = np_of(handle.recv_src)
    N = data.shape[0]
    y = np.zeros((N, case.H), dtype=np.uint16)
    local = np.full(N, -1)
    if expanded:
        offs, counts = handle.expert_offsets, handle.num_recv_tokens_per_expert
        for j in range(len(counts)):
            local[offs[j]:offs[j] + counts[j]] = j
    for i in range(N):
        if src[i, 0] < 0:
            continue
        n = local[i] if expanded else int(sum(v for v in np_of(recv_idx)[i] if v >= 0))
        y[i] = epx_ref._expert(data[i], None if scales is None else scales[i], epx_ref.expert_factor(n))
    return y


def same(name, got, want, rank):
    got, want = np.asarray(np_of(got)), np.asarray(want)
    assert got.shape == want.shape, f"rank {rank}: {name} has shape {got.shape}, want {want.shape}"
    g = np.ascontiguousarray(got).view(np.uint8)
    w = np.ascontiguousarray(want.astype(got.dtype)).view(np.uint8)
    if not np.array_equal(g, w):
        bad = np.argwhere(np.ascontiguousarray(got) != np.ascontiguousarray(want.astype(got.dtype)))
        raise AssertionError(f"rank {rank}: {name} differs at {bad[:3].tolist()} ({len(bad)} elements)")


def check_dispatch(case, res, r, out, expanded, fp8):
    """epx's dispatch outputs `out` = (recv_x, recv_topk_idx, recv_topk_weights, handle)
    on rank r against the reference result `res`."""
    want = res.ranks[r]
    recv_x, recv_idx, recv_w, handle = out
    if fp8:
        same("recv_x data", recv_x[0], want["recv_x_fp8"], r)
        same("recv_x scales", np.ascontiguousarray(np_of(recv_x[1])), want["recv_x_scales"], r)
    else:
        same("recv_x", recv_x, want["recv_x"], r)
    same("recv_src", handle.recv_src, want["recv_src"], r)
    same("num_recv_tokens_per_expert", np.array(handle.num_recv_tokens_per_expert), want["num_recv_tokens_per_expert"], r)
    if expanded:
        assert recv_idx is None
        same("recv_topk_weights (expanded: one per row)", recv_w, want["recv_weights"], r)
        same("expert_offsets", np.array(handle.expert_offsets), want["expert_offsets"], r)
    else:
        same("recv_topk_idx", recv_idx, want["recv_topk_idx"], r)
        same("recv_topk_weights", recv_w, want["recv_topk_weights"], r)


def round_trip(ep, case, me, x, idx, w, expanded, who=None):
    """One dispatch / combine of EPBuffer `ep` of rank me's inputs (x, idx, w) of `case`, bit for
    bit against the reference (`who`: the rank the messages name, me by default)."""
    res = epx_ref.compute(case, layout="expanded" if expanded else "compact", alignment=4 if expanded else 1,
                          deterministic=True, zero_padding=True)
    out = ep.dispatch(x, idx, w, do_expand=expanded, expert_alignment=4 if expanded else 1, deterministic=True,
                      do_zero_padding=True)
    check_dispatch(case, res, me, out[:4], expanded, False)
    y = expert_y(case, out[0], out[1], out[3], expanded)
    combined, _, _ = ep.combine(y, out[3])
    same("combined_x", combined, res.ranks[me]["combined_x"], me if who is None else who)


def checked_pair(ep, n, me, L, K, H, tokens, seed, expanded):
    """One dispatch / combine of EPBuffer `ep` over a group of n ranks (this one: me) routing
    to its n * L experts (tokens[:n] a rank), bit for bit against the reference."""
    case = make_case(n, n * L, K, H, tokens[:n], seed=seed)
    x, idx, w = inputs(case, me, "torch")
    round_trip(ep, case, me, x, idx, w, expanded)


def masked_pair(ep, group, logical, lost, orig, mapping, L, expanded):
    """One dispatch / combine of rank orig's inputs of `logical` (a case over the first group's
    len(mapping) ranks), routed by epx.live_routing to the live replicas of the survivors of
    `lost`: the routing against hand_mask, then bit for bit against the reference of that
    routing. Returns (hand_mask's (routing, pairs, tokens) of every survivor, this rank's
    dropped pairs and tokens as live_routing counted them)."""
    import epx
    B = len(mapping[0])
    survivors = [r for r in range(len(mapping)) if r not in lost]
    me = survivors.index(orig)
    masks = [hand_mask(logical.topk_idx[r], lost, mapping, L) for r in survivors]
    x, idx, w = inputs(logical, orig, "torch")
    routed, num_experts, pairs, tokens = epx.live_routing(idx, mapping, L, group)  # group None: the torch group
    assert np.array_equal(routed.numpy(), masks[me][0]), f"rank {orig}: live_routing differs from the plain loop"
    assert (num_experts, pairs, tokens) == (len(survivors) * (L + B), masks[me][1], masks[me][2])
    n = len(survivors)
    case = epx_ref.Case({"num_ranks": n, "num_experts": n * (L + B), "hidden": logical.x[0].shape[1],
                         "num_topk": logical.topk_idx[0].shape[1]},
                        [m[0] for m in masks], [logical.topk_weights[r] for r in survivors],
                        x=[logical.x[r] for r in survivors])
    round_trip(ep, case, me, x, routed, w, expanded, who=orig)
    return masks, pairs, tokens


def hand_mask(idx, lost, mapping, L):
    """A logical routing sent to live replicas, written apart from epx. Expert e's home is
    rank e // L; rank d's redundant slots hold the logical experts mapping[d] (-1: unused).
    The replicas of e are its home copy, then the slots holding it by ascending (rank, slot);
    of the live ones, token t takes the (t mod count)-th; rank d of the survivors holds the
    physical experts d*(L+B) .. +L+B-1. Returns (the routing, the dropped (token, slot) pairs,
    the tokens with a dropped slot)."""
    P0, B = len(mapping), len(mapping[0])
    survivors = [r for r in range(P0) if r not in lost]
    out = np.full(idx.shape, -1, dtype=np.int64)
    pairs = tokens = 0
    for t in range(idx.shape[0]):
        dropped = False
        for k in range(idx.shape[1]):
            e = int(idx[t, k])
            if e < 0:
                continue
            live = []
            if e // L not in lost:
                live.append(survivors.index(e // L) * (L + B) + e % L)
            for d in range(P0):
                for b in range(B):
                    if mapping[d][b] == e and d not in lost:
                        live.append(survivors.index(d) * (L + B) + L + b)
            if not live:
                pairs += 1
                dropped = True
                continue
            out[t, k] = live[t % len(live)]
        tokens += dropped
    return out, pairs, tokens


def wait_until_dead(pid_dir, rank):
    """Until the process of `rank` (its pid in pid_dir) has ended (gone, or a zombie)."""
    with open(os.path.join(pid_dir, f"pid{rank}")) as f:
        pid = int(f.read())
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return
        except OSError:
            return
        time.sleep(0.01)
    raise AssertionError(f"rank {rank} (pid {pid}) did not die")


def _answer(target, rank, args, answers):
    """In a rank's process: target(*args)'s value, or its error as text, into `answers`; then
    the process ends without its interpreter's teardown (a group whose rank died cannot be
    torn down collectively)."""
    try:
        answers.put((rank, True, target(*args)))
    except BaseException as e:  # noqa: BLE001 - the test process reports it
        answers.put((rank, False, f"{type(e).__name__}: {e}"))
    finally:
        answers.close()
        answers.join_thread()
    os._exit(0)


def run_ranks(ranks, expect, timeout, later=(), delay=0.5):
    """Starts target(*args) for each (rank, target, args) of `ranks` in a forked process, then
    those of `later` after `delay` s; collects (ok, value) per rank until `expect` ranks have
    answered, one has failed or `timeout` s have passed; waits up to 30 s for each process to
    end (unless one failed) and kills what is left. Returns ({rank: (ok, value)}, the processes' exit codes in start order)."""
    ctx = mp.get_context("fork")
    answers = ctx.Queue()
    procs = []

    def start(group):
        for rank, target, args in group:
            procs.append(ctx.Process(target=_answer, args=(target, rank, args, answers)))
            procs[-1].start()
    results = {}
    try:
        start(ranks)
        if later:
            time.sleep(delay)
            start(later)
        deadline = time.monotonic() + timeout
        while len(results) < expect and time.monotonic() < deadline:
            try:
                rank, ok, value = answers.get(timeout=1)
            except queue_module.Empty:
                continue
            results[rank] = (ok, value)
            if not ok:
                break  # the test fails on it: the others are killed below, not waited for
        if all(ok for ok, _ in results.values()):
            for p in procs:
                p.join(timeout=30)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    return results, [p.exitcode for p in procs]


def shm_segments():
    return {f for f in os.listdir("/dev/shm") if f.startswith("epx-")}


def segments_left(before, patience=5.0):
    """epx segments not in `before` still there after up to `patience` s: another job on the
    machine holds its own only between creating and unlinking them, a leaked one stays."""
    deadline = time.monotonic() + patience
    while True:
        left = shm_segments() - before
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)
