"""Horovod's elastic forms under ``horovodliterun --elastic`` (the Gloo driver): fault tolerance on
fixed hosts (``-np 2 --min-np 2 --max-np 4 -H localhost:2,127.0.0.1:2``, or the same slots from a
discovery script), and workers that learn their start rank and host from HOROVOD_RANK and
HOROVOD_HOSTNAME (tests/scripts/horovod_style_elastic.py).

``localhost`` and ``127.0.0.1`` are two hosts of the job on this machine. The job starts on all
four slots (up to --max-np, as horovodrun); the worker of start rank 0 fails at the start of
epoch 1 - raising, or SIGKILLed - so its host leaves the job, and the two workers of the other
host (start ranks 2 and 3) finish at size 2 after their second rendezvous. Every worker failing
ends the job non-zero.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
from launching import discovery_script, run_job

from horovodlite.common.basics import gloo_built
from horovodlite.runner import elastic_driver, launch, mpi_launch

ROOT = Path(__file__).resolve().parent.parent
WORKER = "tests/scripts/horovod_style_elastic.py"
HOSTS = "localhost:2,127.0.0.1:2"

pytestmark = pytest.mark.skipif(not gloo_built(), reason="this build has no Gloo controller")


def elastic_job(tmp_path, hosts_by: str, *worker_args: str, hosts: str = HOSTS) -> tuple:
    if hosts_by == "discovery":
        _, script = discovery_script(tmp_path, hosts.replace(",", "\n") + "\n")
        given = ["--host-discovery-script", str(script)]
    else:
        given = ["-H", hosts]
    cmd = [sys.executable, "-m", "horovodlite.runner.launch", "--elastic", "-np", "2",
           "--min-np", "2", "--max-np", "4", *given, sys.executable, WORKER, *worker_args]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    rc, out, _ = run_job(cmd, cwd=ROOT, env=env, timeout=150, what="the elastic job")
    return rc, out


def done(out: str) -> dict:
    """start rank -> what the worker reported at its end."""
    found = [json.loads(m) for m in re.findall(r"<stdout>:DONE (\{.*\})$", out, re.M)]
    return {d["start_rank"]: d for d in found}


def started(out: str) -> dict:
    """start rank -> the HOROVOD_* variables the worker saw at its start."""
    found = re.findall(r"<stdout>:UP rank (\d+) (\{.*\})$", out, re.M)
    return {int(r): json.loads(v) for r, v in found}


@pytest.mark.parametrize("fail, hosts_by", [("raise", "hosts"), ("kill", "discovery")])
def test_rank_0_failing_leaves_the_other_host_at_size_2(tmp_path, fail, hosts_by):
    rc, out = elastic_job(tmp_path, hosts_by, "--fail", fail, "--fail-rank", "0")
    assert rc == 0, out
    # the start assignment, as horovodrun gives it, and the host as -H / the script named it
    start = started(out)
    assert sorted(start) == [0, 1, 2, 3], out
    for rank, seen in start.items():
        host = "localhost" if rank < 2 else "127.0.0.1"
        assert seen == {"rank": str(rank), "size": "4", "local_rank": str(rank % 2),
                        "local_size": "2", "cross_rank": str(rank // 2), "cross_size": "2",
                        "hostname": host}, (rank, seen)
    # start ranks 2 and 3 finish at size 2 on 127.0.0.1, after their second rendezvous
    finished = done(out)
    assert sorted(finished) == [2, 3], out
    for start_rank, d in finished.items():
        assert (d["hostname"], d["size"], d["rendezvous"], d["epochs"]) == (
            "127.0.0.1", 2, 2, 3), d
        assert d["rank"] == start_rank - 2, d
    assert "rank 1 (worker 1) on localhost leaves the job with its host" in out, out
    assert "round 1: 2 workers (127.0.0.1:2): they reset and go on" in out, out
    assert re.search(r"worker 0 on localhost: exited with (status 1|signal 9)", out), out


def test_every_worker_failing_ends_the_job_non_zero(tmp_path):
    rc, out = elastic_job(tmp_path, "hosts", "--fail", "raise", "--fail-rank", "all",
                          hosts="localhost:1,127.0.0.1:1")
    assert rc == 1 and done(out) == {}, out
    # (the driver may see both exits in one look, or one and the end below --min-np)
    assert "horovodliterun: the elastic job did not complete: " in out, out
    for worker, host in ((0, "localhost"), (1, "127.0.0.1")):
        assert f"horovodliterun:   worker {worker} on {host}: exited with status 1" in out, out


# -- without a job -------------------------------------------------------------------------------


def test_fixed_hosts_with_max_np_above_np_are_accepted():
    args = launch.parse_args(["--elastic", "-np", "2", "--min-np", "2", "--max-np", "4", "-H",
                              HOSTS, "x"])
    mpi_launch.check_elastic(args, pytest.fail)
    args = launch.parse_args(["--elastic", "-np", "2", "--max-np", "4", "x"])
    with pytest.raises(SystemExit, match="needs --host-discovery-script or -H"):
        mpi_launch.check_elastic(args, lambda m: (_ for _ in ()).throw(SystemExit(m)))


def test_start_places_follow_horovodrun():
    places = elastic_driver.start_places(["a", "b", "a", "c"])
    assert [p["HOROVOD_RANK"] for p in places] == ["0", "1", "2", "3"]
    assert [p["HOROVOD_LOCAL_RANK"] for p in places] == ["0", "0", "1", "0"]
    assert [p["HOROVOD_LOCAL_SIZE"] for p in places] == ["2", "1", "2", "1"]
    assert [p["HOROVOD_CROSS_RANK"] for p in places] == ["0", "1", "0", "2"]
    assert {p["HOROVOD_SIZE"] for p in places} == {"4"}
    assert {p["HOROVOD_CROSS_SIZE"] for p in places} == {"3"}
