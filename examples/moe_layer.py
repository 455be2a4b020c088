#!/usr/bin/python3
"""A DeepSeek-style MoE layer on epx, trained on 4 ranks (CPU, torch.distributed gloo).

    torchrun --nproc_per_node 4 --redirects 1 --tee 1 examples/moe_layer.py [--fp8]
    /usr/bin/python3 examples/moe_layer.py --launch 4 [--fp8]     # the ranks by epx.launch

(Debian's torch 1.13 torchrun spells `--nproc_per_node`, and under Python 3.11 it crashes
in `to_map` unless --redirects / --tee get a non-zero value.) Exit status 0 when every
rank's check passed and the loss went down.

The layer (`MoELayer`), per rank:
  1. router: scores = softmax(x @ W_router) over E experts, top-k -> (topk_idx, topk_weights)
  2. dispatch (expanded layout, rows grouped by local expert, `expert_alignment` rows per
     group, zero padding) issued with `async_with_compute_stream=True` ...
  3. ... while the shared expert runs on every token of this rank (overlap), then wait
  4. routed experts: one matmul per local expert over its aligned row group (the grouped
     GEMM of the expanded layout), SwiGLU, each row scaled by its routing weight
  5. combine with the shared expert's output as bias: out = shared(x) + sum_k w_k E_k(x)
Backward runs through `epx.autograd` (gradient of dispatch = combine with the same handle,
gradient of combine = cached dispatch). Parameters are float32 and the expert math is
float32; what crosses ranks is bf16 (or FP8 + float32 scales for `--fp8`), as in DeepEP.

The script first compares the output and the gradients of x, the router, the shared and
the routed experts' weights with `dense_reference`: one process, all ranks' tokens, the same
weights, no epx, every expert on every token mixed by a dense gate. Tolerance (bf16 at
the wire):
    max|a - b| <= TOL * max|b|  per tensor, TOL = 1e-2 (bf16 has a 2^-8 relative step;
    a value passes through up to four bf16 roundings and a K-term sum).
Then a few SGD steps (router and shared grads all-reduced) must lower the loss.
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD_PY = os.path.join(HERE, "..", "build", "python")
if os.path.isdir(os.path.join(BUILD_PY, "epx")):  # epx from this checkout, when built here
    sys.path.insert(0, BUILD_PY)

import epx  # noqa: E402
import epx.autograd as ea  # noqa: E402

TOL = 1e-2


class Config:
    def __init__(self, hidden=128, ffn=64, shared_ffn=64, num_experts=8, topk=2,
                 tokens=(12, 9, 16, 5), alignment=4, use_fp8=False, seed=1, **_):
        self.hidden, self.ffn, self.shared_ffn = hidden, ffn, shared_ffn
        self.num_experts, self.topk, self.alignment = num_experts, topk, alignment
        self.tokens, self.use_fp8, self.seed = list(tokens), use_fp8, seed


def init_params(cfg):
    """All weights of the layer (every rank builds the same ones from the seed)."""
    g = torch.Generator().manual_seed(cfg.seed)
    H, F_, Fs, E = cfg.hidden, cfg.ffn, cfg.shared_ffn, cfg.num_experts

    def rnd(*shape, scale):
        return torch.randn(*shape, generator=g) * scale

    return {
        "router": rnd(H, E, scale=H ** -0.5),
        "w_in": rnd(E, H, 2 * F_, scale=H ** -0.5),   # gate | up
        "w_out": rnd(E, F_, H, scale=F_ ** -0.5),
        "shared_in": rnd(H, 2 * Fs, scale=H ** -0.5),
        "shared_out": rnd(Fs, H, scale=Fs ** -0.5),
    }


def make_batch(cfg, num_ranks):
    """Every rank's tokens (bf16, as a transformer would hand them over) and targets."""
    g = torch.Generator().manual_seed(cfg.seed + 1000)
    xs = [torch.randn(cfg.tokens[r % len(cfg.tokens)], cfg.hidden, generator=g).bfloat16()
          for r in range(num_ranks)]
    targets = [torch.randn(x.shape, generator=g) * 0.5 for x in xs]
    return xs, targets


def swiglu(x, w_in, w_out):
    gate, up = w_in.shape[1] // 2, w_in.shape[1] // 2
    h = x @ w_in
    return (F.silu(h[:, :gate]) * h[:, gate:gate + up]) @ w_out


