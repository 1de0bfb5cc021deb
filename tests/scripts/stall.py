"""A rank that never submits a tensor (rank 1 skips 'grad.w'), submits it late, ranks that
disagree on the name (rank 0 'grad.a', others 'grad.b') or on the op under one name (rank 0
allreduces 'grad.k', the others allgather it: names are op-prefixed, so these are two names), or
a DistributedOptimizer step that rank 1 skips (its gradients' stall report names the other ranks'
backward line). Used by tests/test_failures.py."""

import sys
import time

import torch

import horovodlite.torch as hvd

# A line is one write (the ranks share one pipe; unbuffered, print writes its parts apart).
sys.stdout.reconfigure(line_buffering=True, write_through=False)

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
    elif mode == "optimizer":
        model = torch.nn.Linear(3, 2)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters())
        for step in range(3):
            opt.zero_grad()
            if r == 1 and step == 1:
                time.sleep(float(sys.argv[2]))
                break
            model(torch.ones(4, 3)).sum().backward()  # the step's gradients go out here
            opt.step()
        hvd.allreduce(torch.ones(2), name="later")
    elif mode == "late":
        if r == 1:
            time.sleep(float(sys.argv[2]))  # slow, but it does submit
        hvd.allreduce(torch.ones(2), name="grad.w")
    elif mode == "ops":
        if r == 0:
            hvd.allreduce(torch.ones(2), name="grad.k")
        else:
            hvd.allgather(torch.ones(2), name="grad.k")
    else:
        hvd.allreduce(torch.ones(2), name="grad.a" if r == 0 else "grad.b")
    print(f"rank {r}: finished without error", flush=True)
except hvd.HorovodInternalError as exc:
    print(f"rank {r}: HorovodInternalError after {time.monotonic() - start:.1f}s: {exc}",
          flush=True)
    sys.exit(3)
