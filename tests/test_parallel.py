"""Runs every tests/parallel/test_*.py file under ``horovodliterun -np N`` for N in 1, 2, 3, and
some of them under ``horovodliterun --gloo`` (the controller without MPI) for N in 2, 3.

Each rank runs pytest on the file and asserts on its own; a failing rank makes the launcher exit
non-zero, and a hang is bounded by a timeout (the stall inspector turns a missing collective into
an error on every rank first). On failure the tail of every rank's output is shown.

One test per file and number of ranks, but one job for all the files of a launcher and number of
ranks selected in the session (``SOLO`` files run alone): starting ranks costs seconds a job,
which for 23 files at 1, 2 and 3 ranks was most of this module's 13 minutes. The first test of a
batch runs the job; each rank reports every file's outcome (tests/parallel/conftest.py), and a
file's test fails if a rank failed in it, if not every rank reported it, or with the job's
output if the job failed without saying where.
``launch_command`` builds the launch for each launcher; a new launcher is one more entry there
and in ``CASES``.
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
# The files the Gloo controller runs too: data movement, errors, the optimizer, its own init.
GLOO = ["test_allreduce.py", "test_collectives.py", "test_errors.py", "test_optimizer_api.py",
        "test_optimizer_native.py", "test_gloo_init.py", "test_sharded_optimizer.py",
        "test_combinations.py", "test_powersgd.py",
        "test_sharded_overlap.py", "test_bucket_views.py"]
CASES = ([("mpi", m, n) for m in PARALLEL for n in SIZES] +
         [("gloo", m, n) for m in GLOO for n in SIZES if n in (2, 3)])
# Files that start horovodlite differently from the others (process sets made dynamic or not at
# init), so they need ranks of their own.
SOLO = {"test_process_sets.py"}
_BATCHES = {}  # (launcher, np) -> (job, {file: [each rank's report of it]})


def launch_command(launcher: str, np_: int, launch_args: tuple = ()) -> list:
    """The command that starts ``np_`` ranks with ``launcher``, up to the ranks' command."""
    run = [sys.executable, "-m", "horovodlite.runner.launch"]
    if launcher == "mpi":
        return [*run, "--mpi", "-np", str(np_), *launch_args]
    if launcher == "gloo":
        return [*run, "--gloo", "-np", str(np_), *launch_args]
    raise ValueError(f"unknown launcher {launcher!r}")


def _mpi_built() -> bool:
    from horovodlite.runner.launch import mpi_built
    return mpi_built()


def run_parallel(np_: int, target: str | list, extra_env: dict | None = None,
                 timeout: int = TIMEOUT, launch_args: tuple = (),
                 on_host: list | None = None, launcher: str = "mpi",
                 test_timeout: int | None = None) -> subprocess.CompletedProcess:
    """Runs ``pytest target`` (a path or a list of them) on every rank; returns the
    CompletedProcess (output combined).

    The job runs in its own process group so that a timeout kills every rank, and its output
    goes to a file so that a hang still shows what each rank printed last. ``launch_args`` go
    to horovodliterun (e.g. -H for test hosts); ``on_host`` prefixes the launch (e.g. the test
    hosts' ``hostctl.sh run hvdl-host0``, to launch from that host as on a cluster);
    ``launcher`` is one of ``launch_command``'s. A list of paths runs on after a failure
    (``-x`` for one path); ``test_timeout`` bounds each test (default: ``timeout``).
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
    cmd = [*(on_host or []), *launch_command(launcher, np_, launch_args),
           sys.executable, "-m", "pytest", *(["-x"] if isinstance(target, str) else []), "-q",
           "-p", "no:cacheprovider",
           "--timeout", str(max((test_timeout or timeout) - 30, 60)),
           "-o", "addopts=", *([target] if isinstance(target, str) else target)]
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


@pytest.mark.parametrize("launcher, module, np_", CASES,
                         ids=[f"{launcher}-{m}-np{n}" for launcher, m, n in CASES])
def test_parallel(launcher, module, np_, request):
    if launcher == "mpi" and not _mpi_built():
        pytest.skip("this build has no MPI")
    if module in SOLO:
        proc = retry_if_launcher_did_not_start(lambda: _as_tuple(
            run_parallel(np_, f"tests/parallel/{module}", launcher=launcher)))[2]
        if proc.returncode != 0:
            pytest.fail(f"{launcher} np={np_} {module} failed (exit {proc.returncode}):\n"
                        f"{proc.stdout[-10000:]}")
        return
    if (launcher, np_) not in _BATCHES:
        _BATCHES[(launcher, np_)] = _run_batch(launcher, np_, _batch_of(request, launcher, np_))
    proc, reports = _BATCHES[(launcher, np_)]
    mine = reports.get(module, [])
    failed = [t for r in mine for t in r["failed"]]
    # a job that failed with no failing test reported anywhere (a crash at exit) fails them all
    unexplained = proc.returncode != 0 and not any(
        r["failed"] for rs in reports.values() for r in rs)
    if (failed or unexplained or len(mine) != np_
            or not any(r["passed"] + r["skipped"] for r in mine)):
        why = (f"failed on some rank: {sorted(set(failed))}" if failed else
               "the job failed without naming a test" if unexplained else
               f"reported by {len(mine)} of {np_} ranks")
        pytest.fail(f"{launcher} np={np_} {module} {why} (the job of {len(reports)} files "
                    f"exited {proc.returncode}):\n{proc.stdout[-10000:]}")


def _batch_of(request, launcher: str, np_: int) -> list:
    """The files of this launcher and number of ranks that this session runs, but SOLO ones."""
    out = []
    for item in request.session.items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if (item.originalname == "test_parallel" and params.get("launcher") == launcher
                and params.get("np_") == np_ and params["module"] not in SOLO):
            out.append(params["module"])
    return out


def _run_batch(launcher: str, np_: int, files: list) -> tuple:
    """One job running ``files``: its CompletedProcess and each file's reports."""
    import json
    with tempfile.TemporaryDirectory(prefix="hvdl-batch-") as folder:
        def attempt():
            for old in Path(folder).glob("report-*.json"):
                old.unlink()
            return _as_tuple(run_parallel(
                np_, [f"tests/parallel/{f}" for f in files], launcher=launcher,
                timeout=2 * TIMEOUT, test_timeout=TIMEOUT,
                extra_env={"HVDL_PARALLEL_REPORT": folder}))
        proc = retry_if_launcher_did_not_start(attempt)[2]
        reports = {}
        for path in Path(folder).glob("report-*.json"):
            for file, outcome in json.loads(path.read_text()).items():
                reports.setdefault(file, []).append(outcome)
    return proc, reports


def test_process_set_barriers_at_np4():
    """Issue 15 asks for the independent process-set barriers at np 4 too (two sets of two)."""
    target = "tests/parallel/test_dropin_parity.py::test_process_set_barriers_are_independent"
    proc = retry_if_launcher_did_not_start(lambda: _as_tuple(run_parallel(4, target)))[2]
    if proc.returncode != 0:
        pytest.fail(f"np=4 {target} failed (exit {proc.returncode}):\n{proc.stdout[-10000:]}")
