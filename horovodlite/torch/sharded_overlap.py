"""The sharded optimizer's gradient reduction overlapped with backward (sharded_optimizer.py),
with the default collectives (an allreduce).

Every parameter of a bucket has a post-accumulate-grad hook. On its
``backward_passes_per_step``-th backward pass of a step, the hook starts the allreduce of the
parameter's gradient; the background thread runs it while backward goes on. With
``shard="optimizer_state"`` the gradient is first written into the parameter's place in the
bucket's flat gradient, which ``.grad`` then is (nothing to write when ``.grad`` already is that
place: after ``zero_grad(set_to_none=False)``). With ``shard="gradients"`` the gradient tensor
is reduced where it is and ``.grad`` is dropped; once a bucket's allreduces ended, this rank's
range is copied out of them (``_overlap_retire``) and they go. ``synchronize()`` starts what no
hook started (a parameter without a gradient on this rank goes out as zeros, a gradient set by
hand without backward as it is) and waits for all of them. A gradient replaced or edited after
its hook ran is not seen (as with Horovod's hooks): edit gradients with a tensor hook, or after
``synchronize()``.

Each parameter goes out as a tensor of its own, named by its bucket and index, whichever way it
started, so ranks that started it differently (one from its hook, one in ``synchronize()``)
still meet, and the ring sums each element in the order the unsharded optimizer's per-parameter
allreduce sums it. A parameter has one such hook, for the sharded optimizer that laid it out
last (``_HOOKS``, which holds both weakly), so an optimizer built again over the same model takes
the hooks over and the old one starts nothing. A step in which the parameters requiring a
gradient changed (frozen, unfrozen, a param group added) before backward is not overlapped: its
``synchronize()`` lays the buckets out again first. Laying them out again while this step's
allreduces are in flight (a change between backward and step, ``load_state_dict``) raises.

With ``shard="gradients"`` and ``step()`` alone, a hook retires the buckets wholly started on
this rank whose allreduces ended, in order; while more than ``HOROVOD_SHARDED_OVERLAP_BUCKETS``
(default 0) are still in flight it waits for the oldest, so backward holds at most that many
buckets' full gradients besides the one being filled and the kept ranges. The wait is bounded
(``WAIT_SECONDS``): a rank may start a parameter only in ``synchronize()`` (it has no gradient
there), and then some rank's wait can only end once another rank gives up its own. A rank whose
wait runs out warns and stops waiting for the rest of training; results never depend on it.
"""

from __future__ import annotations

import math
import os
import threading
import time
import warnings
import weakref

import torch
from torch.utils.weak import WeakIdKeyDictionary

from horovodlite._extension import load
from horovodlite.common.exceptions import HorovodArgumentError
from horovodlite.torch.distributed_optimizer import OutstandingAllreduceError
from horovodlite.torch.mpi_ops import allreduce_async_, synchronize
from horovodlite.torch.submission import poll

_C = load()

# The longest a hook waits for a bucket's allreduces (see the module's docstring): longer than
# a 25 MiB allreduce over a 1 Gbit/s link with a straggling rank, short enough to be one stall.
WAIT_SECONDS = 2.0


def overlap_limit() -> float:
    """``HOROVOD_SHARDED_OVERLAP_BUCKETS``: how many wholly started buckets may be in flight
    while backward goes on (``all``: backward never waits)."""
    value = os.environ.get("HOROVOD_SHARDED_OVERLAP_BUCKETS", "0").strip()
    if value == "all":
        return math.inf
    if not value.isdigit():
        raise HorovodArgumentError(
            "HOROVOD_SHARDED_OVERLAP_BUCKETS must be a number of buckets (0, 1, ...) or 'all', "
            f"got {value!r}")
    return int(value)


# parameter -> (weakref to the sharded optimizer that laid it out last, its hook's handle)
_HOOKS = WeakIdKeyDictionary()


