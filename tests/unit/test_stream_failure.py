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
