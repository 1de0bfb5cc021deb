"""Process sets: collectives over a subset of the ranks.

Ranks inside a set are set-relative (``ps.rank()``), except broadcast's ``root_rank``, which is
a global rank, as in Horovod. The global set (id 0) always exists. Static sets are passed to
``hvd.init(process_sets=[...])``; with ``hvd.init(process_sets="dynamic")`` or
HOROVOD_DYNAMIC_PROCESS_SETS=1, ``add_process_set``/``remove_process_set`` create and destroy them
at run time: both are collective over every rank and must be called in the same order everywhere.
"""

from __future__ import annotations

from collections.abc import Iterable

from horovodlite._extension import load
from horovodlite.common.exceptions import HorovodArgumentError

_C = load()


def _world_ranks_of(comm) -> list[int]:
    from mpi4py import MPI

    group = comm.Get_group()
    world = MPI.COMM_WORLD.Get_group()
    return sorted(MPI.Group.Translate_ranks(group, list(range(comm.Get_size())), world))


class ProcessSet:
    """A set of global ranks. ``ProcessSet([0, 2])`` or ``ProcessSet(mpi4py_comm)``."""

    def __init__(self, ranks_or_comm: Iterable[int] | None = None) -> None:
        if ranks_or_comm is None:
            self.ranks: list[int] | None = None
        elif hasattr(ranks_or_comm, "Get_group"):
            self.ranks = _world_ranks_of(ranks_or_comm)
        else:
            ranks = sorted(int(r) for r in ranks_or_comm)
            if len(set(ranks)) != len(ranks):
                raise HorovodArgumentError(f"ProcessSet: duplicate ranks in {ranks}")
            self.ranks = ranks
        self.process_set_id: int | None = None

    def _require(self) -> int:
        if self.process_set_id is None:
            raise HorovodArgumentError(
                f"{self!r} is not registered: pass it to hvd.init(process_sets=[...]) or "
                "hvd.add_process_set() first (or it was removed)."
            )
        return self.process_set_id

    def size(self) -> int | None:
        """Number of ranks in the set (None before registration)."""
        return None if self.ranks is None else len(self.ranks)

    def rank(self) -> int:
        """This process's rank within the set; ValueError if it is not a member."""
        self._require()
        me = _C.rank()
        if me not in self.ranks:
            raise HorovodArgumentError(f"rank {me} is not in {self!r}")
        return self.ranks.index(me)

    def included(self) -> bool:
        """True if this process belongs to the set."""
        self._require()
        return _C.rank() in self.ranks

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ProcessSet) and self.ranks == other.ranks

    def __hash__(self) -> int:
        return hash(tuple(self.ranks or ()))

    def __repr__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


#: The set of every rank (id 0). Default ``process_set`` of every collective.
global_process_set = ProcessSet()
global_process_set.process_set_id = 0

_registered: dict[int, ProcessSet] = {}


def _setup(static_sets: list[ProcessSet]) -> None:
    """Called by init: fills in the global set and numbers the static sets 1, 2, ..."""
    global_process_set.ranks = list(range(_C.size()))
    global_process_set.process_set_id = 0
    _registered.clear()
    _registered[0] = global_process_set
    next_id = 1
    for ps in static_sets:
        if ps.ranks == global_process_set.ranks:
            ps.process_set_id = 0
            continue
        ps.process_set_id = next_id
        _registered[next_id] = ps
        next_id += 1


def _teardown() -> None:
    for ps in list(_registered.values()):
        if ps is not global_process_set:
            ps.process_set_id = None
    _registered.clear()


def _static_rank_lists(process_sets) -> list[list[int]]:
    out = []
    for ps in process_sets:
        if not isinstance(ps, ProcessSet) or ps.ranks is None:
            raise HorovodArgumentError(
                f"init(process_sets=...): expected ProcessSet objects with ranks, got {ps!r}"
            )
        out.append(ps.ranks)
    return out


def _id_of(process_set: ProcessSet) -> int:
    if process_set is global_process_set:
        return 0  # the hot path: the C++ enqueue itself reports a missing hvd.init()
    _C.rank()  # raises "Horovod has not been initialized; use hvd.init()" before init
    if not isinstance(process_set, ProcessSet):
        raise HorovodArgumentError(
            f"process_set must be a hvd.ProcessSet, got {type(process_set).__name__}"
        )
    ps_id = process_set._require()
    if ps_id not in _registered:
        raise HorovodArgumentError(f"{process_set!r} was removed; it cannot be used any more")
    return ps_id


def add_process_set(process_set) -> ProcessSet:
    """Registers a new process set (collective over every rank). Needs dynamic process sets."""
    if not _C.dynamic_process_sets():
        raise HorovodArgumentError(
            "add_process_set needs dynamic process sets: hvd.init(process_sets='dynamic') or "
            "HOROVOD_DYNAMIC_PROCESS_SETS=1"
        )
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    size = _C.size()
    bad = [r for r in ps.ranks if r < 0 or r >= size]
    if not ps.ranks or bad:
        raise HorovodArgumentError(
            f"add_process_set: ranks {ps.ranks} must be a non-empty subset of 0..{size - 1}"
        )
    for existing in _registered.values():
        if existing.ranks == ps.ranks:
            raise HorovodArgumentError(
                f"add_process_set: a process set with ranks {ps.ranks} already exists "
                f"(id {existing.process_set_id})"
            )
    _, extra = _C.wait(_C.enqueue_add_process_set(ps.ranks))
    ps.process_set_id = int(extra[0])
    _registered[ps.process_set_id] = ps
    return ps


def remove_process_set(process_set: ProcessSet) -> bool:
    """Removes a process set (collective over every rank). Returns True if it was removed."""
    if not _C.dynamic_process_sets():
        raise HorovodArgumentError(
            "remove_process_set needs dynamic process sets: hvd.init(process_sets='dynamic') or "
            "HOROVOD_DYNAMIC_PROCESS_SETS=1"
        )
    ps_id = process_set.process_set_id
    if ps_id is None or ps_id == 0 or ps_id not in _registered:
        return False
    _C.wait(_C.enqueue_remove_process_set(ps_id))
    _registered.pop(ps_id, None)
    process_set.process_set_id = None
    return True


__all__ = ["ProcessSet", "global_process_set", "add_process_set", "remove_process_set"]
