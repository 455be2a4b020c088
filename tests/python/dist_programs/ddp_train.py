"""DistributedDataParallel training of a small MLP on the backend under test, against the same
loop on a gloo group of the same job: the loss curve within float32 tolerance, the final
parameters bitwise equal on every rank (and close to gloo's).

    torchrun --nproc_per_node 4 ddp_train.py --backend epx
    torchrun --nnodes 2 --nproc_per_node 2 --node_rank N --master_addr HOST ddp_train.py --backend gloo
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F

from _common import Checks, setup


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
                               torch.nn.Linear(64, 4))


def train(pg, rank, size, steps):
    torch.manual_seed(0)  # the same initial model on every rank (DDP broadcasts rank 0's anyway)
    model = mlp()
    # small buckets: the reducer's all_reduce runs several times per step
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=pg, bucket_cap_mb=0.005)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for step in range(steps):
        g = torch.Generator().manual_seed(1000 * step + rank)  # each rank its own batch
        x = torch.randn(32, 16, generator=g)
        y = torch.randint(0, 4, (32,), generator=g)
        loss = F.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean, group=pg)
        losses.append(mean.item() / size)
    return torch.tensor(losses), torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def run(a, c):
    """The checks on this rank (into c); returns the summary line's text."""
    gloo = dist.new_group(backend="gloo") if a.backend != "gloo" else None
    losses, params = train(None, a.rank, a.size, a.steps)
    ref_losses, ref_params = train(gloo, a.rank, a.size, a.steps)
    c.close("loss curve against gloo's", losses, ref_losses, rtol=1e-5, atol=1e-6)
    c.close("final parameters against gloo's", params, ref_params, rtol=1e-4, atol=1e-5)
    c.true("the loss went down", losses[-1] < losses[0], f"{losses.tolist()}")
    everyone = [torch.empty_like(params) for _ in range(a.size)]
    dist.all_gather(everyone, params, group=gloo)  # through gloo: not the backend checking itself
    for r, p in enumerate(everyone):
        c.equal(f"final parameters of rank {r} against rank {a.rank}'s", p, params)
    return (f"backend {a.backend}, {a.size} ranks, {a.steps} DDP steps, loss {losses[0]:.4f} -> {losses[-1]:.4f}, "
            f"max |loss - gloo's| {(losses - ref_losses).abs().max().item():.2e}")


def options(ap):
    ap.add_argument("--steps", type=int, default=8)


def main():
    a = setup("ddp_train", __doc__.split("\n\n")[0], options)
    c = Checks("ddp_train", a.rank)
    c.finish(run(a, c))


if __name__ == "__main__":
    main()
