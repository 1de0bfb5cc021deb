"""The Python submission core: what every collective goes through between its argument checks
and the C++ queue, and back through ``synchronize``. ``mpi_ops``, ``collectives``, ``adasum`` and
``DistributedOptimizer`` use these functions; this module imports none of them.

It owns:

* **names**, as Horovod namespaces them: a collective negotiates under ``<op>.<name>``
  (``allreduce.x``, ``broadcast.x``), so different ops may use one user name at the same time,
  while the same op and name twice in flight is refused (the core refuses a name still in flight
  on this rank). Unnamed: ``<op>.noname.<n>``. Grouped ops: ``<op>.<name>.<i>`` for tensor i,
  where ``<op>`` is ``grouped_allreduce``, ``grouped_allgather`` or ``grouped_reducescatter``;
  sparse allreduce: ``sparse_allreduce.<name>.indices`` and ``.values`` (two allgathers);
  barriers: ``barrier.<set>.<n>``; join: ``join``. Timelines, stall reports and errors show
  these names (the core shows a name in its op's namespace as it is). Names outside this scheme
  (the GPU pinning check's) cannot collide with a user's;
* **call sites**: ``call_site()`` is the user's ``file:line`` for stall reports;
* **the handle table**: handle -> (result handler, kept). The result handler, one per kind of
  result (``in_place``, ``first_output``, ``all_outputs``, ``in_place_group``, ``alltoall_pair``,
  ``last_joined``, ``no_result``), turns the completed handle into what ``synchronize`` returns;
  ``kept`` (the op's tensors) is its argument and stays alive until then. ``then`` adds a step
  after the handler (Adasum combines the rows an allreduce returns);
* **submission**: ``submit`` (device check, enqueue, record), ``allreduce_inplace`` (the same for
  the per-gradient path, inlined), ``poll``, ``synchronize``, and ``reset`` after shutdown.

The GPU placement check (``device_check``) runs before every enqueue on CUDA builds; its
allgather is submitted and finished here too.
"""

from __future__ import annotations

import itertools
import os
import sys

import torch

from horovodlite._extension import load
from horovodlite.torch import device_check

_C = load()
CUDA_BUILT = bool(getattr(_C, "cuda_built", lambda: False)())

# ------------------------------------------------------------------------------------- names

_counters: dict[str, itertools.count] = {}  # op -> the next unnamed op's number
_barriers: dict[int, int] = {}  # process set id -> barriers so far


def op_name(op: str, name=None) -> str:
    """The name ``op`` negotiates under: ``<op>.<name>``, or ``<op>.noname.<n>`` without a name
    (numbered per op, so every rank must issue its unnamed ops of one kind in the same order)."""
    if name is not None:
        return f"{op}.{name}"
    counter = _counters.get(op)
    if counter is None:
        counter = _counters[op] = itertools.count()
    return f"{op}.noname.{next(counter)}"


def group_names(op: str, name, n: int) -> list:
    """The names of a grouped op's ``n`` tensors: ``op_name(op, name)`` + ``.<i>``."""
    base = op_name(op, name)
    return [f"{base}.{i}" for i in range(n)]


def barrier_name(ps_id: int) -> str:
    """``barrier.<set>.<n>``: the n-th barrier of process set ``ps_id`` (every member counts its
    barriers the same)."""
    count = _barriers.get(ps_id, 0)
    _barriers[ps_id] = count + 1
    return f"barrier.{ps_id}.{count}"


# -------------------------------------------------------------------------------- call sites

