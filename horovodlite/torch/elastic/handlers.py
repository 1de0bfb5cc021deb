"""How ``TorchState`` snapshots, restores and synchronises each kind of object it holds.

One handler per attribute. Every handler keeps its own snapshot (``save``), puts it back
(``restore``, local) and makes every rank's object equal to rank 0's (``sync``, collective:
every rank calls it in the same order, see ``TorchState.sync``). Snapshots are deep copies held
in memory: a model's snapshot costs as much memory as the model.

| value                               | sync                                                   |
|-------------------------------------|--------------------------------------------------------|
| ``torch.nn.Module``                 | ``broadcast_parameters(model.state_dict(), 0)``        |
| ``torch.optim.Optimizer``           | ``broadcast_optimizer_state(optimizer, 0)``            |
| ``ElasticSampler``                  | union of every rank's processed indices, rank 0's epoch |
| anything with ``state_dict`` and    | rank 0's ``state_dict()`` by ``broadcast_object``      |
| ``load_state_dict`` (LR scheduler,  |                                                        |
| GradScaler, a custom sampler, ...)  |                                                        |
"""

from __future__ import annotations

import copy

import torch

from horovodlite.torch.elastic.sampler import ElasticSampler
from horovodlite.torch.functions import (
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)


class StateHandler:
    """Snapshot / restore / sync of one object held by a ``TorchState`` attribute ``name``."""

    def __init__(self, name: str, value) -> None:
        self.name = name
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
        root = broadcast_object(self.value.state_dict(), 0, name=f"elastic.{self.name}")
        self.value.load_state_dict(root)


class ModelHandler(StateHandler):
    """``torch.nn.Module``: parameters and buffers (``state_dict``)."""

    def restore(self) -> None:
        self.value.load_state_dict(self._saved)  # copies into the existing tensors

    def sync(self) -> None:
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class OptimizerHandler(StateHandler):
    """``torch.optim.Optimizer``, plain or ``hvd.DistributedOptimizer``.

    Gradients are not part of the state. ``restore`` and ``on_reset`` drop the interrupted
    step's gradients and, for a DistributedOptimizer, its in-flight reductions (their handles
    die with the runtime at the reset), so the retried step starts clean - also after a
    ``HostsUpdatedInterrupt``, which resets without restoring."""

    def _abandon_step(self) -> None:
        abandon = getattr(self.value, "_hvd_abandon_step", None)
        if abandon is not None:
            abandon()
        else:
            self.value.zero_grad(set_to_none=True)

    def restore(self) -> None:
        self._abandon_step()  # load_state_dict refuses while reductions are in flight
        super().restore()

    def on_reset(self) -> None:
        self._abandon_step()

    def sync(self) -> None:
        broadcast_optimizer_state(self.value, root_rank=0)


class SamplerHandler(StateHandler):
    """``ElasticSampler``: a sample processed on any rank is processed for everyone.

    ``sync`` gathers every rank's state in one collective and loads rank 0's epoch with the
    union of the processed indices, which re-partitions what is left over the ranks."""

    def sync(self) -> None:
        states = allgather_object(self.value.state_dict(), name=f"elastic.{self.name}")
        merged = dict(states[0])
        merged["processed_indices"] = sorted(set().union(*(s["processed_indices"]
                                                           for s in states)))
        self.value.load_state_dict(merged)


def handler_for(name: str, value) -> StateHandler | None:
    """The handler for ``value``, or None for a plain attribute (pickled as is)."""
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


__all__ = ["StateHandler", "ModelHandler", "OptimizerHandler", "SamplerHandler", "handler_for"]
