"""A two-stage pipeline on the backend under test: stage 0 on the first half of the ranks,
stage 1 on the second; rank i of stage 0 feeds rank i + n/2 of stage 1 (n/2 pipelines side by
side, data parallel: each stage's gradients are averaged over its own new_group). Micro-batches
go forward as activations (isend / irecv, every receive of a step posted up front, tags
naming the micro-batch) and come back as gradients; several SGD steps. Checked against the
unsplit model trained on one process on the same data: the loss curve and every stage's final
parameters.

    torchrun --nproc_per_node 4 pipeline.py --backend epx
"""
import torch
import torch.distributed as dist

from _common import Checks, setup

MICRO, BATCH, STEPS, LR = 4, 8, 4, 0.1
GRAD_TAG = 1000


def model():
    torch.manual_seed(5)
    full = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.Tanh(), torch.nn.Linear(32, 24),  # stage 0
                               torch.nn.ReLU(), torch.nn.Linear(24, 24), torch.nn.Tanh(), torch.nn.Linear(24, 3))
    return full, full[:3], full[3:]


def data(pipe, step, m):
    g = torch.Generator().manual_seed(10_000 * pipe + 100 * step + m)
    return torch.randn(BATCH, 12, generator=g), torch.randn(BATCH, 3, generator=g)


def flat(mod):
    return torch.cat([p.detach().reshape(-1) for p in mod.parameters()])


def reference(pipes):
    """The unsplit model: each step's gradient is the mean over pipelines of the mean over
    micro-batches, as the pipeline computes it."""
    full, _, _ = model()
    opt = torch.optim.SGD(full.parameters(), lr=LR)
    losses = []
    for step in range(STEPS):
        opt.zero_grad()
        total = 0.0
        for p in range(pipes):
            for m in range(MICRO):
                x, y = data(p, step, m)
                loss = torch.nn.functional.mse_loss(full(x), y) / (MICRO * pipes)
                loss.backward()
                total += loss.item()
        opt.step()
        losses.append(total)
    return losses, full


def run(a, c):
    """The checks on this rank (into c); returns the summary line's text."""
    P, r = a.size, a.rank
    if P % 2:
        raise SystemExit("pipeline: needs an even number of ranks")
    half = P // 2
    stage, pipe = divmod(r, half)
    peer = r + half if stage == 0 else r - half
    groups = [dist.new_group(list(range(half))), dist.new_group(list(range(half, P)))]  # every rank makes both
    mine = groups[stage]
    _, part0, part1 = model()
    part = part0 if stage == 0 else part1
    opt = torch.optim.SGD(part.parameters(), lr=LR)
    losses = []
    for step in range(STEPS):
        opt.zero_grad()
        if stage == 0:
            acts = []
            sends = []
            grads = [torch.empty(BATCH, 24) for _ in range(MICRO)]
            pending = [dist.irecv(grads[m], peer, tag=GRAD_TAG + m) for m in range(MICRO)]  # posted up front
            for m in range(MICRO):
                x, _ = data(pipe, step, m)
                act = part(x)
                acts.append(act)
                sends.append(dist.isend(act.detach(), peer, tag=m))
            for m in reversed(range(MICRO)):  # the gradients come back last micro-batch first
                pending[m].wait()
                acts[m].backward(grads[m])
            for w in sends:
                w.wait()
            step_loss = torch.zeros(1)
        else:
            bufs = [torch.empty(BATCH, 24) for _ in range(MICRO)]
            pending = [dist.irecv(bufs[m], peer, tag=m) for m in range(MICRO)]
            outs = []
            for m in range(MICRO):
                pending[m].wait()
                act = bufs[m].requires_grad_()
                _, y = data(pipe, step, m)
                outs.append((act, torch.nn.functional.mse_loss(part(act), y) / (MICRO * half)))
            sends = []
            total = 0.0
            for m in reversed(range(MICRO)):
                act, loss = outs[m]
                loss.backward()
                total += loss.item()
                sends.append(dist.isend(act.grad, peer, tag=GRAD_TAG + m))
            for w in sends:
                w.wait()
            step_loss = torch.tensor([total])
        for p in part.parameters():  # data parallel over the pipelines: each stage its own group
            dist.all_reduce(p.grad, group=mine)
        opt.step()
        dist.all_reduce(step_loss)  # stage 1's losses, summed over the pipelines
        losses.append(step_loss.item())
    ref_losses, ref = reference(half)
    c.close("loss curve", torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=1e-6)
    c.close(f"stage {stage} parameters after {STEPS} steps", flat(part), flat(ref[:3] if stage == 0 else ref[3:]),
            rtol=1e-4, atol=1e-6)
    return (f"backend {a.backend}, {P} ranks = {half} pipelines x 2 stages, {MICRO} micro-batches, {STEPS} steps, "
            f"loss {losses[0]:.4f} -> {losses[-1]:.4f}, equal to the unsplit model's")


def main():
    a = setup("pipeline", __doc__.split("\n\n")[0])
    c = Checks("pipeline", a.rank)
    c.finish(run(a, c))


if __name__ == "__main__":
    main()
