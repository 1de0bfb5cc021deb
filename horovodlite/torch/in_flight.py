"""What DistributedOptimizer has in flight during a step, and its C++ gradient hooks' Python
side (``distributed_optimizer.py`` describes the protocol).

* ``Pending``: one reduction launched by the Python path, and how its result is written back;
* ``InFlight``: the step's reductions - the Python path's ``Pending`` objects and the ones the
  C++ reducer (``_C.GradReducer``, csrc/torch/grad_reducer.h) launched - as one mapping from
  parameter to launch;
* ``NativeHook``: the entry of ``_hvd_hooks`` for a parameter hooked in C++;
* ``hook_site``: the user's line, for the C++ hooks' stall reports.
"""

from __future__ import annotations

import collections.abc

from horovodlite.torch.submission import call_site, synchronize


class Pending:
    """One launched reduction: the parameters it covers and how to write results back.

    ``handle`` is an int handle (dense, possibly grouped) or a callable returned by
    ``sparse_allreduce_async``. ``wires`` are the tensors on the wire (``p.grad`` itself without
    compression and when contiguous, else a compressed or contiguous copy).
    """

    __slots__ = ("params", "handle", "wires", "ctxs")

    def __init__(self, params, handle, wires=(), ctxs=()):
        self.params = list(params)
        self.handle = handle
        self.wires = list(wires)
        self.ctxs = list(ctxs)

    def finish(self, compression) -> None:
        """Waits and writes the reduced gradients into ``p.grad`` (caller's thread)."""
        if callable(self.handle):  # sparse: the reduced tensor replaces the gradient
            self.params[0].grad = self.handle()
            return
        synchronize(self.handle)
        for p, wire, ctx in zip(self.params, self.wires, self.ctxs):
            if wire is not p.grad:
                p.grad.copy_(compression.decompress(wire, ctx))


class InFlight(collections.abc.MutableMapping):
    """What is in flight this step: ``own`` maps a parameter launched by this module to its
    ``Pending``; a parameter whose allreduce the C++ reducer launched maps to its reducer index
    (an allreduce of its own, as each of the reducer's is)."""

    __slots__ = ("own", "reducer", "native")

    def __init__(self, reducer, native):
        self.own = {}
        self.reducer = reducer  # the _C.GradReducer, or None
        self.native = native  # reducer index -> parameter

    def _natives(self) -> list:
        return [] if self.reducer is None else [self.native[i] for i in self.reducer.in_flight()]

    def __getitem__(self, p):
        pending = self.own.get(p)
        if pending is not None:
            return pending
        for i in [] if self.reducer is None else self.reducer.in_flight():
            if self.native[i] is p:
                return ("native", i)
        raise KeyError(p)

    def __setitem__(self, p, pending) -> None:
        self.own[p] = pending

    def __delitem__(self, p) -> None:
        del self.own[p]

    def __iter__(self):
        yield from self.own
        yield from self._natives()

    def __len__(self) -> int:
        return len(self.own) + (0 if self.reducer is None else self.reducer.num_in_flight())

    def clear(self) -> None:
        """Forgets this module's launches (the reducer's end with its wait_all or abandon)."""
        self.own.clear()


class NativeHook:
    """``_hvd_hooks``' entry for a parameter on the C++ path: removing it detaches the reducer,
    whose hooks go together (``_hvd_remove_hooks`` removes every hook at once)."""

    __slots__ = ("reducer",)

    def __init__(self, reducer):
        self.reducer = reducer

    def remove(self) -> None:
        self.reducer.detach()


def hook_site() -> str:
    """The C++ hooks' call site: the user's line, or "" on a thread with no Python frames
    (autograd's CUDA device threads)."""
    try:
        return call_site()
    except ValueError:  # fewer frames than call_site skips
        return ""


__all__ = ["Pending", "InFlight", "NativeHook", "hook_site"]
