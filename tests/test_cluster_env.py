"""A first run on a cluster, emulated on 2 test hosts entered as ssh enters a machine (the
agent's login environment has nothing of the caller's; tests/hosts): variables only the caller
has reach every rank under --gloo, --elastic (on a host added later too) and --mpi, with
spaces, quotes, a newline and non-ASCII intact, and CUDA_VISIBLE_DEVICES stays on the caller's
host; horovodliterun without -H finds the hosts of a Slurm, PBS or LSF allocation, or of a
hostfile handed to mpirun, and its rank reports reach it there: a rank killed mid-run is named
with its host and the job fails. Each job (a few seconds; its ranks need neither torch nor MPI)
checks both. Plain srun under PMI, with real tasks, is at the end (no hosts needed).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from hosts.fixture import HOSTCTL, MPIRUN, hosts_fixture
from launching import (
    LAUNCHER_DID_NOT_START,
    communicate_all,
    retry_if_launcher_did_not_start,
    run_job,
)

from horovodlite import _mpi_check
from horovodlite.runner import mpi_launch
from horovodlite.runner.launch import build_parser as launch_parser

ROOT = Path(__file__).resolve().parent.parent
hosts = hosts_fixture(2)

CALLER_ONLY = {"MY_SETTING": "hello", "NCCL_SOCKET_IFNAME": "eth0",
               "TORCH_DISTRIBUTED_DEBUG": "INFO", "MY_QUOTED": "a b \"c\" 'd' $HOME `x` ;",
               "MY_MULTI": "first line\nsecond ünïcødé ✓"}
# LS_JOBPID: a scheduler's identity of the launcher's own task (LSF's), which no rank gets
NAMES = ",".join([*CALLER_ONLY, "CUDA_VISIBLE_DEVICES", "MY_EXCLUDED", "LS_JOBPID"])
JOB = [sys.executable, "tests/scripts/cluster_env_job.py", NAMES]
TWO_BY_TWO = {0: "hvdl-host0", 1: "hvdl-host0", 2: "hvdl-host1", 3: "hvdl-host1"}
SCHEDULERS = ("SLURM_", "PBS_", "LSB_", "OMPI_MCA_orte_default", "PRTE_MCA_prte_default")


def launch(args: list, extra_env: dict, timeout: float = 120) -> tuple:
    """horovodliterun ARGS JOB... on hvdl-host0, from an environment with the caller-only
    variables; (exit status, output)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(SCHEDULERS)}
    env.update(CALLER_ONLY, CUDA_VISIBLE_DEVICES="0", MY_EXCLUDED="x", LS_JOBPID="4321",
               OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra_env)
    cmd = [HOSTCTL, "run", "hvdl-host0", sys.executable, "-m", "horovodlite.runner.launch",
           "--env-exclude", "MY_EXCL*", *args]
    return retry_if_launcher_did_not_start(
        lambda: run_job(cmd, cwd=ROOT, env=env, timeout=timeout))[:2]


def check_ranks(out: str, placed: dict) -> None:
    """Every rank ran where ``placed`` says and saw the caller's variables exactly; the
    caller's CUDA_VISIBLE_DEVICES only on its own host; --env-exclude's and the scheduler's
    identity (LS_JOBPID) nowhere, the launcher's host included (under --mpi: mpirun's ranks
    there inherit mpirun's environment)."""
    seen = {}
    for m in re.finditer(r"ENV (\{.*\})$", out, re.M):
        report = json.loads(m.group(1))
        seen[report["rank"]] = report
    assert {r: s["host"] for r, s in seen.items()} == placed, out[-6000:]
    for rank, report in seen.items():
        want = dict(CALLER_ONLY, MY_EXCLUDED=None, LS_JOBPID=None,
                    CUDA_VISIBLE_DEVICES="0" if report["host"] == "hvdl-host0" else None)
        assert report["env"] == want, (rank, report, out[-4000:])


def check_killed(rc: int, out: str, named: str) -> None:
    assert rc != 0, out[-6000:]
    assert re.search(named, out), out[-6000:]
    assert "running without exit reports" not in out, out[-6000:]


