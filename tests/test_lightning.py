"""horovodlite.lightning in real jobs (tests/scripts/lightning_job.py; every rank asserts and
prints each check it passed):

- pytorch_lightning under horovodliterun (MPI controller) at np 2: 20 steps with
  accumulate_grad_batches=2 end with the weights of one process on the global batch and of
  Lightning's DDPStrategy in the same job; sync_dist metrics; a checkpoint by rank 0; validate,
  test, predict, torchmetrics, manual optimization; then a fit in which rank 1 raises ends the
  job with rank 1's error named on rank 0;
- the unified ``lightning`` package (lightning.pytorch, horovodlite.lightning.pytorch) under
  torchrun (the Gloo controller, as horovodliterun --gloo) at np 2: the fit's checks again
  (equal to one process and to DDP, sync_dist, the checkpoint), then a checkpoint saved by a
  one-rank run resumed at np 2 equals 40 single-process steps. The other stages do not depend
  on the launcher or the namespace: the strategy's code is one (horovodlite.lightning.logic).

- Trainer options in combination with the strategy (tests/scripts/lightning_options.py) at
  np 2: precision plugins, accumulate_grad_batches, gradient_clip_val and an optimizer wrapped
  with shard= in configure_optimizers, each equal to DDPStrategy's; sync_batchnorm equal to
  one process on the global batch.

Lightning's import costs seconds per process (~5 s of CPU), and that is nearly all of these
jobs' time, so there are few processes, each running many checks: 2 + 1 + 2 + 2 in all.
"""

from __future__ import annotations

import importlib.util
import os
import re
import runpy
import sys
from pathlib import Path

import pytest
from launching import retry_if_launcher_did_not_start, run_job, unprefixed
from optional_extras import assert_installed_within

HERE = Path(__file__).parent
SCRIPT = HERE / "scripts" / "lightning_job.py"
CORE_CHECKS = ["registry", "steps", "fit_equals_one_process", "sync_dist_sum", "sync_dist_max",
               "sync_dist_mean_same_everywhere", "checkpoint_written", "fit_equals_ddp",
               "all_phases"]
FIT_CHECKS = CORE_CHECKS + ["val_loss", "torchmetrics_synced", "torchmetrics_uneven_states",
                            "test_loss", "predict_outputs", "predict_covers_the_data",
                            "manual_optimization_equals_one_process",
                            "explicit_synchronize_reduces_once"]
LAUNCHER_PREFIXES = ("OMPI_", "PMI", "PMIX_", "SLURM", "HOROVOD_", "HVDL_", "TORCHELASTIC_")
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT")

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("pytorch_lightning") is None,
    reason="PyTorch Lightning is not installed (pip install 'horovodlite[lightning]'; "
           "scripts/install.sh --test does)")


def clean_env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(LAUNCHER_PREFIXES) and k not in LAUNCHER_VARS}
    env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", HOROVOD_LOG_HIDE_TIME="1",
               PYTHONWARNINGS="ignore")
    return env


def horovodliterun(np_: int, *args, script: Path = SCRIPT) -> tuple:
    cmd = [sys.executable, "-m", "horovodlite.runner.launch", "-np", str(np_), sys.executable,
           str(script), *map(str, args)]
    rc, out, _ = retry_if_launcher_did_not_start(
        lambda: run_job(cmd, cwd=HERE.parent, env=clean_env(), timeout=300,
                        what=f"horovodliterun np={np_} {script.name} {args[:1]}"))
    return rc, unprefixed(out)


def assert_checks(out: str, ranks: int, checks: list) -> None:
    for r in range(ranks):
        for name in checks:
            assert f"rank {r}: CHECK {name} ok" in out, f"rank {r} did not pass {name}:\n" + \
                out[-8000:]


OPTION_CHECKS = [f"{name}_equals_ddp" for name in (
    "bf16_mixed", "fp16_mixed", "accumulate_grad_batches", "gradient_clip_val",
    "shard_optimizer_state", "shard_gradients")] + ["sync_batchnorm_equals_one_process"]


def test_trainer_options_in_combination_with_the_strategy():
    """sync_batchnorm used to be ignored (per-rank statistics) and an optimizer wrapped with
    shard= in configure_optimizers crashed the first step."""
    rc, out = horovodliterun(2, script=HERE / "scripts" / "lightning_options.py")
    assert rc == 0, out[-8000:]
    assert_checks(out, 2, OPTION_CHECKS)


def test_installed_versions_are_within_the_declared_ranges():
    versions = assert_installed_within("lightning")
    assert set(versions) == {"pytorch-lightning", "lightning"}, versions


def test_the_lightning_namespace_module_without_lightning_names_the_extra(monkeypatch):
    # the module's guard runs before anything else it imports: cheap to run here
    monkeypatch.setitem(sys.modules, "lightning", None)  # "not installed" for the import system
    with pytest.raises(ImportError, match=r"pip install 'horovodlite\[lightning\]'"):
        runpy.run_path(str(HERE.parent / "horovodlite" / "lightning" / "pytorch.py"))


def test_pytorch_lightning_under_horovodliterun(tmp_path):
    rc, out = horovodliterun(2, "fit", tmp_path / "two_ranks.ckpt", "--raise")
    assert_checks(out, 2, FIT_CHECKS)
    # the last fit: rank 1 raises at its 4th batch; the job ends, rank 0 naming rank 1's error
    assert rc != 0, out[-4000:]
    assert "ValueError: bad batch 3 on rank 1" in out, out[-6000:]
    assert re.search(r"HorovodInternalError: .*rank 1: raised ValueError: bad batch 3 on rank 1 "
                     r"\(at .*lightning_job\.py:\d+\)", out), out[-6000:]


@pytest.mark.skipif(importlib.util.find_spec("lightning") is None,
                    reason="the lightning package is not installed (horovodlite[lightning] and "
                           "scripts/install.sh --test install it)")
def test_lightning_pytorch_under_torchrun_resuming_a_one_rank_checkpoint(tmp_path):
    one_rank = tmp_path / "one_rank.ckpt"
    # one process, no launcher: horovodlite at size 1
    rc, out, _ = run_job([sys.executable, str(SCRIPT), "save", str(one_rank), "--lightning"],
                         cwd=HERE.parent, env=clean_env(), timeout=300,
                         what="lightning_job.py save (one rank)")
    assert rc == 0, out[-8000:]
    assert_checks(out, 1, ["saved_steps", "save_at_np1_equals_one_process", "checkpoint_written"])

    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(SCRIPT), "fit", str(tmp_path / "torchrun.ckpt"), "--core", "--lightning",
           "--resume", str(one_rank)]
    rc, out, _ = run_job(cmd, cwd=HERE.parent, env=clean_env(), timeout=300,
                         what="torchrun np=2 lightning_job.py fit")
    assert rc == 0, out[-8000:]
    assert_checks(out, 2, CORE_CHECKS + ["resumed_steps", "resume_at_np2_equals_one_process"])
