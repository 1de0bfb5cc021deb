"""What the test harnesses share about launching real jobs.

Open MPI 5's launcher occasionally fails before starting any rank ("The PMIx server's listener
thread failed to start"; seen once in several full runs here, and in other projects' CI). That is
not horovodlite's behaviour under test, so a launch that failed that way is run once more.
"""

from __future__ import annotations

from horovodlite.runner.mpi_launch import TRANSIENT_STARTUP

# The same words horovodliterun itself restarts a job on: needed here for what starts mpirun
# directly, or a job whose restart failed alike.
(LAUNCHER_DID_NOT_START,) = TRANSIENT_STARTUP


def unprefixed(output: str) -> str:
    """A job's output without the ``[rank]<stdout>:`` prefixes horovodliterun puts before each
    rank's lines (both modes), for tests that read the lines as the ranks wrote them."""
    import re

    return re.sub(r"(?m)^\[\d+\]<std(?:out|err)>:", "", output)


def retry_if_launcher_did_not_start(run, attempts: int = 2):
    """Calls ``run()`` -> (returncode, output, ...) again while the launcher itself failed."""
    result = run()
    for _ in range(attempts - 1):
        returncode, output = result[0], result[1]
        if returncode == 0 or LAUNCHER_DID_NOT_START not in output:
            break
        result = run()
    return result


def communicate_all(procs: list, timeout: float, what: str = "rank") -> list:
    """(exit status, output) of each process started with its output piped, in order; if one
    does not end within ``timeout`` s, every one is killed and the test fails naming it."""
    import subprocess

    import pytest

    results = []
    for i, proc in enumerate(procs):
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            pytest.fail(f"{what} {i} did not finish within {timeout:.0f} s")
        results.append((proc.returncode, out))
    return results


def run_job(cmd: list, *, cwd, env: dict, timeout: float, what: str = "the job",
            tail: int = 6000) -> tuple:
    """(exit status, stdout + stderr, seconds) of ``cmd`` run in a session of its own. A job
    that does not end within ``timeout`` s is killed (its whole process group) and fails the
    test with the output's tail."""
    import os
    import signal
    import subprocess
    import time

    import pytest

    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{what} did not end within {timeout:.0f} s:\n{out[-tail:]}")
    return proc.returncode, out, time.monotonic() - start


def run_with_event(cmd: list, log, ranks_up: int, event, timeout: float, *, cwd=None,
                   env: dict | None = None, settle: float = 1.0):
    """Runs the job ``cmd`` with its output in ``log``; once ``ranks_up`` "UP rank" lines are
    in it (and ``settle`` s more), calls ``event()``; waits ``timeout`` s for the end.
    Returns (returncode, output, monotonic time of the event). A job that does not end in
    time is killed (its process group) and fails the test with the output's tail."""
    import os
    import subprocess
    import time

    import pytest

    full_env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", **(env or {}))
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=cwd, env=full_env, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
        deadline = time.monotonic() + 120
        while log.read_text().count("UP rank") < ranks_up and time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            time.sleep(0.2)
        time.sleep(settle)
        at = time.monotonic()
        event()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            pytest.fail(f"no end within {timeout:.0f} s of the event:\n" + log.read_text()[-6000:])
    return proc.returncode, log.read_text(errors="replace"), at


def discovery_script(folder, hosts: str):
    """A host discovery script in ``folder`` printing the file it returns, which holds
    ``hosts`` (``host:slots`` lines) until the test rewrites it. Returns (listing, script)."""
    listing = folder / "hosts"
    listing.write_text(hosts)
    script = folder / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {listing}\n")
    script.chmod(0o755)
    return listing, script


# tests/scripts/elastic_train.py at 3 ranks losing two: (its arguments, the survivors' FINAL
# rank -> (size, epochs, steps), rank 0's LOSSES). The same in both elastic modes.
REPEATED_LOSSES = [  # the steps: a lost rank's batches of the steps applied are not trained again
    # a second rank dies inside the recovery from the first (in its reset callback, after the
    # survivors re-initialised and while they synchronise): recovered again, rank 0 trains alone
    (("--kill", "2:0:3", "--kill-in-reset", "1"), {0: (1, 2, 30)}, "[(0, 3, [1, 2])]"),
    # two losses at different steps: 3 -> 2 -> 1 ranks
    (("--kill", "1:0:2", "--kill", "2:1:1"), {0: (1, 2, 25)}, "[(0, 2, [1]), (1, 1, [2])]"),
]
