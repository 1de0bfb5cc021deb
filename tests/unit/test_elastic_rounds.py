"""The rounds of an elastic job without MPI (common/elastic_rounds.py), the driver's blacklist
and the round tag on the launcher's notices - no processes, an in-memory store."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import pytest
import torch.distributed as dist

from horovodlite.common import elastic_rounds as er
from horovodlite.runner import task
from horovodlite.runner.elastic_driver import Blacklist
from horovodlite.runner.elastic_places import Worker


def test_a_round_round_trips_and_knows_its_ranks():
    r = er.Round(3, ["0", "1", "4"], ["a", "a", "b"], "lost c", retired=["2"])
    back = er.Round.from_json(r.to_json())
    assert back == r and back.size == 3 and back.rank_of("4") == 2 and back.rank_of("2") is None


def test_workers_see_the_latest_round_and_wait_for_a_newer_one():
    store = dist.HashStore()
    assert er.latest(store) == -1
    er.publish(store, er.Round(0, ["0", "1"], ["a", "a"], "start"))
    assert er.wait_round(store, -1, 1).number == 0
    with pytest.raises(TimeoutError, match="--elastic-timeout"):
        er.wait_round(store, 0, 0.3, poll=0.05)
    later = threading.Timer(0.2, er.publish, (store, er.Round(1, ["0"], ["a"], "lost 1")))
    later.start()
    got = er.wait_round(store, 0, 5, poll=0.05)
    later.join()
    assert got.number == 1 and got.workers == ["0"]


def test_an_added_worker_waits_for_the_round_that_lists_it():
    store = dist.HashStore()
    er.publish(store, er.Round(0, ["0", "1"], ["a", "a"], "start"))
    threading.Timer(0.2, er.publish,
                    (store, er.Round(1, ["0", "1", "2"], ["a", "a", "b"], "added"))).start()
    r = er.wait_listing(store, "2", 5, poll=0.05)
    assert r.number == 1 and r.rank_of("2") == 2
    er.publish(store, er.Round(2, [], [], "", end="fewer than --min-np"))
    assert er.wait_listing(store, "7", 1, poll=0.05).end  # an end round ends every wait


def test_reset_requests_are_counted_per_round():
    store = dist.HashStore()
    workers = ["0", "1", "2"]
    assert er.resets_requested(store, 0, workers) == 0
    er.request_reset(store, 0, "0")
    er.request_reset(store, 0, "2")
    er.request_reset(store, 0, "2")  # asking again counts once
    assert er.resets_requested(store, 0, workers) == 2
    assert er.resets_requested(store, 1, workers) == 0


def test_discovery_output_parses_into_slots_per_host():
    assert er.parse_hosts("a:2\n# c\nb\n\na:1\n") == {"a": 3, "b": 1}


def test_the_driver_blacklist_for_good_or_with_a_doubling_cooldown():
    forever = Blacklist(None)
    assert forever.add("h", 0.0) == "for the rest of the job"
    assert forever.blocked("h", 1e9) and not forever.blocked("g", 0.0)
    cool = Blacklist((2.0, 5.0))
    assert cool.add("h", 0.0) == "for 2 s (--blacklist-cooldown-range)"
    assert cool.blocked("h", 1.9) and not cool.blocked("h", 2.1)
    assert cool.add("h", 10.0) == "for 4 s (--blacklist-cooldown-range)"
    assert cool.add("h", 20.0) == "for 5 s (--blacklist-cooldown-range)"


def test_the_driver_signals_a_workers_own_group_and_never_its_own():
    """Worker.signal: SIGTERM to the worker's session while it runs, nothing once it ended; a
    pid below 1 is refused (os.killpg(0) would end the driver's group: a stand-in of the
    scale benchmark with pid 0 once ended the test session that ran it)."""
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    worker = Worker(0, "h", True, proc)
    worker.signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == -signal.SIGTERM
    worker.signal(signal.SIGTERM)  # ended: nothing to do, no error

    class NoProcess:
        pid = 0

        def poll(self):
            return None
    with pytest.raises(ValueError, match="worker 1 on h: no process to signal"):
        Worker(1, "h", False, NoProcess()).signal(signal.SIGTERM)


def test_the_wrapper_tags_an_elastic_notice_with_its_round(monkeypatch):
    """The rank's runtime drops a notice whose round is before its own (LauncherNotices)."""
    read, write = os.pipe()
    try:
        monkeypatch.setenv("HVDL_WORKER_ID", "3")
        reporter = task.Reporter(None, 3, write)
        reporter._event(b'{"event": "lost", "host": "h1", "ranks": [2], "why": "gone", '
                        b'"round": 4}')
        reporter._event(b'{"event": "failed", "rank": 1, "host": "h0", "why": "status 3"}')
        time.sleep(0.05)
        lines = os.read(read, 4096).decode().splitlines()
    finally:
        os.close(read)
        os.close(write)
    assert lines == ["@4 lost h1 (rank 2): gone", "lost rank 1 (host h0): status 3"]
