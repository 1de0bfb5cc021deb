"""Which launcher started this process, and what it says about the job: launch detection as data.

Each launcher Horovod's users have leaves its own variables in every worker's environment. This
module maps them, one table entry per launcher, to one ``Launch``: the controller to use (MPI or
Gloo), this process's rank and the job's size, the local and cross layout when the launcher
states it, and where the ranks meet (the rendezvous). ``hvd.init()`` asks ``detect()``; nothing
else reads launcher variables.

=================  ==========================================================  ===========
launcher           variables                                                   controller
=================  ==========================================================  ===========
forced             ``HOROVOD_CONTROLLER=mpi|gloo``                             as named
mpirun / mpiexec   ``OMPI_COMM_WORLD_SIZE``, ``PMI_SIZE``, ``PMIX_RANK``       MPI
horovodliterun     ``HVDL_WORKER_ID``, ``HOROVOD_GLOO_RENDEZVOUS_ADDR|PORT``,  Gloo (rank
--elastic          ``HOROVOD_HOSTNAME``, ``HVDL_RENDEZVOUS_SECRET``            and size from
                                                                               the driver's
                                                                               rounds)
horovodliterun     ``HOROVOD_RANK``, ``HOROVOD_SIZE``, ``HOROVOD_LOCAL_*``,    Gloo
--gloo, Horovod's  ``HOROVOD_CROSS_*``, ``HOROVOD_GLOO_RENDEZVOUS_ADDR|PORT``,
Gloo launchers     ``HOROVOD_HOSTNAME``, ``HVDL_RENDEZVOUS_SECRET``
torch.distributed  an initialised default process group (Ray Train's           Gloo
already up         TorchTrainer, Lightning, user code): its store is reused
torchrun (and      ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,                   Gloo
what runs it:      ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``MASTER_ADDR``,
Kubeflow,          ``GROUP_WORLD_SIZE``, ``MASTER_PORT``,
TorchDistributor)  ``TORCHELASTIC_USE_AGENT_STORE``, ``TORCHELASTIC_RUN_ID``
Slurm ``srun``     ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``,      Gloo (MPI
                   ``SLURM_STEP_TASKS_PER_NODE``/``SLURM_TASKS_PER_NODE``,     when srun
                   ``SLURM_NODEID``, ``SLURM_JOB_ID`` (the port),              gives PMI)
                   ``SLURM_STEP_NODELIST``/``SLURM_JOB_NODELIST`` (the
                   first host: rank 0's)
none               -                                                           MPI if built
                                                                               (a singleton),
                                                                               else Gloo, 1 rank
=================  ==========================================================  ===========

A launcher that states a size and a controller that would see another one is the classic silent
failure (N jobs of one rank each); ``check_size`` turns it into an error naming both.

Plain ``srun python train.py`` on a cluster whose Slurm has ``MpiDefault=pmix`` (or ``pmi2``)
sets PMIx (or PMI-1/2) variables: the MPI controller is used when the build's MPI speaks that
interface. An MPI that does not starts every task as a job of its own (rank 0 of 1), so two
checks stop each task with one message naming ``HOROVOD_CONTROLLER=gloo`` (the tasks then meet
over TCP, from the SLURM_* variables) and ``srun --mpi=...``: before MPI starts, where the
build's MPI cannot speak the PMI offered (``srun_pmi_mismatch``: Open MPI 5 has no PMI-1/2,
MPICH's family no PMIx unless built for it); and after MPI starts, whatever the MPI, where srun
said N > 1 tasks (``SLURM_STEP_NUM_TASKS``/``SLURM_NTASKS``; PMI's own size when it states one)
and MPI's world has 1 rank (``check_size``). The second check is the one that does not rest on
what an MPI's version suggests: an Open MPI 4 whose PMIx client cannot reach the server it is
handed, for one, starts alone. ``HOROVOD_CONTROLLER=mpi`` overrides the first check only.
A torchrun worker (``TORCHELASTIC_RUN_ID``) is torchrun's even where MPI's or srun's variables
are set: they are its agent's (``srun torchrun ...``), inherited.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re

from horovodlite import _mpi_check
from horovodlite.common import launch_env as E
from horovodlite.common.slurm_lists import expand_counts, expand_nodelist

# What a launch says about where the ranks meet.
STORE_HOST = "host"  # rank 0 hosts a TCPStore at (addr, port)
STORE_CLIENT = "client"  # a TCPStore someone else hosts at (addr, port): launcher, torchrun agent
STORE_DEFAULT_GROUP = "default-group"  # the initialised torch.distributed default group's store
STORE_NONE = "none"  # one rank: nothing to meet

DEFAULT_PORT = 29500
SLURM_PORT_BASE = 29800  # srun gives no port: 29800 + SLURM_JOB_ID % 1000 unless one is set


@dataclasses.dataclass
class Launch:
    launcher: str  # "mpirun", "horovodliterun --gloo", "torchrun", "slurm", ...
    controller: str  # "mpi" or "gloo"
    rank: int | None = None
    size: int | None = None
    local_rank: int | None = None
    local_size: int | None = None
    cross_rank: int | None = None
    cross_size: int | None = None
    host: str | None = None  # the launcher's name for this rank's host
    store: str = STORE_NONE
    addr: str | None = None
    port: int | None = None
    secret: str | None = None  # a per-job secret: a worker of another job is refused
    job: str = "job"  # names the job's keys in the store and its shared memory
    worker: str = ""  # an elastic Gloo job's worker number: rank and size come from its rounds
    pmi: str = ""  # srun with PMI (PMIX or PMI2): the interface srun offered this task
    tasks: int | None = None  # ... and the tasks srun said the step has (check_size)
    why: str = ""  # one line: what in the environment decided this

    def describe(self) -> str:
        where = f" (rank {self.rank} of {self.size})" if self.size is not None else ""
        return f"{self.launcher}{where}, {self.controller.upper()} controller: {self.why}"


def _int(env, name: str) -> int | None:
    value = env.get(name, "").strip()
    return int(value) if re.fullmatch(r"-?\d+", value) else None


def _job_id(*parts) -> str:
    return hashlib.sha256("/".join(str(p) for p in parts).encode()).hexdigest()[:12]


def elastic_job(secret: str) -> str:
    """The job id of an elastic Gloo job's workers (their keys' names): from the job's secret
    (its driver's address where there is none)."""
    return _job_id("elastic", secret)


def _mpi(env) -> Launch | None:
    for size_var, rank_var in (("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"),
                               ("PMI_SIZE", "PMI_RANK"), ("PMIX_SIZE", "PMIX_RANK")):
        if size_var in env or rank_var in env:
            launch = Launch("mpirun", "mpi", rank=_int(env, rank_var), size=_int(env, size_var),
                            why=f"{rank_var if rank_var in env else size_var} is set")
            return _srun_with_pmi(env, launch)
    return None


def _srun_with_pmi(env, launch: Launch) -> Launch:
    """``launch`` as srun's when srun started this task with PMI (SLURM_PROCID, a PMI, none of
    mpirun's own variables), with the step's task count: PMI's size where it states one, else
    srun's (Slurm's pmix plugin sets no size variable), so that ``check_size`` can tell a task
    MPI started alone. srun's count is not taken for the job's size: a heterogeneous step's
    SLURM_NTASKS is its component's, while MPI's world spans them all."""
    pmi = offered_pmi(env)
    # mpirun's ranks (OMPI_*), Hydra's (MPI_LOCALRANKID) and torchrun's workers inherit the
    # SLURM_* variables of the srun task that started their launcher: not srun's tasks
    if ("SLURM_PROCID" not in env or pmi is None
            or any(v in env for v in ("OMPI_COMM_WORLD_SIZE", "MPI_LOCALRANKID",
                                      "TORCHELASTIC_RUN_ID"))):
        return launch
    size_var = next((v for v in ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
                     if _int(env, v) is not None), None)
    tasks = launch.size if launch.size is not None or size_var is None else _int(env, size_var)
    rank = launch.rank if launch.rank is not None else _int(env, "SLURM_PROCID")
    said = f"{size_var}={tasks}" if launch.size is None and size_var else "its PMI's size"
    return dataclasses.replace(launch, launcher="srun", rank=rank, pmi=pmi, tasks=tasks,
                               why=f"srun with {pmi}: {launch.why}, {said}")


PMIX = "PMIx"
PMI2 = "PMI-1/2"


def offered_pmi(env) -> str | None:
    """The process-management interface the launcher offers this process: PMIx (a PMIx server:
    ``PMIX_NAMESPACE``/``PMIX_RANK``), PMI-1/2 (``PMI_FD`` or ``PMI_PORT``: Slurm's pmi2 plugin,
    Hydra), or None."""
    if "PMIX_NAMESPACE" in env or "PMIX_RANK" in env:
        return PMIX
    if "PMI_FD" in env or "PMI_PORT" in env:
        return PMI2
    return None


def speaks(mpi, pmi: str) -> bool:
    """Whether ``mpi`` (``_mpi_check.Mpi``; None: unknown, taken to) starts under ``pmi``. Open
    MPI 5 has only PMIx, and Open MPI 4's PMI-1/2 support is a build option distributions leave
    out; MPICH's ABI family has its own PMI-1/2 client, PMIx only when built for it."""
    if mpi is None:
        return True
    if mpi.family == "Open MPI":
        return pmi == PMIX
    return pmi == PMI2


def srun_pmi_mismatch(env, mpi) -> str | None:
    """The message for a task that srun started with a PMI the build's MPI (``mpi``) does not
    speak, else None. Ranks that mpirun started inside an allocation (its own variables) and
    tasks without PMI are not judged."""
    pmi = offered_pmi(env)
    if ("SLURM_PROCID" not in env or pmi is None or "OMPI_COMM_WORLD_SIZE" in env
            or speaks(mpi, pmi)):
        return None
    other = "pmi2" if pmi == PMIX else "pmix"
    return (f"srun started this task (SLURM_PROCID={env['SLURM_PROCID']}) with {pmi} (Slurm's "
            f"MpiDefault or srun --mpi), but this build's MPI, {mpi}, speaks "
            f"{PMI2 if pmi == PMIX else PMIX}: every task would start alone as rank 0 of 1. "
            f"Set HOROVOD_CONTROLLER=gloo for the job (`export HOROVOD_CONTROLLER=gloo` before "
            f"srun: the tasks then meet over TCP), or run `srun --mpi={other}` "
            "(HOROVOD_CONTROLLER=mpi uses MPI regardless).")


def _built_mpi():
    record = _mpi_check.read_record()
    return _mpi_check.built_mpi(record) if record else None


def _elastic_worker(env) -> Launch | None:
    worker = env.get(E.WORKER_ID, "")
    if not worker:
        return None
    addr, port = env.get(E.GLOO_RENDEZVOUS_ADDR), _int(env, E.GLOO_RENDEZVOUS_PORT)
    secret = env.get(E.RENDEZVOUS_SECRET) or None
    return Launch("horovodliterun --elastic", "gloo", host=env.get(E.GLOO_HOSTNAME),
                  store=STORE_CLIENT, addr=addr, port=port, secret=secret,
                  job=elastic_job(secret or f"{addr}:{port}"), worker=worker,
                  why=f"{E.WORKER_ID}={worker} is set (an elastic job's worker)")


def _horovod_gloo(env) -> Launch | None:
    if E.GLOO_RANK not in env or E.GLOO_SIZE not in env:
        return None
    secret = env.get(E.RENDEZVOUS_SECRET) or None
    addr = env.get(E.GLOO_RENDEZVOUS_ADDR)
    port = _int(env, E.GLOO_RENDEZVOUS_PORT)
    size = _int(env, E.GLOO_SIZE)
    return Launch(
        "horovodlite's launcher" if secret else "a Horovod Gloo launcher", "gloo",
        rank=_int(env, E.GLOO_RANK), size=size,
        local_rank=_int(env, E.GLOO_LOCAL_RANK), local_size=_int(env, E.GLOO_LOCAL_SIZE),
        cross_rank=_int(env, E.GLOO_CROSS_RANK), cross_size=_int(env, E.GLOO_CROSS_SIZE),
        host=env.get(E.GLOO_HOSTNAME),
        store=STORE_CLIENT if addr and port else (STORE_NONE if size == 1 else STORE_HOST),
        addr=addr, port=port, secret=secret,
        job=_job_id("horovod", secret or f"{addr}:{port}"),
        why="HOROVOD_RANK and HOROVOD_SIZE are set")


def _torchrun(env) -> Launch | None:
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return None
    size = _int(env, "WORLD_SIZE")
    agent = env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    addr = env.get("MASTER_ADDR")
    port = _int(env, "MASTER_PORT")
    if agent:
        store = STORE_CLIENT  # torchrun's agent hosts it; every worker is a client
    elif size == 1:
        store = STORE_NONE
    else:  # plain env:// launches: rank 0 hosts it, beside the port torch itself would use
        store, port = STORE_HOST, (port or DEFAULT_PORT) + 1
    run_id = env.get("TORCHELASTIC_RUN_ID", "")
    restart = env.get("TORCHELASTIC_RESTART_COUNT", "0")
    launcher = "torchrun" if "TORCHELASTIC_RUN_ID" in env or agent else "a torch env:// launch"
    return Launch(
        launcher, "gloo", rank=_int(env, "RANK"), size=size,
        local_rank=_int(env, "LOCAL_RANK"), local_size=_int(env, "LOCAL_WORLD_SIZE"),
        cross_rank=_int(env, "GROUP_RANK"), cross_size=_int(env, "GROUP_WORLD_SIZE"),
        store=store, addr=addr, port=port,
        job=_job_id("torchrun", run_id, addr, port, restart),
        why="RANK and WORLD_SIZE are set" + (" (torchrun's agent store)" if agent else ""))


def first_slurm_host(nodelist: str) -> str:
    """The first host of a Slurm node list: ``node[03-05,7],gpu1`` gives ``node03``,
    ``rack[1-2]-n[01-04]`` gives ``rack1-n01`` (``slurm_lists.expand_nodelist``); what is not
    a node list is given back as it is."""
    try:
        return expand_nodelist(nodelist)[0]
    except ValueError:
        return nodelist


def _slurm_tasks_on_node(env) -> int | None:
    """Tasks on this node from ``SLURM_STEP_TASKS_PER_NODE`` (``2(x3),1``), by SLURM_NODEID."""
    spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    node = _int(env, "SLURM_NODEID")
    if not spec or node is None:
        return None
    try:
        counts = expand_counts(spec)
    except ValueError:
        return None
    return counts[node] if 0 <= node < len(counts) else None


def _slurm(env) -> Launch | None:
    if "SLURM_PROCID" not in env or "SLURM_NTASKS" not in env:
        return None
    size = _int(env, "SLURM_NTASKS")
    job = env.get("SLURM_JOB_ID", "0")
    # The step's first node runs its rank 0; a step may use only some of the job's nodes.
    nodes = (env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
             or env.get("SLURM_NODELIST") or "localhost")
    addr = env.get(E.GLOO_RENDEZVOUS_ADDR) or env.get("MASTER_ADDR") or first_slurm_host(nodes)
    port = (_int(env, E.GLOO_RENDEZVOUS_PORT) or _int(env, "MASTER_PORT")
            or SLURM_PORT_BASE + (int(job) % 1000 if job.isdigit() else 0))
    return Launch(
        "srun", "gloo", rank=_int(env, "SLURM_PROCID"), size=size,
        local_rank=_int(env, "SLURM_LOCALID"), local_size=_slurm_tasks_on_node(env),
        cross_rank=_int(env, "SLURM_NODEID"), cross_size=_int(env, "SLURM_NNODES"),
        host=env.get("SLURMD_NODENAME"),
        store=STORE_NONE if size == 1 else STORE_HOST, addr=addr, port=port,
        job=_job_id("slurm", job, env.get("SLURM_STEP_ID", "")),
        why="SLURM_PROCID and SLURM_NTASKS are set (srun without PMI)")


def _default_group() -> Launch | None:
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    if not (dist.is_available() and dist.is_initialized()):
        return None
    return Launch("torch.distributed", "gloo", rank=dist.get_rank(), size=dist.get_world_size(),
                  store=STORE_DEFAULT_GROUP,
                  job=_job_id("default-group", os.environ.get("MASTER_ADDR"),
                              os.environ.get("MASTER_PORT"), os.environ.get("TORCHELASTIC_RUN_ID")),
                  why="torch.distributed's default process group is initialised: its store is "
                      "reused")


def _single(mpi_built: bool) -> Launch:
    if mpi_built:
        return Launch("no launcher", "mpi", why="no launcher's variables are set: one rank "
                                                "(an MPI singleton)")
    return Launch("no launcher", "gloo", rank=0, size=1, local_rank=0, local_size=1,
                  cross_rank=0, cross_size=1, why="no launcher's variables are set: one rank")


def detect(env=None, mpi_built: bool = True, gloo_built: bool = True,
           default_group: bool = True, built_mpi=_built_mpi) -> Launch:
    """The launch this process is part of (see the table at the top). ``built_mpi``: the
    build's MPI (``_mpi_check.Mpi`` or None), or a function that reads it. ValueError when
    srun offers a PMI the build's MPI does not speak (``srun_pmi_mismatch``)."""
    env = os.environ if env is None else env
    forced = env.get(E.CONTROLLER, "").strip().lower()
    if forced not in ("", "mpi", "gloo"):
        raise ValueError(f"{E.CONTROLLER}={env[E.CONTROLLER]!r}: expected mpi or gloo")
    mpi = _mpi(env)
    if mpi is not None and forced != "mpi" and "TORCHELASTIC_RUN_ID" in env:
        # a torchrun worker: MPI's (and srun's) variables are its agent's, inherited (`srun
        # torchrun ...`); taken for its own, each worker of a node would start MPI as one rank
        mpi = None
    if mpi is not None and forced != "gloo":
        # srun with PMI sets PMI_*/PMIX_* too; MPI then takes precedence over SLURM_* - unless
        # this build has no MPI, where the Slurm variables still give a Gloo launch.
        if forced != "mpi" and mpi_built and "SLURM_PROCID" in env:
            problem = srun_pmi_mismatch(env, built_mpi() if callable(built_mpi) else built_mpi)
            if problem:
                raise ValueError(problem)
        if mpi_built or forced == "mpi":
            return mpi
    for probe in (_elastic_worker, _horovod_gloo,
                  lambda e: _default_group() if default_group else None, _torchrun, _slurm):
        found = probe(env)
        if found is not None:
            if forced == "mpi":
                found = dataclasses.replace(found, controller="mpi",
                                            why=found.why + "; HOROVOD_CONTROLLER=mpi forces MPI")
            return found
    if forced == "gloo":
        return dataclasses.replace(_single(False), why="HOROVOD_CONTROLLER=gloo, no launcher: "
                                                       "one rank")
    return _single(mpi_built)


def srun_started_alone(launch: Launch, seen_size: int) -> str | None:
    """The message for a task srun started with PMI as one of N > 1 whose MPI started as a job
    of 1 rank (its MPI did not join srun's PMI), else None."""
    if not launch.pmi or launch.tasks is None or launch.tasks <= 1 or seen_size != 1:
        return None
    other = "pmi2" if launch.pmi == PMIX else "pmix"
    return (f"srun started this task as rank {launch.rank} of {launch.tasks} with {launch.pmi} "
            f"({launch.why}), but MPI started it alone, as rank 0 of 1: this build's MPI did "
            f"not join srun's {launch.pmi}, and every task would train by itself. Set "
            "HOROVOD_CONTROLLER=gloo for the job (`export HOROVOD_CONTROLLER=gloo` before srun: "
            f"the tasks then meet over TCP), or run `srun --mpi={other}` if this MPI speaks "
            "that (`srun --mpi=list` names what the cluster offers).")


def check_size(launch: Launch, seen_size: int, seen_rank: int) -> None:
    """Raises when the launcher said another size (or rank) than the controller found."""
    alone = srun_started_alone(launch, seen_size)
    if alone:
        raise RuntimeError(alone)
    if launch.size is not None and launch.size != seen_size:
        raise RuntimeError(
            f"{launch.launcher} started this process as rank {launch.rank} of {launch.size} "
            f"({launch.why}), but horovodlite's {launch.controller.upper()} controller sees "
            f"{seen_size} rank(s): the ranks would train separately. Start the job with the "
            "launcher that matches the controller (mpirun for MPI; torchrun or horovodliterun "
            "--gloo for Gloo), or set HOROVOD_CONTROLLER.")
    if launch.rank is not None and launch.rank != seen_rank:
        raise RuntimeError(
            f"{launch.launcher} says this process is rank {launch.rank}, horovodlite's "
            f"{launch.controller.upper()} controller made it rank {seen_rank}.")
