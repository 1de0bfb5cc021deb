"""Gradient clipping for the sharded optimizer (sharded_optimizer.py): after ``synchronize()``
every rank's ``.grad`` holds the whole reduced gradient, so clipping is torch's own
``clip_grad_norm_`` on the unsharded optimizer's gradients (docs/sharded_optimizer.md)."""

from __future__ import annotations

import torch

from horovodlite.torch.sharded_state import index_params


class ShardedClipping:
    """A mixin of ``_ShardedOptimizer``: ``clip_grad_norm_``."""

    def _shard_params(self) -> list:
        """The parameters in the buckets, in the order of the param groups (the order in which
        torch.nn.utils.clip_grad_norm_(model.parameters()) sees them for one param group)."""
        mine = {id(p) for b in self._shard_buckets for p in b.params}
        return [p for p in index_params(self.param_groups) if id(p) in mine]

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0,
                        error_if_nonfinite: bool = False,
                        foreach: bool | None = None) -> torch.Tensor:
        """Clips the reduced gradient by its norm over the whole model and returns the total
        norm: ``torch.nn.utils.clip_grad_norm_`` on the parameters (taken in the order of the
        param groups), after ``synchronize()`` if it has not run this step. Every rank holds
        the same whole reduced gradient then, so the result is torch's on the unsharded
        optimizer's gradients, to the bit, and the same on every rank. No communication
        beyond ``synchronize()``'s."""
        self.synchronize()  # does nothing if it ran since zero_grad()
        return torch.nn.utils.clip_grad_norm_(self._shard_params(), max_norm, norm_type,
                                              error_if_nonfinite, foreach)


__all__ = ["ShardedClipping"]
