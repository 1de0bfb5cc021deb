"""Checkpoints of the sharded optimizer (sharded_optimizer.py): the full state in torch's
format (the shards allgathered), this rank's shard, and loading either at any number of ranks
(docs/sharded_optimizer.md, "Checkpoints")."""

from __future__ import annotations

import threading
import warnings

import torch

from horovodlite.common.exceptions import HorovodArgumentError
from horovodlite.common.process_sets import _id_of
from horovodlite.torch.collectives import grouped_allgather_async
from horovodlite.torch.functions import allgather_object
from horovodlite.torch.mpi_ops import synchronize
from horovodlite.torch.sharded_state import (
    SHARD_KEY,
    assemble,
    clone,
    elementwise_keys,
    from_full_flats,
    from_torch,
    groups_to_torch,
    index_params,
    to_torch,
)


class ShardedCheckpoints:
    """A mixin of ``_ShardedOptimizer``: ``state_dict``, ``shard_state_dict``,
    ``load_state_dict`` and the allgather of every parameter's full state behind them."""

    def state_dict(self) -> dict:
        """The full state in torch's format (loadable by the plain optimizer, at any number of
        ranks). Collective - the shards are allgathered - unless ``consolidate_state_dict(to=r)``
        ran on every rank since the last step: then rank r returns what it gathered, without
        communication (for Horovod's ``if hvd.rank() == 0: torch.save(opt.state_dict())``), and
        the other ranks raise. A rank that calls it alone while the others train on is named
        after ``CONSOLIDATE_HINT_SECONDS`` (a warning; it still waits)."""
        held = getattr(self, "_shard_consolidated", None)
        if held is not None and held[0] == self._shard_steps:
            if held[1] is None:
                raise HorovodArgumentError(
                    f"state_dict(): consolidate_state_dict(to={held[2]}) gathered the full "
                    f"state on rank {held[2]}, not on this rank ({self._shard_rank}); call "
                    "state_dict() there, or on every rank without consolidating")
            return held[1]
        with _named_if_alone(self._shard_rank, "state_dict()"):
            return self._shard_full_state_dict()

    def _shard_full_state_dict(self) -> dict:
        """The full state, always collective (what every rank calls together: the elastic
        state's snapshots, broadcast_optimizer_state), whatever consolidate_state_dict held."""
        return to_torch(self.param_groups, self._shard_collect())

    def consolidate_state_dict(self, to: int = 0) -> None:
        """Gathers the full state on rank ``to`` of the optimizer's process set (as torch's
        ``ZeroRedundancyOptimizer.consolidate_state_dict``). Collective: call it on every rank;
        afterwards ``state_dict()`` on rank ``to`` returns it without communication, until the
        next ``step()`` or ``load_state_dict()``::

            opt.consolidate_state_dict(to=0)
            if hvd.rank() == 0:
                torch.save(opt.state_dict(), "ckpt.pt")
        """
        if not 0 <= int(to) < self._shard_size:
            raise HorovodArgumentError(
                f"consolidate_state_dict(to={to}): not a rank of the optimizer's "
                f"{self._shard_size} ranks")
        full = self._shard_full_state_dict()
        self._shard_consolidated = (self._shard_steps, full if self._shard_rank == to else None,
                                    int(to))

    def shard_state_dict(self) -> dict:
        """This rank's shard and the layout it belongs to (local, no communication). The shard
        checkpoints of all ranks, passed as a list to ``load_state_dict``, load at any number
        of ranks."""
        params = index_params(self.param_groups)
        index = {id(p): i for i, p in enumerate(params)}
        buckets = []
        for b in self._shard_buckets:
            st = self._shard_inner.state.get(b.shard, {}) if self._shard_inner else {}
            buckets.append({
                "params": [index[id(p)] for p in b.params],
                "numels": list(b.layout.numels),
                "shapes": [tuple(p.shape) for p in b.params],
                "elementwise": elementwise_keys(st, b.shard),
                "state": {k: clone(v) for k, v in st.items()},
            })
        return {
            "param_groups": groups_to_torch(self.param_groups, params),
            SHARD_KEY: {"rank": self._shard_rank, "size": self._shard_size, "buckets": buckets,
                        "parked": {index[id(p)]: {k: clone(v) for k, v in s.items()}
                                   for p, s in self._shard_parked.items()}},
        }

    def load_state_dict(self, state_dict) -> None:
        """Loads torch's format (from ``state_dict()`` or a plain optimizer), this rank's shard
        checkpoint (collective: the ranks exchange their shards; saved at the same number of
        ranks), or the list of shard checkpoints of every rank of a run (any number)."""
        if isinstance(state_dict, (list, tuple)):
            state_dict = assemble(list(state_dict))
        elif isinstance(state_dict, dict) and SHARD_KEY in state_dict:
            saved = state_dict[SHARD_KEY]["size"]
            if saved != self._shard_size:
                raise HorovodArgumentError(
                    f"load_state_dict: this shard checkpoint was saved by rank "
                    f"{state_dict[SHARD_KEY]['rank']} of {saved} ranks and this job has "
                    f"{self._shard_size}; pass the list of all {saved} shard checkpoints, or a "
                    "full state_dict()")
            state_dict = assemble(allgather_object(state_dict, process_set=self.process_set))
        self._shard_consolidated = None
        states = from_torch(state_dict, self.param_groups, self._shard_names)
        for group, saved in zip(self.param_groups, state_dict["param_groups"]):
            group.update({k: v for k, v in saved.items() if k != "params"})
        self._shard_build(states)

    def _shard_collect(self) -> dict:
        """Every parameter's full state (collective: one grouped allgather of the shards)."""
        states = {p: {k: clone(v) for k, v in s.items()} for p, s in self._shard_parked.items()}
        if self._shard_inner is None:
            return states
        if self._shard_ranks() != (self._shard_size, self._shard_rank):
            raise HorovodArgumentError(
                f"the sharded optimizer's state is laid out over {self._shard_size} ranks and "
                f"the job now has {self._shard_ranks()[0]}: the shards of other ranks are gone; "
                "load a full state_dict() saved before (e.g. the elastic state's last commit)")
        tensors, where = [], []
        for i, b in enumerate(self._shard_buckets):
            st = self._shard_inner.state.get(b.shard, {})
            for key in elementwise_keys(st, b.shard):
                tensors.append(st[key].detach().contiguous())
                where.append((i, key))
        self._shard_check_same_state(where, tensors)
        fulls = []
        if tensors:
            fulls = synchronize(grouped_allgather_async(
                tensors, name=f"{self._shard_prefix}.state", process_set=self.process_set))
        flats: dict = {}
        for (i, key), full in zip(where, fulls):
            flats.setdefault(i, {})[key] = full
        for i, b in enumerate(self._shard_buckets):
            st = self._shard_inner.state.get(b.shard, {})
            for p, s in zip(b.params, from_full_flats(st, flats.get(i, {}), b.params, b.layout)):
                if s:
                    states[p] = s
        return states

    def _shard_summary(self) -> dict:
        """What the ranks must agree on for their shards to form one state (small: no tensor
        data): the number of ranks, each bucket's parameters and sizes, its state entries
        (element-wise: dtype and length; scalars: their values), whether frozen parameters hold
        state, and the param-group options."""
        index = {id(p): i for i, p in enumerate(index_params(self.param_groups))}
        inner = self._shard_inner
        buckets = []
        for b in self._shard_buckets:
            st = inner.state.get(b.shard, {}) if inner is not None else {}
            entries = []
            for key, value in st.items():
                if not isinstance(value, torch.Tensor):
                    entries.append((str(key), repr(value)))
                elif value.shape == b.shard.shape and key != "step":  # element-wise
                    entries.append((str(key), str(value.dtype), value.numel()))
                else:
                    entries.append((str(key), str(value.dtype), value.reshape(-1).tolist()))
            buckets.append((b.group, [index[id(p)] for p in b.params], b.layout.numels,
                            sorted(entries)))
        return {"layout": (self._shard_size, buckets), "parked": bool(self._shard_parked),
                "options": [{k: v for k, v in g.items() if k != "params"}
                            for g in self.param_groups]}

    def _shard_broadcast(self, root_rank: int) -> bool:
        """``hvd.broadcast_optimizer_state`` on a sharded optimizer, without moving the state
        where it need not: each range of the element-wise state has one holder, so when every
        rank holds the same layout, entries and scalars (one small allgather compares them),
        the state assembled from the shards is the root's already, and only the root's
        param-group options are taken. Returns False where the state must travel (the ranks
        differ, or frozen parameters hold state): the caller's full path then gathers it."""
        every = allgather_object(self._shard_summary(), name=f"{self._shard_prefix}.bcast",
                                 process_set=self.process_set)
        if every[0]["parked"] or any(s["layout"] != every[0]["layout"] for s in every):
            return False
        ranks = self.process_set.ranks if _id_of(self.process_set) else None
        root = ranks.index(root_rank) if ranks else root_rank
        for group, options in zip(self.param_groups, every[root]["options"]):
            group.update(options)
        return True

    def _shard_check_same_state(self, where, tensors) -> None:
        """Every rank must hold the same state entries before they are allgathered (a rank
        that loaded a checkpoint alone holds them, the others not: a hang otherwise). One
        small allgather of the structure; raises on every rank, naming the ranks that differ."""
        mine = [(i, key, t.numel(), str(t.dtype)) for (i, key), t in zip(where, tensors)]
        every = allgather_object(mine, name=f"{self._shard_prefix}.structure",
                                 process_set=self.process_set)
        differ = [r for r, other in enumerate(every) if other != every[0]]
        if differ:
            raise HorovodArgumentError(
                f"the sharded optimizer's state differs across ranks (ranks {differ} differ from "
                f"rank 0: {len(every[differ[0]])} vs {len(every[0])} state tensors); each rank "
                "holds only its shard, so load the same checkpoint on every rank "
                "(broadcast_optimizer_state cannot spread a state loaded on one rank)")


