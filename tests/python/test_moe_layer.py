"""examples/moe_layer.py on 4 ranks: output and gradients (x, router, shared expert, routed
experts) vs the example's single-process dense reference within moe_layer.TOL (1e-2 of each
tensor's largest value; bf16 at the wire), a few SGD steps lower the loss; the same with FP8
dispatch, whose effect on the output must be well above the check's error; and the example
itself under torchrun."""

import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
if os.path.isdir(os.path.join(ROOT, "build", "python", "epx")):  # this checkout's build first
    sys.path.insert(0, os.path.join(ROOT, "build", "python"))
sys.path.insert(0, os.path.join(ROOT, "examples"))

import epx  # noqa: E402
import moe_layer  # noqa: E402

P = 4


def _assert_rank_results(results, fp8):
    assert len(results) == P
    for rank, (ok, lines, losses, errs) in enumerate(results):
        text = "\n".join(lines)
        assert ok, text
        assert all(v <= moe_layer.TOL for k, v in errs.items() if k != "fp8 effect"), text
        assert losses[-1] < losses[0] and all(b < a for a, b in zip(losses, losses[1:])), losses
        if fp8:
            # FP8 changes the output by far more than the distance to the FP8 reference:
            # a dispatch that skipped the cast would fail the check
            assert errs["fp8 effect"] > 2 * errs["out"], text
    # every rank saw the same global loss curve
    assert all(r[2] == results[0][2] for r in results)


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_moe_layer_under_epx_launch(fp8):
    cfg = moe_layer.Config(use_fp8=fp8)
    _assert_rank_results(epx.launch(moe_layer._launched, P, cfg, start_method="fork",
                                    timeout_secs=60), fp8)


def test_moe_layer_under_torchrun(tmp_path):
    torchrun = shutil.which("torchrun") or "/usr/bin/torchrun"
    # Debian's torch 1.13 spells it --nproc_per_node; under Python 3.11 its default
    # --redirects/--tee parse to None, so name them (1 = stdout, teed to the console)
    cmd = [torchrun, "--nproc_per_node", str(P), "--redirects", "1", "--tee", "1",
           "--log_dir", str(tmp_path / "logs"), os.path.join(ROOT, "examples", "moe_layer.py")]
    p = subprocess.run(cmd, cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-4000:]
    assert p.stdout.count("(lowered)") == P, p.stdout[-4000:]
    assert "MISMATCH" not in p.stdout
