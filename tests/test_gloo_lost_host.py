"""A host lost under a 3-host Gloo job (the controller without MPI, one rank per test host):
host 2's processes are killed mid-training. Host 0's root was gathering from both other hosts
(comm/hierarchical_control_plane's CrossGather) when one of them went: its posted receives must
be waited for or cancelled for good (comm/transport.h), so host 1's late message never lands in
freed memory, and the cancel closes the group's connections (backends/gloo/gloo_work.h), so no
Gloo loop thread is left spinning on an unread message. Every survivor raises naming the lost
host, then stays idle: the job script measures its own CPU time over two seconds after the
error and reports it."""

from __future__ import annotations

import re

from hosts.fixture import hosts_fixture
from test_multihost import LAYOUTS, _kill_host, _run_and_lose

hosts = hosts_fixture(3)

IDLE_JOB = """
import os, time, torch, horovodlite.torch as hvd
from pathlib import Path
hvd.init()
print("UP", hvd.rank(), flush=True)
try:
    for i in range(3000):
        hvd.allreduce(torch.ones(1000), name=f"step{i}")
        time.sleep(0.02)
except hvd.HorovodInternalError as e:
    Path(__file__).with_name(f"raised.{hvd.rank()}").write_text(f"{time.time():.3f} {e}")
    # after the error: this process's CPU seconds over two wall seconds (a spinning Gloo loop
    # thread would take about one core)
    before = sum(os.times()[:2])
    time.sleep(2)
    Path(__file__).with_name(f"idle.{hvd.rank()}").write_text(f"{sum(os.times()[:2]) - before}")
    raise
"""


def test_gloo_3_hosts_a_lost_host_every_survivor_raises_and_goes_idle(hosts, tmp_path):
    import test_multihost

    job = test_multihost.LOST_JOB
    test_multihost.LOST_JOB = IDLE_JOB
    try:
        rc, _, out, raised = _run_and_lose(tmp_path, LAYOUTS["3x1"][0], 3,
                                           lambda: _kill_host("hvdl-host2"), gloo=True)
    finally:
        test_multihost.LOST_JOB = job
    assert rc != 0, out
    assert sorted(raised) == [0, 1], out
    for rank, (_, msg) in raised.items():
        assert re.search(r"hvdl-host2|rank 2", msg), (rank, msg)
    for rank in (0, 1):
        cpu = float((tmp_path / f"idle.{rank}").read_text())
        # idle: well under the one core (2 s) a spinning loop thread takes
        assert cpu < 1.0, f"rank {rank} used {cpu:.2f} CPU seconds in 2 s after the error"