def test_the_agent_enters_a_host_as_ssh_does(hosts):
    """What makes the jobs below mean something: a command the agent runs on a host gets a login
    environment there, nothing of its caller's."""
    env = dict(os.environ, **CALLER_ONLY)
    r = subprocess.run([HOSTCTL, "agent", "hvdl-host1", "env"], env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    got = dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)
    assert not set(CALLER_ONLY) & set(got), got
    assert {"PATH", "HOME", "USER"} <= set(got) and got["TMPDIR"].endswith("hvdl-host1")


def test_slurm_allocation_gloo(hosts):
    rc, out = launch(["--gloo", "-np", "4", "--ssh-agent", HOSTCTL, "--verbose",
                         *JOB, "--kill", "3"],
                        {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "hvdl-host[0-1]",
                         "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_JOB_CPUS_PER_NODE": "8(x2)"})
    assert ("horovodliterun: hosts from Slurm (SLURM_JOB_NODELIST, SLURM_TASKS_PER_NODE): "
            "hvdl-host0:2,hvdl-host1:2") in out, out[-6000:]
    assert "not given to any rank - --env-exclude: MY_EXCLUDED" in out, out[-6000:]
    assert ("not given to ranks on other hosts - this host's GPU numbering (--env-include "
            "NAME sends it): CUDA_VISIBLE_DEVICES") in out, out[-6000:]
    check_ranks(out, TWO_BY_TWO)
    check_killed(rc, out, r"rank 3 on hvdl-host1 exited with signal 9")


def test_pbs_allocation_elastic(hosts, tmp_path):
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("hvdl-host0\nhvdl-host0\nhvdl-host1\nhvdl-host1\n")
    rc, out = launch(["--elastic", "-np", "4", "--min-np", "4", "--ssh-agent", HOSTCTL,
                         *JOB, "--kill", "3"],
                        {"PBS_JOBID": "17.pbs", "PBS_NODEFILE": str(nodefile)})
    assert f"horovodliterun: hosts from PBS (PBS_NODEFILE={nodefile}): " \
           "hvdl-host0:2,hvdl-host1:2" in out, out[-6000:]
    check_ranks(out, TWO_BY_TWO)  # (an elastic worker's number)
    check_killed(rc, out, r"\(worker 3\) on hvdl-host1 exited with signal 9")


def test_elastic_a_worker_added_later_on_another_host_gets_the_environment(hosts, tmp_path):
    """-np 1, --max-np 2: the discovery script lists a second host once the first worker runs;
    the worker started there then sees what the first one saw."""
    mark = tmp_path / "added"
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\necho hvdl-host0:1\n[ -e {mark}.0 ] && echo hvdl-host1:1\n"
                      "exit 0\n")
    script.chmod(0o755)
    rc, out = launch(["--elastic", "-np", "1", "--max-np", "2", "--host-discovery-script",
                      str(script), "--ssh-agent", HOSTCTL, *JOB, "--mark", str(mark)],
                     {"HVDL_DISCOVERY_INTERVAL": "0.3"})
    assert rc == 0, out[-6000:]
    # (it runs no hvd.init: it is started, never listed in a round)
    assert "started 1 worker on hvdl-host1:1 (host discovery)" in out, out[-6000:]
    check_ranks(out, {0: "hvdl-host0", 1: "hvdl-host1"})


def test_lsf_allocation_mpi(hosts):
    rc, out = launch(["--mpi", "-np", "4", "--ssh-agent", HOSTCTL, "--verbose", "--mpi-args",
                         "--mca mpi_yield_when_idle 1", *JOB, "--kill", "3"],
                        {"LSB_JOBID": "555", "LSB_MCPU_HOSTS": "hvdl-host0 2 hvdl-host1 2"})
    assert "horovodliterun: hosts from LSF (LSB_MCPU_HOSTS): hvdl-host0:2,hvdl-host1:2" in out, \
        out[-6000:]
    # what --verbose says is left out is left out of the ranks mpirun starts here too
    assert "not given to any rank - --env-exclude: MY_EXCLUDED" in out, out[-6000:]
    assert re.search(r"not given to any rank - the scheduler's identity [^\n]*: [^\n]*LS_JOBPID",
                     out), out[-6000:]
    check_ranks(out, TWO_BY_TWO)
    check_killed(rc, out, r"rank 3 on hvdl-host1 exited with signal 9")


