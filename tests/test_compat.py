"""Horovod-style PyTorch training scripts run unchanged but for the import line (issue 15).

Each script in tests/compat/ is written the way Horovod's published PyTorch examples are, with
``import horovodlite.torch as hvd`` as its only horovodlite-specific line. Every test launches
one under ``horovodliterun -np 2`` with small settings, requires exit code 0 (the launcher
exits non-zero if any rank fails) and checks what the script prints. The accuracy bounds are
well below what the scripts reach here (see tests/compat/README.md), so they catch broken
training, not noise.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from launching import retry_if_launcher_did_not_start

ROOT = Path(__file__).resolve().parent.parent
COMPAT = ROOT / "tests" / "compat"
TIMEOUT = 120  # seconds per job; each takes about 5-10 s on two idle cores


def launch(script: str, *args: str, np_: int = 2, timeout: int = TIMEOUT) -> str:
    """Runs ``horovodliterun -np N python tests/compat/<script> args``; returns stdout+stderr.

    Fails the test on a non-zero exit or when the job outlives ``timeout`` (then the whole
    process group, ranks included, is killed)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    # `python -m horovodlite.runner.launch` is the horovodliterun entry point, run with the
    # interpreter pytest uses.
    cmd = [sys.executable, "-m", "horovodlite.runner.launch", "-np", str(np_), sys.executable,
           str(COMPAT / script), *args]

    def run():
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            pytest.fail(f"{script} {' '.join(args)} did not finish in {timeout} s:\n"
                        f"{out[-4000:]}\n{err[-4000:]}")
        return proc.returncode, out + err, out, err

    returncode, _, out, err = retry_if_launcher_did_not_start(run)
    if returncode != 0:
        pytest.fail(f"{script} {' '.join(args)} exited {returncode}:\n{out[-4000:]}\n"
                    f"{err[-4000:]}")
    return out + err


def floats(pattern: str, text: str) -> list[float]:
    return [float(x) for x in re.findall(pattern, text)]


# -- 1. synthetic benchmark ---------------------------------------------------------------------

@pytest.mark.parametrize("variant", ["--fp16-allreduce", "--use-adasum"])
def test_synthetic_benchmark(variant):
    out = launch("pytorch_synthetic_benchmark.py", "--image-size", "32", "--width", "8",
                 "--batch-size", "8", "--num-warmup-batches", "2", "--num-batches-per-iter",
                 "3", "--num-iters", "3", "--no-cuda", variant)
    assert "Model: resnet18" in out
    assert "Number of CPUs: 2" in out
    iters = floats(r"Iter #\d+: ([\d.]+) img/sec per CPU", out)
    assert len(iters) == 3 and all(x > 0 for x in iters), out
    per_cpu = floats(r"Img/sec per CPU: ([\d.]+) \+-[\d.]+", out)
    total = floats(r"Total img/sec on 2 CPU\(s\): ([\d.]+) \+-[\d.]+", out)
    assert len(per_cpu) == 1 and len(total) == 1, out  # printed by rank 0 only
    assert total[0] == pytest.approx(2 * per_cpu[0], rel=0.01, abs=0.2)


# -- 2. MNIST-style (sklearn digits) ------------------------------------------------------------

TEST_SET = r"Test set: Average loss: ([\d.]+), Accuracy: ([\d.]+)%"


@pytest.mark.parametrize("variant", [
    [],
    ["--use-adasum"],
    ["--fp16-allreduce", "--backward-passes-per-step", "2", "--gradient-predivide-factor", "2"],
], ids=["average", "adasum", "fp16-bpps2-predivide2"])
def test_mnist(variant):
    out = launch("pytorch_mnist.py", "--epochs", "10", *variant)
    results = re.findall(TEST_SET, out)
    assert len(results) == 10, out  # one line per epoch, rank 0 only
    assert "Train Epoch: 10 [" in out
    accuracy = float(results[-1][1])
    assert accuracy >= 90.0, out  # measured 96.9-98.6% (10 epochs, all three variants)