class ShardedOverlap:
    """A mixin of ``_ShardedOptimizer``: the hooks, the per-step flat gradients and the
    allreduces in flight."""

    def _overlap_reset(self) -> None:
        """Forgets this step's launches (after the wait, or when the layout is rebuilt)."""
        # bucket index -> what this step reduces: shard="optimizer_state" the flat gradient,
        # shard="gradients" the list of its parameters' gradient tensors (None: not yet)
        self._overlap_flats = {}
        self._overlap_started = set()  # (bucket index, parameter index) started this step
        self._overlap_handles = {}  # bucket index -> its allreduces in flight
        self._overlap_queue = []  # buckets wholly started, in order, not yet retired
        self._overlap_counts = {}  # parameter -> backward passes seen this step
        self._overlap_live = None  # this step may overlap (None: no hook ran yet)

    def _overlap_attach(self) -> None:
        """After a layout is built: hooks on parameters new to this optimizer, and ownership of
        every parameter in a bucket."""
        self._overlap_reset()
        self._overlap_where = {}
        if not hasattr(self, "_overlap_lock"):
            # hooks of parameters on different devices may run on autograd's device threads
            self._overlap_lock = threading.Lock()
            # shard="gradients": retire each bucket as soon as its allreduces ended, keeping
            # only this rank's range (see _overlap_retire); learnt from the previous step
            self._overlap_early = False
        if self._shard_wire != "allreduce":
            return
        for bi, b in enumerate(self._shard_buckets):
            for pi, p in enumerate(b.params):
                self._overlap_where[p] = (bi, pi)
                held = _HOOKS.get(p)
                if held is not None and held[0]() is self:
                    continue
                if held is not None:
                    held[1].remove()  # another optimizer's (or a dead one's)
                me = weakref.ref(self)
                _HOOKS[p] = (me, p.register_post_accumulate_grad_hook(_hook_for(me)))

    def _overlap_hook(self, p) -> None:
        with self._overlap_lock:
            self._overlap_hook_locked(p)

    def _overlap_hook_locked(self, p) -> None:
        where = self._overlap_where.get(p)
        if where is None:
            return
        if self._overlap_live is None:
            self._overlap_live = self._shard_active_signature() == self._shard_signature
        if not self._overlap_live:
            return
        seen = self._overlap_counts.get(p, 0) + 1
        self._overlap_counts[p] = seen
        if seen == self.backward_passes_per_step:
            self._overlap_start(*where)
        elif seen > self.backward_passes_per_step:
            raise RuntimeError(_C.too_many_passes_message(self._shard_name(p),
                                                          self.backward_passes_per_step))

    def _shard_name(self, p) -> str:
        return self._shard_names.get(p, f"of shape {list(p.shape)}")

    def _overlap_place(self, bi: int, pi: int, grad) -> torch.Tensor:
        """shard="optimizer_state": ``grad`` written into parameter ``pi``'s place in bucket
        ``bi``'s flat gradient, which is returned."""
        b = self._shard_buckets[bi]
        flat = self._overlap_flats.get(bi)
        if flat is None:
            flat = b.flat
            if flat is None:
                flat = torch.empty(b.layout.padded, dtype=b.shard.dtype, device=b.shard.device)
                flat[b.layout.total:].zero_()  # padding: stepped on by the last rank
            self._overlap_flats[bi] = flat
        place = flat[b.layout.offsets[pi]:b.layout.offsets[pi + 1]]
        with torch.no_grad():
            if grad is None:
                place.zero_()
            elif grad.data_ptr() != place.data_ptr() or grad.numel() != place.numel():
                place.copy_(grad.reshape(-1))
        return place

    def _overlap_start(self, bi: int, pi: int) -> None:
        """Starts the allreduce of parameter ``pi`` of bucket ``bi``'s gradient."""
        b = self._shard_buckets[bi]
        p = b.params[pi]
        grad = p.grad
        if grad is not None and grad.is_sparse:  # nn.Embedding(sparse=True): reduced dense
            grad = grad.to_dense()
        if self._shard_mode == "optimizer_state":
            # .grad becomes the place (the reduced gradient once synchronize() waited)
            tensor = self._overlap_place(bi, pi, grad)
            p.grad = tensor.view(p.shape)
        else:
            # shard="gradients": reduced where it is (only this rank's range will be kept)
            if grad is None:
                tensor = torch.zeros_like(p, memory_format=torch.contiguous_format)
            else:
                tensor = grad if grad.is_contiguous() else grad.contiguous()
            self._overlap_flats.setdefault(bi, [None] * len(b.params))[pi] = tensor
            p.grad = None
        handles = self._overlap_handles.setdefault(bi, [])
        handles.append(allreduce_async_(
            tensor, name=f"{self._shard_prefix}.grads.{bi}.{pi}", op=self._shard_op,
            prescale_factor=self._shard_scale[0], postscale_factor=self._shard_scale[1],
            process_set=self.process_set))
        self._overlap_started.add((bi, pi))
        if self._overlap_early:
            if len(handles) == len(b.params):
                self._overlap_queue.append(bi)
            self._overlap_drain()

    def _overlap_drain(self) -> None:
        """Retires, in order, the buckets wholly started on this rank whose allreduces ended.
        While more than ``HOROVOD_SHARDED_OVERLAP_BUCKETS`` of them are in flight, waits for
        the oldest first (bounded: see the module's docstring)."""
        queue = self._overlap_queue
        while queue:
            if not all(poll(h) for h in self._overlap_handles[queue[0]]):
                if len(queue) <= self._overlap_limit or not self._overlap_wait_for(queue[0]):
                    return
            self._overlap_retire(queue.pop(0))

    def _overlap_wait_for(self, bi: int) -> bool:
        """Waits up to ``WAIT_SECONDS`` for bucket ``bi``'s allreduces; False if they did not
        end by then, and backward stops waiting from then on (with a warning)."""
        handles = self._overlap_handles[bi]
        deadline = time.monotonic() + WAIT_SECONDS
        pause = 5e-5
        while not all(poll(h) for h in handles):
            if time.monotonic() > deadline:
                self._overlap_limit = math.inf
                params = self._shard_buckets[bi].params
                names = ", ".join(self._shard_name(p) for p in params[:3])
                if len(params) > 3:
                    names += f" and {len(params) - 3} more"
                warnings.warn(
                    f"rank {_C.rank()}: DistributedOptimizer(shard=\"gradients\"): backward "
                    f"waited {WAIT_SECONDS:g} s for the allreduce of bucket {bi} ({names}), "
                    "which some rank has not started (a parameter without a gradient on some "
                    "ranks?); backward no longer waits, so up to the whole gradient may be in "
                    "flight at once (HOROVOD_SHARDED_OVERLAP_BUCKETS)", RuntimeWarning,
                    stacklevel=2)
                return False
            time.sleep(pause)
            pause = min(2 * pause, 1e-3)
        return True

    def _overlap_retire(self, bi: int) -> None:
        """shard="gradients", step() without an explicit synchronize() last step: bucket
        ``bi``'s allreduces ended, so only this rank's range of it is kept and its gradients
        go, while backward still runs: the full gradient never exists at once."""
        for h in self._overlap_handles.pop(bi):
            synchronize(h)
        self._shard_buckets[bi].grad = self._shard_range_of(bi, self._overlap_flats.pop(bi))

    def _shard_range_of(self, bi: int, tensors: list) -> torch.Tensor:
        """This rank's range of bucket ``bi``, copied out of its parameters' ``tensors``."""
        b = self._shard_buckets[bi]
        out = torch.empty(b.layout.shard, dtype=b.shard.dtype, device=b.shard.device)
        with torch.no_grad():
            return b.layout.gather_shard(tensors, self._shard_rank, out)

    def _overlap_finish(self) -> list:
        """Starts every allreduce no hook started, waits for all of them, and returns what each
        bucket reduced (its flat gradient, or with shard="gradients" its parameters' gradient
        tensors), or None for a bucket retired already (its range is in ``b.grad``)."""
        for bi, b in enumerate(self._shard_buckets):
            for pi in range(len(b.params)):
                if (bi, pi) not in self._overlap_started:
                    self._overlap_start(bi, pi)
        # Every rank has started everything now, so waiting is safe: the buckets wholly
        # started during backward are retired in the order they were, each freed before the
        # next is waited for.
        for bi in self._overlap_queue:
            self._overlap_retire(bi)
        self._overlap_queue = []
        flats = [self._overlap_flats.get(bi) for bi in range(len(self._shard_buckets))]
        self._overlap_wait()
        return flats

    def _overlap_wait(self) -> None:
        handles = self._overlap_handles
        self._overlap_reset()
        for bucket in handles.values():
            for h in bucket:
                synchronize(h)

    def _overlap_check_idle(self, what: str) -> None:
        if any(self._overlap_handles.values()):
            raise OutstandingAllreduceError(
                f"optimizer.{what} was called after loss.backward() but before "
                "optimizer.step() or optimizer.synchronize(): the allreduces of "
                f"{sum(map(len, self._overlap_handles.values()))} parameters' gradients are "
                "still in flight. Call optimizer.step() (or optimizer.synchronize()) first.")

    def _overlap_refuse_rebuild(self) -> None:
        """Before the buckets are laid out again: raises, on every rank alike (the layout
        changes on all of them), if this step's allreduces are in flight, after waiting for
        them, so nothing is left in flight; the step is dropped."""
        if not any(getattr(self, "_overlap_handles", {}).values()):
            return
        count = sum(map(len, self._overlap_handles.values()))
        self._overlap_wait()
        self._shard_synced = False
        raise OutstandingAllreduceError(
            "DistributedOptimizer(shard=...): the buckets must be laid out again (the parameters "
            "requiring a gradient changed, a param group was added, or a state was loaded) "
            f"after loss.backward() started this step's allreduces ({count} parameters); do "
            "that before backward or after step(). This step's gradients were dropped: call "
            "zero_grad() and run it again.")

    def _hvd_abandon_step(self) -> None:
        """Drops this step after a failure (``hvd.elastic`` rolls back): its allreduces died
        with the runtime at the elastic reset, so they are not waited for, and its gradients
        and reduced ranges are cleared."""
        self._overlap_reset()
        self._shard_synced = False
        # Learnt from the last step, which a rank that joins at the reset has not seen: every
        # rank starts from the same value, so they decide alike whether to gather (_shard_reduce).
        self._overlap_early = False
        for b in self._shard_buckets:
            b.grad = None
            for p in b.params:
                p.grad = None


def _hook_for(ref):
    def hook(p):
        opt = ref()
        if opt is not None:
            opt._overlap_hook(p)
    return hook


__all__ = ["ShardedOverlap"]
