"""What zero padding costs: an expanded dispatch with do_zero_padding=True (the default)
against False, interleaved call by call on the same routing, P ranks of this machine.

    /usr/bin/python3 -m epx.bench_padding [--ranks 4] [--tokens 512] [--hidden 2048]
        [--topk 8] [--experts 32] [--alignment 128] [--calls 40]

Prints per-rank medians and their ratio (zero / unspecified), and the padding rows' share
of the output: the memset is of those rows only.
"""
import argparse
import json
import time

import epx


def _rank(rank, n, a):
    import torch
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(a.tokens, a.hidden, generator=g).bfloat16()
    idx = torch.stack([torch.randperm(a.experts, generator=g)[:a.topk] for _ in range(a.tokens)])
    w = torch.rand(a.tokens, a.topk, generator=g)
    times = {True: [], False: []}
    with epx.EPBuffer(None, num_max_tokens_per_rank=a.tokens, hidden=a.hidden, num_topk=a.topk,
                      num_experts=a.experts) as buf:
        for i in range(2 * a.calls + 4):
            zero = i % 2 == 0
            t0 = time.perf_counter()
            out = buf.dispatch(x, idx, w, do_expand=True, expert_alignment=a.alignment, do_zero_padding=zero)
            dt = time.perf_counter() - t0
            if i >= 4:  # warm-up
                times[zero].append(dt)
        h = out[3]
        rows = h.num_recv_rows
        padding = rows - sum(h.num_recv_tokens_per_expert)
    med = {k: sorted(v)[len(v) // 2] * 1e6 for k, v in times.items()}
    return {"zero_us": med[True], "unspecified_us": med[False], "ratio": med[True] / med[False],
            "rows": rows, "padding_rows": padding}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name, v in (("ranks", 4), ("tokens", 512), ("hidden", 2048), ("topk", 8), ("experts", 32),
                    ("alignment", 128), ("calls", 40)):
        p.add_argument("--" + name, type=int, default=v)
    a = p.parse_args()
    res = epx.launch(_rank, a.ranks, a, start_method="fork")
    for r, x in enumerate(res):
        print(f"rank {r}: zero {x['zero_us']:.0f} us, unspecified {x['unspecified_us']:.0f} us, "
              f"ratio {x['ratio']:.3f}; {x['padding_rows']} of {x['rows']} rows are padding")
    print(json.dumps({"median_ratio": sorted(x["ratio"] for x in res)[len(res) // 2]}))


if __name__ == "__main__":
    main()
