"""Adasum: the adaptive-summation reduction behind ``op=hvd.Adasum``.

Adasum of two vectors ``a`` and ``b``::

    adasum(a, b) = (1 - a.b / (2 |a|^2)) * a  +  (1 - a.b / (2 |b|^2)) * b

Orthogonal vectors are summed, parallel ones averaged; in between, the shared component is counted
once. Ranks are combined pairwise in a binary tree: (0, 1), (2, 3), ... at the first level, then
the pair results (01, 23), ... and so on, so the number of ranks in the process set must be a power
of two (anything else is a ValueError before anything is enqueued). A zero vector contributes
nothing (its coefficient is irrelevant and taken as 1, so ``adasum(0, b) = b``).

Protocol. Every rank puts its flattened tensor in its own row of an ``[n, numel]`` matrix of
zeros and the matrix is Sum-allreduced (adding zeros is exact), so each rank holds all ``n``
inputs and then evaluates the same tree in float64 in the same order. Every rank therefore
computes bit-identical results without a second round of communication. Being an allreduce, it
also runs while ranks have called ``hvd.join()``: their rows stay zero, and a zero vector drops
out of the tree, as a joined rank's zeros drop out of a Sum (an allgather would refuse to run
then). It moves ``2n`` times the data of a ring allreduce of the tensor (Horovod's Adasum uses
recursive vector halving with partial dot products instead); that is the price of simplicity and
of running on any device and backend the allreduce supports. The reduction is per tensor: each
tensor gets its own dot products, as in Horovod.

``prescale_factor`` multiplies every rank's input before the tree, ``postscale_factor`` the
result. 16-bit inputs travel as themselves and are combined in float64.
"""

from __future__ import annotations

import torch

from horovodlite.common.exceptions import HorovodArgumentError
from horovodlite.common.process_sets import _id_of, global_process_set
from horovodlite.common.reduce_ops import Sum
from horovodlite.torch.submission import allreduce_inplace, call_site, op_name, then


def adasum_pair(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Adasum of two flat float64 vectors (a zero vector leaves the other one unchanged)."""
    dot = torch.dot(a, b)
    norm_a = torch.dot(a, a)
    norm_b = torch.dot(b, b)
    coef_a = torch.where(norm_a > 0, 1 - dot / (2 * norm_a), torch.ones_like(dot))
    coef_b = torch.where(norm_b > 0, 1 - dot / (2 * norm_b), torch.ones_like(dot))
    return coef_a * a + coef_b * b


def adasum_tree(rows: torch.Tensor) -> torch.Tensor:
    """Combines the rows of ``rows`` ([n, numel], n a power of two) level by level:
    (0, 1), (2, 3), ... then the pair results, until one row is left."""
    level = list(rows.unbind(0))
    while len(level) > 1:
        level = [adasum_pair(level[i], level[i + 1]) for i in range(0, len(level), 2)]
    return level[0]


def _set_size(process_set) -> int:
    if process_set.ranks is None:
        raise HorovodArgumentError(
            f"{process_set!r} is not registered; pass it to hvd.init() first"
        )
    return len(process_set.ranks)


def check_adasum_size(n: int, what: str) -> None:
    """ValueError unless ``n`` (the number of ranks) is a power of two."""
    if n < 1 or n & (n - 1):
        raise HorovodArgumentError(
            f"{what}: op=hvd.Adasum combines ranks pairwise in a binary tree and needs a "
            f"power-of-two number of ranks, but the process set has {n}; run with 1, 2, 4, ... "
            "ranks or use op=hvd.Average."
        )


def adasum_allreduce_async(tensor, name, prescale_factor, postscale_factor,
                           process_set=global_process_set, inplace=False) -> int:
    """Starts an Adasum allreduce of ``tensor`` over ``process_set``; returns an int handle.

    ``hvd.synchronize(handle)`` returns the result: ``tensor`` itself (overwritten) when
    ``inplace``, else a new tensor of the same shape and dtype. Every rank gets the same values.
    Raises ValueError for non-floating tensors and non-power-of-two process sets.
    """
    name = op_name("allreduce", name)
    if not isinstance(tensor, torch.Tensor):
        raise HorovodArgumentError(
            f"{name} (Adasum): expected a tensor, got "
            f"{type(tensor).__name__}"
        )
    if not tensor.dtype.is_floating_point:
        raise HorovodArgumentError(
            f"{name} (Adasum): needs a floating-point tensor, got "
            f"{tensor.dtype}; use op=hvd.Sum for integers."
        )
    if inplace and not tensor.is_contiguous():
        raise HorovodArgumentError(
            f"{name} (Adasum): the tensor is not contiguous; pass "
            "tensor.contiguous()."
        )
    n = _set_size(process_set)
    check_adasum_size(n, name)
    rows = torch.zeros((n, tensor.numel()), dtype=tensor.dtype, device=tensor.device)
    rows[process_set.rank()] = tensor.detach().reshape(-1)
    handle = allreduce_inplace(rows, name, Sum, 1.0, 1.0, _id_of(process_set), call_site())
    prescale, postscale = float(prescale_factor), float(postscale_factor)

    def finish(gathered: torch.Tensor) -> torch.Tensor:
        rows = gathered.to(torch.float64)
        if prescale != 1.0:
            rows = rows * prescale
        combined = adasum_tree(rows)
        if postscale != 1.0:
            combined = combined * postscale
        result = combined.to(tensor.dtype).reshape(tensor.shape)
        if inplace:
            tensor.copy_(result)
            return tensor
        return result

    # ``rows`` is reduced in place; synchronize returns ``finish`` of it.
    return then(handle, finish)


__all__ = ["adasum_allreduce_async", "adasum_pair", "adasum_tree", "check_adasum_size"]
