"""``hvd.DistributedOptimizer(opt, shard="optimizer_state" | "gradients")``: each rank keeps the
optimizer state of 1/N of the parameters (ZeRO stages 1 and 2), with the results of the unsharded
optimizer.

Layout. The parameters that require a gradient are put in *buckets*, runs of at most
BUCKET_BYTES of one param group, dtype, device and state signature (``sharded_state.signature``:
parameters whose scalar state differs, e.g. a layer unfrozen later with a smaller Adam ``step``,
cannot share one copy of it). Each bucket is one flat vector split into N equal contiguous
ranges (``shard_layout.ShardLayout``); rank r owns range r of every bucket. The parameters live
in their bucket: each one's ``.data`` is a view of the bucket's ``params_flat``. The *inner
optimizer* is a fresh instance of the wrapped optimizer's class whose parameters are this rank's
ranges of those vectors (views, so its step writes the parameters), one param group per bucket
with the hyperparameters of the bucket's param group; ``opt.state`` is its state, so it holds
only this rank's shards.

Step protocol (collective; every rank calls it in the same order):

1. ``synchronize()`` (``step()`` calls it unless it already ran since ``zero_grad()``): the
   gradients of each bucket (zeros for a parameter without a gradient on this rank, as the
   unsharded optimizer does) are averaged (see COLLECTIVES: by default an allreduce of each
   parameter's gradient, most of them started by backward's hooks while it runs,
   sharded_overlap.py; a grouped reducescatter of the bucket's flat vector with
   HOROVOD_SHARDED_COLLECTIVES=reducescatter); rank r keeps the reduced range r. With
   ``shard="optimizer_state"`` the flat vector is kept and the parameters' ``.grad`` become
   views into it. With ``shard="gradients"`` the gradients are freed once the range is copied
   out of them (bucket by bucket, during backward where it can: sharded_overlap.py) and
   ``.grad`` is None: only the reduced range stays. An explicit ``synchronize()`` leaves the
   whole reduced gradient in ``.grad`` on every rank, the same bits everywhere, whatever the
   mode and collectives (where some rank holds only its range - the reducescatter, a bucket
   retired during backward - one allgather of the ranges, ``_shard_gather``): code written for
   the unsharded optimizer between ``synchronize()`` and ``step()`` (torch's
   ``clip_grad_norm_``, GradScaler's ``unscale_`` and inf check) sees what it sees there,
   alike on every rank. ``step()`` then takes this rank's range out of it.
2. ``step()``: takes back into the bucket a parameter whose ``.data`` was replaced since (in-place
   edits, e.g. a broadcast, are there already), mirrors each param group's current
   hyperparameters into its buckets' inner groups (LR schedulers edit ``param_groups``), runs
   the inner optimizer on the shards (with GradScaler's ``grad_scale``/``found_inf`` when a
   fused optimizer was handed them), and gathers the updated shards into the buckets' storage,
   so into the parameters, in one grouped collective (the same choice as step 1).

When the set of parameters requiring a gradient changes (freezing, ``add_param_group``), the
next ``synchronize()`` or ``step()`` gathers the state (one allgather) and rebuilds the buckets;
the state of frozen parameters is kept whole on every rank until they train again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os

import torch

from horovodlite._extension import load
from horovodlite.common.exceptions import HorovodArgumentError
from horovodlite.common.process_sets import _id_of
from horovodlite.common.reduce_ops import Average, Sum
from horovodlite.torch import summary
from horovodlite.torch.collectives import grouped_allgather_async, grouped_reducescatter_async
from horovodlite.torch.distributed_optimizer import _refuse_unreduced_inf_check
from horovodlite.torch.mpi_ops import grouped_allreduce_async_, synchronize
from horovodlite.torch.shard_layout import ShardLayout, check_elementwise
from horovodlite.torch.sharded_checkpoints import ShardedCheckpoints
from horovodlite.torch.sharded_clip import ShardedClipping
from horovodlite.torch.sharded_overlap import ShardedOverlap, overlap_limit
from horovodlite.torch.sharded_state import (
    from_torch,
    signature,
    to_shard,
)

_C = load()

MODES = ("optimizer_state", "gradients")
# How the flat vectors travel. "allreduce": the gradients are allreduced in place and each rank
# keeps its range; the parameters travel as an allreduce (Sum) of a zeroed vector holding each
# rank's range (adding zeros is exact, so this is an allgather). Twice the volume of
# "reducescatter" (one reducescatter, one allgather), but this library's allreduce is much faster
# than its reducescatter and allgather on one host (docs/sharded_optimizer.md), and the gradients
# are then reduced exactly as the unsharded optimizer's fused allreduce reduces them.
COLLECTIVES = ("allreduce", "reducescatter")
# A bucket's largest size in bytes (HOROVOD_SHARDED_BUCKET_BYTES; DDP's bucket_cap_mb default):
# with shard="gradients" a bucket's gradients are freed once its allreduces ended (polled during
# backward, sharded_overlap.py). A larger parameter is a bucket alone.
BUCKET_BYTES = 25 * 2 ** 20


@dataclasses.dataclass(eq=False)
class _Bucket:
    group: int  # index into param_groups
    params: list
    layout: ShardLayout
    params_flat: torch.Tensor  # the parameters' storage: each parameter's .data is a view of it
    shard: torch.Tensor  # this rank's range of params_flat: the inner optimizer's parameter
    flat: torch.Tensor | None = None  # shard="optimizer_state": the kept flat gradient
    grad: torch.Tensor | None = None  # this rank's reduced range of the gradient


class _ShardedOptimizer(ShardedOverlap, ShardedClipping, ShardedCheckpoints):
    """Mixin in front of the wrapped optimizer's class (built as in ``optimizer.py``: the
    instance shares the wrapped optimizer's ``__dict__``). ``setup`` fills the ``_shard_*``
    attributes."""

    _step_supports_amp_scaling = False

    def _shard_setup(self, base, mode, op, prescale, postscale, process_set, prefix,
                     passes, names) -> None:
        self._shard_base = base
        self._shard_mode = mode
        self._shard_op = op
        self._shard_scale = (prescale, postscale)
        self.process_set = process_set
        self._shard_prefix = prefix
        self._shard_wire = os.environ.get("HOROVOD_SHARDED_COLLECTIVES", "allreduce")
        if self._shard_wire not in COLLECTIVES:
            raise HorovodArgumentError(
                f"HOROVOD_SHARDED_COLLECTIVES must be one of {', '.join(COLLECTIVES)}, got "
                f"{self._shard_wire!r}")
        cap = os.environ.get("HOROVOD_SHARDED_BUCKET_BYTES", str(BUCKET_BYTES))
        if not cap.isdigit() or int(cap) < 1:
            raise HorovodArgumentError(
                f"HOROVOD_SHARDED_BUCKET_BYTES must be a positive number of bytes, got {cap!r}")
        self._shard_cap = int(cap)
        self._overlap_limit = overlap_limit()  # HOROVOD_SHARDED_OVERLAP_BUCKETS
        self.backward_passes_per_step = passes
        self._shard_names = names or {}
        self._shard_steps = 0  # steps taken: a consolidated state_dict() is of one step
        self._shard_consolidated = None
        self._shard_buckets = []
        self._shard_inner = None
        self._shard_parked = {}  # param -> full state, for parameters not in a bucket
        self._shard_signature = None
        self._shard_synced = False
        states = from_torch(base.state_dict(self), self.param_groups) if self.state else {}
        self._shard_build(states)

    # ------------------------------------------------------------------------------ layout

    def _shard_active_signature(self) -> tuple:
        return tuple(tuple(id(p) for p in g["params"] if p.requires_grad)
                     for g in self.param_groups)

    def _shard_ranks(self) -> tuple:
        ps = self.process_set
        return (ps.size(), ps.rank()) if _id_of(ps) else (_C.size(), _C.rank())

    def _shard_build(self, states: dict) -> None:
        """Buckets and inner optimizer from per-parameter ``states`` (local: every rank builds
        the same layout from the same parameters and states). The number of ranks is read
        again, so loading a full state after an elastic reset lays it out over the ranks left."""
        self._overlap_refuse_rebuild()
        self._shard_size, self._shard_rank = self._shard_ranks()
        keyed: dict = {}
        seen = set()
        parked = {}
        for g, group in enumerate(self.param_groups):
            for p in group["params"]:
                if id(p) in seen:
                    continue
                seen.add(id(p))
                state = states.get(p, {})
                if not p.requires_grad:
                    if state:
                        parked[p] = state
                    continue
                keyed.setdefault((g, p.dtype, p.device, signature(state, p)), []).append(p)
        size, rank = self._shard_size, self._shard_rank
        buckets, inner_groups = [], []
        for (g, dtype, device, _), params in [(key, chunk) for key, ps in keyed.items()
                                              for chunk in _chunks(ps, self._shard_cap)]:
            layout = ShardLayout([p.numel() for p in params], size)
            params_flat = torch.empty(layout.padded, dtype=dtype, device=device)
            with torch.no_grad():
                layout.flatten([p.detach() for p in params], params_flat)
            for p, view in zip(params, layout.split(params_flat, [p.shape for p in params])):
                p.data = view
            lo, hi = layout.range(rank)
            b = _Bucket(g, params, layout, params_flat, params_flat[lo:hi])
            buckets.append(b)
            inner_groups.append({**self._shard_hyper(g), "params": [b.shard]})
        laid = {id(p) for b in buckets for p in b.params}
        for b in self._shard_buckets:  # parameters leaving the layout get storage of their own
            for p in b.params:
                if id(p) not in laid:
                    p.data = p.detach().clone()
        inner = self._shard_base(inner_groups) if buckets else None
        if inner is not None:
            for b in buckets:
                st = to_shard([states.get(p, {}) for p in b.params], b.params, b.layout, rank,
                              b.shard)
                if st:
                    inner.state[b.shard] = st
        self._shard_buckets, self._shard_inner, self._shard_parked = buckets, inner, parked
        self.state = inner.state if inner is not None else {}
        self._shard_signature = self._shard_active_signature()
        self._shard_synced = False
        self._overlap_attach()

    def _shard_hyper(self, g: int) -> dict:
        return {k: v for k, v in self.param_groups[g].items() if k != "params"}

    def _shard_refresh(self) -> None:
        """Rebuilds the layout (collective) when the parameters requiring a gradient changed."""
        if self._shard_active_signature() != self._shard_signature:
            self._shard_build(self._shard_collect())

    # ----------------------------------------------------------------------- gradients

    def _shard_reduce(self, agree: bool) -> None:
        """Step 1 of the protocol: reduce every bucket's flat gradient (COLLECTIVES). With
        ``agree`` (an explicit ``synchronize()``) every rank ends with the whole reduced
        gradient in ``.grad``, whatever the shard mode and collectives (``_shard_gather``)."""
        keep = self._shard_mode == "optimizer_state"
        if not self._shard_buckets:
            self._shard_synced = True
            return
        if self._shard_wire == "allreduce":
            # Started by the hooks during backward (sharded_overlap.py), the rest now; each
            # parameter's place in the flat vector is a tensor of its own, so from three ranks
            # on the ring sums the gradients exactly as the unsharded optimizer does.
            # shard="optimizer_state": each bucket's flat gradient; shard="gradients": its
            # parameters' reduced gradients, or None for a bucket retired during backward
            # (b.grad is its range already).
            retiring = self._overlap_early  # the same on every rank (see below)
            flats = self._overlap_finish()
            for bi, (b, flat) in enumerate(zip(self._shard_buckets, flats)):
                if keep:
                    self._shard_keep_flat(b, flat)
                elif flat is None:  # retired during backward: b.grad is the range
                    pass
                elif agree:  # the whole gradient stays in .grad; its range is taken at step()
                    b.grad = None
                    for p, g in zip(b.params, flat):
                        p.grad = g.view(p.shape)
                else:
                    b.grad = self._shard_range_of(bi, flat)
            # shard="gradients": a step without an explicit synchronize() lets the next one
            # retire buckets during backward; one with it keeps them whole until step(), as
            # code does the same every step. Some rank may have retired a bucket this step
            # only if ``retiring``: then an explicit synchronize() gathers every range.
            self._overlap_early = not keep and not agree
            gather = agree and not keep and retiring
        else:
            flats = [self._shard_flatten(b, keep) for b in self._shard_buckets]
            prescale, postscale = self._shard_scale
            outs = synchronize(grouped_reducescatter_async(
                flats, name=f"{self._shard_prefix}.grads", op=self._shard_op,
                process_set=self.process_set, prescale_factor=prescale,
                postscale_factor=postscale))
            for b, flat, out in zip(self._shard_buckets, flats, outs):
                if keep:
                    lo, hi = b.layout.range(self._shard_rank)
                    with torch.no_grad():
                        # Only this rank's range was reduced: the rest is this rank's own
                        # gradient, not the average; zeros instead (or the other ranks'
                        # ranges, _shard_gather).
                        flat[:lo].zero_()
                        flat[hi:].zero_()
                        if out.data_ptr() != flat[lo:hi].data_ptr():
                            flat[lo:hi].copy_(out)
                    self._shard_keep_flat(b, flat)
                else:
                    b.grad = out
            gather = agree
        if gather:
            self._shard_gather()
        self._shard_synced = True

    def _shard_keep_flat(self, b: _Bucket, flat: torch.Tensor) -> None:
        """``flat`` is bucket ``b``'s gradient: ``.grad`` of its parameters are views of it and
        ``b.grad`` is this rank's range."""
        lo, hi = b.layout.range(self._shard_rank)
        b.flat, b.grad = flat, flat[lo:hi]
        for p, view in zip(b.params, b.layout.split(flat, [p.shape for p in b.params])):
            p.grad = view

    def _shard_gather(self) -> None:
        """An explicit ``synchronize()`` where some rank holds only its range of the reduced
        gradient (the reducescatter; a bucket retired during backward): every rank's range
        into every rank's flat gradient (an allreduce-Sum of the ranges laid in zeros, which
        is exact: an allgather), so ``.grad`` is the whole reduced gradient on every rank, the
        same bits everywhere. Code written for the unsharded optimizer between
        ``synchronize()`` and ``step()`` - ``torch.nn.utils.clip_grad_norm_``, GradScaler's
        ``unscale_`` and inf check - then sees what it would see there, alike on every rank."""
        fulls = []
        for bi, b in enumerate(self._shard_buckets):
            lo, hi = b.layout.range(self._shard_rank)
            rng = b.grad if b.grad is not None else self._shard_range_from_params(bi)
            # shard="optimizer_state": the kept flat gradient, whose range b.grad is
            full = b.flat if self._shard_mode == "optimizer_state" else None
            with torch.no_grad():
                if full is None:
                    full = torch.empty(b.layout.padded, dtype=rng.dtype, device=rng.device)
                    full[lo:hi].copy_(rng)
                full[:lo].zero_()
                full[hi:].zero_()
            fulls.append(full)
        synchronize(grouped_allreduce_async_(fulls, name=f"{self._shard_prefix}.wholegrads",
                                             op=Sum, process_set=self.process_set))
        for b, full in zip(self._shard_buckets, fulls):
            self._shard_keep_flat(b, full)

    def _shard_range_from_params(self, bi: int) -> torch.Tensor:
        """This rank's range of bucket ``bi``'s gradient, copied out of its parameters'
        ``.grad`` as they are now (None: zeros)."""
        b = self._shard_buckets[bi]
        return self._shard_range_of(bi, [torch.zeros_like(p) if p.grad is None else p.grad
                                         for p in b.params])

    def _shard_flatten(self, b: _Bucket, keep: bool) -> torch.Tensor:
        """The reducescatter's input: the bucket's gradients end to end (zeros for a parameter
        without one); with shard="gradients" the parameters' own gradients are dropped."""
        flat = b.flat if keep and b.flat is not None else torch.empty(
            b.layout.padded, dtype=b.shard.dtype, device=b.shard.device)
        with torch.no_grad():
            b.layout.flatten([_dense(p.grad) for p in b.params], flat)
        if not keep:
            for p in b.params:
                p.grad = None
        return flat

    # -------------------------------------------------------------------------- public API

    def synchronize(self) -> None:
        """Reduces this step's gradients: afterwards the parameters' ``.grad`` hold the whole
        averaged gradient on every rank, the same bits everywhere, whatever ``shard`` and the
        collectives (see the module docstring), until ``step()``. Collective. Call it before
        clipping, ``scaler.unscale_(opt)`` or anything else that reads the reduced gradient.
        A second call before ``step()`` or ``zero_grad()`` does nothing (the gradients are
        reduced once)."""
        if self._shard_synced:
            return
        self._shard_refresh()
        self._shard_reduce(agree=True)

    @contextlib.contextmanager
    def skip_synchronize(self):
        """For code written for the unsharded optimizer: ``step()`` inside does not reduce
        again; ``synchronize()`` must have run since ``zero_grad()``."""
        if not self._shard_synced:
            raise HorovodArgumentError(
                "skip_synchronize(): call optimizer.synchronize() first; the sharded optimizer "
                "has not reduced this step's gradients")
        yield

    def step(self, closure=None):
        """Reduces (unless done since ``zero_grad()``), steps this rank's shards, allgathers the
        parameters. Collective."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if not self._shard_synced:
            _refuse_unreduced_inf_check(self)
            self._shard_refresh()
            self._shard_reduce(agree=False)
        self._shard_synced = False
        self._shard_steps += 1
        inner = self._shard_inner
        if inner is not None:
            with torch.no_grad():
                for bi, (b, group) in enumerate(zip(self._shard_buckets, inner.param_groups)):
                    group.update(self._shard_hyper(b.group))
                    self._shard_hold_params(b)
                    if b.grad is None:  # shard="gradients" after synchronize(): .grad is whole
                        b.grad = self._shard_range_from_params(bi)
                    b.shard.grad = b.grad
                    if self._shard_mode == "gradients":
                        b.flat = None
                        for p in b.params:
                            p.grad = None
                with _amp_scaling_passed_on(self, inner):
                    inner.step()
                for b in self._shard_buckets:
                    b.shard.grad = None
                    if self._shard_mode == "gradients":
                        b.grad = None
                self._shard_gather_params()
                # The parameters changed through views of their buckets' storage, which
                # autograd does not count: a graph kept from before the step must see it.
                torch.autograd.graph.increment_version(
                    [p for b in self._shard_buckets for p in b.params])
        summary.step_completed()
        return loss

    def _shard_hold_params(self, b: _Bucket) -> None:
        """Points a parameter whose ``.data`` was replaced since the layout was built (``p.data
        = t``) back at its place in the bucket, with the new values: the inner optimizer steps
        the bucket's storage. In-place edits (a broadcast, ``load_state_dict``) land there
        already."""
        for p, view in zip(b.params, b.layout.split(b.params_flat, [p.shape for p in b.params])):
            if p.data_ptr() != view.data_ptr():
                view.copy_(p.detach())
                p.data = view

    def _shard_gather_params(self) -> None:
        """Every rank's updated shard into every rank's parameters, in place in the buckets'
        storage."""
        name = f"{self._shard_prefix}.params"
        if self._shard_wire == "reducescatter":
            fulls = synchronize(grouped_allgather_async(
                [b.shard for b in self._shard_buckets], name=name, process_set=self.process_set))
            for b, full in zip(self._shard_buckets, fulls):
                b.params_flat.copy_(full)
            return
        # Sum of this rank's shard and zeros elsewhere: adding zeros is exact, so this is an
        # allgather (see COLLECTIVES).
        for b in self._shard_buckets:
            lo, hi = b.layout.range(self._shard_rank)
            b.params_flat[:lo].zero_()
            b.params_flat[hi:].zero_()
        synchronize(grouped_allreduce_async_([b.params_flat for b in self._shard_buckets],
                                             name=name, op=Sum, process_set=self.process_set))

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clears the gradients and restarts accumulation. Raises if this step's allreduces
        are in flight (call ``step()`` or ``synchronize()`` first)."""
        self._overlap_check_idle("zero_grad()")
        self._overlap_reset()
        self._shard_synced = False
        if self._shard_mode == "gradients":  # what a step that was skipped (GradScaler) kept
            for b in self._shard_buckets:
                b.grad = b.flat = None
        super().zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group) -> None:
        """Adds a param group; its parameters join the layout at the next step."""
        super().add_param_group(param_group)

    def set_backward_passes_per_step(self, passes: int) -> None:
        self.backward_passes_per_step = int(passes)


