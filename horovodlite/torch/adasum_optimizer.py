"""``DistributedOptimizer(op=hvd.Adasum)``: the Adasum delta optimizer.

Adasum combines *updates*, not gradients: an optimizer such as Adam or momentum SGD turns a
gradient into a step non-linearly, and Adasum's benefit (orthogonal directions add, parallel ones
average) is meant for the steps each rank would take. So at ``step()``:

1. every rank snapshots the parameters that require a gradient and runs the wrapped optimizer's
   step on its *local* (unreduced, possibly accumulated) gradients;
2. ``delta = p_after - p_before`` is taken and ``p`` is put back to ``p_before``;
3. the deltas are Adasum-allreduced (``hvd.allreduce_async_(op=hvd.Adasum)``; all launched, then
   all waited for) and each rank applies the same combined delta, so parameters stay identical.

A parameter unused on this rank has a zero delta (the wrapped step skips it) and still takes part
in the collective; Adasum of a zero vector with ``b`` is ``b``. Gradient hooks only count
backward passes here (for ``backward_passes_per_step``); nothing is sent during backward, so
``synchronize()`` has nothing to do and is a no-op. The wrapped optimizer's step runs once over all
parameters (not once per parameter, as in Horovod), so optimizers with per-step bookkeeping
(Adam's step count, norms across parameters) behave as in a single process. Optimizer state
(momentum, Adam moments) stays local to each rank, as in Horovod. Needs a power-of-two number of
ranks in the process set (ValueError at construction otherwise).
"""

from __future__ import annotations

import torch

from horovodlite.torch.adasum import adasum_allreduce_async, check_adasum_size
from horovodlite.torch.distributed_optimizer import _DistributedOptimizer
from horovodlite.torch.submission import synchronize


class _AdasumDeltaOptimizer(_DistributedOptimizer):
    """Mixin for ``op=hvd.Adasum`` (see the module docstring)."""

    @staticmethod
    def _hvd_check_size(process_set) -> None:
        check_adasum_size(len(process_set.ranks), "DistributedOptimizer(op=hvd.Adasum)")

    def _hvd_on_ready(self, p) -> None:
        """Gradients stay local with Adasum: the deltas are combined in ``step()``."""

    def synchronize(self) -> None:
        """No-op for the Adasum delta optimizer: gradients are never reduced, ``step()``
        combines the parameter updates instead."""
        self._hvd_refresh()

    def step(self, closure=None):
        """Local step, then the Adasum combination of every rank's parameter delta."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._hvd_refresh()
        params = [p for p in self._hvd_params() if p.requires_grad]
        with torch.no_grad():
            before = [p.detach().clone() for p in params]
        super(_DistributedOptimizer, self).step()  # the wrapped optimizer's own step
        with torch.no_grad():
            launched = [self._hvd_launch_delta(p, b) for p, b in zip(params, before)]
            error = None
            for p, wire, ctx, handle in launched:
                try:
                    synchronize(handle)
                except Exception as exc:  # wait for every handle before raising
                    error = error or exc
                    continue
                p.add_(self._hvd_compression.decompress(wire, ctx))
        self._hvd_reset_counters()
        self._hvd_fresh_sync = False
        if error is not None:
            raise error
        return loss

    def _hvd_launch_delta(self, p, before):
        """Restores ``p`` to ``before`` and starts the Adasum allreduce of its local delta."""
        delta = p.detach() - before
        p.copy_(before)
        wire, ctx = self._hvd_compression.compress(delta)
        wire = wire.contiguous()
        handle = adasum_allreduce_async(wire, f"{self._hvd_wire_name(p)}.delta", 1.0, 1.0,
                                        self.process_set, inplace=True)
        return p, wire, ctx, handle


# See distributed_optimizer.py: the wrapped class's step already runs torch's step hooks.
_AdasumDeltaOptimizer.step.hooked = True

__all__: list = []
