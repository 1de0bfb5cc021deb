"""``hvd.DistributedOptimizer`` for Keras 3 on the torch backend.

Keras's torch trainer runs ``loss.backward()`` and hands the gradients, torch tensors, to
``optimizer.apply(grads, variables)``. The wrapper steps in there:

1. accumulation: with ``backward_passes_per_step=k`` the gradients of k calls are summed
   locally (divided by k with ``average_aggregated_gradients``); the first k-1 calls return
   without updating anything (and without advancing ``optimizer.iterations``);
2. reduction: the dense gradients go out as one fused ``hvd.grouped_allreduce`` (compressed
   with ``compression`` on the wire), sparse ones as an allgather of their indices and values
   (``hvd.sparse_allreduce_async``) unless ``sparse_as_dense``; every rank calls ``apply`` in
   the same order, so the collectives match by order;
3. the wrapped optimizer's own ``apply`` with the reduced gradients (loss-scale unscaling,
   gradient accumulation of Keras's own, EMA and the update rule all stay Keras's).

Mixed precision. Under the ``mixed_float16`` dtype policy Keras's ``compile`` wraps the optimizer
in a ``LossScaleOptimizer``, whose ``apply`` checks the gradients for inf/nan and skips the
update - and so the inner optimizer's ``apply``, our reduction - where it finds one. Checked on
one rank's own gradients, one rank would skip a reduction the others wait in. So the reduction
goes in front of the check: a ``LossScaleOptimizer`` passed in is wrapped itself (the mixin
before its class: reduce, then check, alike on every rank), and under ``mixed_float16`` a plain
optimizer is put in a ``LossScaleOptimizer`` first (``compile`` then leaves it as it is). A
distributed optimizer that a ``LossScaleOptimizer`` wraps after all (the policy set after
``DistributedOptimizer``) raises at its first update, naming the fix.

How the object is built: as in horovodlite.torch, the result is an instance of a subclass of the
optimizer's own class with the mixin in front, sharing the optimizer's ``__dict__`` (variables,
learning rate, iterations): ``isinstance(opt, keras.optimizers.SGD)`` holds, an optimizer that
is already built keeps its state, and ``model.save`` writes it as the plain optimizer it wraps
(``load_model`` wraps it again).
"""

from __future__ import annotations

import itertools
import sys

import keras
import torch

import horovodlite.torch as hvd
from horovodlite.torch.compression import PowerSGD

_classes: dict = {}
_count = itertools.count()  # per process: names the collectives of each wrapped optimizer


class _DistributedOptimizer:
    """The mixin in front of the wrapped optimizer's class (see the module's docstring)."""

    def apply(self, grads, trainable_variables=None):
        _refuse_inside_loss_scaling(self)
        grads = list(grads)
        if self._hvd_passes > 1:
            grads = self._hvd_accumulate(grads)
            if grads is None:
                return None  # inside the accumulation window: no update yet
        if not self._hvd_local:
            grads = self._hvd_reduce(grads)
        return super().apply(grads, trainable_variables)

    def _hvd_accumulate(self, grads):
        """Adds this pass's gradients; on the k-th pass returns the sum (or the mean)."""
        if self._hvd_sum is None:
            self._hvd_sum = [None if g is None else g.detach().clone() for g in grads]
        else:
            if len(grads) != len(self._hvd_sum):
                raise ValueError(
                    f"DistributedOptimizer: {len(grads)} gradients in this pass, "
                    f"{len(self._hvd_sum)} in the previous ones of the accumulation window")
            for acc, g in zip(self._hvd_sum, grads):
                if acc is not None and g is not None:
                    acc.add_(g)
        self._hvd_seen += 1
        if self._hvd_seen < self._hvd_passes:
            return None
        out, self._hvd_sum, self._hvd_seen = self._hvd_sum, None, 0
        if self._hvd_average_aggregated:
            out = [None if g is None else g / self._hvd_passes for g in out]
        return out

    def _hvd_reduce(self, grads) -> list:
        """The gradients reduced over the process set: dense ones fused into one grouped
        allreduce, sparse ones by allgather (or densified with sparse_as_dense). ``None``
        stays ``None`` (a variable without a gradient must have none on every rank)."""
        out = list(grads)
        dense = []
        for i, g in enumerate(grads):
            if g is None:
                continue
            if g.is_sparse and not self._hvd_sparse_as_dense:
                out[i] = hvd.sparse_allreduce_async(
                    g, name=f"{self._hvd_name}.sparse.{i}", op=self._hvd_op,
                    process_set=self._hvd_process_set)
            else:
                dense.append(i)
        if dense:
            tensors = [grads[i].to_dense() if grads[i].is_sparse else grads[i] for i in dense]
            reduced = hvd.grouped_allreduce(
                [t.contiguous() for t in tensors], name=f"{self._hvd_name}.dense",
                compression=self._hvd_compression, op=self._hvd_op,
                prescale_factor=self._hvd_prescale, postscale_factor=self._hvd_postscale,
                process_set=self._hvd_process_set)
            for i, r in zip(dense, reduced):
                out[i] = r
        for i, g in enumerate(out):
            if callable(g) and not isinstance(g, torch.Tensor):
                out[i] = g().to_dense()  # Keras's torch optimizers update densely
        return out


