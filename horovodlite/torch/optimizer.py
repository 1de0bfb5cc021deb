"""``hvd.DistributedOptimizer``: wraps a ``torch.optim`` optimizer so that gradients are averaged
(or summed, or Adasum-combined) across ranks before each step.

How the object is built. ``DistributedOptimizer(opt, ...)`` returns a new object whose class is a
dynamic subclass of ``type(opt)`` with our mixin in front (so ``isinstance(result, type(opt))``
holds and every method we do not override is the wrapped optimizer's own), and whose instance
``__dict__`` *is* ``opt.__dict__``: the two objects share ``param_groups``, ``state``, defaults and
hooks, so a learning-rate scheduler attached to either one drives both. The wrapped class's
``__init__`` is not run again. What the mixin does at each step is described in
``distributed_optimizer.py`` (gradients) and ``adasum_optimizer.py`` (``op=hvd.Adasum``).
"""

from __future__ import annotations

import collections
import itertools
import warnings

import torch

from horovodlite.common.exceptions import HorovodArgumentError
from horovodlite.common.process_sets import ProcessSet, _id_of, global_process_set
from horovodlite.common.reduce_ops import Adasum, Average, Sum
from horovodlite.torch.adasum_optimizer import _AdasumDeltaOptimizer
from horovodlite.torch.buckets import BucketLayout, bucket_view_enabled, send_buckets_now
from horovodlite.torch.compression import Compression, PowerSGD
from horovodlite.torch.distributed_optimizer import _C, _check_passes, _DistributedOptimizer
from horovodlite.torch.in_flight import InFlight, hook_site
from horovodlite.torch.powersgd import PowerSGDState
from horovodlite.torch.sharded_optimizer import _ShardedOptimizer, check_sharding_args

# Per process set: how many DistributedOptimizers this process has created. Part of every
# collective's name, so two optimizers never share names (and ranks agree on them).
_optimizer_counts: dict[int, itertools.count] = collections.defaultdict(itertools.count)
_classes: dict[tuple, type] = {}


def _check_named_parameters(named_parameters, params) -> dict:
    """param -> name from ``named_parameters``; ValueError for a malformed sequence, duplicate
    names, a parameter under two names, or an optimized parameter missing from it."""
    pairs = list(named_parameters)
    for item in pairs:
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
                and isinstance(item[1], torch.Tensor)):
            raise HorovodArgumentError(
                "named_parameters should be a sequence of (name, parameter) tuples, usually "
                f"produced by model.named_parameters(); got an element {item!r:.80}"
            )
    counts = collections.Counter(name for name, _ in pairs)
    duplicates = sorted(name for name, n in counts.items() if n > 1)
    if duplicates:
        raise HorovodArgumentError(
            f"Parameter names in named_parameters must be unique; found duplicates: "
            f"{', '.join(duplicates)}"
        )
    names: dict = {}
    for name, p in pairs:
        if p in names:
            raise HorovodArgumentError(
                f"named_parameters gives one parameter two names: '{names[p]}' and "
                f"'{name}'; name each parameter once"
            )
        names[p] = name
    missing = [p for p in params if p not in names]
    if missing:
        shapes = ", ".join(str(list(p.shape)) for p in missing[:5])
        raise HorovodArgumentError(
            f"named_parameters was specified, but {len(missing)} parameter(s) of the optimizer "
            f"are not named in it (shapes {shapes}); pass the named_parameters() of the "
            "module(s) holding every parameter the optimizer updates"
        )
    return names


def _parse_groups(groups, num_groups, params) -> list:
    """``groups`` (int or list of lists of parameters; deprecated ``num_groups``) -> list of
    parameter lists, each non-empty."""
    if num_groups:
        warnings.warn("DistributedOptimizer(num_groups=...) is deprecated; use groups=",
                      DeprecationWarning, stacklevel=3)
        if groups is not None:
            raise HorovodArgumentError(
                "pass either groups= or the deprecated num_groups=, not both"
            )
        groups = num_groups
    if groups is None or (isinstance(groups, int) and not isinstance(groups, bool)
                          and groups == 0):
        return []
    if isinstance(groups, int) and not isinstance(groups, bool):
        if groups < 0:
            raise HorovodArgumentError(
                f"groups must be a positive int or a list of lists, got {groups}"
            )
        n = min(groups, len(params))
        size, extra = divmod(len(params), n)
        bounds = itertools.accumulate([0] + [size + (i < extra) for i in range(n)])
        bounds = list(bounds)
        return [params[bounds[i]:bounds[i + 1]] for i in range(n)]
    if not isinstance(groups, (list, tuple)) or not all(isinstance(g, (list, tuple))
                                                        for g in groups):
        raise HorovodArgumentError(
            "groups must be an int (number of groups) or a list of lists of "
            f"parameters, got {type(groups).__name__}"
        )
    known = set(params)
    placed: set = set()
    out = []
    for i, group in enumerate(groups):
        for p in group:
            if not isinstance(p, torch.Tensor) or p not in known:
                raise HorovodArgumentError(
                    f"groups[{i}] holds a tensor that is not a parameter of the "
                    "optimizer; groups may only list the optimizer's parameters"
                )
            if p in placed:
                raise HorovodArgumentError(
                    f"groups[{i}] repeats a parameter of shape {list(p.shape)} that "
                    "is already in a group; each parameter may be in one group"
                )
            placed.add(p)
        if group:
            out.append(list(group))
    return out


