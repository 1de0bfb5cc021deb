"""Top-level pytest configuration.

tests/unit      single-process tests, collected normally.
tests/parallel  every test runs on all ranks under MPI; tests/test_parallel.py launches each
                file with horovodliterun at np = 1, 2 and 3. They are only collected inside such
                a launch (HVDL_PARALLEL_WORKER=1).

Two lanes. The whole builds (tests/test_install.py, tests/test_libstdcxx_build.py: a quarter of
the suite's time, all of it compiling) and then the single-process tests (tests/unit) form the
xdist group "build"; everything else - every test that runs a multi-rank job - forms "main".
Run with ``-n 2 --dist loadgroup`` (the README's test command), each lane gets a worker of its
own and runs in order there, so no two multi-rank jobs ever overlap; the build lane runs at a
low CPU priority (``nice 19`` for the builds, 10 for the unit tests, whose subprocesses must not
starve), filling the time the main lane's jobs leave the CPUs idle (waits, timeouts, sleeping
ranks). Without xdist everything runs in one process, in order, as before.
"""

import os

import pytest

collect_ignore = [] if os.environ.get("HVDL_PARALLEL_WORKER") else ["parallel"]

BUILDS = ("test_install.py", "test_libstdcxx_build.py")


def _niceness(path) -> int | None:
    """The build lane's priority for a test file: 19 for whole builds, 10 for unit tests."""
    if path.name in BUILDS:
        return 19
    if path.parent.name == "unit":
        return 10
    return None


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    for item in items:
        lane = "build" if _niceness(item.path) is not None else "main"
        item.add_marker(pytest.mark.xdist_group(lane))


@pytest.fixture(scope="module", autouse=True)
def _build_lane_yields_the_cpu(request):
    """In an xdist worker, the build lane's process (and what it starts) runs at a low priority:
    the main lane's timings must not suffer from it."""
    target = _niceness(request.node.path)
    if target is not None and os.environ.get("PYTEST_XDIST_WORKER"):
        try:
            os.setpriority(os.PRIO_PROCESS, 0, target)
        except OSError:  # lowering the value back needs root: stay at the higher one
            pass
    yield
