"""Top-level pytest configuration.

tests/unit      single-process tests, collected normally.
tests/parallel  every test runs on all ranks under MPI; tests/test_parallel.py launches each
                file with horovodliterun at np = 1, 2 and 3. They are only collected inside such
                a launch (HVDL_PARALLEL_WORKER=1).

Three lanes, and late lanes. The whole builds (tests/test_install.py, tests/test_libstdcxx_build.py,
tests/test_sanitizers.py: most of this lane's time, all of it compiling), the sdist and the docs
builds (tests/test_sdist.py, tests/test_docs.py) form the "build" lane; the multi-rank jobs on
the test hosts (tests/hosts: network namespaces, Slurm on them) form "hosts", the other
multi-rank jobs "main". tests/test_parallel.py's jobs (all tests/parallel files at one number of
ranks, one job per launcher) form one *late* lane per number of ranks, and the single-process
tests of tests/unit one more late lane ("late-unit"). Under pytest-xdist (``-n 3``, the README's
test command) each lane is one work unit of the scheduler below, so it runs on one worker of its
own, in collection order. The three lanes start first, one on each worker; xdist hands a late
lane to a worker only when its lane is nearly done, so the late lanes fill whichever worker ends
first instead of leaving it idle while another still has minutes to go. The build lane runs at a
low CPU priority (``nice 19``), filling the time the multi-rank jobs leave the CPUs idle (waits,
timeouts, sleeping ranks, shaped links); the unit tests' lane at ``nice 10``; the others at the
worker's first priority.

Why two multi-rank lanes side by side on 2 cores: the multi-rank jobs mostly wait. In a whole run
of 2026-12-07 (fresh clone, `--durations=0`, fast state) the single main lane took 33.4 min of
a 34.6 min session, the build lane 19.4 and the late lanes 12.2; the host jobs were 15.2 min of
the main lane. tests/test_multihost_elastic.py (245 s in that run) beside tests/test_compat.py
and tests/test_failures.py (312 s) took 277 s and 259 s, the CPUs 70 % busy. With the three
lanes the CPUs were 98 % busy and the session took 31.0 min, the build lane (starved at nice
19) ending last; the README's command took 34.7 min in all against 39.0. Each lane keeps its
jobs one after the other; tests that watch the test hosts' processes or Slurm's queue see only
their own lane's jobs there. Without xdist everything runs in one process, in order.

Why a scheduler of our own: xdist's ``--dist loadgroup`` finds a test's group in a ``@group``
suffix that its worker writes into ``item._nodeid``; from pytest 9.2 a node's id lives elsewhere,
the suffix is never seen, and the groups silently fall apart (both workers took multi-rank jobs,
the build worker's nice 19 included). The lane here is a function of the test's file alone, read
by the controller from the node id it already has; nothing depends on xdist's markers.

The guard: each worker claims its lane (a file per lane in a directory the controller shares)
before a test of that lane runs. A worker meeting a lane another worker holds, or a second lane of
its own other than a late one (a late lane only ever follows), or a main-lane test at a lowered
priority, stops the whole session with one message before that test starts.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import PurePosixPath

import pytest

collect_ignore = [] if os.environ.get("HVDL_PARALLEL_WORKER") else ["parallel"]

# The test hosts (tests/hosts) run ip and tc, root's tools in /usr/sbin and /sbin; a shell
# started without a login (env -i, cron, some CI runners) leaves them off PATH, and every host
# test would skip as if they were not installed.
_path = os.environ.get("PATH", "").split(os.pathsep)
os.environ["PATH"] = os.pathsep.join(_path + [d for d in ("/usr/sbin", "/sbin") if d not in _path])

BUILDS = ("test_install.py", "test_libstdcxx_build.py", "test_sdist.py", "test_docs.py",
          "test_sanitizers.py")
# the files whose jobs run on the test hosts (tests/hosts); tests/test_parallel.py's are late
HOSTS = ("test_hosts.py", "test_multihost.py", "test_multihost_elastic.py", "test_slurm.py",
         "test_cluster_env.py", "test_gloo_lost_host.py")
MULTI_RANK = ("main", "hosts")
_BASE_NICENESS = os.getpriority(os.PRIO_PROCESS, 0)
_LANES_KEY = "hvdl_lanes_dir"


LATE = "test_parallel.py"
_LATE_PREFIX = "late-"
UNIT = "unit"
UNIT_LANE = _LATE_PREFIX + UNIT
UNIT_NICENESS = 10


def _file_of(path) -> PurePosixPath:
    """The file part of a node id (or a file's path)."""
    return PurePosixPath(str(path).replace(os.sep, "/").split("::", 1)[0])


def lane_of(path) -> str:
    """The lane of a test (a node id, or a file's path): "build", "hosts", "main", or for
    tests/test_parallel.py "late-npN" (N: the number of ranks in the test's id; "late-" without
    one)."""
    file = _file_of(path)
    if file.name in BUILDS:
        return "build"
    if file.name == LATE:
        ranks = re.search(r"(np\d+)\]$", str(path))
        return _LATE_PREFIX + (ranks.group(1) if ranks else "")
    if UNIT in file.parts:
        return UNIT_LANE
    if file.name in HOSTS:
        return "hosts"
    return "main"


def _niceness(path) -> int:
    """The priority a test runs at in an xdist worker: 19 for whole builds, 10 for the unit
    tests' late lane, the worker's own for the multi-rank lanes and tests/test_parallel.py's."""
    lane = lane_of(path)
    if lane == "build":
        return max(19, _BASE_NICENESS)
    return max(UNIT_NICENESS, _BASE_NICENESS) if lane == UNIT_LANE else _BASE_NICENESS


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """One work unit per lane: xdist's scope scheduler, with the lane as the scope."""
    if config.getvalue("dist") not in ("load", "loadgroup", "loadscope", "loadfile"):
        return None  # --dist each / worksteal / no: the user asked for something else
    from collections import OrderedDict

    from xdist.scheduler import LoadScopeScheduling

    class LanesFirst(OrderedDict):
        """xdist's queue of work units, handing out "main", "hosts" and "build" before any late lane
        whatever the collection order (pytest 9.0 collected tests/unit before
        tests/test_docs.py, and a worker that began with the unit tests was then given the
        build lane)."""

        def popitem(self, last=True):
            if not last:
                for lane in self:
                    if not lane.startswith(_LATE_PREFIX):
                        return lane, self.pop(lane)
            return super().popitem(last)

    class LaneScheduling(LoadScopeScheduling):
        def __init__(self, config, log=None):
            super().__init__(config, log)
            self.workqueue = LanesFirst()

        def _split_scope(self, nodeid):
            return lane_of(nodeid)

    return LaneScheduling(config, log)


def _rebuild_once() -> None:
    """An editable install rebuilds its extension at every import (``cmake --build`` under a
    lock: 0.1-0.5 s, one rank after the other), and the suite starts thousands of processes
    that import it. It is rebuilt here, once, and every process the suite starts skips it
    (``HOROVODLITE_NO_REBUILD=1``; the test of the rebuild itself takes the variable away)."""
    if os.environ.get("HOROVODLITE_NO_REBUILD") == "1" or os.environ.get("HVDL_PARALLEL_WORKER"):
        return
    from horovodlite._extension import load

    load()
    os.environ["HOROVODLITE_NO_REBUILD"] = "1"


def pytest_configure(config):
    if not hasattr(config, "workerinput"):  # the controller, before it starts any worker
        _rebuild_once()
    if not hasattr(config, "workerinput") and config.pluginmanager.hasplugin("xdist"):
        config._hvdl_lanes_dir = tempfile.mkdtemp(prefix="hvdl-lanes-")


def pytest_unconfigure(config):
    lanes_dir = getattr(config, "_hvdl_lanes_dir", None)
    if lanes_dir:
        shutil.rmtree(lanes_dir, ignore_errors=True)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    node.workerinput[_LANES_KEY] = node.config._hvdl_lanes_dir


def _lane_violation(config, lane: str, worker: str) -> str | None:
    """Claims `lane` for this worker; returns why the lanes did not hold, or None."""
    lanes_dir = config.workerinput.get(_LANES_KEY)
    if lanes_dir is None:  # a controller without this conftest's hooks: no lanes at all
        return "the controller did not set up the lanes (tests/conftest.py's hooks did not run)"
    mine = getattr(config, "_hvdl_lane", None)
    if mine == lane:
        return None
    if mine is not None and not lane.startswith(_LATE_PREFIX):
        return f"worker {worker} ran the {mine!r} lane and was given a {lane!r} test"
    claim = os.path.join(lanes_dir, lane)
    try:
        fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        os.write(fd, worker.encode())
        os.close(fd)
    except FileExistsError:
        with open(claim) as f:
            owner = f.read()
        if owner != worker:
            return f"the {lane!r} lane is on worker {owner}, and worker {worker} was given its test"
    config._hvdl_lane = lane
    if lane in MULTI_RANK and os.getpriority(os.PRIO_PROCESS, 0) > _BASE_NICENESS:
        return (f"worker {worker} is at nice {os.getpriority(os.PRIO_PROCESS, 0)} "
                f"(the build lane's) and was given a multi-rank test")
    return None


@pytest.fixture(autouse=True)
def _lane(request):
    """In an xdist worker: checks that the lanes held, then runs the build lane's tests (and what
    they start) at a low priority, so that the main lane's timings do not suffer from them."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    config = request.config
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if worker and workers >= 2 and hasattr(config, "workerinput"):  # one worker: no lanes
        lane = lane_of(request.node.nodeid)
        why = _lane_violation(config, lane, worker)
        if why:
            message = ("tests/conftest.py: the suite's lanes did not hold under pytest-xdist: "
                       f"{why} (pytest {pytest.__version__}). Run the README's command with the "
                       "pytest and pytest-xdist that pyproject.toml's test extra allows.")
            request.session.shouldstop = message
            pytest.fail(message, pytrace=False)
        niceness = _niceness(request.node.nodeid)
        if os.getpriority(os.PRIO_PROCESS, 0) != niceness:
            try:
                os.setpriority(os.PRIO_PROCESS, 0, niceness)
            except OSError:  # lowering the value back needs root: stay at the higher one
                pass
    yield
