"""Elastic jobs across test hosts (tests/hosts, docs/test_hosts.md): --elastic --mpi (ULFM)
and --elastic without MPI (horovodliterun as the driver) losing a host's processes, a host's
link or the driver's host, a host leaving the discovery output and a host added to it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest
from hosts.fixture import HOSTCTL, hosts_fixture
from launching import discovery_script, run_with_event
from multihost_jobs import (
    LAYOUTS,
    ROOT,
    _job_processes,
    _kill_host,
    _launch_args,
    _on_host0,
    host_processes,
    launch,
)

hosts = hosts_fixture(3)

# ------------------------------------------------------------------- elastic (MPI with ULFM)

ELASTIC = [sys.executable, "tests/scripts/elastic_train.py"]
ODD_SETTING = "a b \"c\" 'd' $HOME ;\nsecond ünïcødé ✓"  # spaces, quotes, a newline, non-ASCII


def _ulfm() -> bool:
    from horovodlite._extension import load
    return load().fault_tolerance_built()


@pytest.mark.skipif(not _ulfm(), reason="this build's MPI has no ULFM")
def test_elastic_the_ranks_of_one_host_die_and_the_other_host_finishes(hosts):
    """2 hosts x 2 ranks: both ranks of hvdl-host1 die in the same step (SIGKILL); the two
    ranks of hvdl-host0 continue from the last commit and match the reference."""
    spec, slots = LAYOUTS["2x2"]
    r = launch(spec, sum(slots), [*ELASTIC, "--kill", "2:1:2", "--kill", "3:1:2"],
               extra=("--elastic", "--mpi"), timeout=240)
    assert r.returncode == 0, r.stdout
    finals = re.findall(r"FINAL rank (\d) size (\d) epochs 2", r.stdout)
    assert sorted(finals) == [("0", "2"), ("1", "2")], r.stdout
    assert "LOSSES rank 0 [(1, 2, [2, 3])]" in r.stdout, r.stdout
    assert re.search(r"lost ranks 2 \(host hvdl-host1\), 3 \(host hvdl-host1\) of 4", r.stdout)


@pytest.mark.skipif(not _ulfm(), reason="this build's MPI has no ULFM")
def test_elastic_a_whole_host_lost_ends_the_job_with_an_error_not_a_hang(hosts, tmp_path):
    """Killing every process of hvdl-host1, its MPI daemon included: Open MPI 5.0's launcher
    (PRRTE 3.0) ends the whole job when it loses a daemon, whatever the MPI could survive -
    the survivors cannot go on, but the job must end quickly and say so."""
    spec, slots = LAYOUTS["2x2"]
    cmd = [*_on_host0(), sys.executable, "-m", "horovodlite.runner.launch", "-np", "4",
           *_launch_args(spec, "--elastic", "--mpi"), *ELASTIC, "--step-seconds", "0.2",
           "--epochs", "12"]
    rc, out, lost_at = run_with_event(cmd, tmp_path / "job.log", 4,
                                      lambda: _kill_host("hvdl-host1"), 90, cwd=ROOT, settle=2)
    assert rc != 0, out
    assert "horovodliterun: lost hvdl-host1 (ranks 2, 3)" in out, out
    assert "the elastic job did not complete" in out, out
    assert time.monotonic() - lost_at < 60, out
    time.sleep(1)
    assert _job_processes() == []


@pytest.mark.skipif(not _ulfm(), reason="this build's MPI has no ULFM")
def test_elastic_a_host_left_out_by_discovery_retires_its_ranks(hosts, tmp_path):
    """hvdl-host0:2 and hvdl-host1:1; the discovery script lists both, then only hvdl-host0.
    At the next commit the state is synced once more with all three ranks, the rank of
    hvdl-host1 leaves the job (exit status 0: not a failure, nobody is revoked or shrunk) and
    ranks 0-1 continue from that commit; their final weights equal the reference that trained
    with 3 ranks up to it and 2 after it."""
    listing, script = discovery_script(tmp_path, "hvdl-host0:2\nhvdl-host1:1\n")
    cmd = [*_on_host0(), sys.executable, "-m", "horovodlite.runner.launch", "-np", "3",
           *_launch_args("hvdl-host0:2,hvdl-host1:1", "--mpi", "--host-discovery-script",
                         str(script)),
           *ELASTIC, "--step-seconds", "0.1", "--epochs", "4"]
    rc, out, _ = run_with_event(cmd, tmp_path / "job.log", 3,
                                lambda: listing.write_text("hvdl-host0:2\n"), 180, cwd=ROOT,
                                env={"HVDL_DISCOVERY_INTERVAL": "0.2"})
    assert rc == 0, out
    finals = re.findall(r"FINAL rank (\d) size (\d) epochs 4", out)
    assert sorted(finals) == [("0", "2"), ("1", "2")], out
    assert "rank 2 retires: its host hvdl-host1 is no longer in the host discovery output" in out
    assert ("retired rank 2 of 3 (host hvdl-host1 left the host discovery output); 2 remain"
            in out), out
    assert re.search(r"LOSSES rank 0 \[\(\d, \d+, \[2\]\)\]", out), out
    assert "lost rank" not in out and "did not complete" not in out, out
    assert "rank 2 on hvdl-host1 retired: its host left the host discovery output" in out, out


@pytest.mark.skipif(not _ulfm(), reason="this build's MPI has no ULFM")
def test_elastic_grows_onto_a_host_outside_h(hosts, tmp_path):
    """-H hvdl-host0:2, --max-np 3; the discovery script lists hvdl-host0:2, then also
    hvdl-host1:1, a host mpirun was never given: at the next commit MPI adds it to the job and
    a third rank starts there, receives the state by the sync, and the three finish with
    identical weights."""
    listing, script = discovery_script(tmp_path, "hvdl-host0:2\n")
    cmd = [*_on_host0(), sys.executable, "-m", "horovodlite.runner.launch", "-np", "2",
           *_launch_args("hvdl-host0:2", "--mpi", "--max-np", "3", "--host-discovery-script",
                         str(script)),
           *ELASTIC, "--compare", "ranks", "--step-seconds", "0.1", "--epochs", "6"]
    rc, out, _ = run_with_event(cmd, tmp_path / "job.log", 2,
                                lambda: listing.write_text("hvdl-host0:2\nhvdl-host1:1\n"), 180,
                                cwd=ROOT, env={"HVDL_DISCOVERY_INTERVAL": "0.2",
                                               "MY_ODD_SETTING": ODD_SETTING})
    assert rc == 0, out
    assert sorted(re.findall(r"FINAL rank (\d) size 3 epochs 6 agree", out)) == ["0", "1", "2"]
    # a caller's value reaches the rank added on the new host exactly, as the others (its
    # wrapper gets the job's environment from the launcher: nothing on a command line)
    assert sorted(re.findall(r"ODD rank (\d) (.*)$", out, re.M)) == [
        (r, ascii(ODD_SETTING)) for r in "012"], out
    assert ("hvd.elastic: started 1 new rank on hvdl-host1, added to the job (host discovery): "
            "ranks 2..2") in out, out
    assert re.search(r"continuing from step \d+ \(no rollback; \d+ commits\) with 2 -> 3 ranks",
                     out), out
    # the added rank has the report token (its wrapper reports) from MPI_Comm_spawn's "env"
    # info key (the spawn's command line holds none: tests/unit/test_growth_secrets.py), and no
    # rank's or wrapper's command line shows it
    assert sorted(re.findall(r"SECRETS rank (\d) env only", out)) == ["0", "1", "2"], out


# ------------------------------------------- elastic without MPI (horovodliterun as the driver)


def _elastic_gloo(tmp_path, spec: str, np_: int, event, *script_args: str, extra=(),
                  ranks_up: int | None = None, timeout: float = 180, env=None) -> tuple:
    """horovodliterun --elastic on hvdl-host0 (the driver), workers placed by ``spec`` through
    the agent; ``event()`` once every worker is up. Returns (rc, output, the event's wall
    time)."""
    cmd = [*_on_host0(), sys.executable, "-m", "horovodlite.runner.launch", "--elastic", "-np",
           str(np_), "-H", spec, "--ssh-agent", HOSTCTL, "--network-interface", "eth0", *extra,
           *ELASTIC, *script_args]
    wall: list = []

    def at_event():
        wall.append(time.time())
        event()

    rc, out, _ = run_with_event(cmd, tmp_path / "job.log", ranks_up or np_, at_event, timeout,
                                cwd=ROOT, settle=2,
                                env={"HOROVOD_GLOO_TIMEOUT_SECONDS": "10", **(env or {})})
    return rc, out, wall[0]


def _recovered_after(out: str, event_wall: float) -> float:
    """Seconds from the event to the survivors' first step at the new size."""
    resumed = [float(t) for t in re.findall(r"RESUMED rank \d+ at ([\d.]+)", out)]
    assert resumed, out
    return min(resumed) - event_wall


