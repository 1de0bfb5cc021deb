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
   views into it. After the allreduce every rank holds the whole reduced gradient (the same bits
   on every rank, as the unsharded optimizer's), so the flat vector keeps all of it: ``.grad``
   is the unsharded optimizer's gradient, and ``GradScaler`` or
   ``torch.nn.utils.clip_grad_norm_`` see it whole on every rank. After a reducescatter only
   this rank's range is reduced: the rest of the flat vector is zeroed. With
   ``shard="gradients"`` the gradients are freed once the range is copied out of them (bucket by
   bucket, during backward where it can: sharded_overlap.py) and ``.grad`` is None: only the
   reduced range stays. An explicit ``synchronize()`` keeps the range inside the span of the
   parameters crossing it and gives those parameters ``.grad`` views of it (``_shard_expose``),
   and over the allreduce first takes torch's L2 norm of the whole gradient (``clip_grad_norm_``
   uses it; a few scalars, no memory of the gradient's size), unless buckets were retired during
   backward (the step before had no explicit ``synchronize()``). Where ranks see different parts
   (the reducescatter, ``shard="gradients"``), an explicit ``synchronize()`` also agrees across
   ranks whether any reduced gradient is inf/nan (one scalar allreduce); if so, every rank
   writes a NaN into its range, so ``GradScaler``'s check, which then only sees this rank's
   part, finds it on every rank and all ranks skip the step and back off alike.
2. ``step()``: takes back into the bucket a parameter whose ``.data`` was replaced since (in-place
   edits, e.g. a broadcast, are there already), mirrors each param group's current
   hyperparameters into its buckets' inner groups (LR schedulers edit ``param_groups``), runs
   the inner optimizer on the shards, and gathers the updated shards into the buckets' storage,
   so into the parameters, in one grouped collective (the same choice as step 1).

When the set of parameters requiring a gradient changes (freezing, ``add_param_group``), the
next ``synchronize()`` or ``step()`` gathers the state (one allgather) and rebuilds the buckets;
the state of frozen parameters is kept whole on every rank until they train again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os

import torch

from horovodlite._extension import load
from horovodlite.common.exceptions import HorovodArgumentError
from horovodlite.common.process_sets import _id_of
from horovodlite.common.reduce_ops import Average, Max, Sum
from horovodlite.torch import summary
from horovodlite.torch.collectives import grouped_allgather_async, grouped_reducescatter_async
from horovodlite.torch.mpi_ops import allreduce, grouped_allreduce_async_, synchronize
from horovodlite.torch.shard_layout import ShardLayout, check_elementwise
from horovodlite.torch.sharded_checkpoints import ShardedCheckpoints
from horovodlite.torch.sharded_clip import ShardedClipping, total_norm
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
        self._shard_buckets = []
        self._shard_inner = None
        self._shard_parked = {}  # param -> full state, for parameters not in a bucket
        self._shard_signature = None
        self._shard_synced = False
        # shard="gradients": torch's L2 norm of the whole gradient, taken by the last reduction
        # (clip_grad_norm_ reads it only while _shard_synced, i.e. in the same step)
        self._shard_norm = None
        self._shard_norm_ranges = None  # this rank's ranges' sum of squares at that time
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
        """Step 1 of the protocol: reduce every bucket's flat gradient (COLLECTIVES)."""
        keep = self._shard_mode == "optimizer_state"
        self._shard_norm = None
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
            flats = self._overlap_finish()
            if agree and not keep and None not in flats:
                # shard="gradients": the whole reduced gradient exists only now. Its norm, as
                # torch.nn.utils.clip_grad_norm_ takes it, for clip_grad_norm_ (a few scalars).
                self._shard_norm = total_norm(self._shard_full_grads(flats), 2.0)
            outs = []
            for bi, (b, flat) in enumerate(zip(self._shard_buckets, flats)):
                if keep:
                    lo, hi = b.layout.range(self._shard_rank)
                    outs.append(flat[lo:hi])
                elif flat is None:  # retired during backward
                    outs.append(b.grad)
                elif agree:  # _shard_expose copies what it keeps from the gradients
                    outs.append(None)
                else:
                    outs.append(self._shard_range_of(bi, flat))
            # shard="gradients": a step without an explicit synchronize() lets the next one
            # retire buckets during backward; one with it keeps them whole until it (its
            # norm and .grad views need them), as code does the same every step.
            self._overlap_early = not keep and not agree
        else:
            sparse = self._shard_sparse_param()
            if sparse is not None:
                raise self._shard_sparse_error(sparse)
            flats = [self._shard_flatten(b, keep) for b in self._shard_buckets]
            prescale, postscale = self._shard_scale
            outs = synchronize(grouped_reducescatter_async(
                flats, name=f"{self._shard_prefix}.grads", op=self._shard_op,
                process_set=self.process_set, prescale_factor=prescale,
                postscale_factor=postscale))
        for b, flat, out in zip(self._shard_buckets, flats, outs):
            if not keep and agree:
                self._shard_expose(b, flat if self._shard_wire == "allreduce" else None, out)
                continue
            if keep:
                lo, hi = b.layout.range(self._shard_rank)
                with torch.no_grad():
                    if self._shard_wire != "allreduce":
                        # Only this rank's range was reduced: the rest is this rank's own
                        # gradient, not the average; zeros instead.
                        flat[:lo].zero_()
                        flat[hi:].zero_()
                    if out.data_ptr() != flat[lo:hi].data_ptr():
                        flat[lo:hi].copy_(out)
                b.flat, b.grad = flat, flat[lo:hi]
                for p, view in zip(b.params, b.layout.split(flat, [p.shape for p in b.params])):
                    p.grad = view
            else:
                b.grad = out
        if self._shard_norm is not None:  # what it was taken of: edits since make it stale
            self._shard_norm_ranges = self._shard_sumsq([b.grad for b in self._shard_buckets])
        if agree and (self._shard_wire != "allreduce" or not keep):
            # After an allreduce with shard="optimizer_state" every rank's .grad holds the same
            # whole reduced gradient, so every rank's checks (GradScaler's) see the same inf/nan;
            # otherwise each rank's .grad shows only its part of it.
            self._shard_agree_nonfinite()
        self._shard_synced = True

    def _shard_flatten(self, b: _Bucket, keep: bool) -> torch.Tensor:
        """The reducescatter's input: the bucket's gradients end to end (zeros for a parameter
        without one); with shard="gradients" the parameters' own gradients are dropped."""
        flat = b.flat if keep and b.flat is not None else torch.empty(
            b.layout.padded, dtype=b.shard.dtype, device=b.shard.device)
        with torch.no_grad():
            b.layout.flatten([p.grad for p in b.params], flat)
        if not keep:
            for p in b.params:
                p.grad = None
        return flat

    def _shard_expose(self, b: _Bucket, grads: list | None, out) -> None:
        """shard="gradients", explicit ``synchronize()``: keeps this rank's reduced range
        inside a copy of the span of the parameters crossing it (``ShardLayout.extent``), and
        gives those parameters ``.grad`` views of it: code that reads or edits ``.grad`` in
        place between ``synchronize()`` and ``step()`` (GradScaler's unscale_) reaches the range
        the inner optimizer steps with. The others keep no ``.grad``. The span is copied from
        the parameters' reduced ``grads``; where only the range ``out`` is known (after the
        reducescatter, or for a bucket retired during backward) the rest of it is zeros."""
        lo, hi = b.layout.range(self._shard_rank)
        elo, ehi = b.layout.extent(self._shard_rank)
        offsets, total = b.layout.offsets, b.layout.total
        with torch.no_grad():
            if grads is not None:
                kept = torch.empty(ehi - elo, dtype=b.shard.dtype, device=b.shard.device)
                for piece in b.layout.pieces(self._shard_rank):
                    i = piece.index
                    kept[offsets[i] - elo:offsets[i + 1] - elo].copy_(grads[i].reshape(-1))
                kept[max(total, elo) - elo:].zero_()  # padding, if the span reaches it
            else:
                kept = torch.zeros(ehi - elo, dtype=out.dtype, device=out.device)
                kept[lo - elo:hi - elo].copy_(out)
        b.grad = kept[lo - elo:hi - elo]
        for piece in b.layout.pieces(self._shard_rank):
            i = piece.index
            p = b.params[i]
            p.grad = kept[offsets[i] - elo:offsets[i + 1] - elo].view(p.shape)

    def _shard_agree_nonfinite(self) -> None:
        local = any(not bool(torch.isfinite(b.grad).all()) for b in self._shard_buckets)
        flag = allreduce(torch.tensor([float(local)]), op=Max,
                         name=f"{self._shard_prefix}.nonfinite", process_set=self.process_set)
        if flag.item() and not local:
            with torch.no_grad():
                for b in self._shard_buckets:
                    b.grad[0] = math.nan

    # -------------------------------------------------------------------------- public API

    def synchronize(self) -> None:
        """Reduces this step's gradients: afterwards this rank holds at least its range of the
        averaged gradient; with ``shard="optimizer_state"`` and the default collectives the
        parameters' ``.grad`` hold all of it (see the module docstring). Collective. Call it
        before ``scaler.unscale_(opt)`` or ``opt.clip_grad_norm_``."""
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
            self._shard_refresh()
            self._shard_reduce(agree=False)
        self._shard_synced = False
        inner = self._shard_inner
        if inner is not None:
            with torch.no_grad():
                for b, group in zip(self._shard_buckets, inner.param_groups):
                    group.update(self._shard_hyper(b.group))
                    self._shard_hold_params(b)
                    b.shard.grad = b.grad
                inner.step()
                for b in self._shard_buckets:
                    b.shard.grad = None
                    if self._shard_mode == "gradients":
                        b.grad = None
                        for p in b.params:
                            p.grad = None  # views of the kept span (_shard_expose), if any
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
        super().zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group) -> None:
        """Adds a param group; its parameters join the layout at the next step."""
        super().add_param_group(param_group)

    def set_backward_passes_per_step(self, passes: int) -> None:
        self.backward_passes_per_step = int(passes)


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
