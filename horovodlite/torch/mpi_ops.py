"""The horovod.torch collectives: allreduce, allgather, broadcast, alltoall, reducescatter,
barrier, join, and handles (poll/synchronize).

Every ``*_async`` call validates its arguments at once (ValueError, nothing enqueued) and returns
an int handle; the work runs on horovodlite's background thread. ``synchronize(handle)`` waits with
the GIL released and returns the result, or raises HorovodInternalError naming the ranks that
disagreed. The synchronous out-of-place ops are autograd Functions.
"""

from __future__ import annotations

import itertools
import os
import sys
import warnings

import torch

from horovodlite._extension import load
from horovodlite.common.exceptions import HorovodArgumentError, HorovodInternalError
from horovodlite.common.process_sets import _id_of, global_process_set
from horovodlite.torch import device_check as _device_check
from horovodlite.torch.compression import Compression

_C = load()
_CUDA_BUILT = bool(getattr(_C, "cuda_built", lambda: False)())

# Reduce ops, values as in horovod.torch.
Average = 0
Sum = 1
Adasum = 2
Min = 3
Max = 4
Product = 5
_OP_NAMES = {Average: "Average", Sum: "Sum", Adasum: "Adasum", Min: "Min", Max: "Max",
             Product: "Product"}
# op= -> the op, for allreduce_async_'s fast path (None: the default, Average; Adasum and the
# deprecated average= take the full path through _resolve_op)
_PLAIN_OPS = {None: Average, Average: Average, Sum: Sum, Min: Min, Max: Max, Product: Product}

# handle -> (kind, python-side objects kept alive and needed to build the result). Names: a name
# is taken while its collective is in flight on this rank, and free again once it has completed
# there, synchronized or not (as on Horovod); the core's queue keeps that rule (TensorQueue).
_handles: dict[int, tuple] = {}
_counters: dict[str, itertools.count] = {}
_UNKNOWN = (None, ())  # synchronize of a handle _handles does not know: _C.wait reports it
_IN_PLACE = frozenset(("allreduce_", "broadcast_"))
_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Frames from these folders are never "the user's call site" (autograd Functions add torch's).
_INTERNAL_DIRS = (_PKG_DIR, os.path.dirname(os.path.abspath(torch.__file__)))


def _auto_name(op: str, name: str | None) -> str:
    if name is not None:
        return str(name)
    counter = _counters.setdefault(op, itertools.count())
    return f"{op}.noname.{next(counter)}"


def _reset_names() -> None:
    _counters.clear()


# (id of a code object, bytecode offset) of a call into horovodlite -> the user's file:line, or
# _WALK where that frame is horovodlite's or torch's own. Keyed by id, not by the code object,
# whose hash is computed over its contents on every lookup (~50 ns); _site_codes keeps each
# code object alive, so no other one can take its id.
_site_cache: dict = {}
_site_codes: list = []
_WALK = object()


def _site() -> str:
    """file:line of the user code that called into horovodlite (for stall reports)."""
    frame = sys._getframe(2)
    while frame is not None:
        key = (id(frame.f_code), frame.f_lasti)
        site = _site_cache.get(key)
        if site is None:
            code = frame.f_code
            internal = code.co_filename.startswith(_INTERNAL_DIRS)
            # f_lineno decodes the line table: only on a miss
            site = _site_cache[key] = _WALK if internal else f"{code.co_filename}:{frame.f_lineno}"
            _site_codes.append(code)
        if site is not _WALK:
            return site
        frame = frame.f_back
    return ""


def _resolve_op(average, op, fn: str) -> int:
    if average is not None and op is not None:
        raise HorovodArgumentError(f"{fn}: pass either op= or the deprecated average=, not both")
    if average is not None:
        warnings.warn(f"{fn}: average= is deprecated, use op=hvd.Average or op=hvd.Sum",
                      DeprecationWarning, stacklevel=3)
        return Average if average else Sum
    if op is None:
        return Average
    if op not in _OP_NAMES:
        raise HorovodArgumentError(
            f"{fn}: unknown op {op!r}; use hvd.Average, Sum, Adasum, Min, Max or Product"
        )
    return op


def _submit(kind: str, op: str, enqueue, *objects) -> int:
    """Enqueues and remembers the handle (the core refuses a name still in flight on this rank).

    ``objects[0]``, when given, is the op's input tensor (or list of them): CUDA builds check its
    GPU placement first (device_check)."""
    if _CUDA_BUILT and objects:
        _check_device(objects[0], op)
    handle = enqueue()
    _handles[handle] = (kind, objects)
    return handle


def _check_device(obj, op: str) -> None:
    """CUDA builds: device_check's GPU placement check of an op's input (tensor or list)."""
    _device_check.note(obj, op, _submit_pinning_check)
    _poll_pinning_check()


def _submit_pinning_check(record) -> int:
    """The asynchronous allgather of device_check's (host, GPU) records over every rank."""
    name = _device_check.CHECK_NAME
    return _submit("allgather", "allgather",
                   lambda: _C.enqueue_allgather([record], [name], 0, [""]), record)


def _poll_pinning_check() -> None:
    if _device_check._pending is not None:
        _device_check.poll(poll, synchronize, _C.rank())


def _track(handle: int, kind: str, *objects) -> int:
    """Changes how ``synchronize`` turns an already-submitted handle into its result (a wrapper
    such as Adasum post-processes an allgather)."""
    _handles[handle] = (kind, objects)
    return handle


def _reset_handles() -> None:
    """After shutdown: handles stay synchronizable (they report the shutdown)."""
    _device_check._reset()


def poll(handle: int) -> bool:
    """True if the operation behind ``handle`` has finished (never blocks)."""
    return bool(_C.poll(handle))


def synchronize(handle: int):
    """Waits for ``handle`` and returns its result; raises HorovodInternalError on failure.

    An unknown or already-synchronized handle raises ValueError.
    """
    if _device_check._pending is not None and _device_check._pending != handle:
        _poll_pinning_check()
    kind, objects = _handles.pop(handle, _UNKNOWN)
    if kind in _IN_PLACE:  # the result is the input: no outputs to convert
        _C.wait_done(handle)
        return objects[0]
    outputs, extra = _C.wait(handle)
    if kind in ("grouped_allreduce_",):
        return list(objects[0])
    if kind in ("grouped_allreduce", "grouped_allgather", "grouped_reducescatter"):
        return list(outputs)
    if kind == "alltoall":
        return outputs[0], torch.tensor(extra, dtype=torch.int32)
    if kind == "join":
        return int(extra[0])
    if kind == "barrier":
        return None
    if kind == "allgather_scalar":
        return outputs[0]
    if kind == "adasum":  # objects = (finish, rows): finish combines the reduced rows
        return objects[0](outputs[0])
    return outputs[0] if outputs else None


# ---------------------------------------------------------------------------------- allreduce


def _check_average_op(op: int, fn: str) -> None:
    if op == Adasum:
        raise HorovodArgumentError(
            f"{fn}: op=hvd.Adasum needs hvd.allreduce/allreduce_async on floating "
            "tensors (see horovodlite.torch.adasum)"
        )


def _enqueue_allreduce(kind, tensors, outputs, names, op, prescale, postscale, process_set,
                       *objects):
    ps_id = _id_of(process_set)
    sites = [_site()] * len(tensors)
    return _submit(kind, "allreduce", lambda: _C.enqueue_allreduce(
        tensors, outputs, names, op, float(prescale), float(postscale), ps_id, sites), *objects)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set) -> int:
    """Out-of-place asynchronous allreduce; ``synchronize`` returns the reduced copy."""
    op = _resolve_op(average, op, "allreduce_async")
    if op == Adasum:
        from horovodlite.torch.adasum import adasum_allreduce_async
        return adasum_allreduce_async(tensor, name, prescale_factor, postscale_factor,
                                      process_set, inplace=False)
    name = _auto_name("allreduce", name)
    output = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    return _enqueue_allreduce("allreduce", [tensor], [output], [name], op, prescale_factor,
                              postscale_factor, process_set, tensor, output)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set) -> int:
    """In-place asynchronous allreduce; ``synchronize`` returns ``tensor``."""
    resolved = _PLAIN_OPS.get(op) if average is None else None
    if resolved is None:  # deprecated average=, Adasum, or an error to report
        resolved = _resolve_op(average, op, "allreduce_async_")
        if resolved == Adasum:
            from horovodlite.torch.adasum import adasum_allreduce_async
            return adasum_allreduce_async(tensor, name, prescale_factor, postscale_factor,
                                          process_set, inplace=True)
    name = _auto_name("allreduce", name) if name is None or type(name) is not str else name
    return _allreduce_inplace(tensor, name, resolved, float(prescale_factor),
                              float(postscale_factor), _id_of(process_set), _site())


