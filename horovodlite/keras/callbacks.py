"""Horovod's Keras callbacks for Keras 3 (torch backend).

- ``BroadcastGlobalVariablesCallback(root_rank)``: the model's and the optimizer's variables
  from ``root_rank`` at the start of ``fit``. Keras builds both before ``on_train_begin``, so
  every rank takes its first step from the same weights and optimizer state.
- ``MetricAverageCallback()``: at each epoch's end, every metric in the logs (validation ones
  included) becomes its mean over the ranks, before the callbacks after it (checkpoints,
  early stopping, the History ``fit`` returns) read them. Put it before those.
- ``LearningRateScheduleCallback(initial_lr, multiplier, ...)``: the learning rate
  ``initial_lr * multiplier(epoch)`` in epochs ``[start_epoch, end_epoch)``, set at the first
  batch of each epoch (``staircase``) or at every batch with a fractional epoch.
- ``LearningRateWarmupCallback(initial_lr, warmup_epochs=5, ...)``: the gradual warmup of
  Goyal et al. ("Accurate, Large Minibatch SGD"), as Horovod documents it: with ``size`` ranks
  and ``epoch`` counted fractionally (``epoch + batch / steps_per_epoch``),
  ``lr(epoch) = initial_lr / size * ((size - 1) / warmup_epochs * epoch + 1)``, adjusted before
  every batch: ``initial_lr / size`` at the start, ``initial_lr`` once ``warmup_epochs`` end.

Momentum correction (both learning-rate callbacks, on by default): Keras's SGD keeps a velocity
that already includes the learning rate, so when the rate changes from ``old`` to ``new`` the
step taken right then uses momentum ``m * new / old`` (and ``m`` again afterwards), as in Goyal
et al. It applies to optimizers with a numeric ``momentum`` attribute.
"""

from __future__ import annotations

import numbers

import keras
import numpy as np
import torch

import horovodlite.torch as hvd
from horovodlite.keras.functions import broadcast_variables


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Broadcasts the model's and its optimizer's variables from ``root_rank`` when training
    starts. ``device`` is accepted for Horovod compatibility and unused."""

    def __init__(self, root_rank: int = 0, device: str = ""):
        super().__init__()
        self.root_rank = root_rank
        self.broadcast_done = False

    def _broadcast(self) -> None:
        variables = list(self.model.variables)
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is not None:
            variables += list(optimizer.variables)
        broadcast_variables(variables, self.root_rank)
        self.broadcast_done = True

    def on_train_begin(self, logs=None):
        if not self.broadcast_done:
            self._broadcast()


class MetricAverageCallback(keras.callbacks.Callback):
    """Averages the epoch's logged metrics over the ranks (in place, one allreduce)."""

    def __init__(self, device: str = ""):
        super().__init__()

    def on_epoch_end(self, epoch, logs=None):
        if not logs:
            return
        keys = sorted(k for k, v in logs.items() if _is_number(v))
        values = torch.tensor([float(logs[k]) for k in keys], dtype=torch.float64)
        # one collective for all of them; ranks logging different metrics fail naming the sizes
        mean = hvd.allreduce(values, op=hvd.Average, name=f"keras.metrics.epoch{epoch}")
        for k, v in zip(keys, mean.tolist()):
            logs[k] = v


def _is_number(v) -> bool:
    """A scalar log value: a Python or NumPy number, or a one-element tensor or array."""
    if isinstance(v, numbers.Number) and not isinstance(v, bool):
        return True
    return isinstance(v, (torch.Tensor, np.ndarray)) and v.size == 1 if isinstance(
        v, np.ndarray) else isinstance(v, torch.Tensor) and v.numel() == 1


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Sets the learning rate to ``initial_lr * multiplier(epoch)`` for epochs in
    ``[start_epoch, end_epoch)`` (``end_epoch=None``: to the end).

    multiplier: a number, or a function of the epoch (a float with ``staircase=False``).
    staircase: adjust once per epoch at its first batch; otherwise before every batch, with
        ``epoch + batch / steps_per_epoch``.
    momentum_correction: see the module's docstring.
    steps_per_epoch: batches per epoch; default: what ``fit`` says (``params["steps"]``).
    """

    def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None, staircase=True,
                 momentum_correction=True, steps_per_epoch=None):
        super().__init__()
        self.initial_lr = float(initial_lr)
        self.multiplier = multiplier if callable(multiplier) else (lambda epoch: multiplier)
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch = 0
        self._restore_momentum = None

    def _optimizer(self):
        return self.model.optimizer

    def on_train_begin(self, logs=None):
        if self.steps_per_epoch is None:
            self.steps_per_epoch = self.params.get("steps")
        if not self.staircase and not self.steps_per_epoch:
            raise ValueError(f"{type(self).__name__}: fit does not know its steps per epoch "
                             "(a generator without steps_per_epoch?); pass steps_per_epoch=")
        if isinstance(self._optimizer()._learning_rate,
                      keras.optimizers.schedules.LearningRateSchedule):
            raise ValueError(f"{type(self).__name__} sets the learning rate, but the optimizer "
                             "follows a LearningRateSchedule; give it a number")

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch

    def _in_range(self) -> bool:
        return self.current_epoch >= self.start_epoch and (
            self.end_epoch is None or self.current_epoch < self.end_epoch)

    def _set_lr(self, lr: float) -> None:
        optimizer = self._optimizer()
        old = float(keras.ops.convert_to_numpy(optimizer.learning_rate))
        optimizer.learning_rate = lr
        momentum = getattr(optimizer, "momentum", None)
        if (self.momentum_correction and isinstance(momentum, (int, float)) and momentum
                and old > 0 and lr != old):
            self._restore_momentum = momentum
            optimizer.momentum = momentum * lr / old

    def on_train_batch_begin(self, batch, logs=None):
        if not self._in_range():
            return
        if self.staircase:
            if batch == 0:
                self._set_lr(self.initial_lr * self.multiplier(self.current_epoch))
        else:
            epoch = self.current_epoch + batch / self.steps_per_epoch
            self._set_lr(self.initial_lr * self.multiplier(epoch))

    def on_train_batch_end(self, batch, logs=None):
        if self._restore_momentum is not None:
            self._optimizer().momentum = self._restore_momentum
            self._restore_momentum = None


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Gradual warmup from ``initial_lr / size`` to ``initial_lr`` over ``warmup_epochs``,
    adjusted before every batch (the formula is in the module's docstring). ``verbose``:
    print when the warmup ends (rank 0)."""

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True,
                 steps_per_epoch=None, verbose=0):
        size = hvd.size()

        def multiplier(epoch):
            return 1.0 / size * (epoch * (size - 1) / warmup_epochs + 1)

        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs,
                         staircase=False, momentum_correction=momentum_correction,
                         steps_per_epoch=steps_per_epoch)
        self.warmup_epochs = warmup_epochs
        self.verbose = verbose

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.warmup_epochs - 1:
            # the formula at epoch == warmup_epochs: the full rate, from the next batch on
            self._optimizer().learning_rate = self.initial_lr
            if self.verbose and hvd.rank() == 0:
                print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to "
                      f"{self.initial_lr:g}.")


__all__ = ["BroadcastGlobalVariablesCallback", "MetricAverageCallback",
           "LearningRateScheduleCallback", "LearningRateWarmupCallback"]
