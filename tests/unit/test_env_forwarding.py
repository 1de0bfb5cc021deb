"""What of the launcher's environment reaches the ranks (horovodlite/common/env_travel.py): the
whole environment but a short list, the same choice on every launcher path (a rank started here
or through ssh under --gloo/--elastic, mpirun's -x and -genvlist under --mpi, the ranks an
elastic MPI job adds), --env-exclude/--env-include, --verbose's list, and values that arrive
exactly through the rank wrapper's stdin. The jobs across test hosts are in
tests/test_cluster_env.py."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest

from horovodlite.common import env_travel
from horovodlite.common import launch_env as le
from horovodlite.runner import gloo_launch, launch, mpi_launch, remote

ODD = {  # values a shell, a command line or a line-based protocol would mangle
    "MY_QUOTES": "a b \"c\" 'd' $HOME `x` \\ ;|&",
    "MY_LINES": "first line\nsecond ünïcødé ✓\n",
    "MY_EMPTY": "",
    "MY_BYTES": b"caf\xe9 \xff".decode("utf-8", "surrogateescape"),  # not UTF-8, as on Linux
}
CALLER = {"PATH": "/opt/bin:/bin", "NCCL_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "4",
          "TORCH_DISTRIBUTED_DEBUG": "INFO", "OMPI_MCA_btl_tcp_if_include": "eth0",
          "SLURM_JOB_ID": "77", **ODD}
LEFT_EVERYWHERE = {"OMPI_COMM_WORLD_RANK": "3", "PMIX_RANK": "3", "PMI_SIZE": "4",
                   "PRTE_LAUNCHED": "1", "SLURM_PROCID": "0", "SLURM_STEP_ID": "0",
                   "SLURMD_NODENAME": "n1", le.NOTICE_FD: "9"}
LEFT_REMOTE = {"BASH_FUNC_module%%": "() { echo; }", "OLDPWD": "/x", "PWD": "/w", "SHLVL": "2",
               "_": "/usr/bin/horovodliterun", "HOSTNAME": "login1", "DISPLAY": ":0",
               "SSH_AUTH_SOCK": "/tmp/ssh-x/agent.1", "SSH_CONNECTION": "1 2 3 4",
               "TMPDIR": "/local/job77", "CUDA_VISIBLE_DEVICES": "0,1",
               # ROCm's and oneAPI's numbering of this host's GPUs: as CUDA's, not sent
               "ROCR_VISIBLE_DEVICES": "1", "HIP_VISIBLE_DEVICES": "0", "GPU_DEVICE_ORDINAL": "1",
               "ZE_AFFINITY_MASK": "0.1"}
ENV = {**CALLER, **LEFT_EVERYWHERE, **LEFT_REMOTE}


def test_everything_travels_but_the_short_list():
    policy = env_travel.Policy()
    assert policy.remote(ENV) == CALLER
    assert policy.local(ENV) == {**CALLER, **LEFT_REMOTE}
    left = dict(policy.select(ENV, remote=True)[1])
    assert set(left) == set(LEFT_EVERYWHERE) | set(LEFT_REMOTE)
    assert all(left.values())  # each with its reason
    assert "GPU numbering" in left["CUDA_VISIBLE_DEVICES"] and "identity" in left["PMIX_RANK"]
    assert all("GPU numbering" in left[n] for n in env_travel.GPU_NUMBERING)


def test_exclude_and_include_patterns():
    policy = env_travel.Policy(exclude=("MY_*", "TORCH_*"), include=("CUDA_VISIBLE_DEVICES",
                                                                     "MY_LINES", "HOSTNAME"))
    got = policy.remote(ENV)
    assert "MY_QUOTES" not in got and "TORCH_DISTRIBUTED_DEBUG" not in got
    assert "MY_LINES" not in got  # --env-exclude wins over --env-include
    assert got["CUDA_VISIBLE_DEVICES"] == "0,1" and got["HOSTNAME"] == "login1"
    assert "MY_QUOTES" not in policy.local(ENV)  # excluded from this host's ranks too
    # what horovodliterun sets for the job cannot be excluded
    everything = env_travel.Policy(exclude=("*",))
    assert everything.remote({le.GLOO_RANK: "1", le.REPORT_TOKEN: "t", "A": "b"}) == {
        le.GLOO_RANK: "1", le.REPORT_TOKEN: "t"}


def test_the_block_on_stdin_round_trips_every_value():
    block = env_travel.encode_block(ENV)
    assert block.count(b"\n") == 1 and block.endswith(b"\n") and block.isascii()
    stream = io.BytesIO(block + b"the command's own input\n")
    assert env_travel.read_block(stream) == ENV
    assert stream.read() == b"the command's own input\n"  # the rest stays for the command
    assert env_travel.read_block(io.BytesIO(b"")) == {}
    with pytest.raises(ValueError):
        env_travel.read_block(io.BytesIO(b'{"A": 1}\n'))


def test_the_rank_wrapper_lays_the_block_over_its_environment():
    """A real wrapper process (as ssh starts it): the values reach the command exactly, the
    host's own variables stay, the command's stdin is empty."""
    script = ("import json, os, sys; print(json.dumps({k: os.environ.get(k) for k in "
              "sys.argv[1:]}), sys.stdin.read() == '')")
    sent = {**remote.remote_env({**ENV, le.GLOO_RANK: "1"}), "PATH": os.environ["PATH"]}
    here = {k: v for k, v in os.environ.items() if not k.startswith(("HVDL_", "HOROVOD_"))}
    here.update(HOSTNAME="this-host", TMPDIR="/tmp")
    proc = subprocess.run(
        [sys.executable, "-m", "horovodlite.runner.task", "--env-on-stdin", "--", sys.executable,
         "-c", script, *ODD, "HOSTNAME", "TMPDIR", "NCCL_SOCKET_IFNAME"],
        input=env_travel.encode_block(sent), capture_output=True, env=here, timeout=60)
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.decode("utf-8", "surrogateescape").split("\n")[0]
    got, stdin_empty = json.loads(line.rsplit(" ", 1)[0]), line.rsplit(" ", 1)[1]
    assert got == {**ODD, "HOSTNAME": "this-host", "TMPDIR": "/tmp", "NCCL_SOCKET_IFNAME": "eth0"}
    assert stdin_empty == "True"


def test_the_ssh_command_line_holds_no_value_but_pythons_start_up():
    env = {**ENV, "PYTHONPATH": "/src", le.RENDEZVOUS_SECRET: "s3cret"}
    cmd = remote.remote_command("node2", ["python", "-m", "x"], env, "/w")
    assert cmd[-1] == "cd /w && exec env PYTHONPATH=/src python -m x"
    assert env_travel.read_block(io.BytesIO(remote.stdin_block(env)))[
        le.RENDEZVOUS_SECRET] == "s3cret"


def _parse(*argv):
    return launch.build_parser().parse_args(list(argv))


@pytest.mark.parametrize("flavor", ["openmpi", "mpich"])
def test_mpirun_forwards_the_same_names(flavor):
    args = _parse("-np", "2", "-H", "a:1,b:1", "--env-exclude", "MY_Q*", "python", "x")
    cmd = mpi_launch.build_command(args, "mpirun", flavor, dict(ENV))
    if flavor == "openmpi":
        names = [cmd[i + 1] for i, a in enumerate(cmd) if a == "-x"]
    else:
        names = cmd[cmd.index("-genvlist") + 1].split(",")
    # by name only (mpirun takes each value from its own environment, exactly); MPI's own
    # settings (OMPI_MCA_*) mpirun hands on by itself
    assert names == sorted(set(CALLER) - {"MY_QUOTES", "OMPI_MCA_btl_tcp_if_include"})
    assert not any("=" in n for n in names)


def test_this_hosts_gloo_ranks_and_the_ranks_an_elastic_mpi_job_adds():
    env = gloo_launch.rank_env(ENV, {le.GLOO_RANK: "0"}, env_travel.Policy(exclude=("MY_*",)))
    assert env == {**{k: v for k, v in CALLER.items() if not k.startswith("MY_")},
                   **LEFT_REMOTE, le.GLOO_RANK: "0"}
    added = env_travel.job_environment({**ENV, le.REPORT_TOKEN: "tok"})
    assert "MY_QUOTES=" + ODD["MY_QUOTES"] in added and f"{le.REPORT_TOKEN}=tok" in added
    assert not any(a.startswith(("MY_LINES=", "HOSTNAME=", "PMIX_", "OMPI_COMM")) for a in added)


def test_verbose_lists_what_was_left_out(capsys):
    lines = env_travel.describe_left_out(env_travel.Policy(exclude=("MY_QUOTES",)), ENV)
    text = "\n".join(lines)
    assert "not given to any rank - --env-exclude: MY_QUOTES" in text
    assert "not given to any rank - MPI's identity" in text and "PMIX_RANK" in text
    assert ("not given to ranks on other hosts - this host's GPU numbering (--env-include "
            "NAME sends it): CUDA_VISIBLE_DEVICES") in text
    assert "NCCL_SOCKET_IFNAME" not in text


def test_the_ranks_mpirun_starts_here_lose_what_every_rank_loses():
    """Under --mpi the ranks on this host inherit mpirun's environment: --env-exclude's names
    are not in it; the scheduler's identity and the notice pipe stay there for mpirun (PBS's TM
    interface reads PBS_TASKNUM) and each rank's command unsets them; MPI's variables stay,
    mpirun replaces them with each rank's own; --verbose says so."""
    policy = env_travel.Policy(exclude=("MY_QUOTES",))
    mpirun_env = policy.mpirun_env(ENV)
    assert "MY_QUOTES" not in mpirun_env and mpirun_env["SLURM_PROCID"] == "0"
    assert policy.mpirun_unset(ENV) == sorted(["SLURM_PROCID", "SLURM_STEP_ID", "SLURMD_NODENAME",
                                               le.NOTICE_FD])
    lines = "\n".join(env_travel.describe_left_out(policy, ENV, mpirun=True))
    assert "not given to any rank - --env-exclude: MY_QUOTES" in lines
    assert "SLURM_PROCID" in lines.split("not given to any rank - the scheduler's")[1]
    mpi_line = next(ln for ln in lines.splitlines() if ln.startswith("given to mpirun only"))
    assert "PMIX_RANK" in mpi_line and "OMPI_COMM_WORLD_RANK" in mpi_line, lines
    assert not any(ln.startswith("not given to any rank - MPI's") for ln in lines.splitlines())
