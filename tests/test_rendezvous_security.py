"""Real jobs attacked by a stranger on the network (issue 37): a plain TCPStore client and raw
connections, with no secret (tests/scripts/strangers.py). Each job runs
tests/scripts/rendezvous_attack.py (``--gloo``) or tests/scripts/elastic_train.py (``--elastic``),
every rank asserting; each test asserts that the job is correct, or fails with an error naming
the key and the tampering. Each job is bounded in time. The launchers without a secret
(torchrun, Ray Train's and Lightning's default groups) are unchanged: tests/test_torchrun.py,
tests/test_integrations.py.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
from launching import run_job

from horovodlite.common.basics import gloo_built

ROOT = Path(__file__).resolve().parent.parent
ATTACK = "tests/scripts/rendezvous_attack.py"
ELASTIC = "tests/scripts/elastic_train.py"
TWO_HOSTS = ("-H", "127.0.0.1:1,localhost:1")  # two host names here: a Gloo pair between them

pytestmark = pytest.mark.skipif(not gloo_built(), reason="this build has no Gloo controller")


def job(mode: tuple, *args: str, timeout: float = 120) -> tuple:
    """(exit status, stdout + stderr) of ``horovodliterun MODE ARGS`` from the repository."""
    cmd = [sys.executable, "-m", "horovodlite.runner.launch", *mode, *args]
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    return run_job(cmd, cwd=ROOT, env=env, timeout=timeout)[:2]


def oks(out: str) -> list:
    return sorted(int(r) for r in re.findall(r"^\[\d+\]<stdout>:OK (\d+)$", out, re.M))


@pytest.mark.parametrize("hosts", [(), TWO_HOSTS], ids=["one-host", "two-host-names"])
def test_a_stranger_cannot_name_any_key_the_job_uses(hosts):
    rc, out = job(("--gloo", "-np", "2", *hosts), sys.executable, ATTACK, "names")
    assert rc == 0, out
    assert oks(out) == [0, 1], out
    m = re.search(r"^\[0\]<stdout>:UNNAMED (\d+) (\d+)$", out, re.M)
    assert m and int(m.group(1)) > 0 and int(m.group(2)) > 0, out


def test_a_forged_rank_address_is_refused_naming_the_key_and_a_fresh_job_runs(tmp_path):
    rc, out = job(("--gloo", "-np", "2"), sys.executable, ATTACK, "forge", str(tmp_path))
    assert rc != 0, out
    refused = re.search(r"^\[0\]<stdout>:REFUSED (.*)$", out, re.M)
    assert refused, out
    assert "the rendezvous was tampered with: key 'rank/1' of round 0" in refused.group(1), out
    assert "the value is not used" in refused.group(1), out
    assert re.search(r"^  rank 0 on \S+ exited with status 1$", out, re.M), out
    assert "[1]<stdout>:WAITED 1" in out, out
    # the job started afresh: a new secret, new names, nothing of the forgery
    rc, out = job(("--gloo", "-np", "2", *TWO_HOSTS), sys.executable, ATTACK, "garbage")
    assert rc == 0, out
    assert oks(out) == [0, 1], out


@pytest.mark.parametrize("hosts", [(), TWO_HOSTS], ids=["one-host", "two-host-names"])
def test_garbage_to_the_store_and_the_reports_is_ignored_and_logged(hosts):
    rc, out = job(("--gloo", "-np", "2", *hosts), sys.executable, ATTACK, "garbage")
    assert rc == 0, out
    assert "[0]<stdout>:GARBAGE sent" in out, out
    assert oks(out) == [0, 1], out
    ignored = re.findall(r"^horovodliterun: ignored a connection to the rank reports from "
                         r"127\.0\.0\.1:\d+: (.*); it is closed$", out, re.M)
    assert len(ignored) == 4, out  # random bytes, a forged hello, a token hello, no line end
    assert any("not signed with the job's report token" in why for why in ignored), ignored
    assert any("without a line end" in why for why in ignored), ignored


def finals(out: str) -> dict:
    return {int(m[0]): tuple(map(int, m[1:]))
            for m in re.findall(r"FINAL rank (\d+) size (\d+) epochs (\d+) steps (\d+)", out)}


def test_an_elastic_round_overwritten_is_refused_and_the_drivers_next_round_proceeds():
    """Rank 0 forges round 1 (one that ends the job) and the pointer to it at epoch 0, batch 1;
    rank 2 is killed at epoch 1: the survivors refuse the forgery, go on to the driver's own
    round 1 and finish from the last commit with the weights of a correct job."""
    rc, out = job(("--elastic", "-np", "3"), sys.executable, ELASTIC, "--forge-round", "0:1",
                  "--kill", "2:1:2")
    assert rc == 0, out
    assert "[0]<stdout>:FORGED round 1" in out, out
    assert re.search(r"horovodlite: the rendezvous was tampered with: key "
                     r"'horovodlite/elastic/round(/1)?' of the elastic driver's rounds at \S+ "
                     r"holds a value not signed with this job's secret .*; the value is not used; "
                     r"waiting for the elastic driver's own round", out), out
    assert "forged by a stranger" not in out, out  # the forged round's end was never used
    assert "horovodliterun: round 1: 2 workers" in out, out
    assert finals(out) == {0: (2, 2, 14), 1: (2, 2, 14)}, out


def test_garbage_to_the_elastic_driver_is_ignored_and_logged():
    rc, out = job(("--elastic", "-np", "2"), sys.executable, ELASTIC, "--garbage")
    assert rc == 0, out
    assert "[0]<stdout>:GARBAGE sent" in out, out
    assert len(re.findall(r"^horovodliterun: ignored a connection to the rank reports", out,
                          re.M)) == 4, out
    assert finals(out) == {0: (2, 2, 18), 1: (2, 2, 18)}, out
