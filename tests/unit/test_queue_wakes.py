"""The background loop's hold of new work (HOROVOD_HOLD_UNTIL_WAIT, HOROVOD_CYCLE_TIME) waits in
TensorQueue::WaitForWake (csrc/core/tensor_queue.h). A wake from before the wait began is stale
and must not end it (a user thread that blocked during the last cycle used to end the next hold
at once); a wake during it, or a ready gradient bucket asking to go now (SendNow, before or
during the wait), ends it - on a host that holds work until a thread waits too; once the loop
took the queued requests, the ask is spent."""

import pytest
from cpp_testing import load_testing_module

T = load_testing_module()


@pytest.mark.parametrize("kind", ["wake", "send_now", "send_now_before"])
def test_a_wake_or_a_send_now_ends_the_hold(kind):
    assert T.queue_wait_ends_early(kind, wait_ms=20000)


@pytest.mark.parametrize("kind", ["stale", "popped"])
def test_a_stale_wake_or_a_spent_send_now_leaves_the_hold_to_its_deadline(kind):
    assert not T.queue_wait_ends_early(kind, wait_ms=100)
