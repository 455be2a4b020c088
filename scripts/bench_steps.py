"""The steps of scripts/benchmarks.py: each runs its commands (epx bench, python -m epx.bench,
epx sim published) and returns the rows of the figures it measures (bench_run.row), or
raises Skip (this machine cannot run it) or StepError (a command failed or disagreed)."""

import json
import os
import shutil
import statistics
import sys

from bench_run import (REPO, Skip, StepError, gbps, median, median_member, not_measured, ratio, row,
                       us_text)

sys.path.insert(0, os.path.join(REPO, "tests", "multinode"))
import machines  # noqa: E402  (the namespace machines, shared with tests/e2e/check_diagnose.py)


# ----------------------------------------------------------------------------------------
# Steps
# ----------------------------------------------------------------------------------------

def ep_shape(r, tokens):
    if r.quick:
        return ["--ranks", "4", "--hidden", "1024", "--topk", "4", "--experts", "16", "--tokens", str(min(tokens, 64))]
    return ["--ranks", "8", "--hidden", "7168", "--topk", "8", "--experts", "256", "--tokens", str(tokens)]


def ep_shape_text(r, tokens):
    return ("4 ranks, H 1024, top-4 of 16, %d tok" % min(tokens, 64) if r.quick else
            "8 ranks, H 7168, top-8 of 256, %d tok" % tokens)


def ep_iters(r, large):
    if r.quick:
        return ["--iters", "3", "--warmup", "1"]
    return ["--iters", "4", "--warmup", "1"] if large else ["--iters", "50", "--warmup", "5"]


def step_ep_limit(r, variant):
    """EP dispatch + combine at the large batch against the one-copy limit (memcpy and a
    streaming copy of the same bytes, interleaved in the same processes); the bf16 run also
    times Open MPI's alltoallv dispatcher on the same routing (--baseline mpi)."""
    tokens = 4096
    extra = {"bf16": ["--baseline", "mpi"], "fp8": ["--fp8"], "expanded": ["--layout", "expanded"]}[variant]
    argv = [r.epx, "bench"] + ep_shape(r, tokens) + ep_iters(r, True) + \
        ["--counters-overhead", "0", "--no-progress"] + extra
    runs = []
    for k in range(r.a.rounds if variant == "bf16" else max(1, r.a.rounds - 1)):
        j, full = r.json_of("ep-%s" % variant, argv, 900)
        runs.append(j)
    shape = ep_shape_text(r, tokens) + ("" if variant == "bf16" else ", " + variant)
    rows = []
    for opname in ("dispatch", "combine"):
        rs = [j[opname]["ratio_vs_limit"] for j in runs]
        mid = runs[rs.index(median_member(rs))]
        o = mid[opname]
        rows.append(row(r, "ep_%s_%s_limit" % (variant, opname), gbps(o["algbw_gbps"]),
                        "%s %s" % (o["limit"], gbps(o["limit_gbps"])), rs, full, shape,
                        "avg max-rank %s" % us_text(o["max_rank_us"]["avg"])))
    if variant == "bf16":
        rows.append(mpi_row(r, "ep_round_trip_mpi_large", runs, full, ep_shape_text(r, tokens)))
    return rows


def mpi_row(r, op, runs, argv, shape):
    rs = []
    for j in runs:
        b = j.get("baseline", {})
        if not b.get("available"):  # the rest of the step's figures stand
            return not_measured(r, op, "skipped", "Open MPI baseline: %s" % b.get("why_unavailable", "not run"))
        if not b.get("verified"):
            raise StepError("the MPI baseline's output differs from epx's: %s" % b.get("verify_detail"))
        rs.append(b["speedup_epx_vs_mpi"]["round_trip"])
    j = runs[rs.index(median_member(rs))]
    e = j["dispatch"]["max_rank_us"]["avg"] + j["combine"]["max_rank_us"]["avg"]
    m = j["baseline"]["dispatch"]["max_rank_us"]["avg"] + j["baseline"]["combine"]["max_rank_us"]["avg"]
    return row(r, op, us_text(e), "Open MPI " + us_text(m), rs, argv, shape,
               "avg max-rank; dispatch %.2fx, combine %.2fx" % (
                   j["baseline"]["speedup_epx_vs_mpi"]["dispatch"], j["baseline"]["speedup_epx_vs_mpi"]["combine"]))


