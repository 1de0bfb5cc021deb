"""The sanitizer lane: the extension built with AddressSanitizer and UndefinedBehaviorSanitizer
(scripts/sanitize.py; build/sanitize-address-undefined, the normal build untouched) runs the C++
unit tests - the transport failure tests among them -, the failure tests and a Gloo elastic job.
A finding aborts the process it happens in, so the inner run fails and its output (the report)
is in the assertion. docs/sanitizers.md says how to run it by hand and what it covers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import sanitize  # noqa: E402

# The C++ unit tests that drive csrc through horovodlite._testing (tests/unit/cpp_testing.py):
# these whole; of the large parametrized ones (1,000+ cases each, minutes under ASan) every
# SAMPLE-th case, which still covers each algorithm, dtype and op.
UNIT = ["test_transport_failures.py", "test_host_collectives.py", "test_single_copy.py",
        "test_shm.py", "test_handle_waits.py", "test_negotiation.py", "test_device_inflight.py"]
SAMPLED = ["test_kernels_and_ring.py", "test_hierarchical.py", "test_device_path.py"]
SAMPLE = 7
# Multi-process jobs: the failure tests' lost ranks and hosts, and a Gloo elastic job that
# loses a worker mid-step (the surviving ranks' cancelled collectives, the next round).
# Of test_failures.py the failure paths and a recorded timeline; left out are the jobs that only
# wait (a slow rank's warning), that kill the job (a killed process's heap is not checked) or that
# only read the log (log prefixes, the summary): each is a job of its own, at ASan's cost.
JOBS = ["test_failures.py", "-k", "not (slow_rank or killed_by_a_signal or stays_valid_json or "
        "log_lines or summary_every)",
        "test_elastic_gloo.py::test_a_worker_killed_mid_step_the_others_finish_without_rolling_back"]


@pytest.fixture(scope="module")
def env():
    try:
        sanitize.build(unity=True)  # a whole build in batches: less than half the CPU time
    except subprocess.CalledProcessError as e:
        pytest.fail(f"the sanitizer build failed: {e}")
    env = sanitize.environment()
    # the inner runs read node ids from `pytest -q --collect-only`: options of the outer run's
    # (PYTEST_ADDOPTS=-v prints a tree instead) are not theirs
    env.pop("PYTEST_ADDOPTS", None)
    return env


def pytest_run(env, tests, timeout):
    # From tests/: `python -m` puts the working folder first on sys.path, which must not be the
    # source tree (its horovodlite is the unsanitized one).
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-x",
                           *tests], cwd=ROOT / "tests", env=env, capture_output=True, text=True,
                          timeout=timeout)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-12000:]
    assert "ERROR: AddressSanitizer" not in out and "runtime error:" not in out, out[-12000:]
    return out


def test_the_lane_loads_the_sanitized_module(env):
    code = ("import horovodlite._C as c, horovodlite._testing as t; "
            "print(c.__file__); print(t.__file__)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT / "tests", env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    pkg = str(sanitize.folder(sanitize.DEFAULT) / "pkg")
    assert all(line.startswith(pkg) for line in proc.stdout.split()), proc.stdout


def sample(env, files):
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                           "--collect-only", *files], cwd=ROOT / "tests", env=env,
                          capture_output=True, text=True, timeout=600)
    # node ids are relative to the root folder; the run is from tests/
    ids = [line.removeprefix("tests/") for line in proc.stdout.splitlines() if "::" in line]
    assert ids, proc.stdout[-4000:] + proc.stderr[-4000:]
    return ids[::SAMPLE]


def test_cpp_unit_tests_under_asan_and_ubsan(env):
    tests = [f"unit/{name}" for name in UNIT] + sample(env, [f"unit/{n}" for n in SAMPLED])
    pytest_run(env, tests, timeout=900)


def test_failure_jobs_under_asan_and_ubsan(env):
    pytest_run(env, JOBS, timeout=900)
