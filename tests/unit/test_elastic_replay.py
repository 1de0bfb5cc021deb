"""A stranger on the network against the elastic driver's rounds (common/elastic_rounds.py),
in one process on an in-memory store: values it saw on the wire replayed later (a rolled-back
round), counters it can add to, slots it squats with garbage. The store has no secret to give
the stranger, so it writes raw bytes under the names it saw; every test asserts that the
workers and the driver still see the driver's own rounds and requests."""

from __future__ import annotations

import threading

import torch.distributed as dist

from horovodlite.common import elastic_rounds as er
from horovodlite.common import signed_store

SECRET = "fedcba9876543210fedcba9876543210"


def signed(raw):
    return signed_store.SignedStore(raw, SECRET, ("elastic",), "the test driver's rounds")


def test_a_replayed_older_round_pointer_does_not_roll_the_job_back():
    """The stranger saw the pointer while it named round 1 and writes those signed bytes back
    after round 2: a worker in round 1 waiting for a newer round must still get round 2."""
    raw = dist.HashStore()
    driver, worker = signed(raw), signed(raw)
    er.publish(driver, er.Round(0, ["0", "1"], ["a", "b"], "start"))
    er.publish(driver, er.Round(1, ["0", "1"], ["a", "b"], "reset"))
    pointer = driver.prefix + er.ROUND_KEY
    seen = raw.get(pointer)  # the signed "1", as it crossed the network
    er.publish(driver, er.Round(2, ["0"], ["a"], "lost b"))
    raw.set(pointer, seen)
    got = er.wait_round(worker, 1, 5, poll=0.05)
    assert got.number == 2 and got.workers == ["0"]
    assert er.latest(worker) == 2  # a late joiner too, from the rolled-back hint


def test_a_pointer_replayed_while_workers_wait_does_not_hide_the_next_round():
    """The stranger writes the old pointer back right after each publish (a race it can win):
    the waiting worker still takes the driver's round 3."""
    raw = dist.HashStore()
    driver, worker = signed(raw), signed(raw)
    er.publish(driver, er.Round(0, ["0", "1"], ["a", "b"], "start"))
    old = raw.get(driver.prefix + er.ROUND_KEY)

    def publish_then_roll_back():
        for k in (1, 2, 3):
            er.publish(driver, er.Round(k, ["0", "1"], ["a", "b"], f"reset {k}"))
            raw.set(driver.prefix + er.ROUND_KEY, old)

    later = threading.Timer(0.1, publish_then_roll_back)
    later.start()
    got = er.wait_round(worker, 0, 5, poll=0.05)
    later.join()
    assert got.number >= 1
    assert er.wait_round(worker, 2, 5, poll=0.05).number == 3


def test_a_negative_add_to_the_reset_counter_hides_no_request():
    """c10d counters cannot be signed: the stranger adds -1 to the counter name it saw for each
    +1 it sees (or before it), so the driver's look reads 0. A worker's request must still
    reach the driver."""
    raw = dist.HashStore()
    driver, worker = signed(raw), signed(raw)
    raw.add(driver.prefix + er.resets_key(0), -1)
    er.request_reset(worker, 0, "1")
    assert er.resets_requested(driver, 0, ["0", "1", "2"]) == 1
    raw.add(driver.prefix + er.resets_key(0), -1)
    er.request_reset(worker, 0, "2")
    assert er.resets_requested(driver, 0, ["0", "1", "2"]) == 2


def test_reset_slots_squatted_or_replayed_are_skipped_and_count_once():
    raw = dist.HashStore()
    driver, worker = signed(raw), signed(raw)
    requests = er.ResetRequests(driver, 0)
    assert requests.count(["0", "1"]) == 0
    raw.set(driver.prefix + er.reset_slot_key(0, 0), b"garbage squatting the first slot")
    er.request_reset(worker, 0, "0")  # takes the next free slot
    er.request_reset(worker, 0, "0")  # asking again counts once
    assert requests.count(["0", "1"]) == 1
    # round 0's signed slot replayed into round 1 (and into another slot of round 0): refused
    seen = raw.get(driver.prefix + er.reset_slot_key(0, 1))
    raw.set(driver.prefix + er.reset_slot_key(1, 0), seen)
    raw.set(driver.prefix + er.reset_slot_key(0, 3), seen)
    assert er.ResetRequests(driver, 1).count(["0", "1"]) == 0
    er.request_reset(worker, 0, "1")
    assert requests.count(["0", "1"]) == 2 and requests.count(["1"]) == 1
    # a fresh reader of round 0 (the stateless form) agrees
    assert er.resets_requested(driver, 0, ["0", "1"]) == 2