def step_ep_mpi(r):
    """The decode-sized round trip against Open MPI (`--baseline mpi`: epx_mpi_baseline, a
    Megatron-style MPI_Alltoallv dispatcher, same routing, outputs compared by hash)."""
    argv = [r.epx, "bench"] + ep_shape(r, 128) + ep_iters(r, False) + \
        ["--counters-overhead", "0", "--no-progress", "--baseline", "mpi"]
    runs = []
    for _ in range(r.a.rounds):
        j, full = r.json_of("ep-mpi", argv, 600)
        runs.append(j)
    return [mpi_row(r, "ep_round_trip_mpi_small", runs, full, ep_shape_text(r, 128))]


def step_ep_gloo(r):
    """python -m epx.bench: EPBuffer from PyTorch against a Megatron-style all_to_all_single
    dispatcher over gloo, interleaved per iteration; and the C++ bench on the same routing."""
    if r.quick:
        shape = ["--ranks", "4", "--tokens", "32", "--hidden", "512", "--experts", "16", "--topk", "4",
                 "--iters", "3", "--warmup", "1"]
        text = "4 ranks, H 512, top-4 of 16, 32 tok"
    else:
        shape = ["--ranks", "8", "--tokens", "128", "--hidden", "7168", "--experts", "256", "--topk", "8",
                 "--iters", "20", "--warmup", "3"]
        text = "8 ranks, H 7168, top-8 of 256, 128 tok"
    argv = [r.python, "-m", "epx.bench"] + shape + ["--no-overlap", "--epx", r.epx]
    runs = []
    for _ in range(max(1, r.a.rounds - 1)):
        j, full = r.json_of("ep-gloo", argv, 900)
        runs.append(j)
    rows = []
    for op, key, which, label in (("ep_round_trip_gloo_python", "compact round trip", "gloo/epx p50", "Python"),
                                  ("ep_round_trip_gloo_expanded", "expanded round trip", "gloo/epx p50", "Python"),
                                  ("ep_round_trip_gloo_cpp", "compact round trip", "gloo/C++ p50", "C++")):
        rs = [j["python"]["ratios"][key][which] for j in runs]
        if any(x is None for x in rs):
            raise StepError("python -m epx.bench gave no %s ratio" % which)
        j = runs[rs.index(median_member(rs))]
        us = j["python"]["max_rank_us"]
        gloo = us["a2a_dispatch"]["p50"] + us["a2a_combine"]["p50"]
        lay = key.split()[0]
        if label == "C++":
            e = j["cpp"][lay]["dispatch"]["p50"] + j["cpp"][lay]["combine"]["p50"]
        else:
            e = us["epx_%s_dispatch" % lay]["p50"] + us["epx_%s_combine" % lay]["p50"]
        rows.append(row(r, op, us_text(e), "gloo " + us_text(gloo), rs, full, text,
                        "p50 max-rank, dispatch + combine"))
    return rows


