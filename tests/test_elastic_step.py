"""Rollback "step" (the default of hvd.elastic.run; docs/elastic.md): a rank killed at each
point of a step costs at most the step in flight, in a job written as Horovod's users write them
(commit every 10 steps, tests/scripts/step_elastic.py), against Horovod's rollback to the last
commit. Every survivor checks that its weights equal one process that trained on every step's
whole batch exactly once (a step applied twice, skipped, or applied by some ranks only would
show), and reports where it resumed and how many optimizer steps it ran."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from horovodlite.common.basics import gloo_built

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = "tests/scripts/step_elastic.py"
STEPS = 30

pytestmark = pytest.mark.skipif(not gloo_built(), reason="this build has no Gloo controller")


def run(np_: int, kills: list, *launcher: str) -> str:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "horovodlite.runner.launch", "--elastic", *launcher, "-np",
           str(np_), sys.executable, SCRIPT, "--steps", str(STEPS)]
    for kill in kills:
        cmd += ["--kill", kill]
    p = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=180)
    assert p.returncode == 0, p.stdout
    return p.stdout


def survivors(out: str, size: int) -> dict:
    """rank -> (the steps it resumed at, steps it ran), every survivor having matched the
    reference."""
    finals = re.findall(rf"FINAL rank (\d) size {size} steps {STEPS}", out)
    assert sorted(finals) == [str(r) for r in range(size)], out
    ran = dict(re.findall(r"RAN rank (\d) steps (\d+)", out))
    return {int(r): (sorted({int(s) for s in re.findall(r"RESUMED rank \d at step (\d+)", out)}),
                     int(ran[r])) for r in finals}


def test_ranks_lost_at_each_point_of_a_step_cost_at_most_the_step_in_flight():
    """4 ranks, one lost in its backward at step 8 (its gradients were being reduced), one after
    its reductions completed at step 15 (they completed on the others too, but it never votes
    for the step: nobody applies it), one after its update at step 22: the last one finishes
    alone. Horovod's rollback would go back to the commits of steps 0, 10 and 20 and redo
    8 + 5 + 2 steps."""
    out = run(4, ["3:8:backward", "2:15:reduced", "1:22:applied"])
    assert survivors(out, 1) == {0: ([8, 15, 23], STEPS)}, out
    assert out.count("(no rollback: the survivors keep their state)") >= 3, out
    for resumed, commits, sizes in ((8, 0, "4 -> 3"), (15, 1, "3 -> 2"), (23, 2, "2 -> 1")):
        assert f"continuing from step {resumed} (no rollback; {commits} commits) with {sizes} " \
               "ranks" in out, out


def test_rollback_commit_goes_back_to_the_last_commit_as_horovod_does():
    out = run(3, ["2:15:backward"], "--elastic-rollback", "commit")
    assert survivors(out, 2) == {0: ([10], STEPS + 5), 1: ([10], STEPS + 5)}, out
    assert "(state rolled back to the last commit)" in out, out