def _check_args(optimizer, compression, op, gradient_predivide_factor, process_set) -> None:
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise HorovodArgumentError(
            f"DistributedOptimizer wraps a torch.optim.Optimizer, got "
            f"{type(optimizer).__name__}"
        )
    if isinstance(optimizer, _DistributedOptimizer):
        raise HorovodArgumentError(
            "this optimizer is already a DistributedOptimizer; wrap the plain one"
        )
    if isinstance(optimizer, torch.optim.LBFGS):
        raise HorovodArgumentError(
            "DistributedOptimizer does not support LBFGS: it evaluates its "
            "closure several times per step, each needing reduced gradients"
        )
    if op not in (Average, Sum, Adasum):
        raise HorovodArgumentError(
            f"DistributedOptimizer: op must be hvd.Average, hvd.Sum or hvd.Adasum, "
            f"got {op!r}"
        )
    if gradient_predivide_factor != 1.0 and op != Average:
        raise HorovodArgumentError(
            "gradient_predivide_factor is only supported with op=hvd.Average, "
            f"got op={op!r}"
        )
    if not gradient_predivide_factor > 0:
        raise HorovodArgumentError(
            f"gradient_predivide_factor must be > 0, got {gradient_predivide_factor}"
        )
    if compression is Compression.powersgd:
        raise HorovodArgumentError(
            "compression=hvd.Compression.powersgd is the factory: call it, e.g. "
            "compression=hvd.Compression.powersgd(rank=4)")
    if not (hasattr(compression, "compress") and hasattr(compression, "decompress")):
        raise HorovodArgumentError(
            "compression must be hvd.Compression.none, .fp16, .bf16, .powersgd(...) or an "
            f"object with compress()/decompress(), got {compression!r}"
        )
    if isinstance(compression, PowerSGD) and op == Adasum:
        raise HorovodArgumentError(
            "DistributedOptimizer: compression=hvd.Compression.powersgd(...) does not combine "
            "with op=hvd.Adasum (Adasum combines whole parameter deltas); drop one of them")
    if not isinstance(process_set, ProcessSet):
        raise HorovodArgumentError(
            f"process_set must be a hvd.ProcessSet, got {type(process_set).__name__}"
        )
    _id_of(process_set)


def _native_hooks_enabled() -> bool:
    """HOROVOD_NATIVE_GRADIENT_HOOKS, as init parsed it (its default before init)."""
    return not _C.is_initialized() or bool(_C.config()["native_gradient_hooks"])


def _dynamic_class(base: type, mixin: type) -> type:
    key = (base, mixin)
    if key not in _classes:
        _classes[key] = type(base.__name__, (mixin, base), {"__module__": base.__module__,
                                                            "__qualname__": base.__qualname__})
    return _classes[key]


