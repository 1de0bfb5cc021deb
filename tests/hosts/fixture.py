"""pytest fixtures that turn this machine into K test hosts hvdl-host0..K-1 (hostctl.sh here).

Each host has its own network (10.213.0.N+1 on a bridge, links shaped by tbf), hostname, PID and
mount namespace; Open MPI starts ranks on them through hostctl.sh as its rsh agent, as on real
machines. See docs/test_hosts.md.

    from hosts.fixture import hosts_fixture

    hosts = hosts_fixture(2)          # a module-scoped fixture named `hosts`

    def test_spread(hosts):
        r = hosts.mpirun(["hostname"], "hvdl-host0:2,hvdl-host1:2", np=4)
        assert sorted(r.stdout.split()) == ["hvdl-host0"] * 2 + ["hvdl-host1"] * 2

A conftest can share one session-wide set of 2 hosts: ``from hosts.fixture import hvdl_hosts``.
The hosts are made once and shared while any fixture uses them, then removed (fixture teardown,
and an ``atexit`` hook should the teardown not run; ``up`` also removes what a killed run left).
Without root or the needed tools the fixture skips and says why; under CI (env CI set) a failing
``up`` on a machine that passes ``hostctl.sh check`` fails the test instead of skipping it.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from launching import LAUNCHER_DID_NOT_START

from horovodlite.runner.remote import mpirun_agent_args

HOSTCTL = str(Path(__file__).resolve().with_name("hostctl.sh"))
DEFAULT_RATE = "1gbit"
SUBNET = "10.213.0.0/24"
_beside_python = Path(sys.executable).with_name("mpirun")
MPIRUN = os.environ.get("HVDL_HOSTS_MPIRUN") or (
    str(_beside_python) if _beside_python.exists() else shutil.which("mpirun") or "mpirun")


def build_launcher() -> str:
    """The mpirun horovodliterun --mpi starts: the one of the MPI horovodlite was built against
    (Debian's Open MPI 4 in a fresh venv, where PATH may also hold PyPI's Open MPI 5)."""
    from horovodlite import _mpi_check
    record = _mpi_check.read_record()
    return (record and _mpi_check.matching_launcher(record)) or MPIRUN


def open_mpi_major(mpirun: str = MPIRUN) -> int:
    """The Open MPI major version of `mpirun` (5 when it cannot be told): Open MPI 5 (PRRTE)
    takes its runtime's settings as --prtemca, Open MPI 4 (ORTE, e.g. Debian's) as --mca."""
    from horovodlite._mpi_check import parse_launcher_version
    from horovodlite.runner.mpi_launch import mpirun_version
    mpi = parse_launcher_version(mpirun_version(mpirun))
    return (mpi.major if mpi and mpi.family == "Open MPI" else None) or 5


def _run(argv, *, env=None, timeout=60, input=None, cwd=None) -> subprocess.CompletedProcess:
    """subprocess.run(text, captured) that, on timeout, ends the whole process group it started."""
    stdin = subprocess.PIPE if input is not None else subprocess.DEVNULL
    proc = subprocess.Popen(argv, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=cwd, start_new_session=True)
    try:
        out, err = proc.communicate(input, timeout=timeout)
    except subprocess.TimeoutExpired:
        out = err = ""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
            try:
                out, err = proc.communicate(timeout=5)
                break
            except subprocess.TimeoutExpired:
                pass  # something of the group still holds the pipes; KILL, then give up on them
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        raise subprocess.TimeoutExpired(argv, timeout, output=out, stderr=err) from None
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def hostctl(*args, timeout=120) -> subprocess.CompletedProcess:
    """Runs ``hostctl.sh ARGS...`` (captured)."""
    return _run([HOSTCTL, *args], timeout=timeout)


class HostSet:
    """The hosts hvdl-host0..k-1 (made by :func:`start_hosts`)."""

    def __init__(self, k: int, rate: str):
        self.k = k
        self.rate = rate
        self.names = [f"hvdl-host{i}" for i in range(k)]
        self.addresses = [f"10.213.0.{i + 1}" for i in range(k)]

    def run(self, host: str, cmd, *, env=None, timeout=60, check=False, input=None,
            cwd=None) -> subprocess.CompletedProcess:
        """Runs ``cmd`` (argv list, or a string for ``sh -c``) on ``host`` with this environment
        (or ``env``) and cwd; returns a CompletedProcess with text stdout/stderr."""
        argv = ["sh", "-c", cmd] if isinstance(cmd, str) else [str(c) for c in cmd]
        result = _run([HOSTCTL, "run", host, *argv], env=env, timeout=timeout, input=input,
                      cwd=cwd)
        if check and result.returncode != 0:
            raise AssertionError(f"on {host}: {argv} exited {result.returncode}\n"
                                 f"{result.stdout}{result.stderr}")
        return result

    def mpirun_args(self, hosts_spec: str | None = None) -> list:
        """mpirun arguments that run on these hosts: -H (default: one slot on each host), the rsh
        agent, TCP pinned to the hosts' subnet, MPI yielding when idle. ``hosts_spec=""`` leaves
        out -H, for horovodliterun, which takes -H itself:
        ``horovodliterun -H ... --mpi-args shlex.join(hosts.mpirun_args(""))``."""
        spec = ",".join(self.names) if hosts_spec is None else hosts_spec
        # for horovodliterun (spec ""): the settings of the launcher it starts, not ours
        major = open_mpi_major(MPIRUN if spec else build_launcher())
        runtime = "--prtemca" if major >= 5 else "--mca"
        return (["-H", spec] if spec else []) + [
            *mpirun_agent_args("openmpi", major, HOSTCTL, None, None),
            runtime, "oob_tcp_if_include", SUBNET,
            "--mca", "btl_tcp_if_include", SUBNET,
            "--mca", "mpi_yield_when_idle", "1"]  # why: hostctl.sh, above mpi_args

    def mpirun(self, cmd, hosts_spec: str | None = None, np: int | None = None, env=None,
               timeout=120, args=()) -> subprocess.CompletedProcess:
        """Runs ``mpirun ... cmd`` on hvdl-host0 (as one would on a cluster's first node), ranks
        placed by slot (--map-by slot --bind-to none --oversubscribe). PATH, OMP_NUM_THREADS=1,
        PYTHONPATH (if set) and every variable of ``env`` are forwarded to the ranks with -x."""
        run_env = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
                       OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", **(env or {}))
        forward = {"PATH", "OMP_NUM_THREADS", *(env or {})}
        if "PYTHONPATH" in run_env:
            forward.add("PYTHONPATH")
        argv = [MPIRUN, *self.mpirun_args(hosts_spec),
                "-np", str(np if np is not None else self.k),
                "--map-by", "slot", "--bind-to", "none", "--oversubscribe"]
        for name in sorted(forward):
            argv += ["-x", name]
        argv += [*args, *cmd]
        result = self.run(self.names[0], argv, env=run_env, timeout=timeout)
        if result.returncode != 0 and LAUNCHER_DID_NOT_START in result.stdout + result.stderr:
            result = self.run(self.names[0], argv, env=run_env, timeout=timeout)  # see launching.py
        return result

    def set_rate(self, rate: str) -> None:
        """Changes the tbf rate of every link (tc units, e.g. "100mbit")."""
        r = hostctl("rate", rate)
        assert r.returncode == 0, r.stdout + r.stderr
        _shared["rate"] = self.rate = rate


_shared = {"users": 0, "k": 0, "rate": None, "atexit": False}


def _down_at_exit() -> None:
    if _shared["k"]:
        hostctl("down")
        _shared.update(users=0, k=0, rate=None)


def hosts_in_use() -> bool:
    """Whether hosts from :func:`start_hosts` are in use in this session."""
    return _shared["users"] > 0


def start_hosts(k: int = 2, rate: str = DEFAULT_RATE) -> HostSet:
    """Makes hvdl-host0..k-1 (or shares the ones made already); pair with :func:`stop_hosts`.
    Skips the calling test when hosts cannot be made on this machine, saying why."""
    if _shared["users"]:
        if _shared["k"] >= k and _shared["rate"] == rate:
            _shared["users"] += 1
            return HostSet(k, rate)
        raise RuntimeError(f"test hosts are in use with K={_shared['k']}, rate {_shared['rate']}; "
                           f"cannot also have K={k}, rate {rate} in the same session")
    check = hostctl("check")
    if check.returncode != 0:
        why = (check.stdout + check.stderr).strip()
        ci = " (CI is set, but this machine cannot make them)" if os.environ.get("CI") else ""
        pytest.skip(f"test hosts cannot be made here{ci}: {why}")
    if not _shared["atexit"]:
        atexit.register(_down_at_exit)
        _shared["atexit"] = True
    up = hostctl("up", str(k), "--rate", rate)
    if up.returncode != 0:
        message = f"hostctl.sh up {k} failed (exit {up.returncode}):\n{up.stdout}{up.stderr}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    _shared.update(users=1, k=k, rate=rate)
    return HostSet(k, rate)


def stop_hosts() -> None:
    """Releases hosts from :func:`start_hosts`; the last user removes them and checks that
    nothing is left (``hostctl.sh status`` exits 3)."""
    _shared["users"] -= 1
    if _shared["users"] > 0:
        return
    _shared.update(users=0, k=0, rate=None)
    down = hostctl("down")
    status = hostctl("status")
    if down.returncode != 0 or status.returncode != 3:
        raise RuntimeError(f"hostctl.sh down left something behind:\n{down.stdout}{down.stderr}"
                           f"{status.stdout}{status.stderr}")


def hosts_fixture(k: int = 2, *, rate: str = DEFAULT_RATE, scope: str = "module"):
    """A fixture (named by the variable it is assigned to) giving a :class:`HostSet` of k hosts."""

    @pytest.fixture(scope=scope)
    def _hosts():
        hosts = start_hosts(k, rate)
        try:
            yield hosts
        finally:
            stop_hosts()

    return _hosts


hvdl_hosts = hosts_fixture(2, scope="session")
