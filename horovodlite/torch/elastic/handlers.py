"""How ``TorchState`` snapshots, restores and synchronises each kind of object it holds.

One handler per attribute. Every handler keeps its own snapshot (``save``), puts it back
(``restore``, local) and makes every rank's object equal to rank 0's (``sync``, collective:
every rank calls it in the same order, see ``TorchState.sync``; under rollback "step", to the
rank ``TorchState`` chooses: ``source``). Snapshots are deep copies held
in memory: a model's snapshot costs as much memory as the model.

| value                               | sync                                                   |
|-------------------------------------|--------------------------------------------------------|
| ``torch.nn.Module``                 | ``broadcast_parameters(model.state_dict(), 0)``        |
| ``torch.optim.Optimizer``           | ``broadcast_optimizer_state(optimizer, 0)``            |
| ``DistributedOptimizer(shard=...)`` | rank 0's param-group options; the shards stay (below)  |
| ``ElasticSampler``                  | union of every rank's processed indices, rank 0's epoch |
| anything with ``state_dict`` and    | rank 0's ``state_dict()`` by ``broadcast_object``      |
| ``load_state_dict`` (LR scheduler,  |                                                        |
| GradScaler, a custom sampler, ...)  |                                                        |

A sharded optimizer (``DistributedOptimizer(shard=...)``, sharded_optimizer.py) holds 1/N of
its state per rank. Its snapshot is still the full state (``state_dict()``: an allgather of the
shards at every commit, and the unsharded state's memory on every rank), because that is what
survives the loss of any rank: after a reset that changed the ranks, ``on_reset`` lays the last
commit's snapshot out over the ranks now in the job (local: every survivor holds the same
snapshot), and ``sync`` then only checks that every rank holds the same layout and takes rank
0's param-group options (one small ``allgather_object``): each range of the state has exactly
one holder, so there is nothing else to make equal. A worker that joins holds no state: the
sync after that reset sends rank 0's snapshot to every rank (``broadcast_object``), and each
lays it out over the ranks now in the job.
"""

from __future__ import annotations

import copy

import torch

from horovodlite.common import basics
from horovodlite.common.exceptions import HorovodInternalError
from horovodlite.common.process_sets import _id_of, global_process_set
from horovodlite.torch.elastic.sampler import ElasticSampler
from horovodlite.torch.functions import (
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)
from horovodlite.torch.sharded_optimizer import _ShardedOptimizer


class StateHandler:
    """Snapshot / restore / sync of one object held by a ``TorchState`` attribute ``name``.

    ``sync`` runs over ``process_set`` from its first rank: ``TorchState.sync`` sets it to the
    process set of its DistributedOptimizer, the ranks that train one model together (every
    rank by default)."""

    process_set = global_process_set
    source: int | None = None  # rollback "step": the rank TorchState.sync chose (state.py)
    bulky = False  # the model and the optimizers: not sent when every rank holds the same

    @property
    def root(self) -> int:
        """The global rank the state is taken from: ``source`` when set, else the first of the
        process set."""
        if self.source is not None:
            return self.source
        return self.process_set.ranks[0] if _id_of(self.process_set) else 0

    def __init__(self, name: str, value) -> None:
        self.name = name
        self.value = value
        self.save()

    def adopt(self, value) -> None:
        """The attribute now holds ``value`` (``state.model = new_model``): snapshot it."""
        self.value = value
        self.save()

    def save(self) -> None:
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        # A copy again: load_state_dict may keep references to the tensors it is given, and
        # later in-place updates must not reach the snapshot.
        self.value.load_state_dict(copy.deepcopy(self._saved))

    def on_reset(self) -> None:
        """After horovodlite was re-initialised: drop what referred to the old runtime. Most
        objects hold nothing of the kind."""

    def sync(self) -> None:
        """Rank 0's ``state_dict()`` to every rank (collective)."""
        root = broadcast_object(self.value.state_dict(), self.root, name=f"elastic.{self.name}",
                                process_set=self.process_set)
        self.value.load_state_dict(root)