def _share_dict(optimizer, cls):
    """A new instance of ``cls`` whose ``__dict__`` is ``optimizer.__dict__``."""
    obj = cls.__new__(cls)
    obj.__dict__ = optimizer.__dict__
    if hasattr(optimizer, "_hvd_hooks"):  # the plain optimizer was wrapped before: retire that
        _DistributedOptimizer._hvd_remove_hooks(obj)
    patched = optimizer.__dict__.get("step")
    if getattr(patched, "_wrapped_by_lr_sched", False):
        # An LR scheduler replaced ``optimizer.step`` by an instance attribute calling the plain
        # step; in the shared dict it would bypass ours. Keep its bookkeeping, call ours.
        def step(*args, **kwargs):
            obj._opt_called = True
            return cls.step(obj, *args, **kwargs)

        step._wrapped_by_lr_sched = True
        obj.__dict__["step"] = step
    return obj


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False,
                         process_set=global_process_set, shard=None, bucket_view=None,
                         find_unused_parameters=False):
    """Wraps ``optimizer`` so that every ``step()`` uses gradients reduced across ranks.

    Args:
        named_parameters: ``model.named_parameters()``; names the allreduces (timeline, errors).
            Must name every optimized parameter once. Without it, names are generated in
            param-group order, identically on every rank.
        compression: ``hvd.Compression.none/fp16/bf16``: dtype of gradients on the wire;
            ``hvd.Compression.powersgd(rank=4, warmup_steps=10, error_feedback=True)``: a
            low-rank approximation of each gradient matrix (not with ``shard=`` or Adasum).
        backward_passes_per_step: backward passes accumulated locally (summed) before one
            allreduce.
        op: ``hvd.Average`` (default), ``hvd.Sum``, or ``hvd.Adasum`` (Adasum delta optimizer:
            each rank takes a local step and the parameter deltas are Adasum-combined).
        gradient_predivide_factor: with Average, scale by 1/f before and f/size after the sum.
        groups: int n (parameters split in order into n groups) or a list of lists of
            parameters; each group is reduced as one fused grouped allreduce once all its
            members are ready.
            ``num_groups`` is the deprecated spelling of an int ``groups``.
        sparse_as_dense: densify sparse gradients and allreduce them; otherwise they are
            allgathered. The reduced gradient stays dense, except for ``torch.optim.SparseAdam``
            (which takes sparse gradients only): it gets it back sparse, with the rows that are
            non-zero after the reduction.
        process_set: the ranks that train together. On a rank outside it the optimizer steps on
            this rank's own gradients without communication (as in Horovod), so one script can
            train several groups of ranks separately.
        shard: None (default), ``"optimizer_state"`` or ``"gradients"``: each rank keeps the
            optimizer state (and, with ``"gradients"``, the reduced gradients) of 1/N of the
            parameters; see docs/sharded_optimizer.md and ``sharded_optimizer.py``. On a
            rank outside ``process_set`` there is nothing to shard: it gets the optimizer that
            steps on its own gradients (the options are checked all the same).
        bucket_view: gradients live in flat buckets their allreduce runs on in place
            (docs/bucket_views.md). None (default): ``HOROVOD_BUCKET_VIEW`` (default on).
        find_unused_parameters: False (default, as Horovod): a parameter without a gradient on
            a rank is reduced as zeros, and one that no rank used gets a zero gradient and is
            stepped (weight decay, momentum move it). True (as DDP's option of that name): the
            ranks also agree at each ``synchronize()`` (one small allreduce) which parameters
            no rank gave a gradient, and those keep ``.grad = None``, so the optimizer skips
            them as one process would. Not with ``shard=`` or ``op=hvd.Adasum``.

    Returns an instance of ``type(optimizer)`` sharing its param groups and state.
    """
    _check_args(optimizer, compression, op, gradient_predivide_factor, process_set)
    _check_passes(backward_passes_per_step)
    _check_find_unused(find_unused_parameters, shard, op)
    bucket_view = bucket_view_enabled(bucket_view)
    send_now = send_buckets_now()
    if shard is not None:
        check_sharding_args(optimizer, shard, compression, op, groups, num_groups,
                            sparse_as_dense)
    # Outside the process set nothing is reduced, so nothing is sharded either: the optimizer
    # steps on this rank's own gradients, with its whole state, as without shard= (one script
    # can shard in some groups of ranks and train others alone).
    if shard is not None and process_set.included():
        return _sharded(optimizer, named_parameters, compression, backward_passes_per_step, op,
                        gradient_predivide_factor, num_groups, groups, sparse_as_dense,
                        process_set, shard)
    cls = _dynamic_class(type(optimizer),
                         _AdasumDeltaOptimizer if op == Adasum else _DistributedOptimizer)
    if op == Adasum:
        _AdasumDeltaOptimizer._hvd_check_size(process_set)
    params = _DistributedOptimizer._hvd_params(optimizer)
    named = None if named_parameters is None else _check_named_parameters(named_parameters, params)
    group_lists = _parse_groups(groups, num_groups, params)
    obj = _share_dict(optimizer, cls)  # only once every argument is known to be valid
    ps_id = _id_of(process_set)
    count = next(_optimizer_counts[ps_id])
    prescale = 1.0 / gradient_predivide_factor if op == Average else 1.0
    postscale = gradient_predivide_factor if op == Average else 1.0
    local = not process_set.included()  # outside the set: no communication at all
    reducer = None
    if (not local and compression is Compression.none and op != Adasum
            and _native_hooks_enabled()):
        reducer = _C.GradReducer(op, prescale, postscale, ps_id, int(backward_passes_per_step),
                                 hook_site)
        reducer.set_send_buckets_now(send_now)
    native = []  # parameters on the C++ reducer, by its index
    state = dict(
        backward_passes_per_step=int(backward_passes_per_step),
        op=op,
        gradient_predivide_factor=float(gradient_predivide_factor),
        sparse_as_dense=bool(sparse_as_dense),
        process_set=process_set,
        _parameter_names={},
        _hvd_negotiated={},  # param -> the name its allreduce negotiates (allreduce_inplace)
        _hvd_named=named,
        _hvd_next_index=0,
        _hvd_prefix=f"grad.opt{count}" + (f".ps{ps_id}" if ps_id else ""),
        _hvd_compression=compression,
        _hvd_powersgd=(PowerSGDState(compression, process_set)
                       if isinstance(compression, PowerSGD) and not local else None),
        _hvd_prescale=prescale,
        _hvd_postscale=postscale,
        _hvd_groups=group_lists,
        _hvd_group_of={p: i for i, g in enumerate(group_lists) for p in g},
        _hvd_hooks={},
        _hvd_signature=None,  # the ids of the param groups' parameters at the last scan
        _hvd_unhooked=[],  # parameters seen without a hook (not requiring grad then)
        _hvd_delay={},
        _hvd_reducer=reducer,  # _C.GradReducer: the C++ hooks of the common case, or None
        _hvd_native=native,
        _hvd_python=[],  # parameters on Python hooks
        _hvd_device=-1,  # the CUDA device the reducer takes gradients on (-1: none yet)
        _hvd_pending=InFlight(reducer, native),
        _hvd_site=None,  # file:line of this step's backward, found once per step
        _hvd_sparse_seen={},
        # SparseAdam takes sparse gradients only: sparse_as_dense hands them back sparse.
        _hvd_resparsify=bool(sparse_as_dense) and isinstance(obj, torch.optim.SparseAdam),
        _hvd_should_sync=True,
        _hvd_fresh_sync=False,
        _hvd_local=local,
        _hvd_find_unused=bool(find_unused_parameters),
        # Bucket views (buckets.py): only on the C++ reducer's path.
        _hvd_buckets=BucketLayout(bucket_view and reducer is not None,
                                  f"grad.opt{count}" + (f".ps{ps_id}" if ps_id else ""),
                                  process_set, _buckets_off_reason(bucket_view, reducer, local,
                                                                   compression, op)),
    )
    obj.__dict__.update(state)
    obj._hvd_refresh()
    return obj


