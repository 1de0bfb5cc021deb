"""The horovod.torch allreduce family (plain, in place, grouped; Adasum via ``adasum``), the
reduce ops, ``shutdown``, and the handles' ``poll``/``synchronize`` (from ``submission``). The
other collectives are in ``collectives``.

Every ``*_async`` call validates its arguments at once (ValueError, nothing enqueued) and returns
an int handle; the work runs on horovodlite's background thread. ``synchronize(handle)`` waits with
the GIL released and returns the result, or raises HorovodInternalError naming the ranks that
disagreed. The synchronous out-of-place ops are autograd Functions.
"""

from __future__ import annotations

import torch

from horovodlite._extension import load
from horovodlite.common import basics
from horovodlite.common.exceptions import HorovodArgumentError, HorovodInternalError
from horovodlite.common.process_sets import _id_of, global_process_set
from horovodlite.common.reduce_ops import (
    PLAIN_OPS,
    Adasum,
    Average,
    Max,
    Min,
    Product,
    Sum,
    resolve_op,
)
from horovodlite.torch import submission
from horovodlite.torch.adasum import adasum_allreduce_async
from horovodlite.torch.compression import Compression
from horovodlite.torch.submission import (
    all_outputs,
    allreduce_inplace,
    call_site,
    first_output,
    in_place_group,
    op_name,
    poll,
    synchronize,
)

_C = load()


def shutdown() -> None:
    """Stops horovodlite on every rank; pending operations fail with a clear error.
    ``init()`` works again afterwards in the same process (names count from 0 again)."""
    basics.shutdown()
    submission.reset()


# ---------------------------------------------------------------------------------- allreduce


def _check_average_op(op: int, fn: str) -> None:
    if op == Adasum:
        raise HorovodArgumentError(
            f"{fn}: op=hvd.Adasum needs hvd.allreduce/allreduce_async on floating "
            "tensors (see horovodlite.torch.adasum)"
        )


def _enqueue_allreduce(handler, tensors, outputs, names, op, prescale, postscale, process_set,
                       kept):
    ps_id = _id_of(process_set)
    sites = [call_site()] * len(tensors)
    return submission.submit(handler, "allreduce", lambda: _C.enqueue_allreduce(
        tensors, outputs, names, op, float(prescale), float(postscale), ps_id, sites), tensors,
        kept)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set) -> int:
    """Out-of-place asynchronous allreduce; ``synchronize`` returns the reduced copy."""
    op = resolve_op(average, op, "allreduce_async")
    if op == Adasum:
        return adasum_allreduce_async(tensor, name, prescale_factor, postscale_factor,
                                      process_set, inplace=False)
    name = op_name("allreduce", name)
    output = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    return _enqueue_allreduce(first_output, [tensor], [output], [name], op, prescale_factor,
                              postscale_factor, process_set, (tensor, output))


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set) -> int:
    """In-place asynchronous allreduce; ``synchronize`` returns ``tensor``."""
    resolved = PLAIN_OPS.get(op) if average is None else None
    if resolved is None:  # deprecated average=, Adasum, or an error to report
        resolved = resolve_op(average, op, "allreduce_async_")
        if resolved == Adasum:
            return adasum_allreduce_async(tensor, name, prescale_factor, postscale_factor,
                                          process_set, inplace=True)
    # op_name("allreduce", name) and _id_of inlined for the common cases (a str name, the
    # global set): the prefix costs a string concatenation per call, the inlined _id_of wins
    # one call back
    name = "allreduce." + name if type(name) is str else op_name("allreduce", name)
    ps_id = 0 if process_set is global_process_set else _id_of(process_set)
    return allreduce_inplace(tensor, name, resolved, float(prescale_factor),
                             float(postscale_factor), ps_id, call_site())


class _AllreduceFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale, postscale, process_set):
        ctx.args = (op, prescale, postscale, process_set)
        return synchronize(allreduce_async(tensor, name=name, op=op, prescale_factor=prescale,
                                           postscale_factor=postscale, process_set=process_set))

    @staticmethod
    def backward(ctx, grad):
        op, prescale, postscale, process_set = ctx.args
        grad = allreduce(grad.contiguous(), op=op, prescale_factor=prescale,
                         postscale_factor=postscale, process_set=process_set)
        return grad, None, None, None, None, None


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Synchronous out-of-place allreduce (differentiable). Default op: Average."""
    op = resolve_op(average, op, "allreduce")
    wire, ctx = compression.compress(tensor)
    out = _AllreduceFunction.apply(wire, name, op, prescale_factor, postscale_factor, process_set)
    return compression.decompress(out, ctx)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set):
    """Synchronous in-place allreduce; returns ``tensor``."""
    return synchronize(allreduce_async_(tensor, average=average, name=name, op=op,
                                        prescale_factor=prescale_factor,
                                        postscale_factor=postscale_factor,
                                        process_set=process_set))


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set) -> int:
    """One handle for a list of tensors reduced together (fused); returns new tensors."""
    op = resolve_op(average, op, "grouped_allreduce_async")
    _check_average_op(op, "grouped_allreduce_async")
    tensors = list(tensors)
    outputs = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in tensors]
    names = submission.group_names("grouped_allreduce", name, len(tensors))
    return _enqueue_allreduce(all_outputs, tensors, outputs, names, op, prescale_factor,
                              postscale_factor, process_set, (tensors, outputs))


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set) -> int:
    """In-place grouped allreduce; ``synchronize`` returns the list of input tensors."""
    op = resolve_op(average, op, "grouped_allreduce_async_")
    _check_average_op(op, "grouped_allreduce_async_")
    tensors = list(tensors)
    names = submission.group_names("grouped_allreduce", name, len(tensors))
    return _enqueue_allreduce(in_place_group, tensors, tensors, names, op, prescale_factor,
                              postscale_factor, process_set, tensors)


class _GroupedAllreduceFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, prescale, postscale, process_set, *tensors):
        ctx.args = (op, prescale, postscale, process_set)
        return tuple(synchronize(grouped_allreduce_async(
            tensors, name=name, op=op, prescale_factor=prescale, postscale_factor=postscale,
            process_set=process_set)))

    @staticmethod
    def backward(ctx, *grads):
        op, prescale, postscale, process_set = ctx.args
        out = grouped_allreduce([g.contiguous() for g in grads], op=op, prescale_factor=prescale,
                                postscale_factor=postscale, process_set=process_set)
        return (None, None, None, None, None, *out)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Synchronous grouped allreduce (differentiable); returns a list."""
    op = resolve_op(average, op, "grouped_allreduce")
    wires, ctxs = zip(*[compression.compress(t) for t in tensors]) if tensors else ((), ())
    outs = _GroupedAllreduceFunction.apply(name, op, prescale_factor, postscale_factor,
                                           process_set, *wires)
    return [compression.decompress(o, c) for o, c in zip(outs, ctxs)]


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    """Synchronous in-place grouped allreduce; returns the list of input tensors."""
    return synchronize(grouped_allreduce_async_(tensors, average=average, name=name, op=op,
                                                prescale_factor=prescale_factor,
                                                postscale_factor=postscale_factor,
                                                process_set=process_set))


__all__ = [
    "Average", "Sum", "Adasum", "Min", "Max", "Product", "HorovodInternalError",
    "shutdown", "poll", "synchronize",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
    "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
    "grouped_allreduce_async_",
]
