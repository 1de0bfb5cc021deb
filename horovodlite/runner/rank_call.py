"""Running user code as one rank, inside a process that a Python launcher did not start for it.

``horovodlite.ray`` (Ray actors) and ``horovodlite.spark`` (Spark tasks) run each rank's function
in a process that outlives it and that catches its exceptions itself, so neither the process's
environment nor ``sys.excepthook`` (which stops the job on an uncaught exception, see
``common/basics.py``) does what it does in a process horovodliterun started. Hence:

- ``rank_environment(env)``: the rank's variables (``launch_env.gloo_rank_settings``) are set
  for the duration and the previous values put back afterwards (a Spark Python worker runs the
  next job's tasks too).
- ``call_as_rank(fn, ...)``: when ``fn`` raises, the runtime is stopped with the reason before
  the exception propagates, so the other ranks' collectives fail naming this rank instead of
  waiting for it until the stall timeout.
"""

from __future__ import annotations

import contextlib
import os
import sys

_BASICS = "horovodlite.common.basics"


def stop_runtime(reason: str) -> None:
    """Stops horovodlite in this process, telling the other ranks ``reason``; nothing when it
    was never imported or is not running."""
    basics = sys.modules.get(_BASICS)
    if basics is not None and basics.is_initialized():
        basics._stop(reason)


def shutdown_runtime() -> None:
    """``hvd.shutdown()`` when horovodlite runs in this process (a reused worker process must
    not carry one job's runtime into the next: ``init`` would be a no-op there)."""
    basics = sys.modules.get(_BASICS)
    if basics is not None and basics.is_initialized():
        basics.shutdown()


def call_as_rank(fn, args=(), kwargs=None):
    """``fn(*args, **kwargs)``; if it raises, the runtime is stopped with the reason first."""
    try:
        return fn(*args, **(kwargs or {}))
    except BaseException as e:
        stop_runtime(f"raised {type(e).__name__}: {e}")
        raise


@contextlib.contextmanager
def rank_environment(env: dict):
    """``os.environ`` updated with ``env`` inside the block, restored afterwards."""
    before = {k: os.environ.get(k) for k in env}
    os.environ.update({k: str(v) for k, v in env.items()})
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
