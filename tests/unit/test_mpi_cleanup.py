"""The cleanup after an error waits on MPI requests with a bound (backends/mpi/mpi_transport.h):
a request that a live peer never matches - left posted by an algorithm that failed elsewhere -
is cancelled at the drain's deadline instead of waited for with MPI_Wait for ever. An 8 MiB
receive cancels; a send MPI cannot cancel leaves the transport refusing every later post,
naming the peer, and the process goes on (the job's other communicators still work)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cpp_testing import load_testing_module

T = load_testing_module()
ROOT = Path(__file__).resolve().parents[2]
BOUND = 1.0

pytestmark = pytest.mark.skipif(not T.mpi_built(), reason="this build has no MPI")


@pytest.fixture(scope="module", params=[2, 3], ids=["np2", "np3"])
def job(request) -> dict:
    """Rank 0's results by kind, from one job (every rank printed its line)."""
    np_ = request.param
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    p = subprocess.run([sys.executable, "-m", "horovodlite.runner.launch", "-np", str(np_),
                        sys.executable, "tests/scripts/mpi_cleanup.py", str(BOUND)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    found = {(int(r), k): json.loads(j) for r, k, j in
             re.findall(r"CLEANUP rank (\d+) (\w+) (\{.*\})", p.stdout)}
    assert sorted(found) == sorted((r, k) for r in range(np_) for k in ("recv", "send")), \
        p.stdout + p.stderr
    return {k: v for (r, k), v in found.items() if r == 0}


def test_an_unmatched_receive_is_cancelled_at_the_bound(job):
    r = job["recv"]
    # before: MPI_Wait, which never returned (the job was killed by the timeout above)
    assert BOUND <= r["drained_seconds"] < BOUND + 5, r
    assert re.fullmatch(r"a receive of 8388608 bytes from rank 1, left behind by an earlier "
                        r"error, was not matched in time and was cancelled", r["waited"]), r
    assert r["later"] == "posted", r  # a cancelled receive leaves the transport usable


def test_an_unmatched_send_ends_at_the_bound_and_is_named(job):
    r = job["send"]
    assert BOUND <= r["drained_seconds"] < BOUND + 5, r
    cancelled = "a send of 8388608 bytes to rank 1, left behind by an earlier error, was not " \
                "matched in time and was cancelled"
    broken = "the MPI transport cannot be used any more: a send of 8388608 bytes to rank 1 " \
             "(in its communicator), left behind by an earlier error, was never matched and " \
             "could not be cancelled; the job must be restarted"
    # Whether MPI can cancel a send depends on the MPI (Open MPI cannot); either way the wait
    # ended and says which
    assert r["waited"] in (cancelled, broken, "post refused: " + broken), r
    if broken in r["waited"]:
        assert r["later"] == broken, r