@contextlib.contextmanager
def _amp_scaling_passed_on(outer, inner):
    """A fused torch optimizer (``Adam(fused=True)``) sets ``_step_supports_amp_scaling``, so
    ``GradScaler.step`` does not skip an overflowing step itself: it sets ``grad_scale`` and
    ``found_inf`` on the optimizer it is given - this wrapper - and the optimizer's kernel
    skips (or unscales). The inner optimizer is the one that steps: it gets them too."""
    passed = [k for k in ("grad_scale", "found_inf") if k in outer.__dict__]
    for k in passed:
        setattr(inner, k, outer.__dict__[k])
    try:
        yield
    finally:
        for k in passed:
            inner.__dict__.pop(k, None)


def _dense(grad):
    """A sparse gradient (``nn.Embedding(sparse=True)``) as a dense one: the buckets hold
    dense gradients, and the element-wise optimizers give a dense gradient's result."""
    return grad.to_dense() if grad is not None and grad.is_sparse else grad


def _chunks(params: list, cap: int) -> list:
    """``params`` cut, in order, into runs of at most ``cap`` bytes (a larger one alone)."""
    out, run, size = [], [], 0
    for p in params:
        n = p.numel() * p.element_size()
        if run and size + n > cap:
            out.append(run)
            run, size = [], 0
        run.append(p)
        size += n
    return out + [run] if run else out