class ModelHandler(StateHandler):
    """``torch.nn.Module``: parameters and buffers (``state_dict``)."""

    bulky = True

    def restore(self) -> None:
        self.value.load_state_dict(self._saved)  # copies into the existing tensors

    def sync(self) -> None:
        broadcast_parameters(self.value.state_dict(), root_rank=self.root,
                             process_set=self.process_set)


class OptimizerHandler(StateHandler):
    """``torch.optim.Optimizer``, plain or ``hvd.DistributedOptimizer``.

    Gradients are not part of the state. ``restore`` and ``on_reset`` drop the interrupted
    step's gradients and, for a DistributedOptimizer, its in-flight reductions (their handles
    die with the runtime at the reset), so the retried step starts clean - also after a
    ``HostsUpdatedInterrupt``, which resets without restoring."""

    bulky = True

    def __init__(self, name: str, value) -> None:
        self.sharded = isinstance(value, _ShardedOptimizer)
        self.steps = 0  # steps applied (rollback "step" syncs from the rank with the most)
        self._hook = value.register_step_post_hook(self._stepped)
        if not self.sharded:
            super().__init__(name, value)
            return
        # A sharded optimizer's state_dict() is collective, and a worker that joins a running
        # job builds its TorchState alone: no snapshot yet. hvd.elastic.run starts with a sync,
        # which ends with save() on every rank.
        self.name, self.value, self._saved = name, value, None

    def _stepped(self, optimizer, args, kwargs) -> None:
        if optimizer is self.value:
            self.steps += 1

    def adopt(self, value) -> None:
        """``state.optimizer = another``: count that one's steps."""
        self._hook.remove()
        self.sharded = isinstance(value, _ShardedOptimizer)
        self._hook = value.register_step_post_hook(self._stepped)
        super().adopt(value)

    def save(self) -> None:
        if self.sharded:  # collective, whatever consolidate_state_dict holds for a rank-0 save
            self._saved = copy.deepcopy(self.value._shard_full_state_dict())
        else:
            super().save()

    def _abandon_step(self) -> None:
        abandon = getattr(self.value, "_hvd_abandon_step", None)
        if abandon is not None:
            abandon()
        else:
            self.value.zero_grad(set_to_none=True)

    def restore(self) -> None:
        self._abandon_step()  # load_state_dict refuses while reductions are in flight
        if self._saved is not None:
            super().restore()

    def on_reset(self) -> None:
        self._abandon_step()
        opt = self.value
        self._reset = True  # the next sync follows a reset (see _sync_sharded)
        if (isinstance(opt, _ShardedOptimizer)
                and opt._shard_ranks() != (opt._shard_size, opt._shard_rank)):
            # The ranks changed: the shards of lost ranks are gone, and the survivors' shards
            # are cut for the old number of ranks. Lay the snapshot out over the ranks now in
            # the job. It is the last commit after a failure (restore() ran), and the current
            # state after HostsUpdatedInterrupt (raised by commit() right after its save(), or
            # after the sync and save() with the retiring ranks). No deep copy: the sharded
            # load_state_dict copies every tensor into shards of its own.
            if self._saved is not None:
                opt.load_state_dict(self._saved)
            elif not opt.state and not opt._shard_parked:
                # No snapshot yet (the first sync failed) and no state to lose: a fresh layout
                # over the ranks now (a stale one would step ranges of the old number of ranks).
                opt._shard_build({})
            else:
                raise HorovodInternalError(
                    f"elastic: the ranks changed before the first commit of {self.name!r}, a "
                    "sharded optimizer holding state (loaded before hvd.elastic.run?): the lost "
                    "ranks' shards of it are gone. Load the checkpoint inside the function "
                    "hvd.elastic.run calls, after state.sync(), or commit once first")

    def sync(self) -> None:
        if isinstance(self.value, _ShardedOptimizer):
            self._sync_sharded()
        else:
            broadcast_optimizer_state(self.value, root_rank=self.root,
                                      process_set=self.process_set)

    def _sync_sharded(self) -> None:
        """``broadcast_optimizer_state`` on a sharded optimizer would allgather the whole state
        on every rank, broadcast it from rank 0 and cut it into shards again, to end where it
        started: each range of the element-wise state has one holder, so the state assembled
        from the shards is the same seen from any rank. What ranks may hold apart are the
        layout, the state's entries, its scalars (``step``) and the param-group options: one
        small allgather compares them; options are then taken from rank 0. Ranks that differ
        otherwise: after a reset (a rank joined without the state, the job grew), rank 0's
        snapshot, which its optimizer holds since the reset, goes to every rank
        (``broadcast_object`` of the full state) and each lays it out over the ranks now; else
        (the state of frozen parameters, which every rank keeps whole, or a state loaded on
        some ranks only) the full path, which raises on every rank when only some ranks hold
        state."""
        opt = self.value
        summary = {**opt._shard_summary(), "reset": getattr(self, "_reset", False)}
        self._reset = False
        every = allgather_object(summary, name=f"elastic.{self.name}",
                                 process_set=self.process_set)
        if every[0]["parked"] or any(s["layout"] != every[0]["layout"] for s in every):
            if every[0]["reset"]:
                opt.load_state_dict(broadcast_object(
                    self._saved if basics.rank() == self.root else None, self.root,
                    name=f"elastic.{self.name}.state", process_set=self.process_set))
            else:
                broadcast_optimizer_state(opt, root_rank=self.root,
                                          process_set=self.process_set)
            return
        for group, options in zip(opt.param_groups, every[0]["options"]):
            group.update(options)


