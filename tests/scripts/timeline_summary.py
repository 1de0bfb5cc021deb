"""Records a timeline of allreduce/allgather/broadcast traffic and prints the summary numbers
as JSON (last line) for tests/test_failures.py to compare with the timeline."""

import json
import sys

import torch

import horovodlite.torch as hvd

# A line is one write (the ranks share one pipe; unbuffered, print writes its parts apart).
sys.stdout.reconfigure(line_buffering=True, write_through=False)

hvd.init()
path = sys.argv[1]
hvd.summary(print_line=False)  # resets the counters
hvd.start_timeline(path, mark_cycles=True)
for _ in range(4):
    handles = [hvd.allreduce_async_(torch.ones(100 * (i + 1)), name=f"grad.{i}") for i in range(5)]
    for h in handles:
        hvd.synchronize(h)
    hvd.allgather(torch.ones(hvd.rank() + 1, 2), name="gathered")
    hvd.broadcast(torch.ones(3, dtype=torch.float64), 0, name="bcast")
hvd.stop_timeline()
stats = hvd.summary()
print(json.dumps({k: v for k, v in stats.items() if k != "line"}), flush=True)