def check_sharding_args(optimizer, shard, compression, op, groups, num_groups,
                        sparse_as_dense) -> None:
    """Raises for an optimizer or option the sharded optimizer does not combine with."""
    from horovodlite.torch.compression import Compression
    if isinstance(optimizer, _ShardedOptimizer):
        raise HorovodArgumentError(
            "this optimizer is already a sharded DistributedOptimizer; wrap the plain one")
    if shard not in MODES:
        raise HorovodArgumentError(
            f"DistributedOptimizer: shard must be None, 'optimizer_state' or 'gradients', got "
            f"{shard!r}")
    if op not in (Average, Sum):
        raise HorovodArgumentError(
            f"DistributedOptimizer(shard={shard!r}) supports op=hvd.Average or hvd.Sum, got "
            f"{op!r}")
    if compression is not Compression.none:
        raise HorovodArgumentError(
            f"DistributedOptimizer(shard={shard!r}) does not compress gradients; use "
            "compression=hvd.Compression.none")
    if groups or num_groups:
        raise HorovodArgumentError(
            f"DistributedOptimizer(shard={shard!r}) buckets the parameters itself; groups= "
            "does not apply")
    if sparse_as_dense:
        raise HorovodArgumentError(
            f"DistributedOptimizer(shard={shard!r}) needs dense gradients; sparse_as_dense "
            "does not apply")
    try:
        check_elementwise(optimizer)
    except ValueError as exc:
        raise HorovodArgumentError(str(exc)) from None


__all__ = ["MODES", "check_sharding_args"]
