"""Training state that ``hvd.elastic.run`` can roll back and re-synchronise.

    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0)

Life cycle, on every rank:

- ``save()``: snapshot in memory (deep copies). ``commit()`` is the collective form: a barrier
  (every rank snapshots at the same point of training), ``save()``, a second barrier, then
  ``check_host_updates()``. Why two: a failure aborts the survivors at different points, so
  one barrier can complete on one survivor and fail on another, which then keep different last
  commits - and the sync after the reset mixed them (rank 0's weights, every rank's processed
  samples: a batch skipped or trained twice). The snapshot a rank takes between the barriers
  is *pending* until the second one completes; it completes on some rank only if every rank
  took it. After a reset, ``agree_on_commit()`` (collective, called by ``hvd.elastic.run``
  before the sync) makes every rank keep its pending snapshot where some rank completed the
  commit, and go back to the one before everywhere else. The one before is the snapshot the
  pending one replaced, kept by reference until the second barrier: no copy is made, but two
  snapshots exist during a commit.
- ``restore()``: back to the last snapshot (local).
- ``sync()``: every rank takes rank 0's current state (collective), which then becomes every
  rank's snapshot too. Called by ``run`` before the first attempt and after each reset.
- ``on_reset()``: the callbacks given to ``register_reset_callbacks``, after each reset.

Attributes given as keyword arguments are tracked (``state.epoch += 1`` changes the tracked
value). Objects with handlers (modules, optimizers, samplers, anything with ``state_dict`` /
``load_state_dict``; see ``handlers.py``) are snapshotted through their state dicts; everything
else is deep-copied and sent with ``broadcast_object`` - it must be picklable.
"""

from __future__ import annotations

import copy

import torch

from horovodlite.common.basics import is_initialized, rank
from horovodlite.common.exceptions import HostsUpdatedInterrupt
from horovodlite.common.process_sets import global_process_set
from horovodlite.torch.collectives import barrier, broadcast
from horovodlite.torch.elastic.handlers import OptimizerHandler, handler_for
from horovodlite.torch.functions import broadcast_object


def _broadcast_from_root(obj):
    return broadcast_object(obj, 0, name="elastic.objects")


