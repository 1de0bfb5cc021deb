"""The vote before an optimizer step inside ``hvd.elastic.run`` under rollback ``step``
(horovodlite/torch/elastic/state.py).

A rank that fails between its backward pass and its ``optimizer.step()`` (its code raised, its
process died) has submitted its gradients' reductions already: they complete on its peers, who
would apply a step that rank never applies. Then the survivors hold different steps, and the
one whose state the others take may hold a step its own counters do not say it took. So every
``DistributedOptimizer.step()`` inside ``hvd.elastic.run`` first takes part in one allreduce of
one integer (the vote) over the optimizer's ranks: it completes only where every rank reached its
step, and a rank whose vote fails applies nothing. A vote that completes on some ranks only (a
rank lost during it) leaves those few a step ahead: the sync after the reset gives their state
to the others. Outside ``hvd.elastic.run``, and under rollback ``commit``, there is no vote.
"""

from __future__ import annotations

import contextlib

import torch

_depth = [0]  # hvd.elastic.run calls under rollback "step" on this thread's stack
NAME = "elastic.step_vote"


@contextlib.contextmanager
def voting(on: bool = True):
    """Steps taken inside vote first (``hvd.elastic.run``, rollback ``step``)."""
    _depth[0] += 1 if on else 0
    try:
        yield
    finally:
        _depth[0] -= 1 if on else 0


def active() -> bool:
    return _depth[0] > 0


def vote(process_set=None) -> None:
    """Collective over ``process_set``: returns once every rank reached its step; raises
    ``HorovodInternalError`` where one failed."""
    from horovodlite.torch.mpi_ops import Sum, allreduce

    kwargs = {} if process_set is None else {"process_set": process_set}
    allreduce(torch.zeros(1, dtype=torch.int32), name=NAME, op=Sum, **kwargs)


__all__ = ["voting", "active", "vote", "NAME"]