def test_gloo_elastic_a_host_whose_processes_die_the_other_host_finishes(hosts, tmp_path):
    """2 hosts x 2 workers; every process of hvdl-host1 SIGKILLed mid-training: the two
    workers of hvdl-host0 restore the last commit, meet in round 1 and finish with the
    weights of the reference (4 ranks up to that commit, 2 after it)."""
    spec, _ = LAYOUTS["2x2"]
    rc, out, lost = _elastic_gloo(tmp_path, spec, 4, lambda: _kill_host("hvdl-host1"),
                                  "--step-seconds", "0.2", "--epochs", "10")
    assert rc == 0, out
    finals = re.findall(r"FINAL rank (\d) size (\d) epochs 10 steps", out)
    assert sorted(finals) == [("0", "2"), ("1", "2")], out
    assert re.search(r"LOSSES rank 0 \[\(\d+, \d+, \[2, 3\]\)\]", out), out
    assert "horovodliterun: lost hvdl-host1 (ranks 2, 3)" in out, out
    assert "horovodliterun: round 1: 2 workers (hvdl-host0:2): they reset and go on" in out
    assert re.search(r"continuing from step \d+ \(no rollback; \d+ commits\) with 4 -> 2 ranks",
                     out), out
    took = _recovered_after(out, lost)
    print(f"killed host: first step at the new size {took:.1f} s after the loss")
    assert took < 10, out


