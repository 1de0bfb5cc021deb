"""Launching gradient reductions: the half of ``_DistributedOptimizer`` (distributed_optimizer.py)
that turns a ready parameter, or one still missing at ``synchronize()``, into an allreduce (or a
sparse allgather) on the wire. The C++ reducer launches the common case itself; what it leaves
(deferred gradients), compressed or grouped gradients, and Python-hooked parameters come here.
"""

from __future__ import annotations

import torch

from horovodlite.common.process_sets import _id_of
from horovodlite.torch import device_check
from horovodlite.torch.collectives import sparse_allreduce_async
from horovodlite.torch.compression import Compression
from horovodlite.torch.in_flight import Pending
from horovodlite.torch.mpi_ops import (
    Sum,
    allreduce_async,
    allreduce_async_,
    grouped_allreduce_async_,
    synchronize,
)
from horovodlite.torch.submission import (
    CUDA_BUILT,
    allreduce_inplace,
    call_site,
    poll_pinning_check,
)


class _GradLaunch:
    """Mixin of ``_DistributedOptimizer``: uses its ``_hvd_*`` attributes."""

    # ------------------------------------------------------------ find_unused_parameters

    def _hvd_start_unused_vote(self):
        """``find_unused_parameters=True``, at ``synchronize()`` before the zeros of this rank's
        unused parameters are filled in: how many ranks gave each parameter a gradient (one
        int32 per parameter, summed), asynchronously. Returns what ``_hvd_end_unused_vote``
        needs."""
        params = self._hvd_params()
        used = torch.tensor([p.grad is not None for p in params], dtype=torch.int32)
        handle = allreduce_async(used, name=f"{self._hvd_prefix}:unused-vote", op=Sum,
                                 process_set=self.process_set)
        return params, handle

    def _hvd_end_unused_vote(self, vote) -> None:
        """After the reductions: a parameter no rank gave a gradient was reduced as zeros
        everywhere; it gets ``.grad = None`` back, so the optimizer skips it (one process
        would never have given it a gradient)."""
        params, handle = vote
        for p, ranks in zip(params, synchronize(handle).tolist()):
            if ranks == 0:
                p.grad = None

    # ---------------------------------------------------------------------------- launching

    def _hvd_wire_compression(self):
        """The compressor of what goes out one tensor at a time: with PowerSGD, what it does
        not compress travels as it is."""
        return self._hvd_compression if self._hvd_powersgd is None else Compression.none

    def _hvd_prepare_grad(self, p):
        """``p.grad`` ready for the wire: zeros when this rank has none (unused parameter),
        densified with ``sparse_as_dense``. A parameter is known to have sparse gradients only
        once this rank has seen one: if it is unused here before that, this rank sends dense
        zeros while the others allgather, and the stall inspector reports the mismatch."""
        if p.grad is None:
            sparse_dim = self._hvd_sparse_seen.get(p)
            if sparse_dim is not None and not self.sparse_as_dense:
                # Same layout as the sparse gradients this parameter had before, with no rows:
                # the other ranks run the sparse (allgather) path for it and need ours.
                indices = torch.zeros((sparse_dim, 0), dtype=torch.int64, device=p.device)
                values = torch.zeros((0, *p.shape[sparse_dim:]), dtype=p.dtype, device=p.device)
                p.grad = torch.sparse_coo_tensor(indices, values, p.shape)
            else:
                p.grad = torch.zeros_like(p, memory_format=torch.contiguous_format)
        elif p.grad.is_sparse:
            self._hvd_sparse_seen[p] = p.grad.sparse_dim()
            if self.sparse_as_dense:
                p.grad = p.grad.to_dense()
        return p.grad

    def _hvd_launch(self, params, group) -> None:
        """Starts the reduction of ``params`` (one parameter, or the members of ``group``)."""
        if group is None and self._hvd_compression is Compression.none:
            p = params[0]
            grad = p.grad
            if grad is not None and not grad.is_sparse and grad.is_contiguous():
                # The common case, once per parameter per step: the gradient itself goes on
                # the wire, through one binding call with everything resolved in advance.
                if self._hvd_site is None:  # the user's line that ran backward (stall reports)
                    self._hvd_site = call_site()
                handle = allreduce_inplace(grad, self._hvd_negotiated[p], self.op,
                                           self._hvd_prescale, self._hvd_postscale,
                                           _id_of(self.process_set), self._hvd_site)
                self._hvd_pending[p] = Pending((p,), handle, (grad,), (None,))
                return
        dense = []
        for p in params:
            grad = self._hvd_prepare_grad(p)
            if grad.is_sparse:
                wait = sparse_allreduce_async(grad, self._hvd_wire_name(p), self.op,
                                              process_set=self.process_set)
                self._hvd_pending[p] = Pending([p], wait)
            else:
                dense.append(p)
        powersgd = self._hvd_powersgd
        if powersgd is not None:
            rest = []
            for p in dense:
                if powersgd.compressing(p.grad):
                    self._hvd_pending[p] = powersgd.launch(p, self._parameter_names[p],
                                                           self._hvd_wire_name(p))
                else:
                    rest.append(p)
            dense = rest
        if not dense:
            return
        wires, ctxs = [], []
        compression = self._hvd_wire_compression()
        for p in dense:
            wire, ctx = compression.compress(p.grad)
            wires.append(wire.contiguous())
            ctxs.append(ctx)
        kwargs = dict(op=self.op, prescale_factor=self._hvd_prescale,
                      postscale_factor=self._hvd_postscale, process_set=self.process_set)
        if group is None:
            handle = allreduce_async_(wires[0], name=self._hvd_wire_name(dense[0]), **kwargs)
        else:
            handle = grouped_allreduce_async_(wires, name=f"{self._hvd_prefix}.group{group}",
                                              **kwargs)
        pending = Pending(dense, handle, wires, ctxs)
        for p in dense:
            self._hvd_pending[p] = pending

    def _hvd_launch_missing(self) -> None:
        """Launches every parameter that requires a gradient and has not gone out yet: the C++
        reducer's (and what it leaves to this module), then the Python hooks'."""
        reducer = self._hvd_reducer
        if reducer is not None:
            if CUDA_BUILT:
                poll_pinning_check()
                device = -1 if device_check._device is None else device_check._device
                if device != self._hvd_device:  # the GPU the placement check accepted
                    reducer.set_device(device)
                    self._hvd_device = device
            for i in reducer.launch_missing():
                self._hvd_launch([self._hvd_native[i]], None)
        for p in self._hvd_python:
            if not p.requires_grad or p in self._hvd_pending.own:
                continue
            group = self._hvd_group_of.get(p)
            if group is None:
                self._hvd_launch([p], None)
            else:
                members = [m for m in self._hvd_groups[group]
                           if m.requires_grad and m not in self._hvd_pending]
                self._hvd_launch(members, group)
