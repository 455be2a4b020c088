"""The README's Python snippet runs as written, so a newcomer who follows it meets no trap:
every rank of an epx.launch runs it, given the tensors it names, and the combined
rows are checked against the same computation done densely."""
import os
import re

import torch

import epx

README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")
P, S, H, K, E = 4, 6, 128, 2, 8


def _snippet():
    text = open(README, encoding="utf-8").read()
    section = text[text.index("\n## Python\n"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def _inputs(rank):
    g = torch.Generator().manual_seed(300 + rank)
    x = torch.randn(S, H, generator=g).bfloat16()
    topk_idx = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(S)])
    topk_weights = torch.rand(S, K, generator=g)
    return x, topk_idx, topk_weights


def _run(rank, n, code):
    x, topk_idx, topk_weights = _inputs(rank)
    scope = dict(S=S, H=H, K=K, E=E, x=x, topk_idx=topk_idx, topk_weights=topk_weights, x2=x * 2,
                 shared_out=torch.zeros(S, H, dtype=torch.bfloat16),
                 run_experts=lambda recv_x, handle: recv_x)  # identity experts
    exec(compile(code, "README.md", "exec"), scope)
    return scope["combined_x"], scope["recv_x2"]


def test_readme_snippet_runs():
    for r, (combined, recv2) in enumerate(epx.launch(_run, P, _snippet(), start_method="fork")):
        x, idx, w = _inputs(r)
        # identity experts, weighted combine: sum over the token's slots of weight * row
        want = (w.sum(dim=1, keepdim=True) * x.float()).bfloat16()
        torch.testing.assert_close(combined.float(), want.float(), rtol=2e-2, atol=2e-2)
        assert recv2.dtype == torch.bfloat16
