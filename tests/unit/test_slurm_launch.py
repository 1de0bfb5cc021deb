"""Launch detection under Slurm's ``srun``, from emulated environments (no Slurm here): what
srun sets per task on one node and on two, with and without PMI (with PMI the MPI controller
wins when MPI is built), and where rank 0 hosts the rendezvous. A real emulated job is in
tests/test_integrations.py."""

from __future__ import annotations

import re

import pytest

from horovodlite.common import launchers


def nodes(per_node: str) -> int:
    """Nodes of a tasks-per-node spec: ``2(x3),1`` is 4."""
    return sum(int(m.group(1) or 1) for m in re.finditer(r"\d+(?:\(x(\d+)\))?", per_node))


def srun_env(procid: int, ntasks: int, per_node: str, nodeid: int, localid: int,
             nodelist: str, node: str, job: str = "1234", **extra) -> dict:
    """The SLURM_* variables srun gives one task."""
    env = {"SLURM_JOB_ID": job, "SLURM_JOBID": job, "SLURM_STEP_ID": "0", "SLURM_STEPID": "0",
           "SLURM_PROCID": str(procid), "SLURM_NTASKS": str(ntasks),
           "SLURM_NPROCS": str(ntasks), "SLURM_LOCALID": str(localid),
           "SLURM_NODEID": str(nodeid), "SLURM_NNODES": str(nodes(per_node)),
           "SLURM_JOB_NODELIST": nodelist, "SLURM_STEP_NODELIST": nodelist,
           "SLURM_STEP_TASKS_PER_NODE": per_node, "SLURM_TASKS_PER_NODE": per_node,
           "SLURMD_NODENAME": node, "SLURM_TOPOLOGY_ADDR": node}
    env.update(extra)
    return env


def test_one_node_two_tasks():
    launch = launchers.detect(srun_env(1, 2, "2", 0, 1, "node07", "node07"), mpi_built=True,
                              default_group=False)
    assert (launch.launcher, launch.controller) == ("srun", "gloo")
    assert (launch.rank, launch.size, launch.local_rank, launch.local_size) == (1, 2, 1, 2)
    assert (launch.cross_rank, launch.cross_size, launch.host) == (0, 1, "node07")
    assert launch.store == launchers.STORE_HOST
    assert (launch.addr, launch.port) == ("node07", launchers.SLURM_PORT_BASE + 234)


@pytest.mark.parametrize("procid,nodeid,localid,node", [
    (0, 0, 0, "node03"), (1, 0, 1, "node03"), (2, 1, 0, "node04"), (3, 1, 1, "node04")])
def test_two_nodes_two_tasks_each(procid, nodeid, localid, node):
    env = srun_env(procid, 4, "2(x2)", nodeid, localid, "node[03-04]", node, job="98765")
    launch = launchers.detect(env, mpi_built=True, default_group=False)
    assert (launch.controller, launch.rank, launch.size) == ("gloo", procid, 4)
    assert (launch.local_rank, launch.local_size) == (localid, 2)
    assert (launch.cross_rank, launch.cross_size, launch.host) == (nodeid, 2, node)
    # Rank 0 runs on the first node of the step and hosts the store there.
    assert (launch.addr, launch.port) == ("node03", launchers.SLURM_PORT_BASE + 765)
    assert "srun without PMI" in launch.why


def test_uneven_nodes_take_their_own_task_count():
    env = srun_env(3, 4, "3,1", 1, 0, "gpu[1,5]", "gpu5")
    launch = launchers.detect(env, mpi_built=False, default_group=False)
    assert (launch.local_rank, launch.local_size, launch.cross_rank) == (0, 1, 1)
    assert launch.addr == "gpu1"


def test_a_step_on_some_of_the_jobs_nodes_meets_on_its_own_first_node():
    env = srun_env(0, 2, "2", 0, 0, "node[03-05]", "node04", SLURM_STEP_NODELIST="node04")
    assert launchers.detect(env, mpi_built=False, default_group=False).addr == "node04"


def test_master_addr_and_port_override_the_node_list():
    env = srun_env(0, 2, "2", 0, 0, "node[03-05]", "node03", MASTER_ADDR="10.1.2.3",
                   MASTER_PORT="41000")
    launch = launchers.detect(env, mpi_built=False, default_group=False)
    assert (launch.addr, launch.port) == ("10.1.2.3", 41000)


@pytest.mark.parametrize("nodelist,first", [
    ("node07", "node07"), ("node[03-05]", "node03"), ("node[03-05,7],gpu1", "node03"),
    ("a1,b2", "a1"), ("n[7,9-10]", "n7"), ("rack[1-2]-n[01-04]", "rack1-n01"),
    ("tux[1-3]-ib", "tux1-ib")])
def test_first_host_of_a_node_list(nodelist, first):
    assert launchers.first_slurm_host(nodelist) == first


@pytest.mark.parametrize("pmi", [{"PMI_RANK": "1", "PMI_SIZE": "2"},
                                 {"PMIX_RANK": "1", "PMIX_SIZE": "2"}], ids=["pmi2", "pmix"])
def test_with_pmi_mpi_wins_when_built(pmi):
    env = srun_env(1, 2, "2", 0, 1, "node07", "node07", **pmi)
    launch = launchers.detect(env, mpi_built=True, default_group=False)
    assert launch.controller == "mpi" and (launch.rank, launch.size) == (1, 2)
    without_mpi = launchers.detect(env, mpi_built=False, default_group=False)
    assert (without_mpi.launcher, without_mpi.controller) == ("srun", "gloo")
    assert (without_mpi.rank, without_mpi.size) == (1, 2)


def test_forced_controller_and_one_task():
    env = srun_env(0, 2, "2", 0, 0, "node07", "node07", HOROVOD_CONTROLLER="mpi")
    assert launchers.detect(env, mpi_built=True, default_group=False).controller == "mpi"
    single = launchers.detect(srun_env(0, 1, "1", 0, 0, "node07", "node07"), mpi_built=True,
                              default_group=False)
    assert (single.controller, single.size, single.store) == ("gloo", 1, launchers.STORE_NONE)


def test_torchrun_inside_an_allocation_wins_over_the_allocations_variables():
    env = srun_env(0, 1, "1", 0, 0, "node07", "node07", RANK="3", WORLD_SIZE="4",
                   LOCAL_RANK="3", LOCAL_WORLD_SIZE="4", MASTER_ADDR="node07",
                   MASTER_PORT="29500", TORCHELASTIC_USE_AGENT_STORE="True",
                   TORCHELASTIC_RUN_ID="r")
    launch = launchers.detect(env, mpi_built=True, default_group=False)
    assert (launch.launcher, launch.rank, launch.size) == ("torchrun", 3, 4)
