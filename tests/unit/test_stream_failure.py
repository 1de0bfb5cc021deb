"""Stream completion's failure path (HOROVOD_GPU_COMPLETION=stream, core/executor.cc): a batch
that fails with an earlier batch's asynchronous error ran, and queued its device work; its
handles then complete with the error, and the user may free its tensors at once. So nothing of
the batch may still be queued on the device when they complete: the executor waits for it on
that path (the error path only; the hot path never blocks). A stand-in device keeps each
batch's work queued until its stream is synchronized, as CUDA does, and fails the first batch's
work on command (csrc/testing/testing_stream_failure.cc)."""

from __future__ import annotations

import pytest
from cpp_testing import load_testing_module

T = load_testing_module()


@pytest.mark.parametrize("poll", [True, False], ids=["found-by-poll", "found-at-hand-over"])
def test_a_batch_failed_with_an_earlier_error_completes_after_its_device_work(poll):
    out = T.stream_failure_script(poll)
    a, b = out["a"], out["b"]
    # a completed at once (its work still queued: the point of stream completion)
    assert a["done"] and a["error"] == "" and a["device_done"] and a["queued_at_done"]
    # b fails naming a's failure ...
    assert b["done"] and b["error"].startswith("allreduce 'b': "), b
    assert "the device work of allreduce 'a' failed after its handles had completed" in b["error"]
    assert "illegal address" in b["error"]
    # ... and only once its own device work has run
    assert not b["queued_at_done"], b
    assert not out["aborted"]  # it ran: nothing to abort


def test_a_batch_whose_own_work_hangs_after_an_earlier_error_is_aborted_not_waited_for():
    """The earlier failure found at the hand-over, after the batch ran: its own collective may
    wait for a peer that is gone (NCCL has no timeout). The executor waits for it a bounded time
    (0.2 s here, 30 s by default), then aborts the backend's device work and fails the batch
    saying so. A plain stream synchronize, what it did before, never returns there. (Found by
    the poll, the failure fails the next batch before it runs: nothing of it to wait for.)"""
    out = T.stream_failure_script(False, hung=True)
    b = out["b"]
    assert b["done"] and "illegal address" in b["error"], b
    assert "had not finished 0.2 s after the earlier failure" in b["error"], b
    assert "work was aborted" in b["error"], b
    assert out["aborted"] and not out["synced_while_hung"], out
    assert not b["queued_at_done"], b
