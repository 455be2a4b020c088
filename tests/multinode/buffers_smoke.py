"""The four buffer kinds on a torch.distributed group, for torchrun (env://):

    torchrun ... tests/multinode/buffers_smoke.py --backend epx|gloo [--timeout SECONDS]

After init_process_group on the default group, every rank builds on that group (epx's
"auto" transport: UCX when the ranks span machines) each buffer kind and checks its calls
against a reference it computes itself from inputs every rank is known to have:

  * EPBuffer: dispatch + combine of 32 tokens a rank, hidden 256, top-2 of 8 experts,
    compact and expanded, bit for bit against the numpy reference of docs/spec.md
    (tests/e2e/epx_ref.py through tests/python/epx_cases.py);
  * BucketBuffer on the world and on the pairs (r, r + P/2) (one rank of each machine when
    the job has two): all_gather into a storage tensor, reduce_scatter and all_reduce of
    integer-valued float32 (exact in any order, so bit for bit);
  * PPBuffer: send/recv around the ring and to the rank P/2 away (the other machine), several
    messages in flight, every byte checked;
  * EngramBuffer: fetch of rows of every rank's shard (other machines' included, and -1 =
    a zero row) of two bf16 layers, against the whole table computed here.

Prints "buffers_smoke: rank R: <check> ok" per check and at the end
"buffers_smoke: OK rank R of P on HOST: N checks (ep E, bucket B, pp Q, engram G;
transport T, engram path X)". Any difference or error prints "buffers_smoke: rank R on
HOST: FAILED: <what differed>" on stderr and exits 1.
"""
import argparse
import datetime
import os
import socket
import sys
import traceback

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))  # epx_cases: the EP problems and checks
sys.path.insert(0, os.path.join(HERE, "..", "e2e"))  # epx_ref: the numpy reference

TOKENS, HIDDEN, TOPK, EXPERTS = 32, 256, 2, 8


def _ints(rank, n, salt):
    """Integer-valued float32 below 2^12: sums of a few are exact in any order."""
    return ((torch.arange(n, dtype=torch.int64) * 13 + rank * 101 + salt * 7) % 2001 - 1000).to(torch.float32)


