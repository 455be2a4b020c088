# The end-to-end programs of tests/python/dist_programs/ under torchrun (4 ranks, env://, the
# epx backend), each against its own reference (gloo's run, one process, the unsplit model);
# and a curated part of torch's own distributed test suite on epx.
import os
import shutil
import socket
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

HERE = os.path.dirname(os.path.abspath(__file__))
PROGRAMS = os.path.join(HERE, "dist_programs")


def _shm():
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith("epx"))


def _no_new_shm(before):
    """No epx segment made since `before` is left (other jobs of the machine may make and
    unlink their own meanwhile: a new name must be gone within a few seconds)."""
    import time
    for _ in range(50):
        new = set(_shm()) - set(before)
        if not new:
            return True
        time.sleep(0.1)
    return False


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(prog, tmp_path, ranks=4, env=None, args=("--backend", "epx")):
    torchrun = shutil.which("torchrun") or "/usr/bin/torchrun"
    launcher = [torchrun] if os.path.exists(torchrun) else [sys.executable, "-m", "torch.distributed.run"]
    # torch 1.13's launcher parses --redirects / --tee to None unless they are named
    cmd = ["timeout", "-k", "5", "150"] + launcher + [
        "--nproc_per_node", str(ranks), "--master_port", str(_free_port()), "--monitor_interval", "0.2",
        "--redirects", "1", "--tee", "1", "--log_dir", str(tmp_path / "logs"), os.path.join(PROGRAMS, prog), *args]
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run(cmd, capture_output=True, text=True, timeout=170, cwd=tmp_path, env=full_env)


@pytest.mark.parametrize("prog, summary", [
    ("ddp_train.py", "ddp_train: OK 28 checks; backend epx, 4 ranks, 8 DDP steps"),
    ("moe_layer.py", "moe_layer: OK 24 checks; backend epx, 4 ranks, 8 experts top-2"),
    ("pipeline.py", "pipeline: OK 8 checks; backend epx, 4 ranks = 2 pipelines x 2 stages"),
])
def test_program(prog, summary, tmp_path):
    before = _shm()
    out = _torchrun(prog, tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert summary in out.stdout, out.stdout[-3000:]
    assert _no_new_shm(before)


def test_program_failure_is_reported(tmp_path):
    """A rank whose comparison fails makes every rank exit non-zero and rank 0 name it."""
    before = _shm()
    out = _torchrun("moe_layer.py", tmp_path, env={"EPX_DIST_PROGRAM_SABOTAGE": "1"})
    assert out.returncode != 0
    assert "moe_layer: FAILED on rank 1: output: max |difference|" in out.stdout + out.stderr
    assert "moe_layer: FAILED 1 of 24 checks" in out.stdout
    assert _no_new_shm(before)


# torch's own tests of the collectives and point-to-point calls that pass on gloo (run them all
# with dist_programs/torch_suite.py; docs/distributed.md has the counts)
SUITE = """test_all_reduce_sum test_all_reduce_sum_async test_all_reduce_sum_complex test_all_reduce_max
test_all_reduce_product test_all_reduce_coalesced_sum test_sparse_all_reduce_sum test_broadcast
test_all_gather test_all_gather_coalesced_simple test_reduce_sum test_scatter test_gather
test_barrier_timeout_full_group test_get_future test_send_recv test_send_recv_any_source
test_send_recv_with_tag test_isend test_irecv test_batch_isend_irecv_gloo_tags test_monitored_barrier_gloo
test_DistributedDataParallelCPU""".split()


def test_torch_suite_subset(tmp_path):
    before = _shm()
    names = tmp_path / "tests.txt"
    names.write_text("\n".join(SUITE) + "\n")
    env = dict(os.environ, TEMP_DIR=str(tmp_path))
    out = subprocess.run(["timeout", "-k", "5", "240", sys.executable, os.path.join(PROGRAMS, "torch_suite.py"),
                          "--backend", "epx", "--world-size", "2", "--tests", str(names)],
                         capture_output=True, text=True, timeout=260, env=env, cwd=tmp_path)
    tail = out.stdout[-2000:] + out.stderr[-4000:]
    assert out.returncode == 0, tail
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("torch suite,")]
    assert line and f"{len(SUITE)} tests" in line[0], tail
    assert _no_new_shm(before)
