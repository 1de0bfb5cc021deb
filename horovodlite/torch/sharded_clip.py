"""Gradient clipping for the sharded optimizer (sharded_optimizer.py), equal to
``torch.nn.utils.clip_grad_norm_`` on the unsharded optimizer's gradients wherever some rank
holds the whole reduced gradient when the norm is taken (docs/sharded_optimizer.md)."""

from __future__ import annotations

import functools
import math

import torch

from horovodlite.common.reduce_ops import Max, Sum
from horovodlite.torch.mpi_ops import allreduce
from horovodlite.torch.sharded_state import index_params


class ShardedClipping:
    """A mixin of ``_ShardedOptimizer``: ``clip_grad_norm_`` and what it reads (the buckets,
    the wire, the norm ``synchronize()`` took for ``shard="gradients"``)."""

    def _shard_params(self) -> list:
        """The parameters in the buckets, in the order of the param groups (the order in which
        torch.nn.utils.clip_grad_norm_(model.parameters()) sees them for one param group)."""
        mine = {id(p) for b in self._shard_buckets for p in b.params}
        return [p for p in index_params(self.param_groups) if id(p) in mine]

    def _shard_full_grads(self, grads) -> list:
        """The parameters' whole reduced gradients (``grads``: a list per bucket, in its
        order), in ``_shard_params()`` order."""
        whole = {id(p): g for b, gs in zip(self._shard_buckets, grads)
                 for p, g in zip(b.params, gs)}
        return [whole[id(p)] for p in self._shard_params()]

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0,
                        error_if_nonfinite: bool = False,
                        foreach: bool | None = None) -> torch.Tensor:
        """Clips the reduced gradient by its norm over the whole model, as
        ``torch.nn.utils.clip_grad_norm_`` on the unsharded optimizer's gradients (the
        parameters taken in the order of the param groups); returns the total norm, the same on
        every rank. Synchronizes first if needed.

        With the default collectives (HOROVOD_SHARDED_COLLECTIVES=allreduce) the result is
        torch's to the bit: with ``shard="optimizer_state"`` the parameters' ``.grad`` hold the
        whole reduced gradient and this calls ``torch.nn.utils.clip_grad_norm_`` on them (no
        communication); with ``shard="gradients"`` the L2 norm (``norm_type=2``) was taken by
        ``synchronize()`` before the whole gradient was dropped. The inf norm is exact
        everywhere (one scalar allreduce of the ranks' maxima). Otherwise (other norm types
        with ``shard="gradients"``, a gradient edited since ``synchronize()`` - by GradScaler's
        ``unscale_`` -, a second clip in one step, the reducescatter collectives, buckets
        retired during backward because the step before had no explicit ``synchronize()``)
        the norm is formed from the ranks' ranges in float64 (one scalar allreduce) and may
        differ from torch's in its last bits."""
        if not self._shard_synced:
            self.synchronize()
        norm_type = float(norm_type)
        if self._shard_mode == "optimizer_state" and self._shard_wire == "allreduce":
            return torch.nn.utils.clip_grad_norm_(self._shard_params(), max_norm, norm_type,
                                                  error_if_nonfinite, foreach)
        grads = [b.grad for b in self._shard_buckets]
        total, self._shard_norm = self._shard_norm, None
        if total is not None and norm_type == 2.0:
            total = self._shard_cached_or_ranges(total, grads)
        else:
            total = self._shard_norm_of_ranges(grads, norm_type)
        if error_if_nonfinite and torch.logical_or(total.isnan(), total.isinf()):
            raise RuntimeError(f"The total norm of order {norm_type} of the gradients is "
                               "non-finite, so it cannot be clipped")
        if grads:
            # torch's expression and ops (torch.nn.utils.clip_grads_with_norm_), on the ranges.
            clip_coef = float(max_norm) / (total + 1e-6)
            clip_coef_clamped = torch.clamp(clip_coef, max=1.0)
            with torch.no_grad():
                by_device: dict = {}
                for g in grads:
                    by_device.setdefault(g.device, []).append(g)
                for device, gs in by_device.items():
                    torch._foreach_mul_(gs, clip_coef_clamped.to(device))
        return total

    @staticmethod
    def _shard_sumsq(grads) -> float:
        """This rank's sum of squares of ``grads``, in float64."""
        return float(sum((g.detach().double().pow(2).sum() for g in grads),
                         torch.zeros((), dtype=torch.float64)))

    def _shard_cached_or_ranges(self, cached: torch.Tensor, grads) -> torch.Tensor:
        """The L2 norm ``synchronize()`` took (torch's, exact), unless some rank's range was
        edited since (GradScaler's unscale_, which torch does not count as a new version). One
        allreduce of a few scalars tells every rank alike. Each rank's sum of squares moved by
        a power of four (4**0 when not edited) when its range was multiplied by a power of two
        (unscale_ with GradScaler's scales), exactly: when every rank's moved by the same one,
        the cached norm times that power of two is torch's norm of the edited gradient, to the
        bit. Any other edit: the norm of the ranges as they are (summed in float64)."""
        now, ref = self._shard_sumsq(grads), self._shard_norm_ranges
        power, counted, other = 0, 0, 0  # a range of zeros before and after: neither
        if ref is not None and 0 < ref < math.inf and 0 < now < math.inf:
            mantissa, exponent = math.frexp(now / ref)
            if mantissa == 0.5 and (exponent - 1) % 2 == 0:  # the ratio is 4**power
                power, counted = (exponent - 1) // 2, 1
            else:
                other = 1
        elif not (ref == 0 and now == 0):  # no reference, or an inf/nan
            other = 1
        # every counted rank has the same power iff n * sum(k^2) == sum(k)^2 (exact integers)
        sums = allreduce(torch.tensor([float(other), float(counted), float(power),
                                       float(power * power), now], dtype=torch.float64),
                         op=Sum, process_set=self.process_set, name=f"{self._shard_prefix}.norm")
        others, n, s1, s2, now_sum = (float(v) for v in sums)
        if not others and n > 0 and n * s2 == s1 * s1:
            return cached * math.ldexp(1.0, int(s1 / n))
        return torch.tensor(now_sum ** 0.5, dtype=cached.dtype, device=cached.device)

    def _shard_norm_of_ranges(self, grads, norm_type: float) -> torch.Tensor:
        """The ``norm_type`` norm of the reduced gradient from every rank's range (one scalar
        allreduce), in the dtype torch's norm has. The inf norm is exact (a maximum); the others
        are summed in float64 in another order than torch's."""
        dtype = functools.reduce(torch.promote_types, [g.dtype for g in grads], torch.float32)
        if norm_type == math.inf:
            local = max((g.detach().abs().max().double() for g in grads),
                        default=torch.zeros((), dtype=torch.float64))
            total = allreduce(local.reshape(1), op=Max, process_set=self.process_set,
                              name=f"{self._shard_prefix}.norm")[0]
        else:
            local = sum((g.detach().double().abs().pow(norm_type).sum() for g in grads),
                        torch.zeros((), dtype=torch.float64))
            total = allreduce(local.reshape(1), op=Sum, process_set=self.process_set,
                              name=f"{self._shard_prefix}.norm")[0] ** (1.0 / norm_type)
        device = grads[0].device if grads else torch.device("cpu")
        return total.to(dtype=dtype, device=device)


def total_norm(grads: list, norm_type: float) -> torch.Tensor:
    """The total norm of ``grads`` exactly as ``torch.nn.utils.clip_grad_norm_`` takes it."""
    get = getattr(torch.nn.utils, "get_total_norm", None)  # torch >= 2.6
    if get is not None:
        return get(grads, norm_type)
    if not grads:  # torch < 2.6: its per-tensor norms on one device and dtype, then theirs
        return torch.tensor(0.0)
    first = grads[0].device
    norms = [torch.linalg.vector_norm(g, norm_type).to(first) for g in grads]
    return torch.linalg.vector_norm(torch.stack(norms), norm_type)


__all__ = ["ShardedClipping", "total_norm"]
