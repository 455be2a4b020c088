"""torch.distributed smoke program for torchrun (env://), on any backend:

    torchrun ... tests/multinode/dist_smoke.py --backend gloo|epx [--elements N] [--loop SECONDS]

Every rank runs all_reduce, all_gather, all_to_all_single (uneven splits), broadcast and
send/recv around a ring, and checks each result against a reference it computes itself from
the inputs every rank is known to have (integer-valued float32 below 2^24: every summation
order gives the same bits, so the check is exact on any backend). Prints one line per check
and "dist_smoke: rank R of P on HOST: N checks passed" at the end.

--mixed K: after the checks, K rounds of (all_to_all_single of several MB per pair, then a
barrier on a gloo group), the pattern of a job that mixes an epx group with gloo (one more
check).

--loop S: after the checks, repeat a checked all_reduce for S seconds, printing
"dist_smoke: rank R iteration K" each time (the fault tests kill a rank or cut the link while
this runs). Any error prints "dist_smoke: rank R on HOST: FAILED: <message>" on stderr and
exits 1 at once (a failed group is not torn down: its peers may be gone).
"""
import argparse
import datetime
import os
import socket
import sys
import time
import traceback

import torch
import torch.distributed as dist


def _value(rank, n, salt):
    """This rank's known input: integer-valued float32 (exact sums in any order)."""
    return ((torch.arange(n, dtype=torch.int64) * 7 + rank * 131 + salt * 17) % 1000).to(torch.float32)


def _rows(src, dst, salt):
    """Rows src sends dst in all_to_all_single: uneven (1..4, some pairs none)."""
    return (src * 3 + dst * 2 + salt) % 5


