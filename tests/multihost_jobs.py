"""What the jobs across test hosts share (tests/test_multihost.py, test_multihost_elastic.py):
the layouts, starting horovodliterun on hvdl-host0 as on a cluster, and losing a host."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from hosts.fixture import HOSTCTL
from launching import retry_if_launcher_did_not_start, unprefixed

ROOT = Path(__file__).resolve().parent.parent

LAYOUTS = {  # name: (-H, slots per host)
    "2x2": ("hvdl-host0:2,hvdl-host1:2", [2, 2]),
    "3x1": ("hvdl-host0:1,hvdl-host1:1,hvdl-host2:1", [1, 1, 1]),
    "2+1": ("hvdl-host0:2,hvdl-host1:1", [2, 1]),
}


def _on_host0() -> list:
    return [HOSTCTL, "run", "hvdl-host0"]


def _launch_args(spec: str, *extra: str) -> tuple:
    # the rsh agent stands in for ssh (horovodliterun passes it as the MPI's agent setting:
    # PRRTE's plm_ssh_agent, Open MPI 4's plm_rsh_agent); eth0 is every test host's only
    # interface; the hosts share two cores, so MPI must yield when idle (tests/hosts/hostctl.sh,
    # above mpi_args)
    return ("-H", spec, "--network-interface", "eth0", "--ssh-agent", HOSTCTL,
            "--mpi-args", "--mca mpi_yield_when_idle 1", *extra)


def launch(spec: str, np_: int, argv: list, env: dict | None = None, timeout: int = 300,
           extra: tuple = ()) -> subprocess.CompletedProcess:
    """horovodliterun -np N -H spec ... argv, started on hvdl-host0; output combined.

    The ranks' stdout stays buffered (no PYTHONUNBUFFERED): a print with flush=True is then one
    write, so one line. Unbuffered, print writes each word apart, and Open MPI 4's daemons
    forward each write as it comes, interleaving the lines of ranks on different hosts."""
    run_env = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    run_env.pop("PYTHONUNBUFFERED", None)
    cmd = [*_on_host0(), sys.executable, "-m", "horovodlite.runner.launch", "-np", str(np_),
           *_launch_args(spec, *extra), *argv]

    def run():
        p = subprocess.run(cmd, cwd=ROOT, env=run_env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=timeout)
        p.stdout = unprefixed(p.stdout)  # the ranks' lines as they wrote them
        return p.returncode, p.stdout, p

    return retry_if_launcher_did_not_start(run)[2]


def _netns_pids(name: str) -> list:
    return subprocess.run(["ip", "netns", "pids", name], capture_output=True,
                          text=True).stdout.split()


def host_processes(pattern: str) -> list:
    """The `ps` lines matching `pattern` of processes on the test hosts (in their network
    namespaces): the jobs of the suite's other lanes run outside them."""
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    on_hosts = {pid for name in re.findall(r"^(hvdl-host\d+)", names, re.MULTILINE)
                for pid in _netns_pids(name)}
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines()
            if re.search(pattern, line) and line.split(None, 1)[0] in on_hosts]


def _job_processes() -> list:
    """Processes of a job (ranks, their wrappers, daemons) still running on any test host."""
    return host_processes(r"lost_host_job\.py|\bprted\b")


def _kill_host(name: str) -> None:
    for pid in _netns_pids(name):
        try:
            if "hvdl-hosts-holder" not in Path(f"/proc/{pid}/cmdline").read_text(errors="replace"):
                os.kill(int(pid), 9)
        except OSError:
            pass
