"""The training examples and the benchmarks run end to end at np=2.

pytorch_digits.py must reach its 95% test-accuracy bar (``--check`` exits 1 below it); the
synthetic benchmark, benchmarks/train_step.py and benchmarks/bucket_views.py run with tiny
settings and must print their reports (their numbers are not asserted: timings depend on the
machine).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from launching import retry_if_launcher_did_not_start

ROOT = Path(__file__).resolve().parent.parent


def launch(script: str, *args: str, np_: int = 2, timeout: int = 240) -> str:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "horovodlite.runner.launch", "-np", str(np_), sys.executable,
           script, *args]
    def run():
        p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=timeout)
        return p.returncode, p.stdout + p.stderr, p

    proc = retry_if_launcher_did_not_start(run)[2]
    if proc.returncode != 0:
        pytest.fail(f"{script} exited {proc.returncode}:\n{proc.stdout[-4000:]}\n"
                    f"{proc.stderr[-4000:]}")
    return proc.stdout


def test_digits_example_reaches_95_percent(tmp_path):
    out = launch("examples/pytorch_digits.py", "--check", "--checkpoint",
                 str(tmp_path / "digits.pt"))
    assert "final test accuracy" in out
    assert (tmp_path / "digits.pt").exists()


def test_synthetic_benchmark_reports_throughput():
    out = launch("examples/pytorch_synthetic_benchmark.py", "--num-warmup-batches", "1",
                 "--num-batches-per-iter", "2", "--num-iters", "2", "--batch-size", "4",
                 "--fp16-allreduce")
    assert "Img/sec per CPU:" in out and "Total img/sec on 2 CPU(s):" in out


def test_train_step_benchmark_prints_its_table():
    out = launch("benchmarks/train_step.py", "--model", "mlp", "--warmup", "1", "--steps", "4",
                 "--rounds", "1")
    for row in ("ceiling (no comm.)", "ceiling, 4 B sync/step", "horovodlite np=2",
                "hvdl per-gradient np=2", "bucket views) / per-gradient path", "DDP gloo np=2",
                "hvdl buckets held np=2", "buckets held until the optimizer waits",
                "not installed", "horovodlite / synchronized ceiling",
                "throughput horovodlite / DDP", "of ceiling", "cpu hvdl-bg"):
        assert row in out, f"missing {row!r} in:\n{out}"


def test_bucket_views_benchmark_prints_its_tables():
    out = launch("benchmarks/bucket_views.py", "--params", "20", "--kib", "16", "--rounds", "1",
                 "--steps", "2", "--warmup", "2")
    for row in ("buckets: 1 (320 KiB)", "copies per step with set_to_none=False: [0]",
                "own: the slowest rank", "after last:", "whole step:", "on-held",
                "mpi-after-backward", "= 1.000x the gradient bytes"):
        assert row in out, f"missing {row!r} in:\n{out}"


def test_gpu_benchmarks_run_with_the_cpu_standing_in(tmp_path, monkeypatch):
    """The --device cuda code of both benchmarks end to end at np=2 (ranks "sharing" the one
    stand-in GPU), on a machine without a GPU: HVDL_BENCH_CUDA_STAND_IN=1 puts the tensors on
    the CPU, with gloo as the peer (benchmarks/gpu_setup.py)."""
    import json

    monkeypatch.setenv("HVDL_BENCH_CUDA_STAND_IN", "1")
    out = launch("benchmarks/allreduce.py", "--device", "cuda", "--quick", "--sizes", "4,65536",
                 "--json", str(tmp_path / "allreduce.json"))
    for row in ("np=2, CPU standing in for a GPU", "peer torch gloo", "x torch gloo",
                "hvdl on CPU", "200 tensors of 64 KiB", "torch gloo (200 calls)"):
        assert row in out, f"missing {row!r} in:\n{out}"
    result = json.loads((tmp_path / "allreduce.json").read_text())
    assert result["shared_gpu"] and result["peer"] == "torch gloo"
    assert {(r["case"], r.get("bytes")) for r in result["rows"]} >= {("single", 4),
                                                                     ("single", 65536)}
    out = launch("benchmarks/train_step.py", "--device", "cuda", "--model", "mlp", "--warmup",
                 "1", "--steps", "2", "--rounds", "1", "--json", str(tmp_path / "train.json"))
    for row in ("no communication", "horovodlite np=2", "DDP gloo np=2",
                "horovodlite / no communication", "horovodlite / DDP"):
        assert row in out, f"missing {row!r} in:\n{out}"
    result = json.loads((tmp_path / "train.json").read_text())
    assert set(result["per_second"]) == {"no communication", "horovodlite np=2", "DDP gloo np=2"}
