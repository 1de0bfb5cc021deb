"""allgather, broadcast, alltoall, reducescatter, barrier, join, sparse allreduce.

Semantics follow horovod.torch (docs/migrating.md): first dimensions may differ across ranks for
allgather/alltoall, broadcast's ``root_rank`` is a global rank, reducescatter gives the low ranks
one extra row when dim 0 does not divide evenly, and ``join`` lets a rank that ran out of data
keep serving the others' allreduces with zeros.
"""

from __future__ import annotations

import torch

from horovodlite._extension import load
from horovodlite.common.exceptions import HorovodArgumentError
from horovodlite.common.process_sets import _id_of, global_process_set
from horovodlite.torch.compression import Compression
from horovodlite.torch.mpi_ops import Average, Sum, allreduce, grouped_allreduce
from horovodlite.torch.submission import (
    all_outputs,
    alltoall_pair,
    barrier_name,
    call_site,
    first_output,
    group_names,
    in_place,
    last_joined,
    no_result,
    op_name,
    submit,
    synchronize,
)

_C = load()


# ---------------------------------------------------------------------------------- allgather


def allgather_async(tensor, name=None, process_set=global_process_set) -> int:
    """Concatenates every rank's ``tensor`` along dim 0 (first dims may differ)."""
    return _allgather(tensor, op_name("allgather", name), process_set)


def _allgather(tensor, name: str, process_set) -> int:
    """allgather_async under the negotiated ``name``."""
    ps, site = _id_of(process_set), [call_site()]
    return submit(first_output, "allgather",
                  lambda: _C.enqueue_allgather([tensor], [name], ps, site), tensor, tensor)


def grouped_allgather_async(tensors, name=None, process_set=global_process_set) -> int:
    """Starts one allgather per tensor of ``tensors``, negotiated and completed as one group
    (names ``grouped_allgather.<name>.<i>``); returns a handle for ``synchronize``."""
    tensors = list(tensors)
    names = group_names("grouped_allgather", name, len(tensors))
    ps, sites = _id_of(process_set), [call_site()] * len(tensors)
    return submit(all_outputs, "allgather",
                  lambda: _C.enqueue_allgather(tensors, names, ps, sites), tensors, tensors)


def _own_rows(process_set, sizes):
    me = process_set.rank() if process_set.process_set_id else _C.rank()
    start = sum(sizes[:me])
    return start, start + sizes[me]


class _AllgatherFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.process_set = process_set
        ctx.dim0 = tensor.shape[0] if tensor.dim() > 0 else 1
        ctx.scalar = tensor.dim() == 0
        return synchronize(allgather_async(tensor, name=name, process_set=process_set))

    @staticmethod
    def backward(ctx, grad):
        sizes = allgather(torch.tensor([ctx.dim0], dtype=torch.int64),
                          process_set=ctx.process_set).tolist()
        summed = allreduce(grad.contiguous(), op=Average, process_set=ctx.process_set)
        lo, hi = _own_rows(ctx.process_set, sizes)
        out = summed[lo:hi]
        return (out.reshape(()) if ctx.scalar else out), None, None


def allgather(tensor, name=None, process_set=global_process_set):
    """Synchronous allgather (differentiable: each rank gets its own rows of the averaged
    gradient)."""
    return _AllgatherFunction.apply(tensor, name, process_set)


class _GroupedAllgatherFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        ctx.process_set = process_set
        ctx.dims = [t.shape[0] if t.dim() > 0 else 1 for t in tensors]
        return tuple(synchronize(grouped_allgather_async(tensors, name=name,
                                                         process_set=process_set)))

    @staticmethod
    def backward(ctx, *grads):
        sizes = allgather(torch.tensor(ctx.dims, dtype=torch.int64).reshape(1, -1),
                          process_set=ctx.process_set)
        summed = _grouped_average([g.contiguous() for g in grads], ctx.process_set)
        outs = []
        for i, g in enumerate(summed):
            lo, hi = _own_rows(ctx.process_set, sizes[:, i].tolist())
            outs.append(g[lo:hi])
        return (None, None, *outs)


def _grouped_average(tensors, process_set):
    return grouped_allreduce(tensors, op=Average, process_set=process_set)


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """Allgathers each tensor of ``tensors`` as one group (see ``grouped_allgather_async``);
    returns the gathered tensors in order. Differentiable."""
    return list(_GroupedAllgatherFunction.apply(name, process_set, *tensors))