class MoELayer(torch.nn.Module):
    def __init__(self, cfg, buffer, rank, num_ranks, params):
        super().__init__()
        self.cfg, self.buffer, self.rank = cfg, buffer, rank
        L = cfg.num_experts // num_ranks
        mine = slice(rank * L, (rank + 1) * L)
        self.router = torch.nn.Parameter(params["router"].clone())
        self.shared_in = torch.nn.Parameter(params["shared_in"].clone())
        self.shared_out = torch.nn.Parameter(params["shared_out"].clone())
        self.w_in = torch.nn.Parameter(params["w_in"][mine].clone())    # this rank's experts
        self.w_out = torch.nn.Parameter(params["w_out"][mine].clone())
        self.num_local = L

    def replicated(self):
        """Parameters every rank holds (their gradients are summed over ranks)."""
        return [self.router, self.shared_in, self.shared_out]

    def forward(self, x):
        cfg = self.cfg
        scores = torch.softmax(x.float() @ self.router, dim=-1)
        topk_weights, topk_idx = torch.topk(scores, cfg.topk, dim=-1)
        recv_x, _, recv_w, handle, event = ea.dispatch(
            self.buffer, x, topk_idx, topk_weights, do_expand=True, expert_alignment=cfg.alignment,
            do_zero_padding=True, async_with_compute_stream=True, use_fp8=cfg.use_fp8)
        shared = swiglu(x.float(), self.shared_in, self.shared_out)  # while the rows move
        event.current_stream_wait()  # now recv_x, recv_w and handle hold the rows
        offsets = list(handle.expert_offsets)
        rows = recv_x.float()
        ys = [swiglu(rows[offsets[j]:offsets[j + 1]], self.w_in[j], self.w_out[j])
              for j in range(self.num_local)]
        y = torch.cat(ys) if ys else rows[:0]
        y = y * recv_w[:, None]
        return ea.combine(self.buffer, y.bfloat16(), handle, bias=shared.bfloat16())


def dense_reference(cfg, params, xs):
    """The layer on all ranks' tokens in one process, without epx: every expert runs on
    every token and a dense [T, E] gate (the top-k softmax weights, 0 elsewhere) mixes
    them. Returns (x_all, out, params) with requires_grad leaves."""
    p = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    x_all = torch.cat(xs).float().requires_grad_(True)
    scores = torch.softmax(x_all @ p["router"], dim=-1)
    w, idx = torch.topk(scores, cfg.topk, dim=-1)
    gate = torch.zeros_like(scores).scatter(1, idx, w)  # differentiable in w
    xe = _fp8_roundtrip_ref(x_all) if cfg.use_fp8 else x_all
    out = swiglu(x_all, p["shared_in"], p["shared_out"])
    for e in range(cfg.num_experts):
        out = out + gate[:, e:e + 1] * swiglu(xe, p["w_in"][e], p["w_out"][e])
    return x_all, out, p