# -- 3. ImageNet-style: warm-up, sub-batches, Metric, join, checkpoints, resume -----------------

TRAIN_EPOCH = r"Train Epoch #(\d+): loss [\d.]+, accuracy [\d.]+%, last rank to join: (\d+)"
VALIDATE_EPOCH = r"Validate Epoch #(\d+): loss [\d.]+, accuracy ([\d.]+)%"


def test_imagenet_style_uneven_batches_and_resume(tmp_path):
    # --batch-size 16 with --batches-per-allreduce 2: 719 training samples per rank make 22
    # batches of 32 and one of 15 (a single sub-batch, so the epoch ends mid-accumulation),
    # and the last rank trains on one batch fewer than rank 0 before hvd.join().
    checkpoint_format = str(tmp_path / "checkpoint-{epoch}.pth.tar")
    common = ["--checkpoint-format", checkpoint_format, "--batch-size", "16",
              "--batches-per-allreduce", "2", "--short-rank-batches", "1", "--warmup-epochs",
              "2", "--no-cuda"]

    first = launch("pytorch_imagenet_style.py", "--epochs", "3", *common)
    assert "resuming" not in first
    assert re.findall(TRAIN_EPOCH, first) == [("1", "0"), ("2", "0"), ("3", "0")], first
    assert [e for e, _ in re.findall(VALIDATE_EPOCH, first)] == ["1", "2", "3"], first
    for epoch in (1, 2, 3):
        assert (tmp_path / f"checkpoint-{epoch}.pth.tar").exists()

    # Resumes from checkpoint-3 (found by rank 0 and sent with hvd.broadcast_object), now with
    # float16 gradients on the wire.
    second = launch("pytorch_imagenet_style.py", "--epochs", "5", "--fp16-allreduce", *common)
    assert "Rank 0: resuming from epoch 3" in second
    assert "Rank 1: resuming from epoch 3" in second
    assert re.findall(TRAIN_EPOCH, second) == [("4", "0"), ("5", "0")], second
    validated = re.findall(VALIDATE_EPOCH, second)
    assert [e for e, _ in validated] == ["4", "5"], second
    assert float(validated[-1][1]) >= 80.0, second  # measured 95-96% after 5 epochs
    assert (tmp_path / "checkpoint-5.pth.tar").exists()


# -- 4. elastic MNIST-style ---------------------------------------------------------------------

TEST_EPOCH = r"Test Epoch: (\d+), Average loss: [\d.]+, Accuracy: ([\d.]+)%"


def test_mnist_elastic_trains_to_completion():
    out = launch("pytorch_mnist_elastic.py", "--epochs", "8")
    results = re.findall(TEST_EPOCH, out)
    assert [e for e, _ in results] == [str(e) for e in range(1, 9)], out
    assert "Training finished after epoch 8" in out
    assert "State reset" not in out and "hvd.elastic: reset" not in out
    assert float(results[-1][1]) >= 90.0, out  # measured 96.1%


def test_mnist_elastic_recovers_from_a_failure():
    # The last rank raises HorovodInternalError at batch 25 of epoch 2, before its backward: no
    # rank applied batch 25, nothing is rolled back (rollback "step"), the reset callback runs,
    # and epoch 2 goes on from batch 25 (not from the commit at batch 20) with only the samples
    # not processed yet.
    out = launch("pytorch_mnist_elastic.py", "--epochs", "8", "--fail-at-batch", "25")
    assert "Rank 1: simulating a failure at epoch 2 batch 25" in out
    assert out.count("hvd.elastic: reset 1 of at most 5") == 2, out  # on both ranks
    assert "State reset: 2 workers, lr 0.1000" in out
    assert "Resuming epoch 2 at batch 25" in out, out
    results = re.findall(TEST_EPOCH, out)
    assert [e for e, _ in results] == [str(e) for e in range(1, 9)], out  # none repeated
    assert "Training finished after epoch 8" in out
    assert float(results[-1][1]) >= 85.0, out  # measured 95.3-96.9%
