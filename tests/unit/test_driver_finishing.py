"""The elastic driver once the training finished (runner/elastic_driver.py, _finishing): a
worker exited with status 0, so the job neither grows nor publishes rounds, and a worker still
running FINISH_GRACE s later - added by discovery as the training ended, waiting to meet a round
the others never joined - is stopped and left out. Real processes, no job."""

from __future__ import annotations

import signal
import subprocess

from horovodlite.runner.elastic_driver import FINISH_GRACE, ElasticJob, Worker


def job_of(workers: list, round_: int = 1) -> ElasticJob:
    job = object.__new__(ElasticJob)  # the state _finishing and outcome read, without a launch
    job.workers = {w.number: w for w in workers}
    job.members = [w.number for w in workers]
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
