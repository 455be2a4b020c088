#!/usr/bin/python3
"""A two-stage pipeline trained with the 1F1B schedule over 4 micro-batches, on 4 ranks,
whose activations and gradients go through epx.PPBuffer (CPU, torch.distributed gloo).

    /usr/bin/python3 examples/pipeline_1f1b.py            # the 4 ranks by epx.launch
    torchrun --nproc_per_node 4 --redirects 1 --tee 1 examples/pipeline_1f1b.py --no-launch

Ranks 2p and 2p+1 are pipeline p (p = 0, 1; data parallel over the two pipelines): stage 0
(rank 2p) holds the first half of the model, stage 1 (rank 2p+1) the second half and the
loss. Each pipeline trains on its half of every batch, split into 4 micro-batches:

    stage 0:  F0 F1 B0 F2 B1 F3 B2 B3       (1 warm-up forward, 3 x (F, B), 1 cool-down B)
    stage 1:  F0 B0 F1 B1 F2 B2 F3 B3
    F on stage 0 sends the activation to stage 1 (PPBuffer.send; it returns once the bytes
    are in the peer's slot, so F1 goes out before B0's gradient comes back); F on stage 1
    receives it (PPBuffer.recv); B on stage 1 sends the activation's gradient back, B on
    stage 0 receives it and finishes the backward pass.

After the 4 micro-batches the two pipelines' gradients are summed (gloo all_reduce between
ranks 0 and 2, and between 1 and 3) and every rank takes an SGD step. The same model run on
one process (both stages, the same micro-batches in the same order, the same sums) must
give bitwise the same parameters after every step; the script checks that and exits 0.
"""
import argparse
import sys

import torch

import epx

D_IN, D_HID, D_OUT = 32, 64, 16
BATCH, MICRO = 64, 4           # per step: BATCH rows, two pipelines x MICRO micro-batches
STEPS, LR = 3, 0.05


def make_stages(seed=0):
    g = torch.Generator().manual_seed(seed)
    stage0 = torch.nn.Sequential(torch.nn.Linear(D_IN, D_HID), torch.nn.Tanh(), torch.nn.Linear(D_HID, D_HID), torch.nn.Tanh())
    stage1 = torch.nn.Sequential(torch.nn.Linear(D_HID, D_HID), torch.nn.Tanh(), torch.nn.Linear(D_HID, D_OUT))
    with torch.no_grad():
        for p in list(stage0.parameters()) + list(stage1.parameters()):
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return stage0, stage1


def batch(step):
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(BATCH, D_IN, generator=g), torch.randn(BATCH, D_OUT, generator=g)


def micro_batches(step, pipeline):
    """Pipeline p's MICRO micro-batches of this step: (x, y) pairs."""
    x, y = batch(step)
    half = BATCH // 2
    xs, ys = x[pipeline * half:(pipeline + 1) * half], y[pipeline * half:(pipeline + 1) * half]
    m = half // MICRO
    return [(xs[i * m:(i + 1) * m], ys[i * m:(i + 1) * m]) for i in range(MICRO)]


def loss_of(out, y):
    return ((out - y) ** 2).mean() / MICRO  # the mean over the pipeline's micro-batches


def schedule(stage):
    """1F1B for two stages: [('F', i) | ('B', i)]."""
    warm = 1 - stage
    ops = [("F", i) for i in range(warm)]
    for i in range(MICRO - warm):
        ops += [("F", i + warm), ("B", i)]
    return ops + [("B", i) for i in range(MICRO - warm, MICRO)]


def sgd(params):
    with torch.no_grad():
        for p in params:
            p -= LR * p.grad
            p.grad = None


def pipeline_rank(rank, num_ranks):
    import torch.distributed as dist
    torch.set_num_threads(1)
    assert num_ranks == 4, "this example runs on 4 ranks"
    pipeline, stage = rank // 2, rank % 2
    peer = rank + 1 if stage == 0 else rank - 1
    model = make_stages()[stage]
    params = list(model.parameters())
    # the stages of both pipelines are linked; activations and gradients are [m, D_HID] f32
    m = BATCH // 2 // MICRO
    pp = epx.PPBuffer(None, num_max_tensor_bytes=m * D_HID * 4, num_max_inflight_tensors=2,
                      links=[(0, 1), (2, 3)])
    dp = [dist.new_group([0, 2]), dist.new_group([1, 3])][stage]
    losses = []
    for step in range(STEPS):
        mbs = micro_batches(step, pipeline)
        saved = {}
        for op, i in schedule(stage):
            x, y = mbs[i]
            if stage == 0 and op == "F":
                saved[i] = model(x)
                pp.send(saved[i].detach(), peer)
            elif stage == 0:
                grad = torch.empty(m, D_HID)
                pp.recv(grad, peer)
                saved.pop(i).backward(grad)
            elif op == "F":
                act = torch.empty(m, D_HID)
                pp.recv(act, peer)
                act.requires_grad_(True)
                loss = loss_of(model(act), y)
                saved[i] = (act, loss)
                losses.append(float(loss))
            else:
                act, loss = saved.pop(i)
                loss.backward()
                pp.send(act.grad, peer)
        for p in params:
            dist.all_reduce(p.grad, group=dp)  # the two pipelines' gradients: a + b
        sgd(params)
    pp.destroy()
    return stage, [p.detach().clone() for p in params], losses


def reference():
    """The same model on one process: per pipeline the 4 micro-batches in order, then the
    two pipelines' gradients summed, then SGD."""
    torch.set_num_threads(1)
    stage0, stage1 = make_stages()
    params = list(stage0.parameters()) + list(stage1.parameters())
    losses = {0: [], 1: []}
    for step in range(STEPS):
        grads = []
        for pipeline in range(2):
            for i, (x, y) in enumerate(micro_batches(step, pipeline)):
                act = stage0(x).detach().requires_grad_(True)  # the activation as stage 1 receives it
                loss = loss_of(stage1(act), y)
                losses[pipeline].append(float(loss))
                loss.backward()
                stage0(x).backward(act.grad)
            grads.append([p.grad.clone() for p in params])
            for p in params:
                p.grad = None
        for p, g0, g1 in zip(params, grads[0], grads[1]):
            p.grad = g0 + g1
        sgd(params)
    return [p.detach() for p in stage0.parameters()], [p.detach() for p in stage1.parameters()], losses


def check(results):
    ref0, ref1, ref_losses = reference()
    ok = True
    for rank, (stage, params, losses) in enumerate(results):
        want = ref0 if stage == 0 else ref1
        same = all(torch.equal(a, b) for a, b in zip(params, want))
        if stage == 1:
            same = same and losses == ref_losses[rank // 2]
        print(f"rank {rank} (pipeline {rank // 2}, stage {stage}): "
              f"{'bitwise equal to the one-process run' if same else 'DIFFERS from the one-process run'}")
        ok = ok and same
    return ok


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-launch", action="store_true", help="this process is one rank (torchrun)")
    a = ap.parse_args(argv)
    if a.no_launch:
        import torch.distributed as dist
        dist.init_process_group("gloo")
        r = pipeline_rank(dist.get_rank(), dist.get_world_size())
        out = [None] * dist.get_world_size()
        dist.all_gather_object(out, r)
        ok = check(out) if dist.get_rank() == 0 else True
        dist.destroy_process_group()
        return 0 if ok else 1
    return 0 if check(epx.launch(pipeline_rank, 4)) else 1


if __name__ == "__main__":
    sys.exit(main())