def _buckets_off_reason(bucket_view, reducer, local, compression, op) -> str:
    """Why the gradients of this optimizer do not live in buckets (when they do not)."""
    if not bucket_view:
        return "turned off (bucket_view=False or HOROVOD_BUCKET_VIEW=0)"
    if local:
        return "this rank is outside the optimizer's process set (nothing is reduced)"
    if compression is not Compression.none:
        return f"compression={compression!r}: gradients are reduced one by one"
    if op == Adasum:
        return "op=hvd.Adasum reduces parameter deltas, not gradients"
    return "HOROVOD_NATIVE_GRADIENT_HOOKS=0: gradients are reduced one by one"


def _check_find_unused(find_unused, shard, op) -> None:
    if not isinstance(find_unused, bool):
        raise HorovodArgumentError(
            f"DistributedOptimizer: find_unused_parameters must be a bool, got {find_unused!r}")
    if find_unused and (shard is not None or op == Adasum):
        other = f"shard={shard!r}" if shard is not None else "op=hvd.Adasum"
        raise HorovodArgumentError(
            f"DistributedOptimizer: find_unused_parameters=True does not combine with {other} "
            "(it is built for the unsharded optimizer's Average and Sum); drop one of them")


def _sharded(optimizer, named_parameters, compression, passes, op, predivide, num_groups,
             groups, sparse_as_dense, process_set, shard):
    """``shard=...``: the sharded optimizer (sharded_optimizer.py), built as above."""
    params = _DistributedOptimizer._hvd_params(optimizer)
    named = None if named_parameters is None else _check_named_parameters(named_parameters, params)
    base = type(optimizer)
    obj = _share_dict(optimizer, _dynamic_class(base, _ShardedOptimizer))
    ps_id = _id_of(process_set)
    prefix = f"shard.opt{next(_optimizer_counts[ps_id])}" + (f".ps{ps_id}" if ps_id else "")
    prescale = 1.0 / predivide if op == Average else 1.0
    postscale = predivide if op == Average else 1.0
    obj._shard_setup(base, shard, op, prescale, postscale, process_set, prefix, int(passes),
                     named)
    return obj


__all__ = ["DistributedOptimizer"]
