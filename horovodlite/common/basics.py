"""Runtime lifecycle and topology queries: init, shutdown, rank, size, feature probes."""

from __future__ import annotations

import atexit
import threading

from horovodlite._extension import load
from horovodlite.common import process_sets as _ps

_C = load()
_lock = threading.Lock()
_atexit_registered = False


def _comm_args(comm):
    """(fortran handle or None, ranks list) for init's ``comm`` argument."""
    if comm is None:
        return None, []
    if hasattr(comm, "py2f"):
        return int(comm.py2f()), []
    try:
        ranks = [int(r) for r in comm]
    except TypeError:
        raise ValueError(
            f"init(comm=...): expected an mpi4py communicator or a list of ranks, got {comm!r}"
        ) from None
    if not ranks:
        raise ValueError("init(comm=[]): the list of ranks is empty")
    return None, sorted(ranks)


def _at_exit() -> None:
    shutdown()
    _C.finalize_transport()


def init(comm=None, process_sets=None) -> None:
    """Starts horovodlite (collective). A second call is a no-op.

    comm: None (every MPI process), an mpi4py communicator, or a list of MPI_COMM_WORLD ranks.
    process_sets: None, a list of ``ProcessSet`` (static sets), or ``"dynamic"``.
    MPI that mpi4py already initialised is reused and never finalised by horovodlite; MPI that
    horovodlite initialised is finalised at process exit.
    """
    global _atexit_registered
    with _lock:
        if _C.is_initialized():
            return
        f2c, ranks = _comm_args(comm)
        dynamic = -1
        static: list = []
        if isinstance(process_sets, str):
            if process_sets != "dynamic":
                raise ValueError(
                    f"init(process_sets={process_sets!r}): expected a list or 'dynamic'"
                )
            dynamic = 1
        elif process_sets is not None:
            static = list(process_sets)
        _C.init(comm_f2c=f2c, ranks=ranks, process_sets=_ps._static_rank_lists(static),
                dynamic=dynamic)
        _ps._setup(static)
        if not _atexit_registered:
            atexit.register(_at_exit)
            _atexit_registered = True


def shutdown() -> None:
    """Stops horovodlite on every rank; pending operations fail with a clear error.

    MPI stays initialised (it cannot be initialised twice), so ``init()`` works again.
    """
    with _lock:
        if _C.is_initialized():
            _C.shutdown("hvd.shutdown() was called")
            _ps._teardown()


def is_initialized() -> bool:
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
    """Rank within this node; pick the GPU with ``torch.cuda.set_device(hvd.local_rank())``."""
    return _C.local_rank()


def cross_size() -> int:
    """Number of nodes (ranks with the same local rank)."""
    return _C.cross_size()


def cross_rank() -> int:
    """Index of this node among the nodes."""
    return _C.cross_rank()


def mpi_threads_supported() -> bool:
    """True if MPI provides MPI_THREAD_MULTIPLE (needed to use mpi4py alongside horovodlite)."""
    return bool(_C.mpi_threads_supported())


def mpi_enabled() -> bool:
    return bool(_C.mpi_built())


def mpi_built() -> bool:
    return bool(_C.mpi_built())


def gloo_enabled() -> bool:
    return False


def gloo_built() -> bool:
    return False


def nccl_built() -> int:
    """The NCCL version code (e.g. 22703) if built with NCCL, else 0."""
    return int(getattr(_C, "nccl_version", lambda: 0)())


def ddl_built() -> bool:
    return False


def ccl_built() -> bool:
    return False


def cuda_built() -> bool:
    return bool(getattr(_C, "cuda_built", lambda: False)())


def rocm_built() -> bool:
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
