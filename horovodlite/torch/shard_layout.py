"""The flat, balanced layout behind ``DistributedOptimizer(shard=...)``: pure arithmetic, no
communication, so it is unit-tested alone (tests/unit/test_shard_layout.py).

A bucket is an ordered list of parameters of one param group, dtype and device. Their elements
are laid end to end in one flat vector of ``total`` elements, padded with zeros to
``padded = shard * size`` (the smallest multiple of the number of ranks), so that a
reducescatter of the flat vector gives every rank exactly ``shard`` elements and rank ``r`` owns
the contiguous range ``[r * shard, (r + 1) * shard)``. Ranks differ by at most the padding
(under ``size`` elements per bucket), whatever the parameter sizes: a parameter may straddle two
or more ranks' ranges. ``pieces(rank)`` lists where the parameters cross a rank's range; the
optimizer copies parameters, gradients and state through those pieces.
"""

from __future__ import annotations

import dataclasses

import torch

# torch.optim optimizers whose update of an element depends only on that element's gradient,
# parameter and state, plus per-parameter scalars that depend on the step count alone (Adam's
# bias corrections, NAdam's mu_product, ASGD's eta and mu, Adagrad's lr decay). Running them on
# a flat slice of many parameters gives the same numbers as running them per parameter.
# Left out on purpose: LBFGS (line search over the whole model), SparseAdam (sparse gradients),
# Adafactor (row and column factors of each matrix) and Muon (orthogonalises whole matrices).
ELEMENTWISE = ("SGD", "Adam", "AdamW", "Adagrad", "RMSprop", "Adamax", "NAdam", "RAdam",
               "Adadelta", "Rprop", "ASGD")


def elementwise_classes() -> tuple:
    return tuple(getattr(torch.optim, name) for name in ELEMENTWISE)


def check_elementwise(optimizer) -> None:
    """Raises naming the optimizer unless its exact class is one of ``ELEMENTWISE``: a subclass
    may override ``step`` with a per-tensor computation, so it is refused too."""
    cls = type(optimizer)
    if cls not in elementwise_classes():
        raise ValueError(
            f"DistributedOptimizer(shard=...): {cls.__module__}.{cls.__qualname__} is not "
            "known to update parameters element-wise, so it cannot run on flat shards of "
            "parameters (an optimizer with a per-tensor norm or factorisation, such as LAMB or "
            f"Adafactor, needs whole tensors). Supported: torch.optim.{', '.join(ELEMENTWISE)}; "
            "use shard=None for this optimizer"
        )


@dataclasses.dataclass(frozen=True)
class Piece:
    """Elements ``[lo, hi)`` of parameter ``index`` (flattened) sit at ``[at, at + hi - lo)`` of
    a rank's shard."""
    index: int
    lo: int
    hi: int
    at: int


class ShardLayout:
    """Offsets of ``numels`` laid end to end, split into ``size`` equal ranges."""

    def __init__(self, numels, size: int):
        if size < 1:
            raise ValueError(f"ShardLayout: size must be >= 1, got {size}")
        self.numels = [int(n) for n in numels]
        if any(n < 0 for n in self.numels):
            raise ValueError(f"ShardLayout: negative numel in {self.numels}")
        self.size = int(size)
        self.offsets = [0]
        for n in self.numels:
            self.offsets.append(self.offsets[-1] + n)
        self.total = self.offsets[-1]
        # At least one element per rank, so that every rank's shard is a real tensor.
        self.shard = max(1, -(-self.total // self.size))
        self.padded = self.shard * self.size

    def range(self, rank: int) -> tuple:
        if not 0 <= rank < self.size:
            raise ValueError(f"ShardLayout: rank {rank} outside [0, {self.size})")
        return rank * self.shard, (rank + 1) * self.shard

    def pieces(self, rank: int) -> list:
        """The parameters crossing ``rank``'s range, in order, with the elements that do."""
        start, stop = self.range(rank)
        out = []
        for i, n in enumerate(self.numels):
            lo, hi = max(start, self.offsets[i]), min(stop, self.offsets[i] + n)
            if lo < hi:
                out.append(Piece(i, lo - self.offsets[i], hi - self.offsets[i], lo - start))
        return out

    def extent(self, rank: int) -> tuple:
        """``[lo, hi)`` of the flat vector covering ``rank``'s range and every parameter that
        crosses it, whole: the span that parameter-shaped views of ``rank``'s elements need."""
        start, stop = self.range(rank)
        crossing = self.pieces(rank)
        if not crossing:
            return start, stop
        return (min(start, self.offsets[crossing[0].index]),
                max(stop, self.offsets[crossing[-1].index + 1]))

    def owner_counts(self) -> list:
        """Real (not padding) elements per rank: they differ by less than ``size``."""
        return [max(0, min(self.total, (r + 1) * self.shard) - r * self.shard)
                for r in range(self.size)]

    # ---------------------------------------------------------------- copying through pieces

    def gather_shard(self, tensors, rank: int, out: torch.Tensor) -> torch.Tensor:
        """Writes ``rank``'s elements of ``tensors`` (one per parameter, any shape) into the
        1-D ``out`` of ``shard`` elements; padding is zero."""
        out.zero_()
        for piece in self.pieces(rank):
            src = tensors[piece.index].reshape(-1)[piece.lo:piece.hi]
            out[piece.at:piece.at + piece.hi - piece.lo].copy_(src)
        return out

    def flatten(self, tensors, out: torch.Tensor) -> torch.Tensor:
        """Writes ``tensors`` end to end into the 1-D ``out`` of ``padded`` elements; a None
        stands for zeros (a parameter without a gradient on this rank)."""
        for i, t in enumerate(tensors):
            view = out[self.offsets[i]:self.offsets[i + 1]]
            if t is None:
                view.zero_()
            else:
                view.copy_(t.reshape(-1))
        out[self.total:].zero_()
        return out

    def split(self, flat: torch.Tensor, shapes) -> list:
        """Views of the padded flat vector ``flat``, one per parameter, with ``shapes``."""
        return [flat[self.offsets[i]:self.offsets[i + 1]].view(shape)
                for i, shape in enumerate(shapes)]


__all__ = ["ELEMENTWISE", "Piece", "ShardLayout", "check_elementwise", "elementwise_classes"]