class State:
    """Base class of elastic state: subclasses implement ``save``, ``restore`` and ``sync``.

    ``bcast_object(obj) -> obj`` and ``get_rank() -> int`` are accepted for compatibility with
    Horovod's signature and default to horovodlite's ``broadcast_object`` (from rank 0) and
    ``rank``.
    """

    def __init__(self, bcast_object=None, get_rank=None) -> None:
        self._bcast_object = bcast_object or _broadcast_from_root
        self._get_rank = get_rank or rank
        self._reset_callbacks: list = []
        self.commits = 0  # how many commit() calls this state has had (for the logs)

    def register_reset_callbacks(self, callbacks) -> None:
        """Adds callables run (in order, no arguments) after each reset, before ``sync``:
        e.g. scale the learning rate to the new ``hvd.size()``."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        """Collective: every rank reaches this point, then snapshots (``save``) and checks for
        host updates; two barriers around the snapshot (see the top), skipped when horovodlite
        is not initialised."""
        if not is_initialized():
            self.save()
            self.commits += 1
            self._check_host_updates(saved=True)
            return
        barrier()
        previous = self._snapshot_refs()
        self._pending = previous is not None
        self._previous = previous
        self.save()
        barrier()  # raises on a rank whose peers failed meanwhile: the snapshot stays pending
        self._pending, self._previous = False, None
        self.commits += 1
        self._check_host_updates(saved=True)

    def agree_on_commit(self) -> None:
        """Collective, after a reset (``hvd.elastic.run`` calls it before ``sync``): a rank
        whose last commit is pending keeps it if some rank completed that commit, and goes back
        to the snapshot before it otherwise, so every rank restores the same commit."""
        from horovodlite.torch.functions import allgather_object

        if not is_initialized():  # nothing to agree with (commit() took no pending snapshot)
            return
        pending = getattr(self, "_pending", False)
        every = allgather_object((self.commits, pending), name="elastic.commits")
        if not pending:
            return
        completed = max(c for c, _ in every)
        if completed == self.commits + 1:  # some rank completed it: so did every rank's save
            self.commits += 1
        else:
            self._restore_refs(self._previous)
        self._pending, self._previous = False, None
        self.restore()

    def _snapshot_refs(self):
        """The current snapshot, by reference (None: this state cannot keep one aside)."""
        return None

    def _restore_refs(self, refs) -> None:
        raise NotImplementedError

    def check_host_updates(self) -> None:
        """Raises ``HostsUpdatedInterrupt`` on every rank when the job is to change: with
        ``horovodliterun --host-discovery-script``, the script lists more slots than the job
        has ranks (up to ``--max-np``), or no longer lists a host the job runs on; collective
        then (see discovery.py). Otherwise it never
        raises; raise ``HostsUpdatedInterrupt`` yourself to re-synchronise without rolling
        back. Training goes on from the current state, not the last commit: what must be
        gathered for that while every rank is still there (a sharded optimizer's shards) is
        gathered before it raises."""
        self._check_host_updates(saved=False)

    def _before_hosts_update(self) -> None:
        """Collective, on every rank of the job about to change, before the interrupt."""

    def _check_host_updates(self, saved: bool) -> None:
        from horovodlite.common import elastic_worker
        from horovodlite.torch.elastic import discovery

        if elastic_worker.active() and is_initialized():  # horovodliterun --elastic (Gloo)
            newer = elastic_worker.newer_round() if rank() == 0 else -1
            newer = int(broadcast(torch.tensor([newer], dtype=torch.int64), 0,
                                  name="elastic.round").item())
            elastic_worker.announce(newer)
            if newer >= 0:
                if not saved:
                    self._before_hosts_update()
                raise HostsUpdatedInterrupt(skip_sync=False)
            return
        if discovery.active():
            add, retire = discovery.updates_agreed()
            if add > 0 or retire:
                if not saved:
                    self._before_hosts_update()
                raise HostsUpdatedInterrupt(skip_sync=False)

    def save(self) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement save()")

    def restore(self) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement restore()")

    def sync(self) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement sync()")


class ObjectState(State):
    """State made of plain picklable attributes, given as keyword arguments.

    Snapshots are deep copies, so mutating a list attribute after a commit does not change the
    commit (Horovod kept references)."""

    def __init__(self, bcast_object=None, get_rank=None, **kwargs) -> None:
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)
        self._object_names = list(kwargs)
        for name, value in kwargs.items():
            setattr(self, name, value)
        self._save_objects()

    def _save_objects(self) -> None:
        self._saved_objects = copy.deepcopy({n: getattr(self, n) for n in self._object_names})

    def save(self) -> None:
        self._save_objects()

    def restore(self) -> None:
        for name, value in copy.deepcopy(self._saved_objects).items():
            setattr(self, name, value)

    def _snapshot_refs(self):
        return {"": self._saved_objects}

    def _restore_refs(self, refs) -> None:
        self._saved_objects = refs[""]

    def sync(self) -> None:
        """Rank 0's current attribute values and commit count to every rank (one
        ``broadcast_object``), then ``save()``: every rank's snapshot is the synchronised
        state."""
        if self._object_names or is_initialized():
            root = self._bcast_object({"objects": {n: getattr(self, n)
                                                   for n in self._object_names},
                                       "commits": self.commits})
            for name, value in root["objects"].items():
                setattr(self, name, value)
            # The same count everywhere (a worker that joined starts at 0): agree_on_commit
            # compares them.
            self.commits = root["commits"]
        self.save()


class TorchState(ObjectState):
    """Model, optimizer and any other training state, e.g.
    ``TorchState(model, optimizer, sampler=sampler, scheduler=scheduler, epoch=0, batch=0)``.

    Assigning a new object to a handled attribute (``state.model = new_model``) switches the
    handler to it and snapshots it.
    """

    def __init__(self, model=None, optimizer=None, **kwargs) -> None:
        kwargs.update(model=model, optimizer=optimizer)
        handlers, plain = {}, {}
        for name, value in kwargs.items():
            handler = handler_for(name, value)
            if handler is None:
                plain[name] = value
            else:
                handlers[name] = handler
        self._handlers = handlers
        for name, handler in handlers.items():
            setattr(self, name, handler.value)
        super().__init__(**plain)

    def __setattr__(self, name, value) -> None:
        handlers = self.__dict__.get("_handlers")
        if handlers is not None and name in handlers and handlers[name].value is not value:
            handlers[name].value = value
            handlers[name].save()
        super().__setattr__(name, value)

    def save(self) -> None:
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def _snapshot_refs(self):
        refs = {f"handler.{n}": h._saved for n, h in self._handlers.items()}
        return {**refs, **super()._snapshot_refs()}

    def _restore_refs(self, refs) -> None:
        for name, handler in self._handlers.items():
            handler._saved = refs[f"handler.{name}"]
        super()._restore_refs(refs)

    def restore(self) -> None:
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def _before_hosts_update(self) -> None:
        """A sharded optimizer lays its state out again over the ranks after the change, from
        its snapshot (handlers.py): between commits the snapshot is older than the model,
        which goes on from its live weights. So everything is snapshotted now, while every
        shard's holder is still in the job (a sharded optimizer's save is one allgather, in
        attribute-name order on every rank): the model, the other objects and the plain
        attributes too, so that a failure before the change completes restores them from the
        same point as the optimizer, not from the commit before."""
        for name in sorted(self._handlers):
            self._handlers[name].save()
        ObjectState.save(self)

    def on_reset(self) -> None:
        """Handlers drop what referred to the old runtime, then the reset callbacks run."""
        for handler in self._handlers.values():
            handler.on_reset()
        super().on_reset()

    def _process_set(self):
        """The ranks that train this state's model together: its DistributedOptimizer's
        process set (every rank when it has none, or several)."""
        sets = {id(ps): ps for h in self._handlers.values() if isinstance(h, OptimizerHandler)
                and (ps := getattr(h.value, "process_set", None)) is not None}
        return next(iter(sets.values())) if len(sets) == 1 else global_process_set

    def sync(self) -> None:
        """Collective. Handlers in attribute-name order (the same on every rank whatever the
        keyword order), then the plain attributes, then ``save()``. The handlers' objects are
        taken from the first rank of the DistributedOptimizer's process set, over that set: a
        rank outside it trains alone (the optimizer reduces nothing there) and keeps its own."""
        ps = self._process_set()
        for name in sorted(self._handlers):
            handler = self._handlers[name]
            handler.process_set = ps
            if ps.included():
                handler.sync()
        super().sync()


__all__ = ["State", "ObjectState", "TorchState"]
