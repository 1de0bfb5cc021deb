"""``hvd.SyncBatchNorm``: batch normalization over the global batch of all ranks, on CPU and CUDA.

Forward (training). Each rank computes, per channel, its element count ``n_r``, mean ``m_r`` and
biased variance ``v_r``; one allgather of these ``2C + 1`` numbers per rank gives every rank all of
them, and every rank combines them the same way (Chan et al.'s parallel formula, numerically
stabler than a global sum of squares):

    N = sum n_r,   mean = sum n_r m_r / N,   var = sum n_r (v_r + (m_r - mean)^2) / N

Ranks may hold different batch sizes (even empty ones). The output is ``(x - mean) / sqrt(var +
eps) * weight + bias``; running stats are updated as BatchNorm does, with the global batch's
unbiased variance ``var * N / (N - 1)``.

Backward. With ``xhat = (x - mean) / sqrt(var + eps)`` and ``dy`` the gradient of the sum of every
rank's loss, the input gradient needs two global per-channel sums, obtained with one allreduce:

    dx = weight / sqrt(var + eps) * (dy - sum(dy) / N - xhat * sum(dy * xhat) / N)

``weight`` and ``bias`` get this rank's share (``sum(dy * xhat)`` and ``sum(dy)`` over local
elements); DistributedOptimizer's averaging across ranks then yields the global gradient divided
by the number of ranks, exactly as for every other parameter of a data-parallel model.

Eval mode uses the running stats (no communication). Without running stats, training mode still
synchronizes and eval mode uses the local batch's statistics, like ``torch.nn.SyncBatchNorm``.
All collectives are unnamed, so every rank must run the same SyncBatchNorm layers in the same order.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from horovodlite.common.exceptions import HorovodArgumentError
from horovodlite.common.process_sets import global_process_set
from horovodlite.common.reduce_ops import Sum
from horovodlite.torch.collectives import allgather_async
from horovodlite.torch.mpi_ops import allreduce_async
from horovodlite.torch.submission import synchronize


def _channels_first(x: torch.Tensor) -> torch.Tensor:
    """[N, C, *] -> [C, N * prod(*)]."""
    return x.transpose(0, 1).reshape(x.shape[1], -1)


def _bcast(v: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A per-channel vector shaped to broadcast against ``x`` ([1, C, 1, ...])."""
    return v.reshape(1, -1, *([1] * (x.dim() - 2)))


def _global_stats(x: torch.Tensor, acc: torch.dtype, process_set):
    """(count, mean, biased var) of every channel over the global batch."""
    cols = _channels_first(x).to(acc)
    channels, n = cols.shape
    if n > 0:
        local_var, local_mean = torch.var_mean(cols, dim=1, correction=0)
    else:
        local_mean = local_var = torch.zeros(channels, dtype=acc, device=x.device)
    row = torch.cat([torch.tensor([float(n)], dtype=torch.float64, device=x.device),
                     local_mean.to(torch.float64), local_var.to(torch.float64)]).reshape(1, -1)
    gathered = synchronize(allgather_async(row, process_set=process_set))
    counts = gathered[:, :1]
    means, variances = gathered[:, 1:channels + 1], gathered[:, channels + 1:]
    total = counts.sum()
    if total <= 1:
        raise HorovodArgumentError(
            f"SyncBatchNorm: expected more than 1 value per channel across all "
            f"ranks when training, got {int(total)} (input shape {list(x.shape)} "
            "on this rank)"
        )
    mean = (counts * means).sum(0) / total
    var = (counts * (variances + (means - mean) ** 2)).sum(0) / total
    return total, mean.to(acc), var.to(acc)


