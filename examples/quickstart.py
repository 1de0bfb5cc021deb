"""Quick start: named and unnamed asynchronous allreduces on every rank.

Shows: hvd.init, rank/size, unnamed ops (matched by call order), named ops (matched by name in any
order), in-place and out-of-place async allreduce with poll/synchronize, and a grouped allreduce.

Run:  horovodliterun -np 2 python examples/quickstart.py
"""

import torch

import horovodlite.torch as hvd

hvd.init()
rank, size = hvd.rank(), hvd.size()

# Unnamed: matched across ranks by the order of the calls.
total = hvd.allreduce(torch.tensor([float(rank)]), op=hvd.Sum)

# Named, asynchronous: ranks may issue them in different orders.
names = ["grad.weight", "grad.bias"]
if rank % 2:
    names.reverse()
values = {name: torch.full((3,), float(rank + 1)) for name in names}
handles = {name: hvd.allreduce_async_(values[name], name=name, op=hvd.Average) for name in names}
in_flight = [name for name, h in handles.items() if not hvd.poll(h)]
results = {name: hvd.synchronize(h) for name, h in handles.items()}

# Out of place, asynchronous; and several tensors in one fused group.
h = hvd.allreduce_async(torch.arange(4, dtype=torch.float32) * (rank + 1), name="scaled",
                        op=hvd.Sum, postscale_factor=0.5)
scaled = hvd.synchronize(h)
group = hvd.grouped_allreduce([torch.ones(2) * rank, torch.ones(3) * rank], op=hvd.Max)

print(f"rank {rank}/{size}: sum of ranks = {total.item():g}; "
      f"grad.weight avg = {results['grad.weight'].tolist()}; "
      f"in flight right after enqueue: {in_flight}; "
      f"scaled = {scaled.tolist()}; group max = {[g.tolist() for g in group]}", flush=True)

expected_avg = sum(k + 1 for k in range(size)) / size
assert torch.allclose(results["grad.weight"], torch.full((3,), expected_avg))
assert total.item() == sum(range(size))
hvd.shutdown()
