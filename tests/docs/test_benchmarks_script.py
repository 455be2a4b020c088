"""scripts/benchmarks.sh --quick --out DIR: every figure is written, as a positive finite ratio
or as skipped with its reason, in the JSON, the markdown table and a chart that parses.

    /usr/bin/python3 -m pytest -q tests/docs/test_benchmarks_script.py

Needs a build (build/, or EPX_BUILD=DIR); skips without one. Runs ~1 min on 2 cores; writes
only into pytest's temp dir (the script's own temp dir is removed, the 2 x 2 namespaces it
may make are removed before it ends).
"""
import importlib.util
import json
import math
import os
import subprocess
import sys
import xml.dom.minidom

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("EPX_BUILD", os.path.join(REPO, "build"))


def load_script():
    sys.dont_write_bytecode = True  # no scripts/__pycache__
    spec = importlib.util.spec_from_file_location("benchmarks", os.path.join(REPO, "scripts", "benchmarks.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    if not os.access(os.path.join(BUILD, "src", "tools", "epx"), os.X_OK):
        pytest.skip("no build at %s (bash scripts/run.sh build)" % BUILD)
    out = tmp_path_factory.mktemp("benchmarks")
    p = subprocess.run(["bash", os.path.join(REPO, "scripts", "benchmarks.sh"), "--quick", "--out", str(out),
                        "--build", BUILD], capture_output=True, text=True, timeout=300, cwd=REPO)
    return p, out


def test_runs_and_prints_a_line_per_step(quick_run):
    p, _ = quick_run
    assert p.returncode == 0, p.stdout + p.stderr
    steps = load_script().steps(None)
    progress = [ln for ln in p.stdout.splitlines() if ln.startswith("[")]
    assert len(progress) == len(steps), p.stdout
    for i, ln in enumerate(progress, 1):
        assert ln.startswith("[%2d/%d " % (i, len(steps))), ln  # step counter, then elapsed m:ss


def test_json_has_every_op_with_a_positive_ratio_or_a_reason(quick_run):
    _, out = quick_run
    ops = [op for op, _, _ in load_script().OPS]
    doc = json.load(open(out / "benchmarks.json"))
    rows = {r["id"]: r for r in doc["rows"]}
    assert sorted(rows) == sorted(ops)
    assert doc["quick"] is True
    for op in ops:
        r = rows[op]
        if r["status"] == "ok":
            assert isinstance(r["ratio"], float) and math.isfinite(r["ratio"]) and r["ratio"] > 0, r
            assert r["rounds"] and all(x > 0 and math.isfinite(x) for x in r["rounds"]), r
            assert r["command"] and r["machine"] and r["date"] and r["commit"], r
        else:
            assert r["status"] == "skipped" and r["why"], r  # only what this machine cannot run
    # what needs nothing but the build and Open MPI ran
    for op in ("ep_bf16_dispatch_limit", "ep_bf16_combine_limit", "all_reduce_limit"):
        assert rows[op]["status"] == "ok", rows[op]


def test_markdown_has_a_row_per_op(quick_run):
    _, out = quick_run
    mod = load_script()
    text = (out / "figures.md").read_text()
    assert text.startswith(mod.BEGIN) and text.rstrip().endswith(mod.END)
    table_rows = [ln for ln in text.splitlines() if ln.startswith("| ") and not ln.startswith("| figure")]
    assert len(table_rows) == len(mod.OPS)
    for (_, _, figure), ln in zip(mod.OPS, table_rows):
        assert ln.startswith("| " + figure), (figure, ln)
    whole = (out / "BENCHMARKS.md").read_text()
    assert text.strip() in whole and "## Method" in whole


def test_svg_parses_and_draws_a_bar_per_measured_op(quick_run):
    _, out = quick_run
    dom = xml.dom.minidom.parse(str(out / "benchmarks.svg"))
    bars = [r for r in dom.getElementsByTagName("rect") if r.getAttribute("class") == "mark"]
    doc = json.load(open(out / "benchmarks.json"))
    assert len(bars) == sum(1 for r in doc["rows"] if r["status"] == "ok")