_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Frames from these folders are never "the user's call site" (autograd Functions add torch's).
_INTERNAL_DIRS = (_PKG_DIR, os.path.dirname(os.path.abspath(torch.__file__)))
# (id of a code object, bytecode offset) of a call into horovodlite -> the user's file:line, or
# _WALK where that frame is horovodlite's or torch's own. Keyed by id, not by the code object,
# whose hash is computed over its contents on every lookup (~50 ns); _site_codes keeps each
# code object alive, so no other one can take its id.
_site_cache: dict = {}
_site_codes: list = []
_WALK = object()


def call_site() -> str:
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


# --------------------------------------------------------------------------- result handlers
# handler(handle, kept) -> what synchronize(handle) returns. Each waits for the handle (GIL
# released; raises the op's error) and builds the result.


def in_place(handle: int, tensor):
    """The op wrote into its input: ``tensor``."""
    _C.wait_done(handle)
    return tensor


def in_place_group(handle: int, tensors) -> list:
    """A grouped op wrote into its inputs: the list of them."""
    _C.wait_done(handle)
    return list(tensors)


def first_output(handle: int, _kept):
    """The op's one output tensor."""
    return _C.wait(handle)[0][0]


def all_outputs(handle: int, _kept) -> list:
    """A grouped op's output tensors, as a list."""
    return list(_C.wait(handle)[0])


def alltoall_pair(handle: int, _kept) -> tuple:
    """(output, the int32 tensor of rows received from each rank)."""
    outputs, received = _C.wait(handle)
    return outputs[0], torch.tensor(received, dtype=torch.int32)


def last_joined(handle: int, _kept) -> int:
    """join: the last rank to join."""
    return int(_C.wait(handle)[1][0])


def no_result(handle: int, _kept) -> None:
    _C.wait_done(handle)


def _untracked(handle: int, _kept):
    """A handle this table does not know (never issued, or synchronized already):
    ``_C.wait`` raises ValueError for it."""
    outputs, _ = _C.wait(handle)
    return outputs[0] if outputs else None


def _chained(handle: int, chain):
    handler, kept, after = chain
    return after(handler(handle, kept))


# ------------------------------------------------------------------------------- submission

_handles: dict[int, tuple] = {}  # handle -> (result handler, kept)
_UNTRACKED = (_untracked, None)


def submit(handler, op: str, enqueue, inputs=None, kept=None) -> int:
    """Enqueues the op and records how ``synchronize`` makes its result.

    ``enqueue()`` calls the binding and returns its handle (the core refuses a name still in
    flight on this rank, as a ValueError). ``inputs``: the op's input tensor or list of them,
    whose GPU placement CUDA builds check first (None: nothing to check). ``kept``: the
    handler's argument, kept alive until ``synchronize``."""
    if CUDA_BUILT and inputs is not None:
        check_device(inputs, op)
    handle = enqueue()
    _handles[handle] = (handler, kept)
    return handle


def allreduce_inplace(tensor, name: str, op: int, prescale: float, postscale: float,
                      ps_id: int, site: str) -> int:
    """In-place allreduce of one tensor with its arguments resolved (the negotiated name, an
    int op, floats, the set's id, the call site): ``allreduce_async_`` and
    DistributedOptimizer's per-gradient path. ``submit`` inlined: this runs once per gradient,
    and the lambda and the call cost ~0.3 us each time."""
    if CUDA_BUILT:
        check_device(tensor, "allreduce")
    handle = _C.enqueue_allreduce_(tensor, name, op, prescale, postscale, ps_id, site)
    _handles[handle] = (in_place, tensor)
    return handle


def then(handle: int, after) -> int:
    """``synchronize(handle)`` returns ``after(result)`` instead of the result."""
    handler, kept = _handles[handle]
    _handles[handle] = (_chained, (handler, kept, after))
    return handle


def poll(handle: int) -> bool:
    """True if the operation behind ``handle`` has finished (never blocks)."""
    return bool(_C.poll(handle))


def synchronize(handle: int):
    """Waits for ``handle`` and returns its result; raises HorovodInternalError on failure.

    An unknown or already-synchronized handle raises ValueError.
    """
    if device_check._pending is not None and device_check._pending != handle:
        poll_pinning_check()
    handler, kept = _handles.pop(handle, _UNTRACKED)
    if handler is in_place:  # every gradient: the handler inlined
        _C.wait_done(handle)
        return kept
    return handler(handle, kept)


# ----------------------------------------------------------------------------- device check


def check_device(inputs, op: str) -> None:
    """CUDA builds: device_check's GPU placement check of an op's input (tensor or list)."""
    device_check.note(inputs, op, _submit_pinning_check)
    poll_pinning_check()


def _submit_pinning_check(record) -> int:
    """The asynchronous allgather of device_check's (host, GPU) records over every rank."""
    name = device_check.CHECK_NAME
    return submit(first_output, "allgather",
                  lambda: _C.enqueue_allgather([record], [name], 0, [""]), None, record)


def poll_pinning_check() -> None:
    """Finishes device_check's pinning check once its allgather completed (never blocks)."""
    if device_check._pending is not None:
        device_check.poll(poll, synchronize, _C.rank())


# ------------------------------------------------------------------------------------ reset

_resets: list = []


def on_reset(fn):
    """Registers ``fn()`` to run at ``reset``: module state that belongs to one runtime."""
    _resets.append(fn)
    return fn


def reset() -> None:
    """After shutdown: unnamed ops and barriers count from 0 again and a new init may pin
    another GPU. Handles stay in the table: synchronizing one reports the shutdown."""
    _counters.clear()
    _barriers.clear()
    device_check._reset()
    for fn in _resets:
        fn()


__all__ = [
    "op_name", "group_names", "barrier_name", "call_site",
    "in_place", "in_place_group", "first_output", "all_outputs", "alltoall_pair", "last_joined",
    "no_result", "submit", "allreduce_inplace", "then", "poll", "synchronize", "check_device",
    "poll_pinning_check", "on_reset", "reset", "CUDA_BUILT",
]
