"""python -m epx.bench on a tiny shape: it runs, its two dispatchers (epx and the
Megatron-style all_to_all_single one) produce the same rows bit for bit on every rank and
combines that agree, it prints the side-by-side ratios, and (when the CLI is built) the C++
epx bench ran on the same routing."""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD_PY = os.path.join(HERE, "..", "..", "build", "python")
if os.path.isdir(os.path.join(BUILD_PY, "epx")):  # this checkout's build first
    sys.path.insert(0, BUILD_PY)

from epx import bench  # noqa: E402


def test_bench_tiny(tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = bench.main(["--ranks", "2", "--tokens", "24", "--hidden", "128", "--experts", "4",
                     "--topk", "2", "--iters", "2", "--warmup", "1", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    j = json.loads(out.read_text())
    assert j["python"]["same_rows"] == [True, True]
    assert max(j["python"]["combine_rel_diff"]) <= bench.COMBINE_TOL
    for k in ("a2a_dispatch", "a2a_combine", "epx_dispatch", "epx_combine", "seq_dispatch", "mm",
              "seq", "ovl"):
        assert j["python"]["max_rank_us"][k]["p50"] > 0, k
    assert "a2a/epx" in text and "efficiency" in text
    if bench.find_cli(None):
        assert j["cpp"]["dispatch"]["p50"] > 0 and "Python/C++" in text, text
