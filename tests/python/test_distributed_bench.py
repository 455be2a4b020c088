# python3 -m epx.distributed_bench --quick: every case printed with both times, a ratio, its
# target and a result check that held (epx's output against gloo's and the reference).
import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("torch")

CASES = ["all_reduce", "all_reduce .* \\(latency\\)", "all_to_all_single MoE 64 tok", "all_to_all_single MoE 16 tok",
         "all_gather_into_tensor", "reduce_scatter_tensor", "DDP step"]
ROW = re.compile(r"^(?P<label>.+?)\s+(?P<epx>\d+\.\d+)\s+(?P<gloo>\d+\.\d+)\s+(?P<ratio>\d+\.\d+)x\s+>= (?P<target>[\d.]+)x "
                 r"(?P<met>met|missed)\s+(?P<check>checked: .*|CHECK FAILED: .*)$")


def _shm():
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith("epx"))


def _run(*args, timeout=120):
    before = _shm()
    r = subprocess.run([sys.executable, "-m", "epx.distributed_bench", *args], capture_output=True, text=True,
                       timeout=timeout)
    assert _shm() == before, "left in /dev/shm"
    return r


def test_quick_prints_every_case_checked():
    r = _run("--quick")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    rows = [m for m in map(ROW.match, r.stdout.splitlines()) if m]
    assert len(rows) == len(CASES), out
    for pattern, m in zip(CASES, rows):
        assert re.match(pattern, m["label"]), (pattern, m["label"])
        epx, gloo, ratio = float(m["epx"]), float(m["gloo"]), float(m["ratio"])
        assert epx > 0 and gloo > 0, m.group(0)
        assert ratio == pytest.approx(gloo / epx, rel=0.01, abs=0.01), m.group(0)  # the ratio is of the two times
        assert (m["met"] == "met") == (ratio >= float(m["target"])), m.group(0)
        assert m["check"].startswith("checked: "), m.group(0)
    assert "every result checked on every rank" in r.stdout, out
    assert "3 ranks" in r.stdout


def test_only_and_bad_only():
    r = _run("--quick", "--only", "all_reduce_16K", "--ranks", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [m for m in map(ROW.match, r.stdout.splitlines()) if m]
    assert [m["label"] for m in rows] == ["all_reduce 16 KiB float32 (latency)"], r.stdout
    assert "2 ranks" in r.stdout
    r = _run("--quick", "--only", "no_such_case")
    assert r.returncode != 0 and "names no case" in r.stderr, r.stdout + r.stderr
