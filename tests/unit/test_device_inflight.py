"""DeviceInFlight (csrc/core/device_inflight): the device work of batches whose handles already
completed (HOROVOD_GPU_COMPLETION=stream), watched until the device ran it. Scripted events and
a backend whose asynchronous failure a step switches on stand in for CUDA and NCCL."""

from __future__ import annotations

from cpp_testing import load_testing_module

T = load_testing_module()


def script(*steps, max_depth=64):
    log, events = T.device_inflight_script(list(steps), max_depth)
    return [tuple(entry) for entry in log], [tuple(e) for e in events]


def test_batches_retire_in_order_with_one_query_each_while_the_oldest_runs():
    log, events = script(("add", 2, False), ("add", 0, False), ("poll",), ("poll",))
    assert [(step, msg, size) for step, msg, size, _ in log] == [
        ("add", "", 1), ("add", "", 2), ("poll", "", 2), ("poll", "", 0)]
    # the second batch is not asked while the first still runs: the stream runs them in order
    assert events == [(3, 0), (1, 0)]
    # the backend was asked for asynchronous failures only while work was pending
    assert [checks for *_, checks in log] == [0, 1, 2, 2]


def test_an_asynchronous_failure_names_the_batch_and_is_reported_once():
    log, _ = script(("add", -1, False), ("add", -1, False), ("poll",), ("fail",), ("poll",),
                    ("poll",))
    failed = log[4]
    assert failed[0] == "poll" and failed[2] == 1  # the failed batch is dropped
    assert "the device work of b0 failed after its handles had completed" in failed[1]
    assert "HOROVOD_GPU_COMPLETION=stream" in failed[1]
    assert "asynchronous error" in failed[1]
    assert log[5][1].startswith("the device work of b1")  # the next one, once


def test_a_failed_event_query_names_the_batch():
    log, _ = script(("add", 0, True), ("poll",), ("poll",))
    assert "b0" in log[1][1] and "illegal address" in log[1][1] and log[1][2] == 0
    assert log[2][1] == ""


def test_past_its_depth_add_waits_for_the_oldest():
    log, events = script(("add", -1, False), ("add", -1, False), ("add", -1, False), max_depth=2)
    assert [size for _, _, size, _ in log] == [1, 2, 2]
    assert [syncs for _, syncs in events] == [1, 0, 0]


def test_drain_waits_for_everything_and_the_first_failure_wins():
    log, events = script(("add", -1, False), ("add", -1, True), ("add", -1, True), ("drain",))
    assert log[-1][2] == 0 and "b1" in log[-1][1]
    assert [syncs for _, syncs in events] == [1, 1, 1]
