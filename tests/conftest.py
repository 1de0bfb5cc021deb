"""Top-level pytest configuration.

tests/unit      single-process tests, collected normally.
tests/parallel  every test runs on all ranks under MPI; tests/test_parallel.py launches each
                file with horovodliterun at np = 1, 2 and 3. They are only collected inside such
                a launch (HVDL_PARALLEL_WORKER=1).

Two lanes. The whole builds (tests/test_install.py, tests/test_libstdcxx_build.py: a quarter of
the suite's time, all of it compiling) form the xdist group "build"; everything else forms
"main". Run with ``-n 2 --dist loadgroup`` (the README's test command), each lane gets a worker
of its own and runs in order there, so no two multi-rank jobs ever overlap; the build lane runs
at the lowest CPU priority (``nice 19``), filling the time the main lane's jobs leave the CPUs
idle (waits, timeouts, sleeping ranks) without slowing them. Without xdist everything runs in
one process, in order, as before.
"""

import os

import pytest

collect_ignore = [] if os.environ.get("HVDL_PARALLEL_WORKER") else ["parallel"]

BUILD_LANE = ("test_install.py", "test_libstdcxx_build.py")


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    for item in items:
        lane = "build" if item.path.name in BUILD_LANE else "main"
        item.add_marker(pytest.mark.xdist_group(lane))


@pytest.fixture(scope="module", autouse=True)
def _build_lane_yields_the_cpu(request):
    """In an xdist worker, the build lane's process (and the compilers it starts) run at the
    lowest priority: the main lane's timings must not suffer from them."""
    if request.node.path.name in BUILD_LANE and os.environ.get("PYTEST_XDIST_WORKER"):
        current = os.nice(0)
        if current < 19:
            os.nice(19 - current)
    yield