class _SyncBatchNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum, process_set):
        acc = torch.float64 if x.dtype == torch.float64 else torch.float32
        total, mean, var = _global_stats(x, acc, process_set)
        invstd = torch.rsqrt(var + eps)
        if running_mean is not None:
            unbiased = var * (total / (total - 1))
            running_mean.mul_(1 - momentum).add_(mean.to(running_mean.dtype), alpha=momentum)
            running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)
        xhat = (x.to(acc) - _bcast(mean, x)) * _bcast(invstd, x)
        y = xhat
        if weight is not None:
            y = y * _bcast(weight.to(acc), x) + _bcast(bias.to(acc), x)
        ctx.save_for_backward(x, weight, mean, invstd)
        ctx.total = float(total)
        ctx.process_set = process_set
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        x, weight, mean, invstd = ctx.saved_tensors
        acc = mean.dtype
        dy = dy.to(acc)
        xhat = (x.to(acc) - _bcast(mean, x)) * _bcast(invstd, x)
        sum_dy = _channels_first(dy).sum(1)
        sum_dy_xhat = _channels_first(dy * xhat).sum(1)
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            both = torch.cat([sum_dy, sum_dy_xhat])
            both = synchronize(allreduce_async(both, op=Sum, process_set=ctx.process_set))
            g_dy, g_dy_xhat = both.chunk(2)
            scale = invstd if weight is None else invstd * weight.to(acc)
            grad_x = _bcast(scale, x) * (dy - _bcast(g_dy / ctx.total, x)
                                         - xhat * _bcast(g_dy_xhat / ctx.total, x))
            grad_x = grad_x.to(x.dtype)
        if weight is not None:
            grad_w = sum_dy_xhat.to(weight.dtype) if ctx.needs_input_grad[1] else None
            grad_b = sum_dy.to(weight.dtype) if ctx.needs_input_grad[2] else None
        return grad_x, grad_w, grad_b, None, None, None, None, None


class SyncBatchNorm(_BatchNorm):
    """BatchNorm whose training statistics cover the batches of every rank in ``process_set``.

    Accepts ``[N, C]``, ``[N, C, L]``, ``[N, C, H, W]`` and ``[N, C, D, H, W]`` inputs; per-rank
    batch sizes may differ. Arguments as ``torch.nn.BatchNorm2d``, plus ``process_set``.
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, process_set=global_process_set):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_set = process_set

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise HorovodArgumentError(
                f"SyncBatchNorm: expected an input of at least 2 dimensions "
                f"[N, C, ...], got shape {list(input.shape)}"
            )
        if input.shape[1] != self.num_features:
            raise HorovodArgumentError(
                f"SyncBatchNorm: input has {input.shape[1]} channels (dim 1), the "
                f"layer was built for num_features={self.num_features}"
            )

    def _momentum(self) -> float:
        """BatchNorm's factor: ``momentum``, or a cumulative average when it is None."""
        if self.momentum is None:
            return 1.0 / float(self.num_batches_tracked)
        return self.momentum

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        if not self.training and self.track_running_stats:
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight,
                                self.bias, False, 0.0, self.eps)
        if not self.training:
            return F.batch_norm(input, None, None, self.weight, self.bias, True, 0.0, self.eps)
        momentum = 0.0
        if self.track_running_stats:
            self.num_batches_tracked.add_(1)
            momentum = self._momentum()
        return _SyncBatchNormFunction.apply(input, self.weight, self.bias, self.running_mean,
                                            self.running_var, self.eps, momentum,
                                            self.process_set)

    @classmethod
    def convert_sync_batchnorm(cls, module, process_set=global_process_set):
        """Returns ``module`` with every BatchNorm*d replaced by a SyncBatchNorm holding the
        same parameters and running stats."""
        out = module
        if isinstance(module, _BatchNorm) and not isinstance(module, cls):
            out = cls(module.num_features, module.eps, module.momentum, module.affine,
                      module.track_running_stats, process_set)
            take_batchnorm_state(out, module)
        for name, child in module.named_children():
            out.add_module(name, cls.convert_sync_batchnorm(child, process_set))
        return out


def take_batchnorm_state(target, source) -> None:
    """``target`` (a BatchNorm of the same configuration) takes ``source``'s parameters and
    running statistics - the same tensors, not copies - and its training mode."""
    with torch.no_grad():
        if source.affine:
            target.weight, target.bias = source.weight, source.bias
        if source.track_running_stats:
            target.running_mean = source.running_mean
            target.running_var = source.running_var
            target.num_batches_tracked = source.num_batches_tracked
    target.train(source.training)


__all__ = ["SyncBatchNorm"]
