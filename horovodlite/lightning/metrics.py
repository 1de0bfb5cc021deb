"""torchmetrics ``Metric`` objects synchronised through horovodlite.

A torchmetrics metric gathers its states across processes through torch.distributed, which
HorovodLiteStrategy does not start: without help each rank would compute its metric on its own
data only. Pass the two functions here to the metric instead::

    from horovodlite.lightning import metric_sync_kwargs
    self.accuracy = torchmetrics.Accuracy(task="multiclass", num_classes=10,
                                          **metric_sync_kwargs())

``gather_all_tensors`` is torchmetrics' ``dist_sync_fn`` contract: every rank's tensor, in rank
order, whatever its shape (a list state holds as many rows as the rank saw): the shapes travel
as one object allgather, the values as one flat allgather, split by those shapes.
"""

from __future__ import annotations

import math

import torch

import horovodlite.torch as hvd


def gather_all_tensors(result: torch.Tensor, group=None) -> list:
    """Every rank's ``result``, in rank order (all ranks call it together)."""
    if group is None:
        group = hvd.global_process_set
    elif not isinstance(group, hvd.ProcessSet):
        raise ValueError("horovodlite's metric sync gathers over a hvd.ProcessSet (the metric's "
                         f"process_group), or every rank with None; got {type(group).__name__}")
    shapes = hvd.allgather_object(tuple(result.shape), name="metric.shapes", process_set=group)
    flat = hvd.allgather(result.detach().contiguous().reshape(-1), name="metric.values",
                         process_set=group)
    out, at = [], 0
    for shape in shapes:
        n = math.prod(shape)
        out.append(flat[at:at + n].reshape(shape))
        at += n
    return out


def distributed_available() -> bool:
    """Whether the metric has ranks to gather from: horovodlite runs with more than one."""
    return hvd.is_initialized() and hvd.size() > 1


def metric_sync_kwargs() -> dict:
    """The keyword arguments that make a torchmetrics ``Metric`` sync through horovodlite."""
    return {"dist_sync_fn": gather_all_tensors, "distributed_available_fn": distributed_available}


__all__ = ["gather_all_tensors", "distributed_available", "metric_sync_kwargs"]
