"""Runs on every rank: starts horovodlite once per process and exposes helpers."""

import pytest

import horovodlite.torch as hvd


@pytest.fixture(scope="session", autouse=True)
def _hvd_session():
    hvd.init()
    yield
    hvd.shutdown()
