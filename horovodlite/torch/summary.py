"""Per-rank performance summary: where each rank's time went since the last summary.

``hvd.summary()`` is collective (every rank calls it at the same point); each rank prints one
line: time in collectives, time it waited for the other ranks and which rank was the slowest
(the one the others waited for: it waited least), fusion buffer fill, achieved bus bandwidth.
With HOROVOD_SUMMARY_STEPS=N, DistributedOptimizer prints it every N steps.
"""

from __future__ import annotations

import os
import socket

from horovodlite._extension import load
from horovodlite.torch import submission
from horovodlite.torch.functions import allgather_object

_C = load()
_steps = 0
_every = None  # HOROVOD_SUMMARY_STEPS, read once per runtime


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024.0
    return f"{n:.1f} GB"


def summary(print_line: bool = True) -> dict:
    """Collects this rank's counters since the last summary, compares them across ranks and
    (by default) prints this rank's line. Returns the numbers as a dict."""
    mine = dict(_C.take_summary())
    everyone = allgather_object(mine, name="hvd.summary")
    _C.take_summary()  # the exchange above is not part of what the next summary reports
    waits = [s["wait_seconds"] for s in everyone]
    slowest = min(range(len(waits)), key=lambda k: waits[k])
    secs = mine["collective_seconds"]
    mine["slowest_rank"] = slowest
    mine["bus_bandwidth"] = mine["bus_bytes"] / secs if secs > 0 else 0.0
    avg_fused = mine["fused_bytes"] / mine["fused_batches"] if mine["fused_batches"] else 0.0
    fill = avg_fused / mine["fusion_threshold"] if mine["fusion_threshold"] else 0.0
    mine["fusion_fill"] = fill
    line = (f"[hvdl summary {_C.rank()}/{_C.size()} {socket.gethostname()}:{os.getpid()}] "
            f"collectives {secs:.3f} s ({mine['collectives']} calls, {mine['tensors']} tensors, "
            f"{_fmt_bytes(mine['bytes'])}); waited {mine['wait_seconds']:.3f} s for other ranks "
            f"(slowest: rank {slowest}); fusion buffer fill {100 * fill:.1f}% "
            f"({mine['fused_batches']} fused batches, avg {_fmt_bytes(avg_fused)} of "
            f"{_fmt_bytes(mine['fusion_threshold'])}); bus bandwidth "
            f"{_fmt_bytes(mine['bus_bandwidth'])}/s")
    mine["line"] = line
    if print_line:
        print(line, flush=True)
    return mine


def step_completed() -> None:
    """Counts a training step; prints the summary every HOROVOD_SUMMARY_STEPS steps."""
    global _steps, _every
    if _every is None:
        _every = int(_C.config().get("summary_steps", 0) or 0)
    if _every <= 0:
        return
    _steps += 1
    if _steps % _every == 0:
        summary()


@submission.on_reset
def _reset() -> None:
    global _steps, _every
    _steps, _every = 0, None


__all__ = ["summary"]
