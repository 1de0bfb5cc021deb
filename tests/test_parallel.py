"""Runs every tests/parallel/test_*.py file under ``horovodliterun -np N`` for N in 1, 2, 3.

Each rank runs pytest on the file and asserts on its own; a failing rank makes mpirun exit
non-zero, and a hang is bounded by a timeout (the stall inspector turns a missing collective into
an error on every rank first). On failure the tail of every rank's output is shown.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from launching import retry_if_launcher_did_not_start

HERE = Path(__file__).parent
# test_gpu_*.py need a GPU and particular environments: tests/test_gpu.py launches them.
PARALLEL = sorted(p.name for p in (HERE / "parallel").glob("test_*.py")
                  if not p.name.startswith("test_gpu"))
SIZES = [int(n) for n in os.environ.get("HVDL_TEST_SIZES", "1,2,3").split(",")]
TIMEOUT = int(os.environ.get("HVDL_PARALLEL_TIMEOUT", "300"))


def run_parallel(np_: int, target: str, extra_env: dict | None = None,
                 timeout: int = TIMEOUT, launch_args: tuple = (),
                 on_host: list | None = None) -> subprocess.CompletedProcess:
    """Runs ``pytest target`` on every rank; returns the CompletedProcess (output combined).

    The job runs in its own process group so that a timeout kills every rank, and its output
    goes to a file so that a hang still shows what each rank printed last. ``launch_args`` go
    to horovodliterun (e.g. -H for test hosts); ``on_host`` prefixes the launch (e.g. the test
    hosts' ``hostctl.sh run hvdl-host0``, to launch from that host as on a cluster).
    """
    env = dict(os.environ)
    env.update({
        "HVDL_PARALLEL_WORKER": "1",
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
        # A collective missing on some rank becomes an error on every rank instead of a hang.
        "HOROVOD_STALL_CHECK_TIME_SECONDS": env.get("HOROVOD_STALL_CHECK_TIME_SECONDS", "20"),
        "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": env.get("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "60"),
    })
    env.update(extra_env or {})
    cmd = [*(on_host or []), sys.executable, "-m", "horovodlite.runner.launch",
           "-np", str(np_), *launch_args, sys.executable, "-m", "pytest", "-x", "-q",
           "-p", "no:cacheprovider",
           "--timeout", str(max(timeout - 30, 60)), "-o", "addopts=", target]
    with tempfile.TemporaryFile(mode="w+") as log:
        proc = subprocess.Popen(cmd, cwd=HERE.parent, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            log.seek(0)
            pytest.fail(f"np={np_} {target}: no result after {timeout}s (hang)\n"
                        f"{log.read()[-8000:]}")
        log.seek(0)
        return subprocess.CompletedProcess(cmd, proc.returncode, log.read(), "")


def _as_tuple(proc: subprocess.CompletedProcess) -> tuple:
    return proc.returncode, proc.stdout, proc


@pytest.mark.parametrize("np_", SIZES, ids=lambda n: f"np{n}")
@pytest.mark.parametrize("module", PARALLEL)
def test_parallel(module, np_):
    proc = retry_if_launcher_did_not_start(
        lambda: _as_tuple(run_parallel(np_, f"tests/parallel/{module}")))[2]
    if proc.returncode != 0:
        pytest.fail(f"np={np_} {module} failed (exit {proc.returncode}):\n{proc.stdout[-10000:]}")


def test_process_set_barriers_at_np4():
    """Issue 15 asks for the independent process-set barriers at np 4 too (two sets of two)."""
    target = "tests/parallel/test_dropin_parity.py::test_process_set_barriers_are_independent"
    proc = retry_if_launcher_did_not_start(lambda: _as_tuple(run_parallel(4, target)))[2]
    if proc.returncode != 0:
        pytest.fail(f"np=4 {target} failed (exit {proc.returncode}):\n{proc.stdout[-10000:]}")