def step_collective(r, op, size):
    """`epx bench --op OP --bytes N --baseline mpi`: one BucketBuffer call against the copy
    limit (every rank copying N bytes at once, interleaved) and the MPI collective."""
    ranks = "4" if r.quick else "8"
    small = size == "16K"
    if r.quick:
        size = "16K" if small else "1M"
        it = ["--iters", "5", "--warmup", "1"]
    else:
        it = ["--iters", "200", "--warmup", "10"] if small else ["--iters", "5", "--warmup", "1"]
    argv = [r.epx, "bench", "--op", op, "--bytes", size, "--ranks", ranks, "--baseline", "mpi", "--no-progress"] + it
    runs = []
    for _ in range(r.a.rounds):
        j, full = r.json_of(op, argv, 600)
        runs.append(j)
    no_mpi = None
    for j in runs:
        b = j.get("baseline", {})
        if not j["check"]["ok"]:
            raise StepError("%s: epx's result differs from docs/spec.md §8: %s" % (op, j["check"]["failures"][:2]))
        if not b.get("ran"):
            no_mpi = "MPI baseline: %s" % b.get("why_not", "not run")
        elif not b.get("verified"):
            raise StepError("MPI %s's result differs: %s" % (op, b.get("verify_detail")))
    shape = "%s ranks, %s float32, algorithm %s" % (ranks, size, runs[0]["algorithm"])
    rows = []
    if not small:
        rs = [j["limit"]["busbw_vs_limit"] for j in runs]
        j = runs[rs.index(median_member(rs))]
        rows.append(row(r, op + "_limit", "busbw " + gbps(j[op]["busbw_gbps"]),
                        "%s %s per rank" % (j["limit"]["limit"], gbps(j["limit"]["limit_gbps"])), rs, full, shape))
    op_id = "all_reduce_small_mpi" if small else op + "_mpi"
    if no_mpi:
        return rows + [not_measured(r, op_id, "skipped", no_mpi)]
    rs = [j["baseline"]["speedup"] for j in runs]
    j = runs[rs.index(median_member(rs))]
    rows.append(row(r, op_id, us_text(j[op]["max_rank_us"]["avg"]),
                    "MPI " + us_text(j["baseline"]["max_rank_us"]["avg"]), rs, full, shape, "avg max-rank"))
    return rows


def peers_missing(j, what):
    """{peer: why} for the peers of an `epx bench --op pp|engram` run that did not run (their
    figures are skipped, the rest stand); a peer that ran and disagrees fails the step."""
    missing = {}
    peers = {p["name"]: p for p in j["peers"]}
    for name in ("mpi", "gloo"):
        p = peers.get(name, {})
        if not p.get("ran"):
            missing[name] = "%s peer %s: %s" % (what, name, p.get("why_not") or "not run")
        elif not p.get("verified"):
            raise StepError("%s peer %s: not the same bytes as epx: %s" % (what, name, p.get("verify_detail")))
    return missing


