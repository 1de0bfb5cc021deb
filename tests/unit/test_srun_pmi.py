"""Plain ``srun python train.py`` under a Slurm whose MpiDefault is pmix or pmi2
(horovodlite/common/launchers.py): MPI when the build's MPI speaks the PMI srun offers, else one
message naming HOROVOD_CONTROLLER=gloo; emulated environments (both PMIs, both MPI families).
Real tasks (a PMIx server of mpirun's standing in for srun's) are in tests/test_cluster_env.py.
"""

from __future__ import annotations

import pytest

from horovodlite._mpi_check import Mpi
from horovodlite.common import launchers

OPEN_MPI_5, OPEN_MPI_4, MPICH = Mpi("Open MPI", "5.0.8"), Mpi("Open MPI", "4.1.4"), Mpi("MPICH",
                                                                                        "4.0")
SRUN = {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_NTASKS": "2",
        "SLURM_LOCALID": "1", "SLURM_NODEID": "0", "SLURM_NNODES": "1",
        "SLURM_STEP_NODELIST": "node1", "SLURM_JOB_NODELIST": "node1",
        "SLURM_STEP_TASKS_PER_NODE": "2", "SLURMD_NODENAME": "node1"}
# what Slurm's mpi plugins add to each task
PMIX = {"PMIX_NAMESPACE": "slurm.pmix.77.0", "PMIX_RANK": "1", "PMIX_SERVER_URI41": "x",
        "PMIX_VERSION": "4.2.6", "PMI_RANK": "1", "PMI_SIZE": "2"}
PMI2 = {"PMI_FD": "5", "PMI_JOBID": "77.0", "PMI_RANK": "1", "PMI_SIZE": "2"}


def detect(env, mpi, mpi_built=True):
    return launchers.detect(env, mpi_built=mpi_built, default_group=False, built_mpi=mpi)


@pytest.mark.parametrize("pmi, mpi", [(PMIX, OPEN_MPI_5), (PMIX, OPEN_MPI_4), (PMI2, MPICH),
                                      (PMIX, None)], ids=["pmix-ompi5", "pmix-ompi4",
                                                          "pmi2-mpich", "pmix-unknown"])
def test_mpi_when_the_builds_mpi_speaks_that_pmi(pmi, mpi):
    launch = detect({**SRUN, **pmi}, mpi)
    assert launch.controller == "mpi" and (launch.rank, launch.size) == (1, 2)


@pytest.mark.parametrize("pmi, mpi, offered, other", [
    (PMI2, OPEN_MPI_5, "PMI-1/2", "pmix"), (PMI2, OPEN_MPI_4, "PMI-1/2", "pmix"),
    (PMIX, MPICH, "PMIx", "pmi2")], ids=["pmi2-ompi5", "pmi2-ompi4", "pmix-mpich"])
def test_one_message_naming_the_gloo_controller_otherwise(pmi, mpi, offered, other):
    with pytest.raises(ValueError) as e:
        detect({**SRUN, **pmi}, mpi)
    message = str(e.value)
    assert f"srun started this task (SLURM_PROCID=1) with {offered}" in message
    assert str(mpi) in message and "HOROVOD_CONTROLLER=gloo" in message
    assert f"srun --mpi={other}" in message
    # ... which works: the tasks meet over TCP from the SLURM_* variables
    launch = detect({**SRUN, **pmi, "HOROVOD_CONTROLLER": "gloo"}, mpi)
    assert (launch.launcher, launch.controller, launch.rank, launch.size) == ("srun", "gloo", 1, 2)
    forced = detect({**SRUN, **pmi, "HOROVOD_CONTROLLER": "mpi"}, mpi)
    assert forced.controller == "mpi"


def test_not_judged_mpirun_in_an_allocation_no_pmi_or_no_mpi():
    # mpirun's ranks inside an allocation inherit its daemon's SLURM_PROCID
    ranks = {**SRUN, **PMIX, "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1"}
    assert detect(ranks, MPICH).controller == "mpi"
    assert detect(SRUN, OPEN_MPI_5).controller == "gloo"  # MpiDefault=none: Slurm's variables
    without = detect({**SRUN, **PMI2}, OPEN_MPI_5, mpi_built=False)
    assert (without.launcher, without.controller) == ("srun", "gloo")


