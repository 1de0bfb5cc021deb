"""Failure modes for tests/test_failures.py: one rank raises, exits early, or is killed, while
the others wait in a collective. The survivors print what they got."""

import os
import signal
import sys
import time

import torch

import horovodlite.torch as hvd

# A line is one write (the ranks share one pipe; unbuffered, print writes its parts apart).
sys.stdout.reconfigure(line_buffering=True, write_through=False)

hvd.init()
r, n = hvd.rank(), hvd.size()
mode = sys.argv[1]
hvd.allreduce(torch.ones(1), name="warmup")
start = time.monotonic()
if r == 1:
    if mode == "raise":
        raise ValueError("bad batch 17")
    if mode == "exit":
        sys.exit(0)
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
try:
    hvd.allreduce(torch.ones(2), name="grad.step")
    print(f"rank {r}: finished", flush=True)
except hvd.HorovodInternalError as exc:
    took = time.monotonic() - start
    print(f"rank {r}: HorovodInternalError after {took:.1f}s: {exc}", flush=True)
    sys.exit(4)
