"""Elastic jobs without MPI (``horovodliterun --elastic``: the launcher is the job's driver,
runner/elastic_driver.py), on this machine. Workers are killed (SIGKILL) mid-training, the job
grows and is ended; across test hosts (a whole host lost or cut off): test_multihost_elastic.py.

Each job runs tests/scripts/elastic_train.py: every survivor compares its final weights with a
one-process reference that trained with every rank up to the commit the job continued from and
with the survivors after it (or, for jobs that grow, that every rank holds the same weights).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from launching import REPEATED_LOSSES, discovery_script, run_with_event

from horovodlite.common.basics import gloo_built

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = "tests/scripts/elastic_train.py"

pytestmark = pytest.mark.skipif(not gloo_built(), reason="this build has no Gloo controller")


def run_elastic(np_: int, *args: str, launcher: tuple = (), timeout: int = 120, env=None):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **(env or {}))
    cmd = [sys.executable, "-m", "horovodlite.runner.launch", "--elastic", *launcher, "-np",
           str(np_), sys.executable, SCRIPT, *args]
    start = time.monotonic()
    p = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=timeout)
    return p.returncode, p.stdout, time.monotonic() - start


def finals(out: str) -> dict:
    """rank -> (size, epochs, steps) from the survivors' FINAL lines."""
    return {int(m[0]): tuple(map(int, m[1:]))
            for m in re.findall(r"FINAL rank (\d+) size (\d+) epochs (\d+) steps (\d+)", out)}


def recovery_seconds(out: str) -> float:
    """From the first KILLED (or STOPPED) to the first RESUMED (the survivors' first step at the
    new size)."""
    killed = float(re.search(r"(?:KILLED|STOPPED) rank \d+ at ([\d.]+)", out).group(1))
    resumed = float(re.search(r"RESUMED rank \d+ at ([\d.]+)", out).group(1))
    return resumed - killed


def test_a_worker_killed_mid_step_the_others_finish_without_rolling_back():
    rc, out, took = run_elastic(3, "--kill", "2:1:2")
    assert rc == 0, out
    assert finals(out) == {0: (2, 2, 14), 1: (2, 2, 14)}, out
    assert out.count("LOSSES rank") == 2 and "[(1, 2, [2])]" in out, out
    # one line each: what was lost, the new round and its size, where training continues
    assert "horovodliterun: rank 2 (worker 2) on " in out and "exited with signal 9" in out, out
    assert "horovodliterun: round 1: 2 workers" in out, out
    # 8 steps applied (6 in epoch 0, 2 in epoch 1), 9 commits (one more at the epoch's end)
    assert "hvd.elastic: continuing from step 8 (no rollback; 9 commits) with 3 -> 2 ranks" \
        in out, out
    assert re.search(r"the elastic job completed with 2 workers, without:\n"
                     r"horovodliterun:   worker 2 on \S+: exited with signal 9", out), out
    # one reset, not two: the launcher's notice of the loss reaches the survivors after they
    # moved on to round 1, and is dropped there
    assert "reset 2 of" not in out, out
    print(f"recovery {recovery_seconds(out):.2f} s")
    assert took < 60, f"{took:.0f} s\n{out}"


def test_a_stopped_worker_is_lost_by_its_heartbeats_not_waited_for():
    """Rank 2 SIGSTOPs itself mid-step: alive, its connections open, silent - a frozen process.
    Its core's heartbeats stop; the driver takes it for lost after --elastic-heartbeat-timeout
    (2 s), kills it, and the survivors' pending allreduce ends naming it, long before the Gloo
    timeout (60 s here) would have."""
    rc, out, took = run_elastic(3, "--stop", "2:1:2", env={"HOROVOD_GLOO_TIMEOUT_SECONDS": "60"})
    assert rc == 0, out
    assert finals(out) == {0: (2, 2, 14), 1: (2, 2, 14)}, out
    assert re.search(r"horovodliterun: lost rank 2 \(worker 2\) on \S+: no heartbeat for "
                     r"[\d.]+ s \(--elastic-heartbeat-timeout 2\): its process is stopped or "
                     r"frozen, its host hung, or its link cut; killed", out), out
    # the survivors' collectives name it (the driver's word, not a timeout)
    assert out.count("did not complete: the job lost rank 2") == 2, out
    assert "hvd.elastic: continuing from step 8 (no rollback; 9 commits) with 3 -> 2 ranks" \
        in out, out
    assert "lost with its host" not in out, out  # the kill is no lost host
    print(f"from SIGSTOP to training again: {recovery_seconds(out):.2f} s")
    assert took < 45, f"{took:.0f} s\n{out}"