# ---------------------------------------------------------------------------------- broadcast


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set) -> int:
    """Out-of-place broadcast from global rank ``root_rank``; the input is left untouched."""
    name = op_name("broadcast", name)
    output = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    ps, site = _id_of(process_set), [call_site()]
    return submit(first_output, "broadcast", lambda: _C.enqueue_broadcast(
        [tensor], [output], [name], int(root_rank), ps, site), tensor, (tensor, output))


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set) -> int:
    """In-place broadcast from global rank ``root_rank``."""
    name = op_name("broadcast", name)
    ps, site = _id_of(process_set), [call_site()]
    return submit(in_place, "broadcast", lambda: _C.enqueue_broadcast(
        [tensor], [tensor], [name], int(root_rank), ps, site), tensor, tensor)


class _BroadcastFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank = root_rank
        ctx.process_set = process_set
        return synchronize(broadcast_async(tensor, root_rank, name=name, process_set=process_set))

    @staticmethod
    def backward(ctx, grad):
        reduced = allreduce(grad.contiguous(), op=Average, process_set=ctx.process_set)
        if _C.rank() != ctx.root_rank:
            reduced = reduced * 0
        return reduced, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """Synchronous out-of-place broadcast (differentiable)."""
    return _BroadcastFunction.apply(tensor, root_rank, name, process_set)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """Synchronous in-place broadcast; returns ``tensor``."""
    return synchronize(broadcast_async_(tensor, root_rank, name=name, process_set=process_set))


# ----------------------------------------------------------------------------------- alltoall


def _splits_list(splits) -> list:
    if splits is None:
        return []
    if isinstance(splits, torch.Tensor):
        if splits.dtype != torch.int32:
            raise HorovodArgumentError(
                f"alltoall: splits must be an int32 tensor, got {splits.dtype}"
            )
        if splits.dim() != 1:
            raise HorovodArgumentError(
                f"alltoall: splits must be 1-D, got shape {list(splits.shape)}"
            )
        return [int(s) for s in splits.tolist()]
    return [int(s) for s in splits]


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set) -> int:
    """Sends rows ``splits[i]`` of ``tensor`` (dim 0) to rank i; ``synchronize`` returns
    ``(output, received_splits)``."""
    name = op_name("alltoall", name)
    ps, site, split_list = _id_of(process_set), call_site(), _splits_list(splits)
    return submit(alltoall_pair, "alltoall",
                  lambda: _C.enqueue_alltoall(tensor, split_list, name, ps, site), tensor, tensor)


