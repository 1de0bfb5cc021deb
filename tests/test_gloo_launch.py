"""Real jobs of ``horovodliterun --gloo`` on this machine (tests/scripts/gloo_job.py, every rank
asserting): ranks placed and reducing together at np 2 and 3, a rank exiting 3 or killed in a
collective named by the launcher and (killed) by every survivor within
HOROVOD_GLOO_TIMEOUT_SECONDS, a worker of another job refused at the rendezvous while the job
goes on (and the rendezvous and reports not listening on other addresses), --output-filename and
--config-file, and ranks that never start or cannot be started. Each job is bounded in
time. Across test hosts: tests/test_multihost.py; the parallel test files: tests/test_parallel.py.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
from launching import communicate_all, run_job

HERE = Path(__file__).parent
SCRIPT = HERE / "scripts" / "gloo_job.py"


def gloo_job(np_: int, *args: str, launch_args: tuple = (), env: dict | None = None,
             timeout: float = 120) -> tuple:
    """(exit status, stdout + stderr, seconds) of ``horovodliterun --gloo -np N ...``."""
    cmd = [sys.executable, "-m", "horovodlite.runner.launch", "--gloo", "-np", str(np_),
           *launch_args, sys.executable, str(SCRIPT), *args]
    full_env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", **(env or {}))
    return run_job(cmd, cwd=HERE.parent, env=full_env, timeout=timeout)


def ok_lines(out: str) -> dict:
    """rank -> the fields of its "OK" line (as forwarded: ``[rank]<stdout>:OK ...``)."""
    found = {}
    for m in re.finditer(r"^\[(\d+)\]<stdout>:OK (.*)$", out, re.M):
        found[int(m.group(1))] = m.group(2).split()
    return found


@pytest.mark.parametrize("np_", [2, 3])
def test_ranks_see_their_place_and_reduce_together(np_):
    rc, out, _ = gloo_job(np_, "check", launch_args=("--verbose",))
    assert rc == 0, out
    assert "horovodliterun: rendezvous at 127.0.0.1:" in out, out
    oks = ok_lines(out)
    assert sorted(oks) == list(range(np_)), out
    for rank, fields in oks.items():
        assert fields[:6] == [str(rank), str(np_), str(rank), str(np_), "0", "1"], out


def test_a_rank_exiting_with_an_error_fails_the_job_naming_it():
    rc, out, took = gloo_job(2, "exit")
    assert rc != 0, out
    assert "horovodliterun: the job did not complete:" in out, out
    assert re.search(r"^  rank 1 on \S+ exited with status 3$", out, re.M), out
    assert took < 60, out


def test_a_rank_killed_in_a_collective_is_named_by_every_survivor_in_time():
    rc, out, took = gloo_job(3, "kill", env={"HOROVOD_GLOO_TIMEOUT_SECONDS": "10"})
    assert rc != 0, out
    killed_at = float(re.search(r"^\[1\]<stdout>:KILLING (\S+)$", out, re.M).group(1))
    raised = {int(m.group(1)): (float(m.group(2)) - killed_at, m.group(3))
              for m in re.finditer(r"^\[\d\]<stdout>:RAISED (\d) (\S+) (.*)$", out, re.M)}
    assert sorted(raised) == [0, 2], out
    for rank, (after, message) in raised.items():
        assert after < 10, (rank, after, message)
        assert re.search(r"\brank 1\b.*(exited|lost|killed)", message), (rank, message)
    assert re.search(r"^  rank 1 on \S+ exited with signal 9$", out, re.M), out
    assert took < 60, out


def test_a_worker_of_another_job_is_refused_and_the_job_goes_on():
    rc, out, _ = gloo_job(2, "foreign")
    assert rc == 0, out
    assert re.search(r"^\[0\]<stdout>:REFUSED .*belongs to another horovodlite job", out,
                     re.M), out
    assert re.search(r"^\[0\]<stdout>:NOT ON ", out, re.M), out  # only on the job's address
    assert sorted(ok_lines(out)) == [0, 1], out


def test_output_files_and_a_config_file(tmp_path):
    config = tmp_path / "job.yaml"
    config.write_text(f"num_proc: 3\noutput-filename: {tmp_path / 'logs'}\nstart_timeout: 60\n")
    rc, out, _ = gloo_job(2, "check", launch_args=("--config-file", str(config)))
    assert rc == 0, out
    assert sorted(ok_lines(out)) == [0, 1], out  # -np 2 on the command line wins
    logs = tmp_path / "logs"
    assert sorted(str(p.relative_to(logs)) for p in logs.rglob("*") if p.is_file()) == [
        "rank.0/stderr", "rank.0/stdout", "rank.1/stderr", "rank.1/stdout"]
    for rank in (0, 1):
        assert (logs / f"rank.{rank}" / "stdout").read_text().startswith(f"OK {rank} 2 "), out


def test_ranks_that_do_not_start_in_time_fail_the_job(tmp_path):
    agent = tmp_path / "agent.sh"  # an ssh that never connects
    agent.write_text("#!/bin/sh\nexec sleep 60\n")
    agent.chmod(0o755)
    rc, out, took = gloo_job(2, "check", launch_args=(
        "-H", "unreachable.invalid:1,localhost:1", "--network-interface", "lo",
        "--ssh-agent", str(agent), "--start-timeout", "3"))
    assert rc == 1, out
    assert "horovodliterun: rank(s) 0 did not start within 3 s (--start-timeout)" in out, out
    assert "  rank 0 on unreachable.invalid did not start within 3 s (--start-timeout)" in out
    assert took < 30, out


def test_a_host_that_cannot_be_reached_ends_the_job_at_once():
    rc, out, took = gloo_job(2, "check", launch_args=(
        "-H", "localhost:1,unreachable.invalid:1", "--network-interface", "lo",
        "--ssh-agent", "false"))  # an ssh that fails to connect
    assert rc == 1, out
    assert "rank 1 on unreachable.invalid exited with status 1 before it started; ending the " \
           "job" in out, out
    assert "  rank 1 on unreachable.invalid never started: its --ssh-agent exited with status 1" \
           in out, out
    assert took < 20, out


REINIT = """
import torch, horovodlite.torch as hvd
for k in range(3):
    hvd.init()
    assert hvd.gloo_enabled()
    out = hvd.allreduce(torch.ones(1) * (hvd.rank() + k), op=hvd.Sum, name=f"round{k}")
    assert out.item() == 1 + 2 * k, out
    hvd.shutdown()
