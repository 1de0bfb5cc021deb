"""Runs on every rank: starts horovodlite when the test session starts (so skip conditions can
use hvd.size()) and shuts it down at the end."""

import json
import os

import pytest

import horovodlite.torch as hvd

hvd.init()


@pytest.fixture(scope="session", autouse=True)
def _hvd_session():
    yield
    hvd.shutdown()


# tests/test_parallel.py runs several files in one job and reads each file's outcome on each
# rank from here: HVDL_PARALLEL_REPORT names a folder; every rank writes report-<pid>.json,
# {file: {"passed": n, "skipped": n, "failed": [test ids]}} (setup and teardown errors count as
# failures).
_outcomes = {}


def pytest_runtest_logreport(report):
    file = report.nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
    seen = _outcomes.setdefault(file, {"passed": 0, "skipped": 0, "failed": []})
    if report.failed:
        seen["failed"].append(report.nodeid)
    elif report.when == "call" and report.passed:
        seen["passed"] += 1
    elif report.skipped:
        seen["skipped"] += 1


def pytest_sessionfinish(session):
    folder = os.environ.get("HVDL_PARALLEL_REPORT")
    if folder:
        with open(os.path.join(folder, f"report-{os.getpid()}.json"), "w") as f:
            json.dump(_outcomes, f)