class _AlltoallFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        ctx.process_set = process_set
        output, received = synchronize(alltoall_async(tensor, splits=splits, name=name,
                                                      process_set=process_set))
        ctx.received = received
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad, _grad_splits):
        out, _ = alltoall(grad.contiguous(), splits=ctx.received, process_set=ctx.process_set)
        return out, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Synchronous alltoall (differentiable). Returns the output, or ``(output,
    received_splits)`` when ``splits`` is given."""
    output, received = _AlltoallFunction.apply(tensor, splits, name, process_set)
    return output if splits is None else (output, received)


# ------------------------------------------------------------------------------ reducescatter


def _check_rs_op(op) -> int:
    op = Average if op is None else op
    if op not in (Average, Sum):
        raise HorovodArgumentError(
            f"reducescatter: only hvd.Average and hvd.Sum are supported, got op={op}"
        )
    return op


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0) -> int:
    """Reduces across ranks, then rank r keeps its slice of dim 0 (low ranks get the extra
    rows)."""
    op = _check_rs_op(op)
    name = op_name("reducescatter", name)
    ps, site = _id_of(process_set), [call_site()]
    return submit(first_output, "reducescatter", lambda: _C.enqueue_reducescatter(
        [tensor], [name], op, float(prescale_factor), float(postscale_factor), ps, site), tensor,
        tensor)


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0) -> int:
    """Starts one reducescatter per tensor of ``tensors`` with ``op`` (Average or Sum), as one
    group (names ``grouped_reducescatter.<name>.<i>``); returns a handle for ``synchronize``."""
    op = _check_rs_op(op)
    tensors = list(tensors)
    names = group_names("grouped_reducescatter", name, len(tensors))
    ps, sites = _id_of(process_set), [call_site()] * len(tensors)
    return submit(all_outputs, "reducescatter",
                  lambda: _C.enqueue_reducescatter(tensors, names, op, float(prescale_factor),
                                                   float(postscale_factor), ps, sites), tensors,
                  tensors)


def _rs_backward(grad, op, process_set):
    n = process_set.size() if process_set.process_set_id else _C.size()
    full = allgather(grad.contiguous(), process_set=process_set)
    return full * n if op == Sum else full


class _ReducescatterFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale, postscale):
        ctx.op, ctx.process_set = op, process_set
        return synchronize(reducescatter_async(tensor, name=name, op=op, process_set=process_set,
                                               prescale_factor=prescale,
                                               postscale_factor=postscale))

    @staticmethod
    def backward(ctx, grad):
        return _rs_backward(grad, ctx.op, ctx.process_set), None, None, None, None, None


def reducescatter(tensor, name=None, compression=Compression.none, op=Average,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """Synchronous reducescatter (differentiable: backward allgathers the gradient, times the
    number of ranks for Sum)."""
    op = _check_rs_op(op)
    wire, cctx = compression.compress(tensor)
    out = _ReducescatterFunction.apply(wire, name, op, process_set, prescale_factor,
                                       postscale_factor)
    return compression.decompress(out, cctx)


class _GroupedReducescatterFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, process_set, prescale, postscale, *tensors):
        ctx.op, ctx.process_set = op, process_set
        return tuple(synchronize(grouped_reducescatter_async(
            tensors, name=name, op=op, process_set=process_set, prescale_factor=prescale,
            postscale_factor=postscale)))

    @staticmethod
    def backward(ctx, *grads):
        return (None, None, None, None, None,
                *[_rs_backward(g, ctx.op, ctx.process_set) for g in grads])


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    """Reducescatters each tensor of ``tensors`` as one group (see
    ``grouped_reducescatter_async``), each compressed with ``compression`` on the wire; returns
    this rank's shares in order. Differentiable."""
    op = _check_rs_op(op)
    pairs = [compression.compress(t) for t in tensors]
    outs = _GroupedReducescatterFunction.apply(name, op, process_set, prescale_factor,
                                               postscale_factor, *[p[0] for p in pairs])
    return [compression.decompress(o, p[1]) for o, p in zip(outs, pairs)]


# ------------------------------------------------------------------------------ barrier, join


def barrier(process_set=global_process_set) -> None:
    """Blocks until every member of ``process_set`` has called barrier."""
    ps_id = _id_of(process_set)
    name = barrier_name(ps_id)
    synchronize(submit(no_result, "barrier", lambda: _C.enqueue_barrier(name, ps_id)))


def join(device=-1) -> int:
    """This rank has no more data: serve other ranks' allreduces with zeros until every rank
    has joined. Returns the last rank to join (the same on every rank)."""
    return synchronize(submit(last_joined, "join", _C.enqueue_join))


# ---------------------------------------------------------------------------- sparse allreduce


def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    """Allreduce of a sparse COO tensor via allgather of its indices and values.

    Returns a callable that waits and returns the reduced sparse tensor (values divided by the
    number of ranks for Average).
    """
    if op not in (Average, Sum):
        raise HorovodArgumentError(
            "sparse_allreduce_async: only hvd.Average and hvd.Sum are supported"
        )
    t = tensor.coalesce()
    indices = t.indices().t().contiguous()  # [nnz, ndim]
    values = t.values().contiguous()
    name = op_name("sparse_allreduce", name)
    h_idx = _allgather(indices, f"{name}.indices", process_set)
    h_val = _allgather(values, f"{name}.values", process_set)
    n = process_set.size() if process_set.process_set_id else _C.size()

    def wait():
        all_idx = synchronize(h_idx)
        all_val = synchronize(h_val)
        if op == Average:
            all_val = all_val / n
        out = torch.sparse_coo_tensor(all_idx.t(), all_val, size=t.shape,
                                      check_invariants=False)
        return out.coalesce()

    return wait


__all__ = [
    "allgather", "allgather_async", "grouped_allgather", "grouped_allgather_async",
    "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
    "alltoall", "alltoall_async",
    "reducescatter", "reducescatter_async", "grouped_reducescatter",
    "grouped_reducescatter_async",
    "barrier", "join", "sparse_allreduce_async",
]