def _allreduce_inplace(tensor, name: str, op: int, prescale: float, postscale: float,
                       ps_id: int, site: str) -> int:
    """allreduce_async_ with its arguments resolved (an int op, floats, the set's id, the call
    site): also DistributedOptimizer's per-gradient path. _submit inlined: this runs once per
    gradient, and the lambda and the call cost ~0.3 us each time."""
    if _CUDA_BUILT:
        _check_device(tensor, "allreduce")
    handle = _C.enqueue_allreduce_(tensor, name, op, prescale, postscale, ps_id, site)
    _handles[handle] = ("allreduce_", (tensor,))
    return handle


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
    op = _resolve_op(average, op, "allreduce")
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


def _group_names(op: str, name: str | None, n: int) -> list:
    base = _auto_name(op, name)
    return [f"{base}.{i}" for i in range(n)]


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set) -> int:
    """One handle for a list of tensors reduced together (fused); returns new tensors."""
    op = _resolve_op(average, op, "grouped_allreduce_async")
    _check_average_op(op, "grouped_allreduce_async")
    tensors = list(tensors)
    outputs = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in tensors]
    names = _group_names("grouped_allreduce", name, len(tensors))
    return _enqueue_allreduce("grouped_allreduce", tensors, outputs, names, op, prescale_factor,
                              postscale_factor, process_set, tensors, outputs)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set) -> int:
    """In-place grouped allreduce; ``synchronize`` returns the list of input tensors."""
    op = _resolve_op(average, op, "grouped_allreduce_async_")
    _check_average_op(op, "grouped_allreduce_async_")
    tensors = list(tensors)
    names = _group_names("grouped_allreduce", name, len(tensors))
    return _enqueue_allreduce("grouped_allreduce_", tensors, tensors, names, op,
                              prescale_factor, postscale_factor, process_set, tensors)


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
    op = _resolve_op(average, op, "grouped_allreduce")
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
    "poll", "synchronize",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
    "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
    "grouped_allreduce_async_",
]
