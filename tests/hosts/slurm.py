"""A real Slurm on the test hosts (slurmctl.sh here) as a pytest fixture.

    from hosts.slurm import slurm_fixture

    slurm = slurm_fixture(2)        # a module-scoped fixture named `slurm`: 2 hosts, 2 nodes

    def test_job(slurm, tmp_path):
        job = slurm.sbatch(["-N", "2", "--wrap", "srun hostname"], tmp_path)
        assert slurm.wait(job)["JobState"] == "COMPLETED"

Slurm runs on the hosts of hosts.fixture (shared with them: ``start_hosts``); the fixture
starts munged, slurmctld and one slurmd per host, and stops them all at its end, checking that
nothing is left. Without root, the packages or namespaces it skips with the reason; under CI
(env CI set) a machine that has root and the tools but fails ``up`` fails the test instead.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from hosts.fixture import _run, start_hosts, stop_hosts

SLURMCTL = str(Path(__file__).resolve().with_name("slurmctl.sh"))
STATE = os.environ.get("HVDL_SLURM_STATE", "/run/hvdl-slurm")
CONF = f"{STATE}/slurm.conf"
DONE = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
        "BOOT_FAIL", "DEADLINE"}


def slurmctl(*args, timeout=120):
    return _run([SLURMCTL, *args], timeout=timeout)


class Slurm:
    """The Slurm of :func:`slurm_fixture`: its client commands with its configuration."""

    def __init__(self, hosts):
        self.hosts = hosts
        self.nodes = hosts.names

    def env(self, **extra) -> dict:
        """This process's environment (what sbatch passes on to a job, as from a login node)
        with the test bed's configuration."""
        return dict(os.environ, SLURM_CONF=CONF, OMP_NUM_THREADS="1", **extra)

    def run(self, argv, *, env=None, timeout=120, cwd=None):
        """A Slurm client command (srun, scontrol, ...) run here, as on a login node."""
        return _run([str(a) for a in argv], env=env or self.env(), timeout=timeout, cwd=cwd)

    def sbatch(self, args, cwd, *, env=None) -> int:
        """Submits ``sbatch ARGS`` from ``cwd``; returns the job id."""
        r = self.run(["sbatch", "--parsable", *args], env=env, cwd=cwd, timeout=30)
        assert r.returncode == 0, f"sbatch {args} exited {r.returncode}:\n{r.stdout}{r.stderr}"
        return int(r.stdout.strip().split(";")[0])

    def job(self, job: int) -> dict:
        """``scontrol show job`` as a dict (JobState, ExitCode, Restarts, NodeList, ...)."""
        r = self.run(["scontrol", "show", "job", "-o", str(job)], timeout=30)
        assert r.returncode == 0, r.stdout + r.stderr
        return dict(re.findall(r"(\w+)=(\S*)", r.stdout))

    def wait(self, job: int, timeout: float = 180, states=DONE) -> dict:
        """Waits until the job is in one of ``states`` (default: ended); returns its fields.
        On timeout the job is cancelled and the test fails with its fields and the logs."""
        deadline = time.monotonic() + timeout
        while True:
            fields = self.job(job)
            if fields.get("JobState") in states:
                return fields
            if time.monotonic() > deadline:
                self.run(["scancel", str(job)])
                pytest.fail(f"job {job} not in {sorted(states)} after {timeout} s: {fields}\n"
                            f"{self.logs()}")
            time.sleep(0.25)

    def logs(self, lines: int = 40) -> str:
        out = []
        for log in sorted(Path(STATE, "log").glob("*.log")):
            out.append(f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace")
                                                        .splitlines()[-lines:]))
        return "\n".join(out)


def slurm_fixture(k: int = 2, *, scope: str = "module"):
    """A fixture (named by the variable it is assigned to) giving a :class:`Slurm` of k nodes."""

    @pytest.fixture(scope=scope)
    def _slurm():
        check = slurmctl("check")
        if check.returncode != 0:
            why = (check.stdout + check.stderr).strip()
            if os.environ.get("CI") and os.geteuid() == 0 and "not installed" in why:
                pytest.fail(f"CI is set and this is root, but {why}")
            pytest.skip(f"a Slurm test bed cannot run here: {why}")
        hosts = start_hosts(k)
        try:
            up = slurmctl("up", str(k))
            if up.returncode != 0:
                message = f"slurmctl.sh up {k} failed:\n{up.stdout}{up.stderr}"
                if os.environ.get("CI"):
                    pytest.fail(message)
                pytest.skip(message)
            yield Slurm(hosts)
        finally:
            down = slurmctl("down")
            status = slurmctl("status")
            stop_hosts()
            if down.returncode != 0 or status.returncode != 3:
                raise RuntimeError(f"slurmctl.sh down left something behind:\n{down.stdout}"
                                   f"{down.stderr}{status.stdout}{status.stderr}")

    return _slurm
