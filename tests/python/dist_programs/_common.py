"""What the end-to-end programs share: the command line, init by env:// (torchrun, one machine
or several), and one verdict agreed by every rank (exit status 1 with the reasons on a mismatch)."""
import argparse
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist


def setup(prog, doc, extra=None):
    ap = argparse.ArgumentParser(prog=prog, description=doc)
    ap.add_argument("--backend", default="epx", help="the backend under test: epx (default) or gloo")
    ap.add_argument("--timeout", type=float, default=120.0, help="the process group's timeout, seconds")
    if extra:
        extra(ap)
    a = ap.parse_args()
    if a.backend == "epx":
        import epx.distributed  # noqa: F401  registers the backend
    if "RANK" not in os.environ:
        sys.exit(f"{prog}: run me under torchrun (env:// needs RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)")
    dist.init_process_group(a.backend, init_method="env://", timeout=datetime.timedelta(seconds=a.timeout))
    a.rank, a.size, a.t0 = dist.get_rank(), dist.get_world_size(), time.time()
    return a


class Checks:
    """Named comparisons of this rank; finish() agrees on them with every rank."""

    def __init__(self, prog, rank):
        self.prog, self.rank, self.failed, self.n = prog, rank, [], 0

    def close(self, name, got, want, rtol=1e-5, atol=1e-6):
        self.n += 1
        if self.n == 1 and self.rank == 1 and os.environ.get("EPX_DIST_PROGRAM_SABOTAGE") == "1":
            got = got + 1e-2  # the failure path's own test: rank 1's first comparison is off
        if got.shape != want.shape or not torch.allclose(got, want, rtol=rtol, atol=atol):
            diff = ((got - want).abs().max().item() if got.shape == want.shape
                    else f"shapes {tuple(got.shape)} vs {tuple(want.shape)}")
            self.failed.append(f"{name}: max |difference| {diff} (rtol {rtol}, atol {atol})")

    def equal(self, name, got, want):
        self.n += 1
        if got.shape != want.shape or not torch.equal(got, want):
            self.failed.append(f"{name}: not bitwise equal")

    def true(self, name, ok, detail=""):
        self.n += 1
        if not ok:
            self.failed.append(f"{name}: {detail}")

    def finish(self, summary, group=None):
        """Every rank's failures, gathered over `group` (the default group if None); rank 0
        prints them or the summary line; exits 1 on any failure."""
        finish_all([(self, summary)], group)


def finish_all(results, group=None):
    """finish() of several programs run one after another in one job: [(Checks, summary)],
    one gather of every rank's verdicts; rank 0 prints each program's failures or summary
    line; exits 1 if any program failed on any rank."""
    verdicts = [None] * dist.get_world_size(group)
    dist.all_gather_object(verdicts, [(c.rank, c.n, c.failed) for c, _ in results], group=group)
    failed = False
    for i, (c, summary) in enumerate(results):
        mine = [v[i] for v in verdicts]
        bad = [(r, f) for r, _, fs in mine for f in fs]
        failed = failed or bool(bad)
        if c.rank == 0:
            if bad:
                for r, f in bad:
                    print(f"{c.prog}: FAILED on rank {r}: {f}", file=sys.stderr, flush=True)
                print(f"{c.prog}: FAILED {len(bad)} of {sum(v[1] for v in mine)} checks ({summary})", flush=True)
            else:
                print(f"{c.prog}: OK {sum(v[1] for v in mine)} checks; {summary}", flush=True)
    dist.destroy_process_group()
    sys.exit(1 if failed else 0)