def _fp8_roundtrip_ref(x):
    """Straight-through f32 -> e4m3 (per 128 columns, docs/spec.md §5) -> f32, written from docs/spec.md §5
    in torch (independent of epx): value forward, identity gradient."""
    q = x.detach().reshape(x.shape[0], x.shape[1] // 128, 128)
    amax = q.abs().amax(-1, keepdim=True).clamp_min(1e-4)
    scale = amax / 448.0
    v = (q * (448.0 / amax)).clamp(-448.0, 448.0)
    # round to the nearest e4m3 value, ties to even: 3 mantissa bits, normals from 2^-6
    _, exp = torch.frexp(v.abs().clamp_min(2.0 ** -6))  # |v| = m * 2^exp, m in [0.5, 1)
    step = torch.pow(2.0, (exp - 4).float())
    r = torch.round(v / step) * step  # torch.round rounds half to even
    deq = (r * scale).reshape(x.shape)
    return x + (deq - x).detach()


def probe_for(cfg, xs):
    """A fixed random cotangent per rank: loss = sum(out * probe)."""
    g = torch.Generator().manual_seed(cfg.seed + 2000)
    return [torch.randn(x.shape, generator=g) for x in xs]


def _rel(got, want):
    err = (got.float() - want.float()).abs().max().item() if got.numel() else 0.0
    ref = want.float().abs().max().item() if want.numel() else 0.0
    return err, ref, err / max(ref, 1e-30)


def check(cfg, buffer, rank, num_ranks, allreduce):
    """Forward + backward on this rank vs the dense reference. Returns (ok, report lines,
    {name: max|err| / max|ref|})."""
    params = init_params(cfg)
    xs, _ = make_batch(cfg, num_ranks)
    probes = probe_for(cfg, xs)
    layer = MoELayer(cfg, buffer, rank, num_ranks, params)
    x = xs[rank].clone().requires_grad_(True)
    out = layer(x)
    (out.float() * probes[rank]).sum().backward()
    for prm in layer.replicated():
        allreduce(prm.grad)

    x_all, ref_out, ref_p = dense_reference(cfg, params, xs)
    (ref_out * torch.cat(probes)).sum().backward()
    lo = sum(cfg.tokens[r % len(cfg.tokens)] for r in range(rank))
    hi = lo + x.shape[0]
    L = layer.num_local
    mine = slice(rank * L, (rank + 1) * L)
    pairs = [("out", out, ref_out[lo:hi]), ("grad x", x.grad, x_all.grad[lo:hi]),
             ("grad router", layer.router.grad, ref_p["router"].grad),
             ("grad shared_in", layer.shared_in.grad, ref_p["shared_in"].grad),
             ("grad shared_out", layer.shared_out.grad, ref_p["shared_out"].grad),
             ("grad w_in", layer.w_in.grad, ref_p["w_in"].grad[mine]),
             ("grad w_out", layer.w_out.grad, ref_p["w_out"].grad[mine])]
    errs, lines, ok = {}, [], True
    for name, got, want in pairs:
        err, ref, rel = _rel(got, want)
        errs[name] = rel
        ok = ok and rel <= TOL
        lines.append("rank %d %-15s max|err| %.3e  max|ref| %.3e  rel %.2e %s" % (
            rank, name, err, ref, rel, "ok" if rel <= TOL else "MISMATCH"))
    if cfg.use_fp8:  # how far FP8 moves the output: the check must be finer than that
        bf16_cfg = Config(**{**vars(cfg), "use_fp8": False})
        _, ref16, _ = dense_reference(bf16_cfg, params, xs)
        errs["fp8 effect"] = _rel(ref_out[lo:hi].detach(), ref16[lo:hi].detach())[2]
        lines.append("rank %d FP8 moves the dense output by rel %.2e" % (rank, errs["fp8 effect"]))
    return ok, lines, errs


def train(cfg, buffer, rank, num_ranks, allreduce, steps=5, lr=0.5):
    """A few SGD steps on a fixed batch; returns the global loss before every step."""
    params = init_params(cfg)
    xs, targets = make_batch(cfg, num_ranks)
    layer = MoELayer(cfg, buffer, rank, num_ranks, params)
    n_all = float(sum(t.numel() for t in targets))
    losses = []
    for _ in range(steps):
        layer.zero_grad()
        out = layer(xs[rank])
        loss = ((out.float() - targets[rank]) ** 2).sum() / n_all
        loss.backward()
        total = loss.detach().clone()
        allreduce(total)
        losses.append(total.item())
        for prm in layer.replicated():
            allreduce(prm.grad)
        with torch.no_grad():
            for prm in layer.parameters():
                prm -= lr * prm.grad
    return losses


def make_buffer(cfg, group=None):
    return epx.EPBuffer(group, num_max_tokens_per_rank=max(cfg.tokens), hidden=cfg.hidden,
                        num_topk=cfg.topk, num_experts=cfg.num_experts,
                        use_fp8_dispatch=cfg.use_fp8)


def run_rank(rank, num_ranks, cfg, group=None, allreduce=None):
    """Check and train on this rank; returns (ok, report lines, losses, errs)."""
    allreduce = allreduce or (lambda t: dist.all_reduce(t, group=group))
    with make_buffer(cfg, group) as buffer:
        ok, lines, errs = check(cfg, buffer, rank, num_ranks, allreduce)
        losses = train(cfg, buffer, rank, num_ranks, allreduce)
    return ok, lines, losses, errs


def report(ok, lines, losses, errs=None):
    print("\n".join(lines), flush=True)
    lowered = losses[-1] < losses[0]
    print("loss per step: %s (%s)" % (" ".join("%.5f" % v for v in losses),
                                      "lowered" if lowered else "NOT lowered"), flush=True)
    return ok and lowered


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fp8", action="store_true", help="FP8 dispatch (docs/spec.md §5 cast)")
    ap.add_argument("--launch", type=int, metavar="P",
                    help="start P ranks with epx.launch instead of running under torchrun")
    args = ap.parse_args(argv)
    cfg = Config(use_fp8=args.fp8)
    torch.set_num_threads(1)
    if args.launch:
        results = epx.launch(_launched, args.launch, cfg, start_method="fork")
        ok = True
        for r in results:
            ok = report(*r) and ok
        return 0 if ok else 1
    dist.init_process_group("gloo")
    rank, num_ranks = dist.get_rank(), dist.get_world_size()
    ok = report(*run_rank(rank, num_ranks, cfg))
    flag = torch.tensor([0 if ok else 1])
    dist.all_reduce(flag)
    dist.destroy_process_group()
    return 0 if flag.item() == 0 else 1


def _launched(rank, num_ranks, cfg):
    return run_rank(rank, num_ranks, cfg)


if __name__ == "__main__":
    sys.exit(main())
