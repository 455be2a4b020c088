"""python -m epx.bench on a tiny shape: it runs, epx in both layouts and the
Megatron-style all_to_all_single dispatcher produce the same rows (expanded: bit for bit;
compact: each row its source token's bits, the right tokens and local experts) on every rank
and combines that agree, it prints the side-by-side ratios, and (when the CLI is built) the
C++ epx bench ran on the same routing in each layout; its options; the compact check fails
on a wrong row."""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD_PY = os.path.join(HERE, "..", "..", "build", "python")
if os.path.isdir(os.path.join(BUILD_PY, "epx")):  # this checkout's build first
    sys.path.insert(0, BUILD_PY)

from epx import bench  # noqa: E402


TINY = ["--ranks", "2", "--tokens", "24", "--hidden", "128", "--experts", "4", "--topk", "2",
        "--iters", "2", "--warmup", "1"]


def test_bench_tiny(tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = bench.main(TINY + ["--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    j = json.loads(out.read_text())
    for lay in ("compact", "expanded"):  # both layouts checked against gloo (and a reference)
        assert j["python"]["same_rows"][lay] == [True, True], lay
        assert max(j["python"]["combine_rel_diff"][lay]) <= bench.COMBINE_TOL, lay
        for op in ("dispatch", "combine"):
            assert j["python"]["max_rank_us"]["epx_%s_%s" % (lay, op)]["p50"] > 0
        assert j["python"]["ratios"][lay + " round trip"]["gloo/epx p50"] > 0
    for k in ("a2a_dispatch", "a2a_combine", "seq_dispatch", "mm", "seq", "ovl"):
        assert j["python"]["max_rank_us"][k]["p50"] > 0, k
    assert "gloo/epx" in text and "round trip" in text and "efficiency" in text
    if bench.find_cli(None):
        for lay in ("compact", "expanded"):
            assert j["cpp"][lay]["dispatch"]["p50"] > 0 and "Python/C++" in text, text
            assert "--layout " + lay in j["cpp_commands"][lay]


def test_bench_one_layout_instant_start_blocked(tmp_path, capsys):
    """--layout compact alone, --start instant, --order blocked, --no-overlap, --no-cpp."""
    out = tmp_path / "bench.json"
    rc = bench.main(TINY + ["--layout", "compact", "--start", "instant", "--order", "blocked", "--no-overlap",
                            "--no-cpp", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    j = json.loads(out.read_text())
    assert list(j["python"]["same_rows"]) == ["compact"] and j["python"]["same_rows"]["compact"] == [True, True]
    assert "expanded" not in text and "late start" in text and "efficiency" not in text
    assert "order: blocked" in text
    for k in ("a2a_dispatch", "a2a_combine", "epx_compact_dispatch", "epx_compact_combine"):
        assert j["python"]["max_rank_us"][k]["p50"] > 0, k
    assert j["cpp"] is None and "epx_expanded_dispatch" not in j["python"]["max_rank_us"]


def test_compact_check_catches_a_wrong_row():
    """The compact check is not vacuous: a dispatcher whose rows are off by one bit fails it."""
    fails = bench.epx.launch(_wrong_row, 2, start_method="fork")
    assert fails == [True, True]


def _wrong_row(rank, n):
    import torch
    a = bench.parse_args(TINY)
    problem = bench.make_problem(a)
    idx, w, x = problem[rank]

    class Bad:  # EPBuffer's dispatch with its first row's lowest bit flipped
        def __init__(self, buf):
            self.buf = buf

        def dispatch(self, *args, **kw):
            r = self.buf.dispatch(*args, **kw)
            r[0].view(torch.int16)[0, 0] ^= 1
            return r

        def combine(self, *args, **kw):
            return self.buf.combine(*args, **kw)

    with bench.epx.EPBuffer(None, num_max_tokens_per_rank=a.tokens, hidden=a.hidden, num_topk=a.topk,
                            num_experts=a.experts, deterministic=True) as buf:
        good = bench._check_compact(buf, bench.AllToAllDispatcher(a.experts), problem, rank, a.experts, x, idx, w)
        bad = bench._check_compact(Bad(buf), bench.AllToAllDispatcher(a.experts), problem, rank, a.experts, x, idx, w)
    return good[0] and not bad[0]