print("DONE", flush=True)
"""


def plain_ranks(script: str, per_rank=({}, {})) -> list:
    """(exit status, output) of each of len(per_rank) processes started with nothing but
    MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE (a Kubernetes job without torchrun's agent: rank 0
    hosts the store), rank r's environment updated with per_rank[r]."""
    import socket
    import subprocess

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    n = len(per_rank)
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("OMPI_", "PMIX_", "PMI_", "HOROVOD_", "TORCHELASTIC_"))}
    base.update(WORLD_SIZE=str(n), LOCAL_WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port), OMP_NUM_THREADS="1", HOROVOD_GLOO_TIMEOUT_SECONDS="20")
    procs = [subprocess.Popen([sys.executable, "-c", script], cwd=HERE.parent, text=True,
                              env=dict(base, RANK=str(r), LOCAL_RANK=str(r), **per_rank[r]),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for r in range(n)]
    return communicate_all(procs, 120)


def test_init_after_shutdown_where_rank_0_hosts_the_rendezvous():
    """Rank 0 hosts the store; an init after shutdown meets through the store it already hosts
    (hosting again found its own port taken)."""
    for r, (rc, out) in enumerate(plain_ranks(REINIT)):
        assert rc == 0 and "DONE" in out, f"rank {r}:\n{out[-4000:]}"


def test_ranks_with_different_gloo_connections_are_told_on_every_rank():
    script = ("import time, horovodlite.torch as hvd\n"
              "try:\n    hvd.init()\nexcept hvd.HorovodInternalError as e:\n"
              "    print('RAISED', e, flush=True)\n"
              "time.sleep(3)  # rank 0 hosts the store the others read the verdict from\n")
    results = plain_ranks(script, ({"HOROVOD_GLOO_CONNECTIONS": "2"},
                                   {"HOROVOD_GLOO_CONNECTIONS": "3"}))
    for rc, out in results:
        assert rc == 0, out[-4000:]
        assert "RAISED" in out and "HOROVOD_GLOO_CONNECTIONS differs between ranks" in out, out
        assert "rank 0 2" in out and "rank 1 3" in out, out
