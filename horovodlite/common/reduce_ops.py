"""Reduce ops (values as in horovod.torch) and the checking of ``op=`` / ``average=``."""

from __future__ import annotations

import warnings

from horovodlite.common.exceptions import HorovodArgumentError

Average = 0
Sum = 1
Adasum = 2
Min = 3
Max = 4
Product = 5
OP_NAMES = {Average: "Average", Sum: "Sum", Adasum: "Adasum", Min: "Min", Max: "Max",
            Product: "Product"}
# op= -> the op, for allreduce_async_'s fast path (None: the default, Average; Adasum and the
# deprecated average= take the full path through resolve_op)
PLAIN_OPS = {None: Average, Average: Average, Sum: Sum, Min: Min, Max: Max, Product: Product}


def resolve_op(average, op, fn: str) -> int:
    """The op of an allreduce call: ``op``, or the deprecated ``average=`` (warns), default
    Average. Raises ValueError for both at once or an unknown op. Call it from the public
    function itself: the warning names that function's caller."""
    if average is not None and op is not None:
        raise HorovodArgumentError(f"{fn}: pass either op= or the deprecated average=, not both")
    if average is not None:
        warnings.warn(f"{fn}: average= is deprecated, use op=hvd.Average or op=hvd.Sum",
                      DeprecationWarning, stacklevel=3)
        return Average if average else Sum
    if op is None:
        return Average
    if op not in OP_NAMES:
        raise HorovodArgumentError(
            f"{fn}: unknown op {op!r}; use hvd.Average, Sum, Adasum, Min, Max or Product"
        )
    return op


__all__ = ["Average", "Sum", "Adasum", "Min", "Max", "Product", "OP_NAMES", "PLAIN_OPS",
           "resolve_op"]