class Smoke:
    def __init__(self, args):
        self.a = args
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        self.host = socket.gethostname()
        self.checks = 0
        self.quiet = False  # the loop prints its iterations only

    def ok(self, what, got, want):
        if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
            bad = (got != want).nonzero()[:4].tolist() if got.shape == want.shape else "shape"
            raise AssertionError(f"{what}: result differs from the reference (first differing indices {bad}; "
                                 f"got {got.dtype} {tuple(got.shape)}, want {want.dtype} {tuple(want.shape)})")
        self.checks += 1
        if not self.quiet:
            print(f"dist_smoke: rank {self.rank}: {what} ok", flush=True)

    def all_reduce(self, salt=0):
        n, P = self.a.elements, self.size
        t = _value(self.rank, n, salt)
        dist.all_reduce(t)
        self.ok(f"all_reduce {n} float32", t, sum(_value(r, n, salt) for r in range(P)))

    def all_gather(self):
        n, P = self.a.elements // 4 + 1, self.size
        outs = [torch.empty(n) for _ in range(P)]
        dist.all_gather(outs, _value(self.rank, n, 1))
        self.ok(f"all_gather {n} float32", torch.stack(outs), torch.stack([_value(r, n, 1) for r in range(P)]))

    def all_to_all(self):
        P, me, w = self.size, self.rank, 96  # rows of 96 int32: every (src, dst, row) distinct

        def block(src, dst):
            k = _rows(src, dst, 2)
            return (torch.arange(k * w, dtype=torch.int32).view(k, w) + (src * 1000 + dst) * 100000)

        send = torch.cat([block(me, d) for d in range(P)])
        splits_in = [_rows(me, d, 2) for d in range(P)]
        splits_out = [_rows(s, me, 2) for s in range(P)]
        out = torch.empty(sum(splits_out), w, dtype=torch.int32)
        dist.all_to_all_single(out, send, splits_out, splits_in)
        self.ok(f"all_to_all_single uneven {splits_in}->{splits_out} rows", out, torch.cat([block(s, me) for s in range(P)]))

    def broadcast(self):
        n, root = 4099, self.size - 1  # a root on the last machine
        t = _value(self.rank, n, 3)
        dist.broadcast(t, src=root)
        self.ok(f"broadcast {n} float32 from rank {root}", t, _value(root, n, 3))

    def send_recv(self):
        """Around the ring: even ranks send first, odd receive first (no cycle of waits)."""
        P, me, n = self.size, self.rank, self.a.elements // 8 + 3
        nxt, prv = (me + 1) % P, (me - 1) % P
        out, got = _value(me, n, 4), torch.empty(n)
        if me % 2 == 0:
            dist.send(out, nxt)
            dist.recv(got, prv)
        else:
            dist.recv(got, prv)
            dist.send(out, nxt)
        self.ok(f"send/recv {n} float32 from rank {prv}", got, _value(prv, n, 4))

    def mixed(self):
        """--mixed K: K rounds of an all_to_all_single of several chunks per pair on this
        group, each followed by a barrier on a gloo group: a rank that is done with its part
        waits in gloo (no more calls on this group), so whatever its peers still need from it
        must have been sent before its call returned."""
        P, me, w = self.size, self.rank, 4096
        gloo = dist.new_group(backend="gloo")
        rows = [((me + d) % P + 1) * 300 for d in range(P)]  # 2.3-9.4 MB per pair: several chunks
        recv = [((s + me) % P + 1) * 300 for s in range(P)]
        send = torch.cat([torch.full((rows[d], w), float(me * 10 + d)) for d in range(P)])
        want = torch.cat([torch.full((recv[s], w), float(s * 10 + me)) for s in range(P)])
        for k in range(self.a.mixed):
            out = torch.empty(sum(recv), w)
            dist.all_to_all_single(out, send, recv, rows)
            if not torch.equal(out, want):
                raise AssertionError(f"mixed round {k}: all_to_all_single differs from the reference")
            if me == P - 1:
                time.sleep(0.2)  # the last rank comes late to the barrier: its peers are done and wait
            dist.barrier(group=gloo)
            print(f"dist_smoke: rank {me}: mixed round {k} done", flush=True)  # where a stalled run stopped
        self.checks += 1
        print(f"dist_smoke: rank {me}: {self.a.mixed} rounds of all_to_all_single then a gloo barrier ok", flush=True)

    def run(self):
        self.all_reduce()
        self.all_gather()
        self.all_to_all()
        self.broadcast()
        self.send_recv()
        if self.a.mixed:
            self.mixed()
        dist.barrier()
        pg = dist.distributed_c10d._get_default_group()
        kind = getattr(getattr(pg, "_transport", None), "name", None)  # epx's transport (shm, ucx, ...)
        how = f"backend {dist.get_backend()}" + (f", transport {kind}" if kind else "")
        print(f"dist_smoke: rank {self.rank} of {self.size} on {self.host}: {self.checks} checks passed ({how})",
              flush=True)
        if self.a.loop:
            end, k = time.monotonic() + self.a.loop, 0
            self.quiet = True
            while time.monotonic() < end:
                self.all_reduce(salt=k % 7)
                print(f"dist_smoke: rank {self.rank} iteration {k}", flush=True)
                k += 1
                time.sleep(0.05)
            print(f"dist_smoke: rank {self.rank} on {self.host}: loop of {k} iterations done", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", default="gloo")
    ap.add_argument("--elements", type=int, default=1 << 18, help="all_reduce size in float32 elements")
    ap.add_argument("--timeout", type=float, default=60, help="the process group's timeout, seconds")
    ap.add_argument("--loop", type=float, default=0, help="then all_reduce in a loop for this many seconds")
    ap.add_argument("--mixed", type=int, default=0, help="rounds of all_to_all_single, each then a gloo barrier")
    a = ap.parse_args()
    rank = int(os.environ.get("RANK", -1))
    try:
        if a.backend == "epx":
            import epx.distributed  # noqa: F401  (registers the backend)
        dist.init_process_group(a.backend, init_method="env://", timeout=datetime.timedelta(seconds=a.timeout))
        Smoke(a).run()
        dist.destroy_process_group()
    except BaseException as e:  # noqa: BLE001
        text = f"{type(e).__name__}: {e}"
        print(f"dist_smoke: rank {rank} on {socket.gethostname()}: FAILED: {text}", file=sys.stderr, flush=True)
        traceback.print_exc(file=sys.stderr)
        sys.stderr.flush()
        os._exit(1)  # no teardown of a failed group (its peers may be gone: that could wait)


if __name__ == "__main__":
    main()
