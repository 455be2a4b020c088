"""python -m epx.bench_binding — what one EPBuffer call costs from Python, back to back.

    /usr/bin/python3 -m epx.bench_binding [--rounds 5] [--calls 300] [--workers 1]
        [--compare PYTHONPATH_DIR] [--epx PATH]

One rank (epx.launch), S=16 H=128 E=4 K=4, expanded layout: the latency (median over
--calls back-to-back calls, the first 20 dropped) of EPBuffer.dispatch, of the native
_epx dispatch call alone, of an async dispatch waited on at once (the price of handing
the call to a thread of its own and back) and of EPBuffer.combine, with torch tensors. Back to back, not
after a sleep: on a shared machine a call that starts after a sleep runs on cold caches and
costs ~10x more (even `x.__dlpack__()` does), which is not the binding's cost.
--compare DIR: another build of the package (a directory holding `epx/`) measured the same
way in alternating processes (this one, then DIR, --rounds times): the before/after of a
change in one run.
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

_CHILD = r"""
import json, sys, time
import numpy as np, torch, epx

def rank_main(rank, n, calls, workers):
    torch.set_num_threads(1)
    S, H, K, E = 16, 128, 4, 4
    g = torch.Generator().manual_seed(1)
    idx = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(S)])
    w = torch.rand(S, K, generator=g)
    x = torch.randn(S, H, generator=g).bfloat16()
    out = {}
    with epx.EPBuffer(None, num_max_tokens_per_rank=S, hidden=H, num_topk=K, num_experts=E, num_workers=workers) as buf:
        def timed(name, fn):
            ts = []
            for _ in range(calls):
                t0 = time.perf_counter()
                fn()
                ts.append((time.perf_counter() - t0) * 1e6)
            out[name] = float(np.median(ts[20:]))
        timed("dispatch", lambda: buf.dispatch(x, idx, w, do_expand=True))
        b = buf._b
        try:  # the native call alone (its signature is the binding's own, not an API)
            native = lambda: b.dispatch(x, None, idx, w, None, True, 1, 0, False, False, "torch", 0, "", "")
            native()
        except TypeError:
            native = lambda: b.dispatch(x, None, idx, w, None, True, 1, 0, False, False, "torch", False, "", "")
        timed("native dispatch", native)
        def async_wait():  # an older build returned only the event
            r = buf.dispatch(x, idx, w, do_expand=True, async_with_compute_stream=True)
            (r[4] if isinstance(r, tuple) else r).wait()
        timed("async dispatch + wait", async_wait)
        r = buf.dispatch(x, idx, w, do_expand=True)
        timed("combine", lambda: buf.combine(r[0], r[3]))
    return out

if __name__ == "__main__":
    print(json.dumps(epx.launch(rank_main, 1, int(sys.argv[1]), int(sys.argv[2]), start_method="fork")[0]))
"""


def _measure(pythonpath, calls, workers):
    env = dict(os.environ, PYTHONPATH=pythonpath)
    r = subprocess.run([sys.executable, "-c", _CHILD, str(calls), str(workers)], env=env, capture_output=True,
                       text=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError("measurement failed:\n" + r.stderr[-2000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m epx.bench_binding", description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--workers", type=int, default=1, help="the EPBuffer's num_workers (default 1: no wake-ups)")
    ap.add_argument("--compare", help="a directory with another build's `epx` package")
    a = ap.parse_args(argv)
    here = os.path.dirname(HERE)
    pkgs = [("this", here)] + ([("compare", os.path.abspath(a.compare))] if a.compare else [])
    runs = {name: [] for name, _ in pkgs}
    for _ in range(a.rounds):
        for name, path in pkgs:
            runs[name].append(_measure(path, a.calls, a.workers))
    keys = list(runs["this"][0])
    print("epx.bench_binding: 1 rank, S=16 H=128 E=4 K=4 expanded, num_workers=%d; median us per call over "
          "%d back-to-back calls; %d alternating rounds; load average %.1f" % (
              a.workers, a.calls - 20, a.rounds, os.getloadavg()[0]))
    for name, path in pkgs:
        cells = []
        for k in keys:
            vals = sorted(r[k] for r in runs[name])
            cells.append("%s %.1f (%.1f-%.1f)" % (k, vals[len(vals) // 2], vals[0], vals[-1]))
        print("  %-8s %s   [%s]" % (name, ";  ".join(cells), path))
    if a.compare:
        med = {n: {k: sorted(r[k] for r in runs[n])[len(runs[n]) // 2] for k in keys} for n in runs}
        print("  compare/this: " + ";  ".join("%s %.2fx" % (k, med["compare"][k] / med["this"][k]) for k in keys))
    return 0


if __name__ == "__main__":
    sys.exit(main())
