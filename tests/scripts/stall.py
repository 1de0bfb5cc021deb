"""A rank that never submits a tensor (rank 1 skips 'grad.w'), submits it late, or ranks that
disagree on the name (rank 0 'grad.a', others 'grad.b'). Used by tests/test_failures.py."""

import sys
import time

import torch

import horovodlite.torch as hvd

hvd.init()
r = hvd.rank()
mode = sys.argv[1]
start = time.monotonic()
try:
    hvd.allreduce(torch.ones(1), name="warmup")
    if mode == "missing":
        if r != 1:
            hvd.allreduce(torch.ones(2), name="grad.w")  # rank 1 never submits it
        else:
            time.sleep(float(sys.argv[2]))
            hvd.allreduce(torch.ones(2), name="later")  # fails: the job was shut down
    elif mode == "late":
        if r == 1:
            time.sleep(float(sys.argv[2]))  # slow, but it does submit
        hvd.allreduce(torch.ones(2), name="grad.w")
    else:
        hvd.allreduce(torch.ones(2), name="grad.a" if r == 0 else "grad.b")
    print(f"rank {r}: finished without error", flush=True)
except hvd.HorovodInternalError as exc:
    print(f"rank {r}: HorovodInternalError after {time.monotonic() - start:.1f}s: {exc}",
          flush=True)
    sys.exit(3)
