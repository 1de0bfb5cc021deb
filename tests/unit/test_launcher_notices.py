"""LauncherNotices (csrc/core/launcher_notices): the launcher's pipe of "lost ..." lines, read by
one thread per process and handed to every Context listening.

A process may hold several Contexts: an aborted one is never destroyed, nor one left after a
recovery, and an elastic worker leaves one behind at each reset that lost ranks. With a reader
thread per Context, a line woke every reader but only one read it: the live Context often
missed it, and the reader that lost the race blocked in read(), so the next hvd.shutdown() -
joining that reader - never returned (scripts/elastic_chaos.py --seed 2026 stalled on it: rank 0
hung in shutdown at a reset while the re-added workers waited for it at the rendezvous).

Each script runs in a process of its own (the pipe is claimed once per process), bounded so that
a hang fails the test instead of stalling the suite."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from cpp_testing import load_testing_module

T = load_testing_module()
HERE = Path(__file__).resolve().parent

CHILD = """
import json, os, sys
sys.path.insert(0, sys.argv[1])
from cpp_testing import load_testing_module
T = load_testing_module()
steps = [tuple(s) for s in json.loads(sys.argv[3])]
print(json.dumps(T.launcher_notices_script(int(sys.argv[2]), steps)))
"""


def run_script(steps: list) -> list:
    """Each subscriber's lines after ``steps`` (see launcher_notices_script)."""
    read_end, write_end = os.pipe()
    try:
        env = dict(os.environ, HVDL_NOTICE_FD=str(read_end), HOROVODLITE_NO_REBUILD="1")
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, str(HERE), str(write_end), json.dumps(steps)],
            env=env, pass_fds=(read_end, write_end), capture_output=True, text=True,
            timeout=120)
    finally:
        os.close(read_end)
        os.close(write_end)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def test_every_context_gets_every_line_and_each_stops_at_once():
    # subscriber 0 stands for a context left behind, 1 for the live one
    got = run_script([["subscribe"], ["subscribe"],
                      ["write", "lost h1 (ranks 2, 3): it exited with signal 9\n"],
                      ["wait", 0, 1], ["wait", 1, 1],
                      ["write", "lost h2 (rank 1): no report for 15 s\n"],
                      ["wait", 0, 2], ["wait", 1, 2],
                      ["unsubscribe", 1], ["subscribe"],
                      ["write", "lost h3 (rank 0): it exited with status 1\n"],
                      ["wait", 0, 3], ["wait", 2, 1]])
    first, second = ("lost h1 (ranks 2, 3): it exited with signal 9",
                     "lost h2 (rank 1): no report for 15 s")
    third = "lost h3 (rank 0): it exited with status 1"
    assert got == [[first, second, third], [first, second], [third]]


def test_lines_between_two_contexts_wait_for_the_next_and_stale_rounds_are_dropped():
    got = run_script([["subscribe"], ["round", 4], ["unsubscribe", 0],
                      ["write", "@3 lost h1 (rank 1): stale\n@4 lost h2 (rank 2): late\n"],
                      ["subscribe"], ["wait", 1, 1],
                      ["write", "@4 lost h3 (rank 3): now\n"], ["wait", 1, 2]])
    # nobody listened when the lines came: the next context gets them (those still current),
    # on its subscription, as a fresh reader would have found them in the pipe
    assert got == [[], ["lost h2 (rank 2): late", "lost h3 (rank 3): now"]]
