"""Elastic jobs on MPI with ULFM (``horovodliterun --elastic --mpi``): ranks are killed (SIGKILL)
in the middle of training and the survivors continue from the last commit at the smaller size.

Each job runs tests/scripts/elastic_train.py: every survivor compares its final weights with a
one-process reference that trained with every rank up to the commit the job continued from and
with the survivors after it, and prints ``FINAL rank R size S ...``. Across hosts:
test_multihost_elastic.py. The same jobs without MPI (horovodliterun as the driver):
test_elastic_gloo.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from launching import (
    REPEATED_LOSSES,
    discovery_script,
    retry_if_launcher_did_not_start,
    run_with_event,
)

from horovodlite._extension import load

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = "tests/scripts/elastic_train.py"

pytestmark = pytest.mark.skipif(
    not load().fault_tolerance_built(),
    reason="this build's MPI has no ULFM (elastic jobs need Open MPI 5)")


def run_elastic(np_: int, *args: str, launcher: tuple = ("--elastic",), timeout: int = 120):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "horovodlite.runner.launch", "--mpi", *launcher, "-np",
           str(np_), sys.executable, SCRIPT, *args]

    def run():
        start = time.monotonic()
        p = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=timeout)
        return p.returncode, p.stdout, time.monotonic() - start

    return retry_if_launcher_did_not_start(run)


def finals(out: str) -> dict:
    """rank -> (size, epochs, steps) from the survivors' FINAL lines."""
    return {int(m[0]): tuple(map(int, m[1:]))
            for m in re.findall(r"FINAL rank (\d+) size (\d+) epochs (\d+) steps (\d+)", out)}


def test_a_rank_killed_mid_step_the_others_finish_without_rolling_back():
    rc, out, took = run_elastic(3, "--kill", "2:1:2")
    assert rc == 0, out
    # both survivors, renumbered 0 and 1 of 2, matched the reference (3 ranks up to the commit
    # after epoch 1 batch 1, then 2 ranks)
    assert finals(out) == {0: (2, 2, 14), 1: (2, 2, 14)}, out
    assert out.count("LOSSES rank") == 2 and "[(1, 2, [2])]" in out, out
    # one line each: who was lost, where the job continues, at what size
    assert "horovodlite lost rank 2 (host " in out and "of 3; 2 ranks remain" in out, out
    assert "hvd.elastic: continuing from step 8 (no rollback; 9 commits) with 3 -> 2 ranks" \
        in out, out
    assert re.search(r"the elastic job completed without:\n  rank 2 on \S+ exited with "
                     r"signal 9", out), out
    assert took < 60, f"{took:.0f} s\n{out}"


@pytest.mark.parametrize("args,final,losses", REPEATED_LOSSES,
                         ids=["during-recovery", "one-after-another"])
def test_repeated_losses(args, final, losses):
    rc, out, took = run_elastic(3, *args)
    assert rc == 0, out
    assert finals(out) == final, out
    assert f"LOSSES rank 0 {losses}" in out, out
    assert took < 60, f"{took:.0f} s\n{out}"


def test_below_min_np_the_job_ends_saying_why():
    rc, out, took = run_elastic(2, "--kill", "1:0:3", launcher=("--min-np", "2"))
    assert rc != 0, out
    assert "hvd.elastic: only 1 rank remains, fewer than --min-np 2; stopping" in out, out
    assert "only 0 of 2 ranks finished, fewer than --min-np 2" in out, out
    assert "FINAL" not in out, out
    assert took < 60, f"{took:.0f} s\n{out}"


def test_growing_from_2_to_3_ranks_with_host_discovery(tmp_path):
    """The discovery script lists 2 slots, then 3 while the job trains: at its next commit
    every rank sees HostsUpdatedInterrupt, a third rank is spawned and merged into the job, it
    receives the state by the sync, and all three finish with identical weights."""
    slots, script = discovery_script(tmp_path, "localhost:2\n")
    cmd = [sys.executable, "-m", "horovodlite.runner.launch", "--mpi", "--min-np", "2",
           "--max-np", "3",
           "--host-discovery-script", str(script), "-np", "2", sys.executable, SCRIPT,
           "--compare", "ranks", "--step-seconds", "0.1", "--epochs", "6"]
    rc, out, _ = run_with_event(cmd, tmp_path / "job.log", 2,
                                lambda: slots.write_text("localhost:3\n"), 120, cwd=ROOT)
    assert rc == 0, out
    assert sorted(re.findall(r"FINAL rank (\d) size 3 epochs 6 agree", out)) == ["0", "1", "2"], out
    assert "hvd.elastic: started 1 new rank (host discovery): ranks 2..2" in out, out
    assert re.search(r"hvd.elastic: continuing from step \d+ \(no rollback; \d+ commits\) "
                     r"with 2 -> 3 ranks", out), out