# what torchrun's agent gives each of its workers (``srun torchrun --nproc-per-node=4 ...``)
TORCHRUN_WORKER = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
                   "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2", "MASTER_ADDR": "node1",
                   "MASTER_PORT": "29400", "TORCHELASTIC_RUN_ID": "77",
                   "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "0"}


@pytest.mark.parametrize("pmi, mpi", [(PMIX, OPEN_MPI_5), (PMI2, MPICH), (PMI2, OPEN_MPI_5),
                                      (PMIX, MPICH)],
                         ids=["pmix-ompi5", "pmi2-mpich", "pmi2-ompi5", "pmix-mpich"])
def test_torchrun_under_srun_is_torchrun_whatever_pmi_srun_gave_the_agent(pmi, mpi):
    """``srun torchrun ...``: the PMI and SLURM_* variables are the srun task's (torchrun's
    agent, one per node), inherited by its workers. A worker taking them for its own started
    MPI as the agent's rank - 4 workers of one node as one rank - or stopped naming srun; it is
    a torchrun worker, rank 5 of 8. HOROVOD_CONTROLLER=mpi still forces MPI."""
    launch = detect({**SRUN, **pmi, **TORCHRUN_WORKER}, mpi)
    assert (launch.launcher, launch.controller, launch.rank, launch.size,
            launch.local_rank) == ("torchrun", "gloo", 5, 8, 1)
    forced = detect({**SRUN, **pmi, **TORCHRUN_WORKER, "HOROVOD_CONTROLLER": "mpi"}, mpi)
    assert forced.launcher == "mpirun" and forced.controller == "mpi"


@pytest.mark.parametrize("pmi, mpi, offered", [
    (PMIX, OPEN_MPI_4, "PMIx"), ({k: v for k, v in PMIX.items() if not k.startswith("PMI_")},
                                 OPEN_MPI_5, "PMIx"), (PMI2, MPICH, "PMI-1/2")],
    ids=["pmix-ompi4", "pmix-no-size-ompi5", "pmi2-mpich"])
def test_a_task_that_mpi_started_alone_stops_naming_the_gloo_controller(pmi, mpi, offered):
    """The check after MPI starts, which no version rule replaces: srun said 2 tasks (PMI's
    size, or SLURM_NTASKS where PMI states none, as Slurm's pmix plugin), MPI's world has 1."""
    launch = detect({**SRUN, **pmi}, mpi)
    assert (launch.launcher, launch.pmi, launch.rank, launch.tasks) == ("srun", offered, 1, 2)
    with pytest.raises(RuntimeError) as e:
        launchers.check_size(launch, 1, 0)
    message = str(e.value)
    assert f"srun started this task as rank 1 of 2 with {offered}" in message, message
    assert "rank 0 of 1" in message and "HOROVOD_CONTROLLER=gloo" in message, message
    launchers.check_size(launch, 2, 1)  # MPI joined srun's PMI: the job runs
    # the step's own task count first (an sbatch's SLURM_NTASKS is the job's)
    step = detect({**SRUN, **pmi, "SLURM_NTASKS": "8", "SLURM_STEP_NUM_TASKS": "2"}, mpi)
    assert step.tasks == 2, step
    # srun's count is not the job's size: a heterogeneous step's SLURM_NTASKS is its
    # component's, MPI's world spans them all
    if "PMI_SIZE" not in pmi:
        launchers.check_size(detect({**SRUN, **pmi}, mpi), 5, 1)


def test_one_task_or_ranks_of_another_launcher_are_not_taken_for_srun_tasks():
    alone = detect({**SRUN, **PMIX, "SLURM_NTASKS": "1", "SLURM_PROCID": "0", "PMIX_RANK": "0",
                    "PMI_RANK": "0", "PMI_SIZE": "1"}, OPEN_MPI_5)
    launchers.check_size(alone, 1, 0)
    hydra = detect({**SRUN, **PMI2, "MPI_LOCALRANKID": "0", "PMI_SIZE": "4"}, MPICH)
    assert (hydra.launcher, hydra.pmi, hydra.size, hydra.tasks) == ("mpirun", "", 4, None)
