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
- Rollback ``step`` (``HOROVOD_ELASTIC_ROLLBACK``/``--elastic-rollback``, the default): after
  a failure nothing is restored. Every completed step is a commit: the survivors keep their live
  state, and ``sync`` takes it from the survivor that applied the most optimizer steps (lowest
  rank among them; ``_source``). Every step first takes part in a vote (torch/step_vote.py): a
  rank whose reductions or vote failed applied nothing of that step; a rank whose vote
  completed before the failure applied it, and gives it to the others.
  So at most the step in flight is lost, and ``commit()`` takes no snapshot (it only checks for
  host updates). When every survivor applied as many steps and none is new, the model and the
  optimizers are not sent at all (they are equal); the other objects are (small). Rollback
  ``commit`` is Horovod's behaviour. A state with a sharded optimizer, or one trained by a
  process set, rolls back to the commit whatever the setting (``rollback_mode``).
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

from horovodlite.common import launch_env
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
        # None: never synced; True: a sync completed here, and no later one overwrote the state
        # part way; False: one did (rollback "step": this rank cannot be the next source)
        self._synced: bool | None = None
        self._behind = True  # (sync) this rank's state is not the source's: see _source

    def rollback_mode(self) -> str:
        """``commit`` for a State subclass of the user's: only its own save/restore/sync know
        what a consistent state is (``ObjectState`` and ``TorchState``: the setting)."""
        return "commit"

    @property
    def applied(self) -> int:
        """Optimizer steps this state has applied (``TorchState``: counted by step hooks)."""
        return 0

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
        if self.rollback_mode() == "step":  # every completed step is a commit: no snapshot
            self.commits += 1
            self._check_host_updates(saved=True)
            return
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

        if not is_initialized() or self.rollback_mode() == "step":
            return  # nothing to agree with (commit() took no pending snapshot)
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
                if not saved and self.rollback_mode() == "commit":
                    self._before_hosts_update()
                raise HostsUpdatedInterrupt(skip_sync=False)
            return
        if discovery.active():
            add, retire = discovery.updates_agreed()
            if add > 0 or retire:
                if not saved and self.rollback_mode() == "commit":
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

    def rollback_mode(self) -> str:
        """``step`` or ``commit`` (see the top): the setting, but ``commit`` where this state
        cannot choose the rank it syncs from (a ``bcast_object`` of the user's)."""
        mode = launch_env.rollback()
        return "commit" if self._bcast_object is not _broadcast_from_root else mode

    def _source(self) -> tuple:
        """Collective under rollback ``step``: (the rank to take the state from, whether the
        model and optimizers must be sent too). See the top."""
        if self.rollback_mode() != "step" or not is_initialized():
            return 0, True
        from horovodlite.torch.functions import allgather_object

        every = allgather_object((self.applied, self.commits, self._synced),
                                 name="elastic.progress")
        clean = [r for r, (_, _, synced) in enumerate(every) if synced]
        self._behind = True  # (below: whether this rank's own state is not the source's)
        if not clean:
            if any(synced is False for _, _, synced in every):
                raise RuntimeError(
                    "hvd.elastic: no rank holds a whole state to continue from: the rank that "
                    "was sending its state to the others after a failure was lost too, and "
                    "each survivor holds part of it (rollback 'step' keeps no snapshot). "
                    "Restart from your checkpoint, or set HOROVOD_ELASTIC_ROLLBACK=commit "
                    "(horovodliterun --elastic-rollback commit) to keep one at every commit")
            return 0, True  # nothing trained yet: the start
        most = max(every[r][0] for r in clean)
        source = min(r for r in clean if every[r][0] == most)
        # a whole state that applied as many steps holds the source's values bit for bit:
        # receiving them again changes nothing, and a failure of the source mid-sync leaves it
        # whole (a newcomer, or a rank behind, holds part of a state until the end)
        self._behind = not (self._synced and self.applied == most)
        return source, len(clean) < len(every) or any(e[0] != most for e in every)

    def sync(self) -> None:
        """Every rank takes the current attribute values and commit count of one rank (rank 0;
        under rollback ``step`` the one ``_source`` names), then ``save()``: every rank's
        snapshot is the synchronised state."""
        source, everything = self._source()
        self._sync_from(source, everything)
        self._synced = True

    def _sync_from(self, source: int, everything: bool) -> None:
        if self._object_names or is_initialized():
            mine = {"objects": {n: getattr(self, n) for n in self._object_names},
                    "commits": self.commits, "steps": self._steps()}
            root = (self._bcast_object(mine) if source == 0 else
                    broadcast_object(mine, source, name="elastic.objects"))
            for name, value in root["objects"].items():
                setattr(self, name, value)
            # The same count everywhere (a worker that joined starts at 0): agree_on_commit
            # compares them.
            self.commits = root["commits"]
            self._set_steps(root["steps"])
        if self.rollback_mode() == "commit":
            self.save()

    def _steps(self) -> dict:
        """The optimizer steps applied, per attribute (``TorchState``)."""
        return {}

    def _set_steps(self, steps: dict) -> None:
        """Takes the source's counts (``sync``)."""


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
            handlers[name].adopt(value)
        super().__setattr__(name, value)

    def save(self) -> None:
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def rollback_mode(self) -> str:
        """The setting, but ``commit`` for a sharded optimizer (a lost rank's shard exists
        only in the last commit's snapshot) and for a state trained by a process set."""
        if any(getattr(h, "sharded", False) for h in self._handlers.values()):
            return "commit"
        if self._process_set() is not global_process_set:
            return "commit"
        return super().rollback_mode()

    @property
    def applied(self) -> int:
        return sum(self._steps().values())

    def _steps(self) -> dict:
        return {n: h.steps for n, h in self._handlers.items() if isinstance(h, OptimizerHandler)}

    def _set_steps(self, steps: dict) -> None:
        for name, count in steps.items():
            if name in self._handlers:
                self._handlers[name].steps = count

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

    def _sync_from(self, source: int, everything: bool) -> None:
        """Collective. Handlers in attribute-name order (the same on every rank whatever the
        keyword order), then the plain attributes, then ``save()``. The handlers' objects are
        taken from the first rank of the DistributedOptimizer's process set, over that set: a
        rank outside it trains alone (the optimizer reduces nothing there) and keeps its own.
        Under rollback ``step`` from ``source``; the model and optimizers only when
        ``everything`` (see the top), and a rank behind the source that takes them holds part
        of a state until they all arrived (``_synced`` false: it cannot be the next source); a
        whole state as far as the source's receives its own values and stays whole."""
        ps = self._process_set()
        if everything and rank() != source and self.rollback_mode() == "step" and self._behind:
            self._synced = False
        for name in sorted(self._handlers):
            handler = self._handlers[name]
            handler.process_set = ps
            handler.source = source if self.rollback_mode() == "step" else None
            if ps.included() and (everything or not handler.bulky):
                handler.sync()
        super()._sync_from(source, everything)


__all__ = ["State", "ObjectState", "TorchState"]
