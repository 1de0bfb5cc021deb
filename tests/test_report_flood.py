"""The rank reports' server (runner/report.py) against a flood of connections that say nothing,
on 127.0.0.1 only: the server runs in its own process with few descriptors
(tests/scripts/report_flood.py, RLIMIT_NOFILE 64), 200 connections open and stay silent, then a
real rank reports. Without a bound on silent connections they held every descriptor: ``accept``
failed with EMFILE at once again on each wake (a spinning loop) and the real rank was never
heard. Every wait here is bounded."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from horovodlite.runner import task

ROOT = Path(__file__).resolve().parent.parent
FLOOD = 200
NOFILE = 64
IDLE = 1.0  # the server's bound on a connection's silence before its signed hello (s)
WAIT = 30.0  # the server's wait for the real report (s)


def test_a_flood_of_silent_connections_neither_starves_nor_spins_the_report_server():
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests/scripts/report_flood.py"),
                             str(NOFILE), str(IDLE), str(WAIT)], cwd=ROOT, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    flood = []
    try:
        first = proc.stdout.readline().split()
        assert first[:1] == ["PORT"], first
        port, token = int(first[1]), first[3]
        for _ in range(FLOOD):
            flood.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        link = None
        deadline = time.monotonic() + WAIT
        while link is None and time.monotonic() < deadline:
            link = task.connect([("127.0.0.1", port)], token,
                                {"event": "started", "rank": 0, "host": "h", "pid": os.getpid()})
        assert link is not None, "the real rank never got the server's signed ok"
        link.send({"event": "exited", "status": 0})
        report = proc.stdout.readline().strip()
        counters = json.loads(proc.stdout.readline().split(" ", 1)[1])
        assert report == "REPORT 0 0", (report, counters)
        # every silent connection is closed by the server (its end reaches the client)
        closed = 0
        for s in flood:
            s.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                while s.recv(4096):
                    pass  # the challenge line
                closed += 1
            except OSError:
                pass
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0
        counters_after = counters
    finally:
        for s in flood:
            s.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert closed == FLOOD, (closed, counters_after)
    # the flood did exhaust the descriptors, and each failed accept freed one: no spinning
    assert 1 <= counters_after["accept_failures"] <= FLOOD + 1, counters_after
    assert counters_after["refused"] == 0, counters_after