# How long a rank waits in a collective state_dict() before it says what the wait may be.
CONSOLIDATE_HINT_SECONDS = 30.0


class _named_if_alone:
    """Warns, once the collective inside has waited ``CONSOLIDATE_HINT_SECONDS``, that the
    other ranks may never join it (Horovod's rank-0-only save, which the unsharded optimizer
    allows), and what to do instead."""

    def __init__(self, rank: int, what: str):
        self.rank, self.what = rank, what

    def _warn(self) -> None:
        warnings.warn(
            f"rank {self.rank}: DistributedOptimizer(shard=...).{self.what} has waited "
            f"{CONSOLIDATE_HINT_SECONDS:g} s for the other ranks: it is collective (each rank "
            "holds a shard of the state). If only this rank calls it (`if hvd.rank() == 0: "
            "torch.save(opt.state_dict())`), the job hangs here: call "
            "opt.consolidate_state_dict(to=0) on every rank first, then state_dict() on rank 0",
            RuntimeWarning, stacklevel=3)

    def __enter__(self):
        self.timer = threading.Timer(CONSOLIDATE_HINT_SECONDS, self._warn)
        self.timer.daemon = True
        self.timer.start()

    def __exit__(self, *exc):
        self.timer.cancel()
        return False


__all__ = ["CONSOLIDATE_HINT_SECONDS", "ShardedCheckpoints"]
