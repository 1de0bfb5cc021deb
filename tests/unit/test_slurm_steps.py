"""Inside a Slurm job, Gloo and elastic ranks on other nodes start as job steps
(runner/slurm_steps.py), and an elastic job follows the node states sinfo gives. Here with a
fake srun and a fake sinfo; tests/test_slurm.py runs the real ones."""

from __future__ import annotations

import os
import subprocess
import sys
import types

import pytest

from horovodlite.runner import cluster, slurm_steps

JOB = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "n[1-3]", "SLURM_TASKS_PER_NODE": "2(x3)"}


def _sinfo(stdout: str, returncode: int = 0):
    calls = []

    def run(cmd, **kwargs):
        calls.append(cmd)
        return types.SimpleNamespace(returncode=returncode, stdout=stdout, stderr="")
    return run, calls


def test_nodes_drained_down_or_silent_leave_the_list_in_the_jobs_order():
    run, calls = _sinfo("n3 mix\nn1 alloc\nn2 drng\nn2 alloc\n")  # n2 in two partitions
    assert slurm_steps.usable(["n1", "n2", "n3"], run) == ["n1", "n3"]
    assert calls == [["sinfo", "--noheader", "--Node", "--nodes=n1,n2,n3", "--format=%N %t"]]
    for state in ("drain", "down", "down*", "alloc*", "fail", "failg", "maint", "idle~",
                  "mix#", "drain*"):
        run, _ = _sinfo(f"n1 alloc\nn2 {state}\n")
        assert slurm_steps.usable(["n1", "n2"], run) == ["n1"], state
    run, _ = _sinfo("n1 alloc\nn2 idle\n")  # resumed: back
    assert slurm_steps.usable(["n1", "n2"], run) == ["n1", "n2"]


def test_when_sinfo_cannot_say_the_last_list_stands():
    for run in (_sinfo("", returncode=1)[0], _sinfo("")[0], _sinfo("garbage\n")[0]):
        assert slurm_steps.usable(["n1"], run) is None

    def broken(cmd, **kwargs):
        raise FileNotFoundError(2, "No such file or directory", "sinfo")
    assert slurm_steps.usable(["n1"], broken) is None


def test_a_rank_starts_as_one_task_on_its_node_sharing_the_jobs_cpus():
    cmd = slurm_steps.step_command("n2", "cd /w && exec env python -m x", {})
    assert cmd[0] == "srun" and cmd[-3:] == ["/bin/sh", "-c", "cd /w && exec env python -m x"]
    for option in ("--overlap", "--nodes=1", "--ntasks=1", "--nodelist=n2", "--mpi=none"):
        assert option in cmd
    assert not any(w.startswith("--cpus-per-task") for w in cmd)
    assert "--cpus-per-task=4" in slurm_steps.step_command("n2", "true",
                                                          {"SLURM_CPUS_PER_TASK": "4"})


def _fake_srun(tmp_path) -> dict:
    """A PATH whose srun records its arguments, then runs the shell line it was given (its
    stdin passes through, as srun's does to its one task)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    srun = folder / "srun"
    srun.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$FAKE_SRUN_ARGS"\n'
                    'while [ "$1" != /bin/sh ]; do shift; done\nexec "$@"\n')
    srun.chmod(0o755)
    return {**os.environ, "PATH": f"{folder}:{os.environ['PATH']}",
            "FAKE_SRUN_ARGS": str(tmp_path / "args")}


def test_the_agent_runs_the_line_through_srun_with_stdin(tmp_path):
    env = _fake_srun(tmp_path)
    agent = [sys.executable, "-m", "horovodlite.runner.slurm_steps"]
    out = subprocess.run([*agent, "n3", "cd /tmp && read line && echo got $line"], env=env,
                         input="the-environment\n", capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "got the-environment\n"
    assert "--nodelist=n3" in (tmp_path / "args").read_text().split("\n")
    # called as ssh would be, with options it cannot honour: a usage error, not a wrong step
    bad = subprocess.run([*agent, "-p", "22", "n3", "true"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and "usage:" in bad.stderr


def _args(**kw):
    base = dict(hosts=None, host_discovery_script=None, mpi_args="", verbose=False, num_proc=4,
                env_exclude=[], env_include=[], ssh_agent=None, ssh_port=None,
                ssh_identity_file=None, elastic=False)
    return types.SimpleNamespace(**{**base, **kw})


def test_gloo_ranks_of_a_slurm_job_start_as_its_steps_and_elastic_follows_its_nodes(
        tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", _fake_srun(tmp_path)["PATH"])
    args = _args(elastic=True)
    cluster.prepare(args, "gloo", pytest.fail, JOB)
    assert args.hosts == "n1:2,n2:2,n3:2"
    assert args.ssh_agent == slurm_steps.agent()
    assert args.slurm_nodes == ["n1", "n2", "n3"]
    assert "ranks on the other nodes start as steps of Slurm job 42 (srun), not over ssh" in \
        capsys.readouterr().err
    plain = _args()
    cluster.prepare(plain, "gloo", pytest.fail, JOB)
    assert plain.ssh_agent == slurm_steps.agent() and plain.slurm_nodes == []


@pytest.mark.parametrize("given", [dict(ssh_agent="my-agent"), dict(ssh_port=2222),
                                   dict(ssh_identity_file="/k"), dict(hosts="a:2")])
def test_the_users_way_to_reach_hosts_and_mpirun_are_left_alone(tmp_path, monkeypatch, given):
    monkeypatch.setenv("PATH", _fake_srun(tmp_path)["PATH"])
    args = _args(elastic=True, **given)
    cluster.prepare(args, "gloo", pytest.fail, JOB)
    assert args.ssh_agent == given.get("ssh_agent") and args.slurm_nodes == []
    mpi = _args()
    cluster.prepare(mpi, "mpi", pytest.fail, JOB)  # mpirun starts its daemons through Slurm
    assert mpi.ssh_agent is None


def test_without_srun_or_outside_a_job_ranks_go_over_ssh(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no srun
    args = _args()
    cluster.prepare(args, "gloo", pytest.fail, JOB)
    assert args.ssh_agent is None
    assert not slurm_steps.available({"SLURM_JOB_NODELIST": "n1"})


def test_an_elastic_driver_in_a_slurm_job_follows_its_nodes(monkeypatch):
    """Without a discovery script, the driver's host list is the job's nodes Slurm still
    offers: a drained node's workers retire; when sinfo cannot say, the last list stands."""
    from horovodlite.runner import elastic_driver
    from horovodlite.runner.elastic_places import Worker

    states = {"now": ["n1", "n2"]}
    monkeypatch.setattr(slurm_steps, "usable", lambda nodes: states["now"])
    job = object.__new__(elastic_driver.ElasticJob)
    job.args = types.SimpleNamespace(host_discovery_script=None, slots_per_host=None)
    job.allocated = {"n1": 2, "n2": 2}
    job.base_env = {}
    job.next_discovery = 0.0
    job.workers = {i: Worker(i, h, False, None) for i, h in enumerate(["n1", "n1", "n2", "n2"])}
    job.members = [0, 1, 2, 3]
    job.pending = []
    job.max_np = 4
    assert job.discovering() and job.discover() == {"n1": 2, "n2": 2}
    assert job._discovery(0.0) == ([], [])  # nothing changed: nothing to do
    states["now"] = ["n1"]  # n2 drained
    assert job._discovery(10.0) == ([2, 3], [])
    states["now"] = None  # sinfo failed
    assert job.discover() is None and job._discovery(20.0) == ([], [])
