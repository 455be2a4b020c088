"""A Megatron-style MoE layer with expert parallelism on the backend under test, forward and
backward: router (softmax, top-k), token permutation (sorted by expert), all_to_all_single of
the tokens with uneven splits, the local experts' MLPs, the reverse all_to_all_single,
unpermutation weighted by the router's probabilities. Autograd runs through both
all_to_alls (an autograd.Function whose backward is the reverse exchange). Checked against a
single-process reference that holds every expert: the outputs, the input gradients, the
expert gradients and the router's gradient (summed over ranks).

    torchrun --nproc_per_node 4 moe_layer.py --backend epx
"""
import torch
import torch.distributed as dist

from _common import Checks, setup

H, FFN, TOPK, EXPERTS_PER_RANK = 16, 32, 2, 2


class AllToAll(torch.autograd.Function):
    """all_to_all_single along dim 0 with the given splits; its gradient goes back the
    reverse way (the splits swapped)."""

    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group):
        ctx.splits, ctx.group = (out_splits, in_splits), group
        out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits = ctx.splits
        back = grad.new_empty((sum(in_splits),) + tuple(grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        return back, None, None, None


def make_params(E):
    """Every expert's and the router's weights, the same on every rank (fixed seed)."""
    g = torch.Generator().manual_seed(1234)
    router = torch.randn(H, E, generator=g) * 0.5
    w1 = torch.randn(E, H, FFN, generator=g) / H ** 0.5
    w2 = torch.randn(E, FFN, H, generator=g) / FFN ** 0.5
    return router, w1, w2


def tokens(rank, n):
    g = torch.Generator().manual_seed(77 + rank)
    return torch.randn(n, H, generator=g), torch.randn(n, H, generator=g)  # input, upstream gradient


def expert(x, w1, w2):
    return torch.nn.functional.gelu(x @ w1) @ w2


def route(x, router):
    probs = torch.softmax(x @ router, dim=-1)
    return torch.topk(probs, TOPK, dim=-1)  # (weights, expert ids) [T, k]


def moe_distributed(x, router, w1_local, w2_local, rank, size, group):
    E = size * EXPERTS_PER_RANK
    T = x.shape[0]
    weights, ids = route(x, router)
    flat_ids = ids.reshape(-1)
    order = torch.argsort(flat_ids, stable=True)  # permutation: tokens sorted by expert
    permuted = x[torch.arange(T).repeat_interleave(TOPK)[order]]
    counts = torch.bincount(flat_ids, minlength=E)  # tokens for each expert, from this rank
    in_splits = counts.view(size, EXPERTS_PER_RANK).sum(1).tolist()
    recv_counts = torch.empty_like(counts)
    dist.all_to_all_single(recv_counts, counts, group=group)  # [src, local expert] counts
    recv_counts = recv_counts.view(size, EXPERTS_PER_RANK)
    out_splits = recv_counts.sum(1).tolist()
    got = AllToAll.apply(permuted, out_splits, in_splits, group)  # by source, then by local expert
    # regroup by local expert, run each expert, and put the rows back in arrival order
    starts = torch.cumsum(torch.tensor([0] + out_splits[:-1]), 0)
    rows = [[] for _ in range(EXPERTS_PER_RANK)]
    for s in range(size):
        off = int(starts[s])
        for j in range(EXPERTS_PER_RANK):
            n = int(recv_counts[s, j])
            rows[j].append(torch.arange(off, off + n))
            off += n
    by_expert = [torch.cat(r) for r in rows]
    outs = [expert(got[idx], w1_local[j], w2_local[j]) for j, idx in enumerate(by_expert)]
    order_back = torch.argsort(torch.cat(by_expert))
    done = torch.cat(outs)[order_back]
    back = AllToAll.apply(done, in_splits, out_splits, group)  # to the tokens' ranks, sorted by expert
    unpermuted = back[torch.argsort(order)]  # token-major, k per token
    y = (unpermuted.view(T, TOPK, H) * weights.unsqueeze(-1)).sum(1)
    return y, in_splits, out_splits


def moe_reference(x, router, w1, w2):
    weights, ids = route(x, router)
    y = torch.zeros_like(x)
    for k in range(TOPK):
        for e in range(w1.shape[0]):
            sel = ids[:, k] == e
            if sel.any():
                rows = weights[sel, k].unsqueeze(-1) * expert(x[sel], w1[e], w2[e])
                y = y.index_add(0, sel.nonzero().squeeze(1), rows)
    return y


def options(ap):
    ap.add_argument("--tokens", type=int, default=40)


def run(a, c):
    """The checks on this rank (into c); returns the summary line's text."""
    P, r, T = a.size, a.rank, a.tokens
    E = P * EXPERTS_PER_RANK
    router0, w1_all, w2_all = make_params(E)
    mine = slice(r * EXPERTS_PER_RANK, (r + 1) * EXPERTS_PER_RANK)
    router = router0.clone().requires_grad_()
    w1 = w1_all[mine].clone().requires_grad_()
    w2 = w2_all[mine].clone().requires_grad_()
    x0, dy = tokens(r, T)
    x = x0.clone().requires_grad_()
    y, in_splits, out_splits = moe_distributed(x, router, w1, w2, r, P, None)
    (y * dy).sum().backward()
    dist.all_reduce(router.grad)  # the router is replicated: its gradient is the sum over ranks
    # the reference: one process, every expert, every rank's tokens
    rr = router0.clone().requires_grad_()
    rw1, rw2 = w1_all.clone().requires_grad_(), w2_all.clone().requires_grad_()
    xs = [tokens(s, T)[0].requires_grad_() for s in range(P)]
    ys = [moe_reference(xs[s], rr, rw1, rw2) for s in range(P)]
    sum((ys[s] * tokens(s, T)[1]).sum() for s in range(P)).backward()
    c.close("output", y.detach(), ys[r].detach())
    c.close("input gradient", x.grad, xs[r].grad)
    c.close("expert w1 gradient", w1.grad, rw1.grad[mine])
    c.close("expert w2 gradient", w2.grad, rw2.grad[mine])
    c.close("router gradient", router.grad, rr.grad, rtol=1e-4, atol=1e-5)
    uneven = torch.tensor([len(set(in_splits)) > 1], dtype=torch.int32)
    dist.all_reduce(uneven)
    c.true("the splits were uneven somewhere", int(uneven) > 0, "every rank sent every rank the same count")
    return (f"backend {a.backend}, {P} ranks, {E} experts top-{TOPK}, {T} tokens a rank; rank 0 sent "
            f"{in_splits} and received {out_splits} rows; forward and backward equal to one process's")


def main():
    a = setup("moe_layer", __doc__.split("\n\n")[0], options)
    c = Checks("moe_layer", a.rank)
    c.finish(run(a, c))


if __name__ == "__main__":
    main()
