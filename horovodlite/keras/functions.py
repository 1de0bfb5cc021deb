"""Collectives on Keras values, ``broadcast_variables`` and ``load_model``.

On the torch backend a Keras tensor is a torch tensor and a Keras variable holds a torch
parameter (``variable.value``), so each function converts its input with
``keras.ops.convert_to_tensor`` and calls horovodlite.torch's collective: there is no second
implementation of any of them here.
"""

from __future__ import annotations

import keras

import horovodlite.torch as hvd
from horovodlite.keras.optimizer import DistributedOptimizer


def allreduce(value, name=None, average=None, prescale_factor=1.0, postscale_factor=1.0,
              op=None, compression=hvd.Compression.none, process_set=hvd.global_process_set):
    """``value`` (a Keras/torch tensor, NumPy array or number) reduced over the ranks:
    averaged by default, or by ``op`` (``hvd.Sum``, ``hvd.Min``, ...). Returns a tensor."""
    return hvd.allreduce(keras.ops.convert_to_tensor(value), average=average, name=name,
                         compression=compression, op=op, prescale_factor=prescale_factor,
                         postscale_factor=postscale_factor, process_set=process_set)


def allgather(value, name=None, process_set=hvd.global_process_set):
    """Every rank's ``value`` concatenated along the first dimension (which may differ)."""
    return hvd.allgather(keras.ops.convert_to_tensor(value), name=name, process_set=process_set)


def broadcast(value, root_rank, name=None, process_set=hvd.global_process_set):
    """``root_rank``'s ``value`` on every rank."""
    return hvd.broadcast(keras.ops.convert_to_tensor(value), root_rank, name=name,
                         process_set=process_set)


def broadcast_variables(variables, root_rank: int) -> None:
    """Assigns ``root_rank``'s values to ``variables`` (Keras variables: ``model.variables``,
    ``optimizer.variables``) on every rank, in place. Every rank must pass the same list."""
    variables = list(variables)
    for v in variables:
        if not isinstance(v, keras.Variable):
            raise ValueError(f"broadcast_variables: expected Keras variables, got "
                             f"{type(v).__name__}")
    hvd.broadcast_parameters([(f"keras.{i}.{v.path}", v.value) for i, v in enumerate(variables)],
                             root_rank)


def load_model(filepath, custom_optimizers=None, custom_objects=None,
               compression=hvd.Compression.none, **optimizer_options):
    """``keras.saving.load_model`` whose compiled optimizer comes back wrapped in
    ``DistributedOptimizer`` (with ``compression`` and ``optimizer_options``), its state
    (iterations, momenta) as saved, so training resumes where it stopped.

    ``custom_optimizers``: optimizer classes of your own, to be found by name;
    ``custom_objects``: as Keras's.
    """
    objects = dict(custom_objects or {})
    for cls in custom_optimizers or ():
        objects[cls.__name__] = cls
    model = keras.saving.load_model(filepath, custom_objects=objects)
    if getattr(model, "optimizer", None) is not None:
        model.optimizer = DistributedOptimizer(model.optimizer, compression=compression,
                                               **optimizer_options)
    return model


__all__ = ["allreduce", "allgather", "broadcast", "broadcast_variables", "load_model"]