def test_workers_that_shut_down_in_order_are_not_taken_for_lost():
    """Every worker calls hvd.shutdown() after training and runs 4 s more (saving, evaluating):
    their cores' last heartbeat says they stopped in order, so the driver waits for them."""
    rc, out, _ = run_elastic(2, "--epochs", "1", "--linger", "4")
    assert rc == 0, out
    assert out.count("LINGERED rank") == 2 and "no heartbeat" not in out, out


def test_a_worker_killed_mid_step_the_sharded_optimizer_state_is_resharded():
    """DistributedOptimizer(shard="optimizer_state"): each of 3 ranks holds a third of the
    momentum when rank 2 dies mid-step. The survivors lay the last commit's full state out over
    2 ranks (half each) and finish with the reference's weights (the same tolerance as
    unsharded: the sharded optimizer's numbers are the unsharded one's here; with the momentum
    lost at the reset they would differ by about 0.3)."""
    rc, out, took = run_elastic(3, "--kill", "2:1:2", "--shard", "optimizer_state")
    assert rc == 0, out
    assert finals(out) == {0: (2, 2, 14), 1: (2, 2, 14)}, out
    assert out.count("LOSSES rank") == 2 and "[(1, 2, [2])]" in out, out
    assert "hvd.elastic: continuing from commit 9 with 3 -> 2 ranks" in out, out
    # 65 parameters: 22 per rank at 3 ranks, 33 (one of them padding) at 2
    assert sorted(re.findall(r"SHARD rank (\d) holds 33 of 65 momentum values", out)) == \
        ["0", "1"], out
    assert took < 60, f"{took:.0f} s\n{out}"


def test_the_retired_rounds_watchdog_stays_silent_in_the_next_round():
    """The failed round's context is kept alive (a collective may still hold it), and so was
    its heartbeat watchdog: it went on reading round 0's heartbeats, and once the killed rank
    had been silent for HOROVOD_GLOO_TIMEOUT_SECONDS it declared it lost - in the middle of
    round 1, where that rank does not exist - and kept polling the store (seen across hosts as
    "lost ranks 2, 3: no heartbeat for 10 s" 10 s into round 1, then wrong weights). The delay
    that makes it certain: round 1 lasts well past the timeout (4 s here, 16 steps of 0.4 s).
    Two names for this machine make round 0 a job of two "hosts" (a Gloo group and its
    watchdog; one host has neither) and round 1 a job of one. A killed process is noticed by
    the launcher at once, so no watchdog may report silence."""
    rc, out, _ = run_elastic(3, "--kill", "2:0:2", "--step-seconds", "0.4",
                             launcher=("-H", "localhost:2,127.0.0.1:1"),
                             env={"HOROVOD_GLOO_TIMEOUT_SECONDS": "4"})
    assert rc == 0, out
    assert finals(out) == {0: (2, 2, 17), 1: (2, 2, 17)}, out
    assert "hvd.elastic: continuing from step 2 (no rollback; 2 commits) with 3 -> 2 ranks" \
        in out, out
    assert "no heartbeat" not in out, out


@pytest.mark.parametrize("args,final,losses", REPEATED_LOSSES[:1], ids=["during-recovery"])
def test_repeated_losses(args, final, losses):
    rc, out, took = run_elastic(3, *args)
    assert rc == 0, out
    assert finals(out) == final, out
    assert f"LOSSES rank 0 {losses}" in out, out
    assert took < 90, f"{took:.0f} s\n{out}"


def test_below_min_np_the_job_ends_saying_why():
    rc, out, took = run_elastic(2, "--kill", "1:0:3", launcher=("--min-np", "2"))
    assert rc != 0, out
    assert "round 1: the job ends: 1 worker left, fewer than --min-np 2" in out, out
    assert re.search(r"JobEnded: the elastic job ended \(round 1\): 1 worker left, fewer than "
                     r"--min-np 2", out), out
    assert "the elastic job did not complete" in out and "FINAL" not in out, out
    assert took < 60, f"{took:.0f} s\n{out}"


