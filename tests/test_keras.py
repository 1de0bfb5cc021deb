"""horovodlite.keras in a real job (tests/scripts/keras_job.py at np 2 under horovodliterun;
every rank asserts and prints each check it passed): model.fit with DistributedOptimizer and the
callbacks equal to one process on the global batch after 20 steps, the warmup's rates and
momenta by Horovod's formula, metrics averaged over the ranks, backward_passes_per_step,
load_model resuming, the collectives on Keras values. Mixed precision and Keras's own gradient
accumulation (tests/scripts/keras_mixed.py at np 2). And the refusal of any backend but torch.
Time on the 2-core development machine, quiet: ~15 s for the job, ~2 s for the refusal.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from launching import retry_if_launcher_did_not_start, run_job, unprefixed
from optional_extras import assert_installed_within

HERE = Path(__file__).parent
SCRIPT = HERE / "scripts" / "keras_job.py"
CHECKS = ["steps", "fit_equals_one_process", "warmup_formula", "momentum_correction",
          "warmup_ends_at_lr"] + [f"metric_average_{k}_{e}" for e in (0, 1)
                                  for k in ("loss", "accuracy")] + [
          "accumulation_updates", "backward_passes_per_step_equals_one_process",
          "compression_fp16",
          "load_model_wraps_the_optimizer", "load_model_keeps_the_state", "load_model_resumes",
          "allreduce", "allgather", "broadcast", "powersgd_refused"]

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("keras") is None,
    reason="Keras is not installed (pip install 'horovodlite[keras]'; scripts/install.sh --test "
           "does)")


def env(**extra) -> dict:
    out = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", HOROVOD_LOG_HIDE_TIME="1",
               KERAS_BACKEND="torch")
    out.update(extra)
    return out


MIXED_CHECKS = ["wrapped_in_a_loss_scaler", "mixed_float16_same_weights_and_scale",
                "mixed_float16_skipped_like_one_process", "mixed_float16_a_step_was_skipped",
                "mixed_float16_equals_one_process", "made_before_the_policy_is_plain",
                "policy_after_wrapping_is_named", "keras_gradient_accumulation_equals_one_process"]


def run_checked_job(script: Path, checks: list, *args) -> str:
    """``script`` at np 2 under horovodliterun; asserts it succeeded and every rank passed
    every check; returns its output without rank prefixes."""
    cmd = [sys.executable, "-m", "horovodlite.runner.launch", "-np", "2", sys.executable,
           str(script), *map(str, args)]
    rc, out, _ = retry_if_launcher_did_not_start(
        lambda: run_job(cmd, cwd=HERE.parent, env=env(), timeout=300,
                        what=f"horovodliterun np=2 {script.name}"))
    out = unprefixed(out)
    assert rc == 0, out[-8000:]
    for r in range(2):
        for name in checks:
            assert f"rank {r}: CHECK {name} ok" in out, f"rank {r} did not pass {name}:\n" + \
                out[-8000:]
    return out


def test_mixed_float16_and_keras_accumulation_at_np2():
    """mixed_float16 used to put the loss scaler's inf check before the reduction: the rank
    whose own gradients overflowed skipped a reduction the other waited in."""
    run_checked_job(HERE / "scripts" / "keras_mixed.py", MIXED_CHECKS)


def test_installed_version_is_within_the_declared_range():
    assert_installed_within("keras")


def test_keras_api_at_np2(tmp_path):
    out = run_checked_job(SCRIPT, CHECKS, tmp_path / "model.keras")
    assert "finished gradual learning rate warmup to 0.1" in out


def test_another_backend_is_refused_naming_keras_backend_torch():
    proc = subprocess.run([sys.executable, "-c", "import horovodlite.keras"], cwd=HERE.parent,
                          env=env(KERAS_BACKEND="numpy"), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0
    assert "ImportError" in proc.stderr and "KERAS_BACKEND=torch" in proc.stderr, proc.stderr
    assert "'numpy'" in proc.stderr, proc.stderr