def _refuse_inside_loss_scaling(opt) -> None:
    """Raises when ``opt`` is the inner optimizer of a LossScaleOptimizer (see the module's
    docstring): the caller a few frames up is a LossScaleOptimizer holding it."""
    frame = sys._getframe(2)
    for _ in range(4):
        if frame is None:
            return
        outer = frame.f_locals.get("self")
        if (isinstance(outer, keras.optimizers.LossScaleOptimizer) and outer is not opt
                and getattr(outer, "inner_optimizer", None) is opt):
            raise hvd.HorovodArgumentError(
                f"rank {hvd.rank()}: a keras LossScaleOptimizer wraps hvd.DistributedOptimizer "
                "(the mixed_float16 dtype policy was set after it was made, and compile() "
                "wrapped it): the loss scaler checks each rank's own gradients before they are "
                "reduced, so ranks would skip different steps. Set the policy before "
                "hvd.DistributedOptimizer(...), or pass it a "
                "keras.optimizers.LossScaleOptimizer")
        frame = frame.f_back


def _loss_scaled(optimizer):
    """Under the mixed_float16 policy, a plain optimizer in a LossScaleOptimizer (what
    compile() would do, but with the reduction in front of its check)."""
    if (keras.config.dtype_policy().name == "mixed_float16"
            and not isinstance(optimizer, keras.optimizers.LossScaleOptimizer)):
        return keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer


def _dynamic_class(base: type) -> type:
    if base not in _classes:
        _classes[base] = type(base.__name__, (_DistributedOptimizer, base),
                              {"__module__": base.__module__, "__qualname__": base.__qualname__})
    return _classes[base]


def DistributedOptimizer(optimizer, name=None, compression=hvd.Compression.none,
                         sparse_as_dense: bool = False, gradient_predivide_factor: float = 1.0,
                         op=hvd.Average, backward_passes_per_step: int = 1,
                         average_aggregated_gradients: bool = False,
                         process_set=hvd.global_process_set):
    """Wraps a ``keras.optimizers.Optimizer`` so that its gradients are reduced across ranks.

    Args:
        optimizer: any Keras 3 optimizer (built or not).
        name: prefix of the collectives' names (timeline, errors); default ``keras.opt<k>``.
        compression: ``hvd.Compression.none`` / ``.fp16`` / ``.bf16``: gradients on the wire.
        sparse_as_dense: reduce sparse gradients densely instead of by allgather.
        gradient_predivide_factor: with ``hvd.Average``, scale by 1/f before the sum and f/size
            after it.
        op: ``hvd.Average`` (default) or ``hvd.Sum``.
        backward_passes_per_step: gradients of this many ``apply`` calls (batches) are summed
            locally before one reduction and one update.
        average_aggregated_gradients: divide the accumulated sum by ``backward_passes_per_step``.
        process_set: the ranks that train together; a rank outside it updates on its own
            gradients without communication.

    Returns an instance of ``type(optimizer)`` sharing the optimizer's state; under the
    ``mixed_float16`` dtype policy, of a ``keras.optimizers.LossScaleOptimizer`` around it.
    """
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise ValueError(f"DistributedOptimizer wraps a keras.optimizers.Optimizer, got "
                         f"{type(optimizer).__name__}")
    if isinstance(optimizer, _DistributedOptimizer):
        raise ValueError("this optimizer is already a DistributedOptimizer; wrap the plain one")
    if op not in (hvd.Average, hvd.Sum):
        raise ValueError(f"DistributedOptimizer (Keras): op must be hvd.Average or hvd.Sum, "
                         f"got {op!r}")
    if gradient_predivide_factor != 1.0 and op != hvd.Average:
        raise ValueError("gradient_predivide_factor is only supported with op=hvd.Average")
    if not gradient_predivide_factor > 0:
        raise ValueError(f"gradient_predivide_factor must be > 0, got {gradient_predivide_factor}")
    if (isinstance(backward_passes_per_step, bool) or not isinstance(backward_passes_per_step, int)
            or backward_passes_per_step < 1):
        raise ValueError(f"backward_passes_per_step must be a positive int, got "
                         f"{backward_passes_per_step!r}")
    if not isinstance(process_set, hvd.ProcessSet):
        raise ValueError(f"process_set must be a hvd.ProcessSet, got {type(process_set).__name__}")
    if isinstance(compression, PowerSGD):
        raise ValueError(f"DistributedOptimizer (Keras): compression={compression!r} is built "
                         "for horovodlite.torch's DistributedOptimizer; use "
                         "hvd.Compression.none, .fp16 or .bf16")
    optimizer = _loss_scaled(optimizer)
    cls = _dynamic_class(type(optimizer))
    wrapped = cls.__new__(cls)
    state = dict(
        _hvd_name=name or f"keras.opt{next(_count)}",
        _hvd_compression=compression,
        _hvd_sparse_as_dense=bool(sparse_as_dense),
        _hvd_op=op,
        _hvd_prescale=1.0 / gradient_predivide_factor if op == hvd.Average else 1.0,
        _hvd_postscale=gradient_predivide_factor if op == hvd.Average else 1.0,
        _hvd_passes=backward_passes_per_step,
        _hvd_average_aggregated=bool(average_aggregated_gradients),
        _hvd_process_set=process_set,
        _hvd_local=not process_set.included(),
        _hvd_sum=None,
        _hvd_seen=0,
    )
    # Keras objects track what is assigned to them; these are plain values, set directly.
    optimizer.__dict__.update(state)
    object.__setattr__(wrapped, "__dict__", optimizer.__dict__)
    return wrapped


__all__ = ["DistributedOptimizer"]