@pytest.mark.parametrize("shard", [None, "optimizer_state"])
def test_growing_from_2_to_3_workers_with_host_discovery(tmp_path, shard):
    """The discovery script lists 2 slots, then 3: the driver starts a third worker, the two
    running ones meet it at their next commit (HostsUpdatedInterrupt), it receives the state
    by the sync, and all three finish with identical weights. With a sharded optimizer the
    joining worker holds no state: rank 0's snapshot is laid out over the 3 ranks."""
    slots, script = discovery_script(tmp_path, "localhost:2\n")
    cmd = [sys.executable, "-m", "horovodlite.runner.launch", "--max-np", "3",
           "--host-discovery-script", str(script), "-np", "2", sys.executable, SCRIPT,
           "--compare", "ranks", "--step-seconds", "0.1", "--epochs", "6",
           *(["--shard", shard] if shard else [])]
    rc, out, _ = run_with_event(cmd, tmp_path / "job.log", 2,
                                lambda: slots.write_text("localhost:3\n"), 120, cwd=ROOT,
                                env={"HVDL_DISCOVERY_INTERVAL": "0.2"})
    assert rc == 0, out
    assert sorted(re.findall(r"FINAL rank (\d) size 3 epochs 6 agree", out)) == ["0", "1", "2"], out
    added = re.search(r"horovodliterun: added 1 worker on \S+:1 \(host discovery\); they join "
                      r"at the next commit", out)
    assert added, out
    # the running workers hear of the newcomer only once it waits for them: it is listed after
    # its interpreter started (not while it imports torch, which they would wait for)
    assert out.index("STARTED worker 2") < added.start(), out
    assert re.search(r"hvd.elastic: continuing from (commit|step) \d+.* with 2 -> 3 ranks",
                     out), out
    if shard:  # 65 momentum values: 22 per rank at 3 ranks (one of them padding on the last)
        assert sorted(re.findall(r"SHARD rank (\d) holds 22 of 65 momentum values", out)) == \
            ["0", "1", "2"], out


def test_a_host_that_lost_a_worker_is_blacklisted_or_cools_down(tmp_path):
    """The script keeps listing 3 slots here. Worker 2 dies: with the blacklist for the rest of
    the job no replacement starts and the two survivors match the reference; with
    --blacklist-cooldown-range 1 1 the job grows back to 3 a second later."""
    _, script = discovery_script(tmp_path, "localhost:3\n")
    rc, out, _ = run_elastic(3, "--kill", "2:0:3", launcher=(
        "--max-np", "3", "--host-discovery-script", str(script)))
    assert rc == 0, out
    assert set(finals(out)) == {0, 1} and {s for s, _, _ in finals(out).values()} == {2}, out
    assert "blacklisted for the rest of the job" in out and "added 1 worker" not in out, out
    rc, out, _ = run_elastic(3, "--kill", "2:0:3", "--compare", "ranks", "--step-seconds", "0.1",
                             "--epochs", "6", launcher=(
                                 "--max-np", "3", "--host-discovery-script", str(script),
                                 "--blacklist-cooldown-range", "1", "1"))
    assert rc == 0, out
    assert "blacklisted for 1 s (--blacklist-cooldown-range)" in out, out
    assert "added 1 worker" in out, out
    assert sorted(re.findall(r"FINAL rank (\d) size 3 epochs 6 agree", out)) == ["0", "1", "2"], out


def test_the_driver_lost_the_workers_end_with_an_error_not_a_hang(tmp_path):
    """horovodliterun SIGKILLed mid-training (its host lost, for the workers): every worker
    ends, naming the driver, well within the timeouts - none trains on alone or waits forever."""
    cmd = [sys.executable, "-m", "horovodlite.runner.launch", "--elastic", "-np", "2",
           sys.executable, SCRIPT, "--step-seconds", "0.2", "--epochs", "40"]
    log = tmp_path / "job.log"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               HOROVOD_GLOO_TIMEOUT_SECONDS="10")
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while log.read_text().count("UP rank") < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        pids = [int(p) for p in subprocess.run(
            ["pgrep", "-f", f"{SCRIPT} --step-seconds 0.2 --epochs 40"], capture_output=True,
            text=True).stdout.split()]
        assert len(pids) >= 2, log.read_text()
        time.sleep(1)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        lost_at = time.monotonic()
        while any(_alive(p) for p in pids) and time.monotonic() - lost_at < 90:
            time.sleep(0.5)
        ended_after = time.monotonic() - lost_at
    for p in pids:
        if _alive(p):
            os.kill(p, signal.SIGKILL)
    assert ended_after < 90, log.read_text()
    print(f"workers ended {ended_after:.1f} s after the driver was killed")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie has ended
        return f.read().split(")")[-1].split()[0] != "Z"
