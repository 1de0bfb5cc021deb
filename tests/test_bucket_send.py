"""A ready gradient bucket goes out at once (HOROVOD_BUCKET_SEND_NOW, default on), overlapping
the rest of backward, instead of being batched with later work: the jobs below batch new work
for 60 s (HOROVOD_CYCLE_TIME=60000), and each rank checks that its bucket was reduced while
nobody waited - on a host that holds new work until a thread waits (HOROVOD_HOLD_UNTIL_WAIT=1)
too -, that with HOROVOD_BUCKET_SEND_NOW=0 it was not, and that every case gives the averaged
gradients (tests/scripts/bucket_send.py). Real jobs at 1, 2 and 3 ranks, under MPI and under the
Gloo controller."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from launching import retry_if_launcher_did_not_start, run_job, unprefixed

HERE = Path(__file__).parent
BATCH = {"HOROVOD_CYCLE_TIME": "60000", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


@pytest.mark.parametrize("launcher,np_,hold", [("mpi", 1, "0"), ("mpi", 2, "0"), ("mpi", 3, "0"),
                                               ("gloo", 2, "0"), ("mpi", 2, "1")],
                         ids=["mpi-np1", "mpi-np2", "mpi-np3", "gloo-np2", "mpi-np2-hold"])
def test_a_ready_bucket_goes_out_while_nobody_waits(launcher, np_, hold):
    cmd = [sys.executable, "-m", "horovodlite.runner.launch",
           *(["--gloo"] if launcher == "gloo" else []), "-np", str(np_), sys.executable,
           str(HERE / "scripts" / "bucket_send.py")]
    env = dict(os.environ, HOROVOD_HOLD_UNTIL_WAIT=hold, **BATCH)
    rc, out, _ = retry_if_launcher_did_not_start(
        lambda: run_job(cmd, cwd=HERE.parent, env=env, timeout=240))
    out = unprefixed(out)
    assert rc == 0, out[-5000:]
    for rank in range(np_):
        for mode in ("1", "0"):
            assert f"BUCKET SEND rank {rank} send_now={mode} ok" in out, out[-5000:]