def test_a_hostfile_given_to_mpirun_only(hosts, tmp_path):
    """The issue's case: hosts only in --mpi-args (as an allocation hands them to mpirun); the
    reports once listened on 127.0.0.1, out of the other host's reach."""
    hostfile = tmp_path / "hf"
    hostfile.write_text("hvdl-host0 slots=2\nhvdl-host1 slots=2\n")
    mpi_args = shlex.join(["--hostfile", str(hostfile), *hosts.mpirun_args("")])
    rc, out = launch(["--mpi", "-np", "4", "--mpi-args", mpi_args, *JOB, "--kill", "3"], {})
    assert f"horovodliterun: hosts from the hostfile in --mpi-args ({hostfile}): " \
           "hvdl-host0:2,hvdl-host1:2" in out, out[-6000:]
    check_ranks(out, TWO_BY_TWO)
    check_killed(rc, out, r"rank 3 on hvdl-host1 exited with signal 9")


# Open MPI 4 (ORTE) and MPICH (Hydra) carry the names as the build's Open MPI 5 does; what
# horovodliterun --mpi would run with each (its mpirun command, less the rank wrapper: a build
# refuses another MPI's launcher), where they are installed
OTHER_MPIS = [("openmpi", 4, "/usr/bin/mpirun.openmpi"), ("mpich", 4, "/usr/bin/mpiexec.hydra")]


def test_open_mpi_4_and_mpich_carry_the_values_by_name(hosts):
    ran = []
    for flavor, major, mpirun in OTHER_MPIS:
        if not os.access(mpirun, os.X_OK):
            continue
        args = launch_parser().parse_args(
            ["-np", "2", "-H", "hvdl-host0:1,hvdl-host1:1", "--ssh-agent", HOSTCTL,
             "--network-interface", "eth0", "--env-exclude", "MY_EXCL*", *JOB])
        env = {k: v for k, v in os.environ.items() if not k.startswith(SCHEDULERS)}
        env.update(CALLER_ONLY, CUDA_VISIBLE_DEVICES="0", OMP_NUM_THREADS="1")
        cmd = mpi_launch.build_command(args, mpirun, flavor, env, major)
        rc, out, _ = run_job([HOSTCTL, "run", "hvdl-host0", *cmd], cwd=ROOT, env=env,
                             timeout=120, what=mpirun)
        assert rc == 0, out[-4000:]
        check_ranks(out, {0: "hvdl-host0", 1: "hvdl-host1"})
        ran.append(mpirun)
    if not ran:
        pytest.skip("neither Open MPI 4's nor MPICH's launcher is installed here")


# ------------------------------------------------------------- plain srun under PMI (no hosts)

SRUN_TASK = """
import os, sys, torch, horovodlite.torch as hvd
try:
    hvd.init()
except Exception as e:  # ValueError before MPI starts, HorovodInternalError after
    print("STOPPED", type(e).__name__, e, flush=True)
    sys.exit(3)
total = hvd.allreduce(torch.ones(1), op=hvd.Sum).item()
print("RAN", hvd.rank(), hvd.size(), hvd.mpi_enabled(), total, flush=True)
"""
# srun's variables for the task whose PMIx rank the shell gives, none of mpirun's own: mpirun's
# PMIx server stands in for the one Slurm's pmix plugin runs
AS_SRUN_TASK = ("for v in $(env | sed -n 's/^\\(OMPI_[A-Za-z0-9_]*\\)=.*/\\1/p; "
                "s/^\\(PRTE_[A-Za-z0-9_]*\\)=.*/\\1/p'); do unset \"$v\"; done; "
                "export SLURM_PROCID=$PMIX_RANK SLURM_LOCALID=$PMIX_RANK; exec \"$@\"")
SLURM = {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "2", "SLURM_NODEID": "0",
         "SLURM_NNODES": "1", "SLURM_JOB_NODELIST": "localhost", "SLURMD_NODENAME": "localhost",
         "SLURM_STEP_NODELIST": "localhost", "SLURM_STEP_TASKS_PER_NODE": "2"}


