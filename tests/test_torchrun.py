"""horovodlite under torchrun, with no MPI variable in the environment: the Gloo controller.

- The parallel suite's collectives, optimizer and error files run under
  ``torchrun --standalone --nproc_per_node N`` at N = 2 and 3, every rank asserting (all files
  in one pytest session per size: one job start instead of one per file).
- What users saw before the controller existed: torchrun starting ranks that each trained alone
  as rank 0 of 1. Now the ranks form one job, and a size the controller does not see is an
  error naming both.
- Failures: a rank that raises is named by the others; a stall is reported with the call sites
  and becomes an error on every rank; a rank killed by a signal ends the job (torchrun's agent
  ends the others) without a hang.
Every job is bounded in time.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from launching import run_job

HERE = Path(__file__).parent
ROOT = HERE.parent
SCRIPTS = HERE / "scripts"
FILES = ["test_allreduce.py", "test_collectives.py", "test_names.py", "test_join.py",
         "test_process_sets.py", "test_errors.py", "test_optimizer_api.py",
         "test_optimizer_equivalence.py", "test_gloo_init.py"]
MPI_VARIABLES = ("OMPI_", "PMI_", "PMIX_", "MPI_LOCALRANKID", "HYDRA_")


def torchrun_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(MPI_VARIABLES)}
    env.update({"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "HOROVOD_LOG_HIDE_TIME": "1",
                "HOROVOD_STALL_CHECK_TIME_SECONDS": "20",
                "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "60"})
    env.update(extra)
    return env


def torchrun(np_: int, *args, env: dict | None = None, timeout: float = 300):
    """(returncode, output, seconds) of ``torchrun --standalone --nproc_per_node np_ ARGS``."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={np_}", *map(str, args)]
    return run_job(cmd, cwd=ROOT, env=env or torchrun_env(), timeout=timeout,
                   what=f"torchrun np={np_} (hang?)", tail=8000)


@pytest.mark.parametrize("np_", [3], ids=lambda n: f"np{n}")  # np 2: dropped for the suite's time
def test_parallel_files_under_torchrun(np_):
    rc, out, _ = torchrun(np_, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                          "-o", "addopts=", *[f"tests/parallel/{f}" for f in FILES],
                          env=torchrun_env(HVDL_PARALLEL_WORKER="1"), timeout=600)
    assert rc == 0, out[-12000:]
    assert out.count(" passed") >= np_, out[-3000:]  # every rank's pytest summary


ONE_JOB = (
    "import horovodlite.torch as hvd, torch\n"
    "hvd.init()\n"
    "s = hvd.allreduce(torch.ones(1), op=hvd.Sum, name='together').item()\n"
    "print(f'RANK {hvd.rank()} OF {hvd.size()} SUM {s:g}', flush=True)\n"
)


def test_torchrun_ranks_form_one_job_not_separate_ones(tmp_path):
    script = tmp_path / "one_job.py"
    script.write_text(ONE_JOB)
    rc, out, _ = torchrun(3, script, timeout=120)
    assert rc == 0, out[-6000:]
    for r in range(3):
        assert f"RANK {r} OF 3 SUM 3" in out, out[-3000:]


def test_a_size_the_controller_does_not_see_is_an_error_naming_both(tmp_path):
    # Every rank's environment says 3 ranks, the MPI controller (forced) sees 1 each: before,
    # three trainings of one rank each; now an error naming both sizes.
    script = tmp_path / "one_job.py"
    script.write_text(ONE_JOB)
    rc, out, _ = torchrun(2, script, env=torchrun_env(HOROVOD_CONTROLLER="mpi", WORLD_SIZE="2"),
                          timeout=120)
    assert rc != 0, out[-4000:]
    assert "started this process as rank" in out and "of 2" in out, out[-4000:]
    assert "sees 1 rank(s)" in out, out[-4000:]


def test_a_rank_raising_is_named_by_the_others():
    rc, out, took = torchrun(3, SCRIPTS / "crash.py", "raise", timeout=120)
    assert rc != 0
    # The other ranks fail with the raising rank's reason instead of hanging.
    assert "rank 1" in out and "raised" in out, out[-6000:]
    assert "HorovodInternalError" in out, out[-6000:]
    assert took < 100


def test_a_stall_is_reported_then_every_rank_errors():
    env = torchrun_env(HOROVOD_STALL_CHECK_TIME_SECONDS="1",
                       HOROVOD_STALL_SHUTDOWN_TIME_SECONDS="3")
    rc, out, took = torchrun(2, SCRIPTS / "stall.py", "missing", 5, env=env, timeout=120)
    assert rc != 0
    assert "allreduce.grad.w" in out and "stall.py" in out, out[-6000:]
    assert took < 100


def test_a_rank_killed_by_a_signal_ends_the_job():
    rc, out, took = torchrun(3, SCRIPTS / "crash.py", "kill", timeout=120)
    assert rc != 0, out[-4000:]
    assert took < 100, out[-4000:]


def test_torchrun_max_restarts_with_hvd_elastic_run(tmp_path):
    """torchrun's own elasticity: rank 1 dies at step 7 of the first attempt; hvd.elastic.run
    ends the survivor instead of waiting for the dead, torchrun restarts both workers, they
    resume from the checkpoint of the last commit and finish with the uninterrupted weights."""
    rc, out, took = torchrun(2, "--max-restarts", "1", SCRIPTS / "torchrun_restart.py",
                             tmp_path / "ckpt.pt", timeout=180)
    assert rc == 0, out[-6000:]
    assert "START rank 0 restart 1 step 7" in out, out[-6000:]
    assert sorted(line.split()[2] for line in out.splitlines()
                  if "FINAL rank" in line and "restart 1 steps 20 match" in line) == \
        ["0", "1"], out[-6000:]
    # the survivor ends itself saying why, unless torchrun's agent ended it first
    assert ("torchrun restarts the job (--max-restarts 1)" in out
            or "closing signal SIGTERM" in out), out[-6000:]
    assert took < 150, out[-4000:]