def test_gloo_elastic_a_host_cut_off_the_other_host_finishes(hosts, tmp_path):
    """The same with hvdl-host1's link cut (ip link set ... down): nothing closes, the silence
    is the sign - the driver's heartbeat watch takes the host's workers for lost after 2 s
    (--elastic-heartbeat-timeout; before the Gloo timeout, 10 s, or the reports' 15 s), then the
    same result; the cut-off workers end themselves."""
    spec, _ = LAYOUTS["2x2"]

    def cut():
        subprocess.run(["ip", "link", "set", "hvdl-veth1", "down"], check=True)

    try:
        rc, out, lost = _elastic_gloo(tmp_path, spec, 4, cut, "--step-seconds", "0.2",
                                      "--epochs", "14")
    finally:
        subprocess.run(["ip", "link", "set", "hvdl-veth1", "up"], check=True)
    assert rc == 0, out
    finals = re.findall(r"FINAL rank (\d) size (\d) epochs 14 steps", out)
    assert sorted(finals) == [("0", "2"), ("1", "2")], out
    assert re.search(r"LOSSES rank 0 \[\(\d+, \d+, \[2, 3\]\)\]", out), out
    assert re.search(r"horovodliterun: lost rank [23] \(worker [23]\) on hvdl-host1: no "
                     r"heartbeat for [\d.]+ s", out), out
    took = _recovered_after(out, lost)
    print(f"cut link: first step at the new size {took:.1f} s after the cut")
    assert took < 10 + 15, out
    deadline = time.monotonic() + 60
    while _elastic_processes() and time.monotonic() < deadline:
        time.sleep(1)
    assert _elastic_processes() == []


def _elastic_processes() -> list:
    return host_processes(r"elastic_train\.py")


def test_gloo_elastic_grows_onto_a_third_host(hosts, tmp_path):
    """-H hvdl-host0:2, --max-np 3; the discovery script adds hvdl-host2:1 while training: the
    driver starts a worker there, the job meets it at the next commit, and all three finish
    with identical weights."""
    listing, script = discovery_script(tmp_path, "hvdl-host0:2\n")
    rc, out, _ = _elastic_gloo(
        tmp_path, "hvdl-host0:2", 2, lambda: listing.write_text("hvdl-host0:2\nhvdl-host2:1\n"),
        "--compare", "ranks", "--step-seconds", "0.1", "--epochs", "8",
        extra=("--max-np", "3", "--host-discovery-script", str(script)),
        env={"HVDL_DISCOVERY_INTERVAL": "0.2"})
    assert rc == 0, out
    assert sorted(re.findall(r"FINAL rank (\d) size 3 epochs 8 agree", out)) == ["0", "1", "2"]
    assert ("horovodliterun: added 1 worker on hvdl-host2:1 (host discovery); they join at the "
            "next commit") in out, out
    assert "round 1: 3 workers (hvdl-host0:2, hvdl-host2:1)" in out, out


def test_gloo_elastic_a_host_left_out_by_discovery_retires_its_worker(hosts, tmp_path):
    """hvdl-host0:2 and hvdl-host1:1; the discovery script then lists only hvdl-host0: at the
    next commit the worker of hvdl-host1 syncs once more, leaves (retired, not failed) and the
    two others finish with the reference's weights (3 ranks up to that commit, 2 after)."""
    listing, script = discovery_script(tmp_path, "hvdl-host0:2\nhvdl-host1:1\n")
    rc, out, _ = _elastic_gloo(
        tmp_path, "hvdl-host0:2,hvdl-host1:1", 3, lambda: listing.write_text("hvdl-host0:2\n"),
        "--step-seconds", "0.1", "--epochs", "4",
        extra=("--host-discovery-script", str(script)), env={"HVDL_DISCOVERY_INTERVAL": "0.2"})
    assert rc == 0, out
    assert sorted(re.findall(r"FINAL rank (\d) size (\d) epochs 4", out)) == [
        ("0", "2"), ("1", "2")], out
    assert ("horovodliterun: hvdl-host1 left the host discovery output: rank 2 retire"
            in out), out
    assert "rank 2 retires: its host hvdl-host1 is no longer in the host discovery output" in out
    assert re.search(r"LOSSES rank 0 \[\(\d, \d+, \[2\]\)\]", out), out
    assert "worker 2 on hvdl-host1: retired: its host left the host discovery output" in out, out