class SamplerHandler(StateHandler):
    """``ElasticSampler``: a sample processed on any rank is processed for everyone.

    ``sync`` gathers every rank's state in one collective and loads the root's epoch (rank 0,
    or the rank rollback "step" syncs from) with the union of the processed indices of the
    ranks in that epoch, which re-partitions what is left over the ranks."""

    def sync(self) -> None:
        states = allgather_object(self.value.state_dict(), name=f"elastic.{self.name}",
                                  process_set=self.process_set)
        ranks = self.process_set.ranks if _id_of(self.process_set) else range(len(states))
        merged = dict(states[list(ranks).index(self.root)])
        merged["processed_indices"] = sorted(set().union(*(
            s["processed_indices"] for s in states if s["epoch"] == merged["epoch"])))
        self.value.load_state_dict(merged)


class GradScalerHandler(StateHandler):
    """``torch.amp.GradScaler``: its state dict (scale, growth tracker) as any object's; after a
    reset also the per-optimizer stages of the step that failed. A failure after
    ``scaler.unscale_(opt)`` left that optimizer "unscaled" with that step's inf check: the
    retried step's ``scaler.step(opt)`` would then skip its own unscale and apply gradients
    still multiplied by the scale. ``update()`` forgets them; after a reset, this does."""

    def on_reset(self) -> None:
        from collections import defaultdict

        from torch.amp.grad_scaler import _refresh_per_optimizer_state

        self.value._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)


def handler_for(name: str, value) -> StateHandler | None:
    """The handler for ``value``, or None for a plain attribute (pickled as is)."""
    if isinstance(value, torch.amp.GradScaler):
        return GradScalerHandler(name, value)
    if isinstance(value, torch.nn.Module):
        return ModelHandler(name, value)
    if isinstance(value, torch.optim.Optimizer):
        return OptimizerHandler(name, value)
    if isinstance(value, ElasticSampler):
        return SamplerHandler(name, value)
    if (not isinstance(value, type) and callable(getattr(value, "state_dict", None))
            and callable(getattr(value, "load_state_dict", None))):
        return StateHandler(name, value)
    return None


__all__ = ["StateHandler", "ModelHandler", "OptimizerHandler", "SamplerHandler",
           "GradScalerHandler", "handler_for"]