# the build's own mpirun (Debian's mpirun.openmpi for a build against its Open MPI 4.1: another
# MPI's launcher would load its own libmpi into the tasks)
_RECORD = _mpi_check.read_record()
PMIX_SERVER = (_RECORD and _mpi_check.matching_launcher(_RECORD)) or MPIRUN


def srun_tasks(np: int) -> list:
    """mpirun -np NP starting SRUN_TASK as srun's tasks (AS_SRUN_TASK)."""
    return [PMIX_SERVER, "-np", str(np), "--oversubscribe", "sh", "-c", AS_SRUN_TASK, "task",
            sys.executable, "-c", SRUN_TASK]


def assert_each_task_stopped(out: str, ranks: range, pmi: str, size: int = 2) -> None:
    """One message per task, naming its rank and HOROVOD_CONTROLLER=gloo; no task ran."""
    assert not re.search(r"(?m)^RAN ", out), out[-4000:]
    stopped = re.findall(r"(?m)^STOPPED (.*)", out)
    assert len(stopped) == len(ranks), out[-4000:]
    for rank in ranks:
        said = [m for m in stopped if re.search(
            rf"srun started this task (as rank {rank} of {size} |\(SLURM_PROCID={rank}\) )"
            rf"with {pmi}", m)]
        assert len(said) == 1 and "HOROVOD_CONTROLLER=gloo" in said[0], (rank, stopped)


def test_srun_with_pmi_runs_on_mpi_or_stops_each_task_naming_the_gloo_controller():
    """Plain srun with PMI never gives N jobs of one rank, whichever MPI the build has:
    - PMIx (a PMIx server of mpirun's): both tasks run on MPI as ranks 0 and 1 of 2 where the
      build's MPI joins that server (this environment's Open MPI 5), else each stops with the
      message (Debian's Open MPI 4.1 under its mpirun.openmpi, which starts alone as rank 0
      of 1);
    - a task that MPI certainly starts alone (mpirun -np 1, srun said 2) stops with it, on any
      MPI: the check after MPI starts;
    - PMI-1/2 (PMI_FD), which no Open MPI build here speaks: each task stops before MPI starts.
    """
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_COMM", "PMI", "SLURM_", "HOROVOD_", "HVDL_"))}
    env.update(SLURM, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    piped = dict(cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    pmi2 = [subprocess.Popen([sys.executable, "-c", SRUN_TASK], env=dict(
        env, SLURM_PROCID=str(r), SLURM_LOCALID=str(r), PMI_FD="9", PMI_RANK=str(r),
        PMI_SIZE="2", PMI_JOBID="77.0"), **piped) for r in range(2)]
    alone = subprocess.Popen(srun_tasks(1), env=env, **piped)
    rc, out, _ = retry_if_launcher_did_not_start(lambda: run_job(
        srun_tasks(2), cwd=ROOT, env=env, timeout=120))
    ran = sorted(re.findall(r"(?m)^RAN (\d+) (\d+) (\w+) (\S+)$", out))
    if ran:
        assert rc == 0 and ran == [("0", "2", "True", "2.0"), ("1", "2", "True", "2.0")], \
            out[-4000:]
        assert not re.search(r"(?m)^STOPPED", out), out[-4000:]
    else:
        assert rc != 0, out[-4000:]
        assert_each_task_stopped(out, range(2), "PMIx")
    (alone_rc, alone_out), *pmi2_results = communicate_all([alone, *pmi2], 120, "srun task")
    if alone_rc != 0 and LAUNCHER_DID_NOT_START in alone_out:
        alone_rc, alone_out, _ = run_job(srun_tasks(1), cwd=ROOT, env=env, timeout=120)
    assert alone_rc != 0, alone_out[-4000:]
    assert_each_task_stopped(alone_out, range(1), "PMIx")
    assert "but MPI started it alone, as rank 0 of 1" in alone_out, alone_out[-4000:]
    for r, (returncode, task_out) in enumerate(pmi2_results):
        assert returncode == 3, task_out[-3000:]
        assert_each_task_stopped(task_out, range(r, r + 1), "PMI-1/2")
