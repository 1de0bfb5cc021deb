"""The elastic driver's heartbeat watch (runner/elastic_beats.py): which workers of a round it
takes for lost, against the keys the C++ watchdog writes - an in-memory store, a clock given."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from horovodlite.common import launch_env, rendezvous
from horovodlite.runner.elastic_beats import BeatWatch

SECRET, JOB = "s3cret", "job1"


def watch(timeout: float = 2.0):
    store = dist.HashStore()
    w = BeatWatch(store, SECRET, JOB, timeout)
    w.start_round(0, ["0", "1", "2"])
    # what the ranks' watchdogs write: the same namespace as a worker's meeting builds
    beats = rendezvous.heartbeats(store, SECRET, JOB, 0)
    return w, beats


def beat(beats, rank: int, value) -> None:
    beats.set(rendezvous.HEARTBEAT_KEY.format(rank), str(value))


def test_a_worker_whose_beat_stops_is_silent_after_the_timeout_only():
    w, beats = watch()
    for r in range(3):
        beat(beats, r, 1)
    assert w.silent(0.0, ["0", "1", "2"]) == []
    for t in (0.5, 1.0, 1.5, 2.0, 2.5):  # ranks 0 and 1 beat on, rank 2 stopped at 1
        beat(beats, 0, t)
        beat(beats, 1, t)
        found = w.silent(t, ["0", "1", "2"])
        assert found == ([("2", t)] if t >= 2.0 else []), (t, found)


def test_not_yet_met_stopped_in_order_or_left_the_round_are_not_watched():
    w, beats = watch()
    beat(beats, 0, 1)  # rank 1 never met; rank 2 beat once, then shut down in order
    beat(beats, 2, 1)
    assert w.silent(0.0, ["0", "1", "2"]) == []
    beats.set(rendezvous.HEARTBEAT_KEY.format(2), rendezvous.STOPPED.decode())
    for t in (0.5, 1.0, 1.5, 2.0, 3.0):
        beat(beats, 0, t)
        assert w.silent(t, ["0", "1", "2"]) == []
    # rank 0 stops beating but is no longer a member (it left with its host): not named
    for t in (3.5, 4.0, 4.5, 5.0, 5.5):
        assert w.silent(t, ["1", "2"]) == []


def test_a_starved_driver_measures_every_silence_afresh():
    w, beats = watch()
    for r in range(3):
        beat(beats, r, 1)
    assert w.silent(0.0, ["0", "1", "2"]) == []
    # the driver was not scheduled for 5 s: nobody's beat changed as far as it saw, but its
    # own gap says nothing of theirs
    assert w.silent(5.0, ["0", "1", "2"]) == []
    for t in (5.5, 6.0, 6.5):
        assert w.silent(t, ["0", "1", "2"]) == []
    assert [x for x, _ in w.silent(7.0, ["0", "1", "2"])] == ["0", "1", "2"]


def test_a_new_round_watches_its_own_keys_and_zero_turns_it_off():
    w, beats = watch()
    beat(beats, 0, 1)
    w.silent(0.0, ["0", "1", "2"])
    w.start_round(1, ["0", "2"])  # round 1's keys are not there yet: nobody met
    assert w.silent(10.0, ["0", "2"]) == []
    off = BeatWatch(dist.HashStore(), SECRET, JOB, 0.0)
    off.start_round(0, ["0"])
    assert off.silent(100.0, ["0"]) == []


def test_the_timeout_setting_and_the_beat_it_asks_for():
    assert launch_env.heartbeat_timeout({}) == 2.0
    assert launch_env.heartbeat_timeout({launch_env.ELASTIC_HEARTBEAT: "0"}) == 0.0
    assert launch_env.beat_period(2.0) == 0.25 and launch_env.beat_period(0.0) == 1.0
    assert launch_env.beat_period(60.0) == 1.0
    for bad in ("-1", "abc", "nan"):
        with pytest.raises(ValueError, match="HOROVOD_ELASTIC_HEARTBEAT_TIMEOUT"):
            launch_env.heartbeat_timeout({launch_env.ELASTIC_HEARTBEAT: bad})