def step_pp(r):
    """`epx bench --op pp`: pipelines of two ranks (2k -> 2k+1), a stream of messages and a
    ping-pong per size, MPI and gloo in the same invocation, in turns (--peer-rounds)."""
    large = 1048576 if r.quick else 58720256
    ranks = "4" if r.quick else "8"
    it = ["--iters", "3", "--warmup", "1"] if r.quick else ["--iters", "5", "--warmup", "1"]
    argv = [r.epx, "bench", "--op", "pp", "--ranks", ranks, "--pp-pattern", "pairs", "--pp-sizes",
            "16384,%d" % large, "--pp-inflight", "1", "--peers", "mpi,gloo", "--peer-rounds", str(r.a.rounds),
            "--no-progress"] + it
    j, full = r.json_of("pp", argv, 900)
    missing = peers_missing(j, "PP")
    if not all(s["correct"] for s in j["sizes"]):
        raise StepError("epx's PP delivered wrong bytes")
    sizes = {s["bytes"]: s for s in j["sizes"]}
    big, small = sizes[large], sizes[16384]
    e = big["epx"][0]
    peer = {p["name"]: p for p in big["peers"]}
    spk = {p["name"]: p for p in small["peers"]}
    shape = "%s ranks as %d pairs, %s" % (ranks, int(ranks) // 2, "1 MiB" if r.quick else "56 MiB (4096 × 7168 bf16)")
    rounds = "%d rounds in turns" % r.a.rounds

    def vs_peer(op, name, epx_us, what):
        if name in missing:
            return not_measured(r, op, "skipped", missing[name])
        p = peer[name]["stream_us"]["p50"]
        return row(r, op, us_text(epx_us), "%s %s" % ("MPI" if name == "mpi" else name, us_text(p)),
                   [ratio(p, epx_us)], full, shape, "p50 per message%s; %s" % (what, rounds))

    rows = [row(r, "pp_large_recv_limit", us_text(e["recv_us"]["p50"]), "copy " + us_text(big["copy_us"]["p50"]),
                [ratio(big["copy_us"]["p50"], e["recv_us"]["p50"])], full, shape, "p50 per message; " + rounds),
            vs_peer("pp_large_recv_mpi", "mpi", e["recv_us"]["p50"], ", into the rank's own tensor"),
            vs_peer("pp_large_planned_mpi", "mpi", e["planned_us"]["p50"], ", into a tensor planned in the window"),
            vs_peer("pp_large_recv_gloo", "gloo", e["recv_us"]["p50"], "")]
    if "mpi" in missing:
        return rows + [not_measured(r, "pp_small_pingpong_mpi", "skipped", missing["mpi"])]
    mpi_pairs = spk["mpi"]["pair_latency_us"]
    pair_ratios = [ratio(m["p50"], x["p50"]) for m, x in zip(mpi_pairs, small["pair_latency_us"])]
    rows.append(row(r, "pp_small_pingpong_mpi", us_text(median([x["p50"] for x in small["pair_latency_us"]])),
                    "MPI " + us_text(median([m["p50"] for m in mpi_pairs])), [statistics.mean(pair_ratios)], full,
                    "%s ranks as %d pairs, 16 KiB" % (ranks, int(ranks) // 2),
                    "p50 one way (ping-pong / 2), mean of the pairs' ratios; " + rounds))
    return rows


def step_engram(r):
    """`epx bench --op engram`: remote row fetch of a sharded table against a copy of the same
    bytes, MPI and gloo (requests and rows by all-to-all) in turns (--peer-rounds)."""
    if r.quick:
        shape = ["--ranks", "4", "--engram-rows", "4096", "--engram-layers", "2", "--engram-hidden", "256",
                 "--engram-entries", "8", "--tokens", "64", "--iters", "3", "--warmup", "1"]
        text = "4 ranks, 2 layers × 4096 rows of 256 bf16, 64 tok × 8"
    else:
        shape = ["--ranks", "4", "--engram-rows", "131072", "--engram-layers", "2", "--engram-hidden", "256",
                 "--engram-entries", "24", "--tokens", "512", "--iters", "10", "--warmup", "2"]
        text = "4 ranks, 2 layers × 131072 rows of 256 bf16, 512 tok × 24"
    argv = [r.epx, "bench", "--op", "engram"] + shape + ["--peers", "mpi,gloo", "--peer-rounds", str(r.a.rounds),
                                                           "--no-progress"]
    j, full = r.json_of("engram", argv, 900)
    if not j["correct"]:
        raise StepError("epx's Engram fetched wrong rows")
    missing = peers_missing(j, "Engram")
    f = j["fetch_us"]["p50"]
    note = "p50 of the slowest rank, path %s; %d rounds in turns" % (j["path"], r.a.rounds)
    return [
        row(r, "engram_copy", us_text(f), "copy " + us_text(j["copy_us"]["p50"]), [ratio(j["copy_us"]["p50"], f)],
            full, text, note),
        not_measured(r, "engram_mpi", "skipped", missing["mpi"]) if "mpi" in missing else
        row(r, "engram_mpi", us_text(f), "MPI " + us_text(j["peer_us"]["mpi"]["p50"]),
            [ratio(j["peer_us"]["mpi"]["p50"], f)], full, text, note),
        not_measured(r, "engram_gloo", "skipped", missing["gloo"]) if "gloo" in missing else
        row(r, "engram_gloo", us_text(f), "gloo " + us_text(j["peer_us"]["gloo"]["p50"]),
            [ratio(j["peer_us"]["gloo"]["p50"], f)], full, text, note),
    ]


# ----------------------------------------------------------------------------------------
# Two machines of two ranks: network namespaces (the recipe of tests/multinode/run.sh)
# ----------------------------------------------------------------------------------------

class Namespaces:
    """Two "machines" (tests/multinode/machines.py: network namespaces on a bridge, UCX over
    TCP on a veth, each rank with its own /dev/shm through agent.sh), with the hostfile and
    the launcher of this script's 2 × 2 runs. Everything is removed by close()."""

    def __init__(self, work):
        self.work = work
        self.m = None

    def open(self):
        if os.geteuid() != 0:
            raise Skip("needs root to create network namespaces")
        for tool in ("ip", "unshare", "oshrun"):
            if not shutil.which(tool):
                raise Skip("no %s" % tool)
        try:
            self.m = machines.Machines(2)
        except OSError as e:
            raise Skip("cannot make the namespace machines (no CAP_NET_ADMIN?): %s" % e)
        with open(os.path.join(self.work, "hosts2"), "w") as f:
            f.write("".join("%s slots=2\n" % ns for ns in self.m.ns))

    def launcher(self):
        """oshrun over the two machines with the network's settings only (epx sets the rest)."""
        agent = os.path.join(REPO, "tests", "multinode", "agent.sh")
        return ["ip", "netns", "exec", self.m.ns[0], "oshrun", "--allow-run-as-root", "--oversubscribe",
                "--mca", "plm_rsh_agent", agent, "--mca", "oob_tcp_if_include", "10.201.0.0/24",
                "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "10.201.0.0/24",
                "-x", "UCX_TLS=tcp,sysv,posix,self", "-x", "UCX_NET_DEVICES=eth1", "-x", "EPX_MN_LOG",
                "--hostfile", os.path.join(self.work, "hosts2"), "-np", "4"]

    def close(self):
        if self.m is not None:
            self.m.remove()
            self.m = None


def step_multinode(r):
    """2 machines × 2 ranks (network namespaces, UCX over TCP on a veth): the EP round trip
    and all_reduce against Open MPI in the same oshrun job (--transport shmem)."""
    if not os.path.exists(os.path.join(r.a.build, "tests", "epx_multinode_rank")):
        raise Skip("the build has no OpenSHMEM transport")
    work = os.path.join(r.tmp, "x2")
    os.makedirs(work, exist_ok=True)
    env = dict(r.env, EPX_MN_LOG=work)
    ns = Namespaces(work)
    try:
        ns.open()
        tokens = 64 if r.quick else 512
        it = ["--iters", "3", "--warmup", "1"] if r.quick else ["--iters", "5", "--warmup", "1"]
        ep_argv = ns.launcher() + [r.epx, "bench", "--transport", "shmem", "--baseline", "mpi", "--tokens",
                                   str(tokens), "--timeout-ms", "60000", "--no-progress"] + it
        if r.quick:
            ep_argv[-len(it):-len(it)] = ["--hidden", "1024", "--topk", "4", "--experts", "16"]
        runs = []
        for _ in range(r.a.rounds):
            j, ep_full = r.json_of("x2-ep", ep_argv, 300, env)
            runs.append(j)
        shape = "2 × 2 ranks, %s, %d tok" % ("H 1024, top-4 of 16" if r.quick else "H 7168, top-8 of 256", tokens)
        rows = [mpi_row(r, "x2_ep_round_trip_mpi", runs, ep_full, shape)]
        size = "1M" if r.quick else "16M"
        ar_argv = ns.launcher() + [r.epx, "bench", "--transport", "shmem", "--op", "all_reduce", "--bytes", size,
                                   "--baseline", "mpi", "--timeout-ms", "60000", "--no-progress"] + it
        ars = []
        for _ in range(r.a.rounds):
            j, ar_full = r.json_of("x2-all-reduce", ar_argv, 300, env)
            if not j.get("baseline", {}).get("ran") or not j["baseline"].get("verified"):
                raise StepError("2 × 2 all_reduce: MPI baseline not run or not verified")
            ars.append(j)
        rs = [j["baseline"]["speedup"] for j in ars]
        j = ars[rs.index(median_member(rs))]
        rows.append(row(r, "x2_all_reduce_mpi", us_text(j["all_reduce"]["max_rank_us"]["avg"]),
                        "MPI " + us_text(j["baseline"]["max_rank_us"]["avg"]), rs, ar_full,
                        "2 × 2 ranks, %s float32, algorithm %s" % (size, j["algorithm"]), "avg max-rank"))
        return rows
    finally:
        ns.close()


# ----------------------------------------------------------------------------------------
# The simulator's published-vs-predicted panels
# ----------------------------------------------------------------------------------------

def step_sim(r, out_svg, out_json):
    """`epx sim published`: every built-in profile's published series predicted at its EP
    sizes (calibrated points, blind predictions), drawn as SVG panels; returns the JSON and
    the argv."""
    if r.quick:
        raise Skip("not with --quick (the published series take ~1 min and ~5 GB)")
    argv = [r.epx, "sim", "published", "--svg", out_svg, "--json", out_json]
    r.run("sim", argv, 1200)
    with open(out_json) as f:
        return json.load(f), argv
