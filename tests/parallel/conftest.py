"""Runs on every rank: starts horovodlite when the test session starts (so skip conditions can
use hvd.size()) and shuts it down at the end."""

import pytest

import horovodlite.torch as hvd

hvd.init()


@pytest.fixture(scope="session", autouse=True)
def _hvd_session():
    yield
    hvd.shutdown()