class Smoke:
    def __init__(self):
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        self.host = socket.gethostname()
        self.counts = {"ep": 0, "bucket": 0, "pp": 0, "engram": 0}
        self.engram_path = "?"

    def ok(self, kind, what, got, want):
        if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
            bad = (got != want).nonzero()[:4].tolist() if got.shape == want.shape else "shape"
            raise AssertionError(f"{kind} {what}: result differs from the reference (first differing indices {bad}; "
                                 f"got {got.dtype} {tuple(got.shape)}, want {want.dtype} {tuple(want.shape)})")
        self.passed(kind, what)

    def passed(self, kind, what):
        self.counts[kind] += 1
        print(f"buffers_smoke: rank {self.rank}: {kind} {what} ok", flush=True)

    # -- EPBuffer ----------------------------------------------------------------------
    def ep(self):
        import epx
        from epx_cases import checked_pair
        P = self.size
        assert EXPERTS % P == 0, f"{EXPERTS} experts do not split over {P} ranks"
        buf = epx.EPBuffer(None, num_max_tokens_per_rank=TOKENS, hidden=HIDDEN, num_topk=TOPK, num_experts=EXPERTS)
        for expanded, seed in ((False, 11), (True, 12)):
            layout = "expanded" if expanded else "compact"
            try:  # raises AssertionError naming the output and rank that differ
                checked_pair(buf, P, self.rank, EXPERTS // P, TOPK, HIDDEN, [TOKENS] * P, seed, expanded)
            except AssertionError as e:
                raise AssertionError(f"ep dispatch + combine ({layout}): {e}") from None
            self.passed("ep", f"dispatch + combine {layout} ({TOKENS} tokens, hidden {HIDDEN}, "
                        f"top-{TOPK} of {EXPERTS} experts)")
        buf.destroy()

    # -- BucketBuffer ------------------------------------------------------------------
    def bucket(self):
        import epx
        P, me, half = self.size, self.rank, self.size // 2
        world = list(range(P))
        pairs = [[r, r + half] for r in range(half)] if P % 2 == 0 else []
        groups = [world] + pairs
        n = 3000  # per member: a multiple of every group's size for reduce_scatter
        plan = epx.BufferAllocator()
        gathered = plan.allocate((P * n,), torch.float32)
        scattered = plan.allocate((P * n,), torch.float32)
        reduced = plan.allocate((n,), torch.float32)
        buf = epx.BucketBuffer(groups, plan)
        for gi, members in enumerate(groups):
            if me not in members:
                continue
            m, pos, salt = len(members), members.index(me), 10 * gi
            name = "world" if gi == 0 else f"ranks {members}"
            out = buf.all_gather(_ints(me, n, salt), gathered[:m * n], group=gi).wait()
            self.ok("bucket", f"all_gather {name}", out.view(-1)[:m * n].clone(),
                    torch.cat([_ints(r, n, salt) for r in members]))
            scattered[:m * n] = _ints(me, m * n, salt + 1)
            shard = buf.reduce_scatter(scattered[:m * n], group=gi).wait()
            full = sum(_ints(r, m * n, salt + 1) for r in members)
            k = n  # each member's shard: (m * n) / m
            self.ok("bucket", f"reduce_scatter {name}", shard.view(-1).clone(), full[pos * k:(pos + 1) * k])
            reduced[:] = _ints(me, n, salt + 2)
            got = buf.all_reduce(reduced, scale=0.5, group=gi).wait()
            self.ok("bucket", f"all_reduce {name} (scale 0.5)", got.view(-1).clone(),
                    sum(_ints(r, n, salt + 2) for r in members) * 0.5)
        buf.destroy()

    # -- PPBuffer ----------------------------------------------------------------------
    def pp(self):
        import epx
        P, me = self.size, self.rank
        sizes = [5, 4096, 70001]  # float32 elements per message: tiny, 16 KiB, > 256 KiB
        inflight = len(sizes)
        buf = epx.PPBuffer(None, num_max_tensor_bytes=max(sizes) * 4, num_max_inflight_tensors=inflight)

        def msg(src, dst, k):
            return _ints(src * 17 + dst, sizes[k], k + 40)

        for what, step in (("ring", 1), ("other half", P // 2)):
            if step == 0:
                continue
            dst, src = (me + step) % P, (me - step) % P
            for k in range(len(sizes)):  # eager: every message fits a slot, so no rank waits to send
                buf.send(msg(me, dst, k), dst)
            for k in range(len(sizes)):
                got = buf.recv(torch.empty(sizes[k]), src)
                self.ok("pp", f"{what} recv {sizes[k]} float32 from rank {src} (message {k})", got, msg(src, me, k))
        st = buf.stats((me + P // 2) % P)
        if P > 1 and st["received"] < len(sizes):
            raise AssertionError(f"pp stats: received {st['received']} messages from rank {(me + P // 2) % P}, "
                                 f"expected at least {len(sizes)}")
        buf.destroy()

    # -- EngramBuffer ------------------------------------------------------------------
    def engram(self):
        import epx
        P, me = self.size, self.rank
        rows, layers, T, E = 64, 2, 16, 4  # rows per rank and layer; tokens; entries per token

        def table(l):  # the whole layer: bf16 integers below 256 (exact)
            g = torch.arange(P * rows, dtype=torch.int64).view(-1, 1)
            c = torch.arange(HIDDEN, dtype=torch.int64).view(1, -1)
            return ((g * 5 + c * 3 + l * 29) % 255 - 127).to(torch.bfloat16)

        nb, ns = epx.EngramBuffer.get_storage_size_hint(None, [rows] * layers, HIDDEN, T, E, torch.bfloat16)
        buf = epx.EngramBuffer(None, nb, ns)
        self.engram_path = buf.path
        buf.set_config([rows] * layers, HIDDEN, T, E, torch.bfloat16)
        buf.write([table(l)[me * rows:(me + 1) * rows].contiguous() for l in range(layers)])
        dist.barrier()  # every shard written before anyone reads a peer's
        # every rank's rows, the other machine's included, and -1 (a zero row); per rank its own order
        t = torch.arange(layers * T * E, dtype=torch.int64).view(layers, T, E)
        idx = ((t * 37 + me * 11) % (P * rows)).to(torch.int32)
        idx[:, ::5, 1] = -1
        hooks = buf.fetch(idx)
        for l in range(layers):
            got = hooks[l]()
            full = torch.cat([table(l), torch.zeros(1, HIDDEN, dtype=torch.bfloat16)])
            pick = torch.where(idx[l] >= 0, idx[l].long(), torch.full_like(idx[l].long(), P * rows))  # -1: the zero row
            want = full[pick.view(-1)].reshape(T, E * HIDDEN)
            owners = sorted({int(i) // rows for i in idx[l].view(-1).tolist() if i >= 0})
            self.ok("engram", f"fetch layer {l} ({T} x {E} rows of ranks {owners})", got.reshape(T, E * HIDDEN).clone(), want)
        stats = hooks.stats
        remote = sum(1 for i in idx.view(-1).tolist() if i >= 0 and i // rows != me)
        moved = stats.get("rows_mapped", 0) + stats.get("rows_get", 0) + stats.get("rows_served", 0)
        if moved != remote:
            raise AssertionError(f"engram stats: {moved} rows from peers ({stats}), expected {remote}")
        self.passed("engram", f"fetch stats ({stats.get('rows_get', 0)} rows by get, "
                    f"{stats.get('rows_mapped', 0)} mapped, {stats.get('rows_served', 0)} served)")
        buf.destroy()

    def run(self):
        from epx.group import transport_of
        kind = transport_of(None).name
        print(f"buffers_smoke: rank {self.rank} on {self.host}: transport {kind}", flush=True)
        self.ep()
        self.bucket()
        self.pp()
        self.engram()
        dist.barrier()
        c = self.counts
        print(f"buffers_smoke: OK rank {self.rank} of {self.size} on {self.host}: {sum(c.values())} checks "
              f"(ep {c['ep']}, bucket {c['bucket']}, pp {c['pp']}, engram {c['engram']}; transport {kind}, "
              f"engram path {self.engram_path})", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", default="gloo")
    ap.add_argument("--timeout", type=float, default=60, help="the process group's timeout, seconds")
    a = ap.parse_args()
    rank = int(os.environ.get("RANK", -1))
    try:
        if a.backend == "epx":
            import epx.distributed  # noqa: F401  (registers the backend)
        dist.init_process_group(a.backend, init_method="env://", timeout=datetime.timedelta(seconds=a.timeout))
        Smoke().run()
        dist.destroy_process_group()
    except BaseException as e:  # noqa: BLE001
        text = f"{type(e).__name__}: {e}"
        print(f"buffers_smoke: rank {rank} on {socket.gethostname()}: FAILED: {text}", file=sys.stderr, flush=True)
        traceback.print_exc(file=sys.stderr)
        sys.stderr.flush()
        os._exit(1)  # no teardown of a failed group (its peers may be gone: that could wait)


if __name__ == "__main__":
    main()
