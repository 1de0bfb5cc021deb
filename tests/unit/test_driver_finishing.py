"""The elastic driver once the training finished (runner/elastic_driver.py, _finishing): a
worker exited with status 0, so the job neither grows nor publishes rounds, and a worker still
running FINISH_GRACE s later - added by discovery as the training ended, waiting to meet a round
the others never joined - is stopped and left out. Real processes, no job."""

from __future__ import annotations

import signal
import subprocess

import torch.distributed as dist

from horovodlite.common import rendezvous
from horovodlite.runner.elastic_beats import BeatWatch
from horovodlite.runner.elastic_driver import FINISH_GRACE, ElasticJob, Worker


class Beats:
    """The driver's heartbeat watch, as _finishing reads it: who was seen meeting a round."""

    def __init__(self, met=()):
        self.met = set(met)  # worker numbers, as the driver's rounds list them


def job_of(workers: list, round_: int = 1, met=None) -> ElasticJob:
    job = object.__new__(ElasticJob)  # the state _finishing and outcome read, without a launch
    job.beats = Beats(w.number for w in workers if w.first_round == 0) if met is None else \
        Beats(met)
    job.workers = {w.number: w for w in workers}
    job.members = [w.number for w in workers]
    job.pending = []
    job.finishing_since = None
    job.round = round_
    job.ended = ""
    job.min_np = 1
    job.first_status = None
    return job


def test_no_finished_worker_no_finishing():
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        job = job_of([Worker(0, "a", True, proc)])
        assert not job._finishing(0.0) and job.finishing_since is None
    finally:
        proc.kill()
        proc.wait()


def test_a_worker_added_as_the_training_ended_is_stopped_after_the_grace():
    finished = subprocess.Popen(["true"])
    finished.wait()
    late = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        job = job_of([Worker(0, "a", True, finished, status=0, first_round=0),
                      Worker(1, "b", True, late, first_round=1)])
        assert job._finishing(100.0) and job.members == [0, 1]  # the grace starts
        assert job._finishing(100.0 + FINISH_GRACE - 1) and job.members == [0, 1]
        assert late.poll() is None
        assert job._finishing(100.0 + FINISH_GRACE + 1)
        assert job.members == [0], job.members
        assert "added as it ended" in job.workers[1].left
        assert late.wait(timeout=10) == -signal.SIGTERM
        assert job.done()
    finally:
        if late.poll() is None:
            late.kill()
            late.wait()


def test_workers_added_by_rounds_the_finishers_never_met_are_stopped_those_that_met_not():
    """Rounds 1 and 2 each added a worker as the training ended; the finishers (round 0's)
    never met either. Worker 1 (round 1, not the newest) never beat in any round: stopped
    too, not left waiting for --elastic-timeout. Worker 3 joined in round 1 and met it
    (its heartbeats were seen): it is finishing, and waited for."""
    finished = subprocess.Popen(["true"])
    finished.wait()
    procs = [subprocess.Popen(["sleep", "30"], start_new_session=True) for _ in range(3)]
    try:
        job = job_of([Worker(0, "a", True, finished, status=0, first_round=0),
                      Worker(1, "b", True, procs[0], first_round=1),
                      Worker(2, "c", True, procs[1], first_round=2),
                      Worker(3, "d", True, procs[2], first_round=1)], round_=2)
        # the driver's own watch saw workers 0 and 3 beat in round 1 (ranks 0 and 2 there)
        store = dist.HashStore()
        job.beats = BeatWatch(store, "s3cret", "job", 2.0)
        job.beats.start_round(1, [0, 1, 3])
        beats = rendezvous.heartbeats(store, "s3cret", "job", 1)
        beats.set(rendezvous.HEARTBEAT_KEY.format(0), "1")
        beats.set(rendezvous.HEARTBEAT_KEY.format(2), "1")
        job.beats.silent(0.0, [0, 1, 3])
        assert job._finishing(100.0) and job._finishing(100.0 + FINISH_GRACE + 1)
        assert job.members == [0, 3], job.members
        assert procs[0].wait(timeout=10) == procs[1].wait(timeout=10) == -signal.SIGTERM
        assert procs[2].poll() is None and not job.workers[3].left
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_a_member_still_finishing_is_waited_for_and_named_if_it_is_killed(capsys):
    """A worker that trained in the last round (rank 0 saving a large checkpoint) is not
    stopped after the grace, however long it takes; killed meanwhile, it fails the job, which
    names it."""
    finished = subprocess.Popen(["true"])
    finished.wait()
    saving = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        job = job_of([Worker(0, "a", True, saving, first_round=0),
                      Worker(1, "b", True, finished, status=0, first_round=0)])
        assert job._finishing(100.0)
        assert job._finishing(100.0 + 10 * FINISH_GRACE)
        assert job.members == [0, 1] and saving.poll() is None and not job.workers[0].left
        saving.kill()
        job.workers[0].status = saving.wait(timeout=10)
        assert job.outcome() != 0
        out = capsys.readouterr()
        text = out.out + out.err
        assert "did not complete" in text and "worker 0 on a" in text, text
    finally:
        if saving.poll() is None:
            saving.kill()
            saving.wait()