def test_a_host_that_lost_a_rank_is_blacklisted_and_the_job_does_not_regrow_there(tmp_path):
    """The discovery script keeps listing 3 slots on this machine. Rank 2 dies: without the
    blacklist the next commit would start a replacement there (and a rank that keeps dying
    would cycle fail-shrink-regrow until reset_limit); with it, the two survivors finish alone
    and match the reference."""
    _, script = discovery_script(tmp_path, "localhost:3\n")
    rc, out, took = run_elastic(3, "--kill", "2:0:3", launcher=(
        "--max-np", "3", "--host-discovery-script", str(script)))
    assert rc == 0, out
    assert set(finals(out)) == {0, 1} and {s for s, _, _ in finals(out).values()} == {2}, out
    assert re.search(r"hvd.elastic: host \S+ blacklisted for the rest of the job: the job lost "
                     r"ranks there \(1 time\); no new ranks start there", out), out
    assert "hvd.elastic: started" not in out, out  # no replacement
    assert took < 60, f"{took:.0f} s\n{out}"


def test_with_a_cooldown_the_blacklisted_host_gets_ranks_again(tmp_path):
    """--blacklist-cooldown-range 2 2: two seconds after rank 2 died, this machine's slot counts
    again and the job grows back to 3 ranks, which finish with identical weights."""
    _, script = discovery_script(tmp_path, "localhost:3\n")
    rc, out, _ = run_elastic(3, "--kill", "2:0:3", "--compare", "ranks", "--step-seconds", "0.1",
                             "--epochs", "6", launcher=(
                                 "--max-np", "3", "--host-discovery-script", str(script),
                                 "--blacklist-cooldown-range", "2", "2"))
    assert rc == 0, out
    assert re.search(r"hvd.elastic: host \S+ blacklisted for 2 s \(--blacklist-cooldown-range\)",
                     out), out
    assert "hvd.elastic: started 1 new rank (host discovery): ranks 2..2" in out, out
    assert sorted(re.findall(r"FINAL rank (\d) size 3 epochs 6 agree", out)) == ["0", "1", "2"], out


def test_the_launcher_names_a_rank_added_while_training_that_died(tmp_path):
    """Rank 2 dies, the job grows back after the cooldown (the new rank runs under
    horovodliterun's wrapper, as --added-as 2), and the added rank dies too: the launcher names
    both, the added one as such, and the job completes with the others."""
    _, script = discovery_script(tmp_path, "localhost:3\n")
    # 0.2 s steps: the added rank is there well before epoch 5 (it joins 1 s of cooldown plus a
    # recovery and a spawn after the first loss, at epoch 1-3 here, later under load)
    rc, out, _ = run_elastic(3, "--kill", "2:0:3", "--kill", "2:5:0", "--compare", "ranks",
                             "--step-seconds", "0.2", "--epochs", "8", launcher=(
                                 "--max-np", "3", "--host-discovery-script", str(script),
                                 "--blacklist-cooldown-range", "1", "2"))
    assert rc == 0, out
    assert "hvd.elastic: started 1 new rank (host discovery): ranks 2..2" in out, out
    assert re.search(r"the elastic job completed without:\n  rank 2 on \S+ exited with signal 9\n"
                     r"  rank 2 \(added while training\) on \S+ exited with signal 9", out), out
    assert {"0", "1"} <= set(re.findall(r"FINAL rank (\d) size \d epochs 8 agree", out)), out


def test_launcher_checks_the_elastic_flags(tmp_path):
    for extra, says in [(("--max-np", "4"), "needs --host-discovery-script"),
                        (("--max-np", "1"), "below -np"),
                        (("--host-discovery-script", str(tmp_path / "none.sh")),
                         "is not an executable file"),
                        (("--min-np", "3"), "must be between 1 and -np"),
                        (("--blacklist-cooldown-range", "5", "1"), "need 0 < MIN <= MAX"),
                        (("--blacklist-cooldown-range", "1", "5"),
                         "needs --host-discovery-script")]:
        p = subprocess.run([sys.executable, "-m", "horovodlite.runner.launch", "-np", "2",
                            *extra, "true"], capture_output=True, text=True, timeout=60)
        assert p.returncode == 2 and says in p.stderr, (extra, p.stderr)
        p = subprocess.run([sys.executable, "-m", "horovodlite.runner.launch", "--mpi", "-np",
                            "2", *extra, "true"], capture_output=True, text=True, timeout=60)
        assert p.returncode == 2 and says in p.stderr, (extra, p.stderr)