def test_gloo_elastic_a_second_loss_during_recovery(hosts, tmp_path):
    """hvdl-host0:2, hvdl-host1:1, hvdl-host2:1: hvdl-host2 is killed, and the worker of
    hvdl-host1 dies inside the recovery (its reset callback): host 0's two workers finish with
    the reference's weights."""
    rc, out, _ = _elastic_gloo(tmp_path, "hvdl-host0:2,hvdl-host1:1,hvdl-host2:1", 4,
                               lambda: _kill_host("hvdl-host2"), "--kill-in-reset", "2",
                               "--step-seconds", "0.2", "--epochs", "10")
    assert rc == 0, out
    assert sorted(re.findall(r"FINAL rank (\d) size (\d) epochs 10 steps", out)) == [
        ("0", "2"), ("1", "2")], out
    assert re.search(r"LOSSES rank 0 \[\(\d+, \d+, \[2, 3\]\)\]", out), out
    assert "horovodliterun: lost hvdl-host2 (rank 3)" in out, out


def test_gloo_elastic_the_drivers_host_lost(hosts, tmp_path):
    """Workers on hvdl-host1 and hvdl-host2, the driver on hvdl-host0, which is killed whole:
    the workers end by themselves (they lost the driver's store and its reports), none trains
    on or waits for ever."""
    cmd = [*_on_host0(), sys.executable, "-m", "horovodlite.runner.launch", "--elastic", "-np",
           "2", "-H", "hvdl-host1:1,hvdl-host2:1", "--ssh-agent", HOSTCTL,
           "--network-interface", "eth0", *ELASTIC, "--step-seconds", "0.2", "--epochs", "60"]
    log = tmp_path / "job.log"
    env = dict(os.environ, OMP_NUM_THREADS="1", HOROVOD_GLOO_TIMEOUT_SECONDS="10")
    env.pop("PYTHONUNBUFFERED", None)  # one write per flushed line, as in launch()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        deadline = time.monotonic() + 120
        while log.read_text().count("UP rank") < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert log.read_text().count("UP rank") == 2, log.read_text()
        time.sleep(1)
        lost_at = time.monotonic()
        _kill_host("hvdl-host0")
        proc.wait()
    while _elastic_processes() and time.monotonic() - lost_at < 90:
        time.sleep(1)
    left = _elastic_processes()
    for line in left:
        os.kill(int(line.split()[0]), 9)
    assert left == [], log.read_text()
    print(f"the workers ended {time.monotonic() - lost_at:.1f} s after the driver's host")


@pytest.mark.skipif(not _ulfm(), reason="this build's MPI has no ULFM")
def test_elastic_mpi_a_host_cut_off_ends_the_job_within_seconds(hosts, tmp_path):
    """--elastic --mpi (ULFM) cannot go on without a host's MPI daemon, and behind a cut link
    Open MPI's runtime would wait for ever: horovodliterun ends the job once it notices, with
    a non-zero exit and a line saying what survives what."""
    spec, _ = LAYOUTS["3x1"]
    cmd = [*_on_host0(), sys.executable, "-m", "horovodlite.runner.launch", "-np", "3",
           *_launch_args(spec, "--elastic", "--mpi"), *ELASTIC, "--step-seconds", "0.2",
           "--epochs", "40"]

    def cut():
        subprocess.run(["ip", "link", "set", "hvdl-veth2", "down"], check=True)

    try:
        rc, out, cut_at = run_with_event(cmd, tmp_path / "job.log", 3, cut, 120, cwd=ROOT,
                                         settle=2)
    finally:
        subprocess.run(["ip", "link", "set", "hvdl-veth2", "up"], check=True)
    took = time.monotonic() - cut_at
    assert rc != 0, out
    assert "horovodliterun: lost hvdl-host2 (rank 2)" in out, out
    assert "--elastic --mpi survives lost processes, not a lost host" in out, out
    print(f"--elastic --mpi, cut link: the job ended {took:.1f} s after the cut")
    assert took < 15 + 30, out
