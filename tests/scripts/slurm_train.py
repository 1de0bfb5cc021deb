"""One task of an ``srun`` job (tests/test_slurm.py, on a real Slurm): hvd.init() from Slurm's
variables (and PMI's, under srun --mpi=pmix), a linear model trained on this rank's shard with
hvd.DistributedOptimizer, then one line ``RESULT {json}`` with the topology the runtime found and,
on rank 0, how far every rank's weights are from one process training on the whole data set."""

import json
import os
import socket
import sys

import torch

import horovodlite.torch as hvd

# A line is one write (the ranks share one pipe; unbuffered, print writes its parts apart).
sys.stdout.reconfigure(line_buffering=True, write_through=False)

SAMPLES, FEATURES, STEPS, LR = 240, 8, 20, 0.1


def make_data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, FEATURES, generator=g)
    y = x @ torch.linspace(-1, 1, FEATURES) + 0.1 * torch.randn(SAMPLES, generator=g)
    return x, y.unsqueeze(1)


def fit(model, optimizer, x, y):
    for _ in range(STEPS):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def main():
    hvd.init()
    x, y = make_data()
    torch.manual_seed(hvd.rank())
    model = torch.nn.Linear(FEATURES, 1)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                         named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    mine = fit(model, optimizer, x[hvd.rank()::hvd.size()], y[hvd.rank()::hvd.size()])
    everyone = hvd.allgather_object(mine.tolist())
    out = {"rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(),
           "local_size": hvd.local_size(), "cross_rank": hvd.cross_rank(),
           "cross_size": hvd.cross_size(), "gloo": hvd.gloo_enabled(),
           "slurm_procid": int(os.environ["SLURM_PROCID"]), "host": socket.gethostname()}
    if hvd.rank() == 0:
        torch.manual_seed(0)
        alone = torch.nn.Linear(FEATURES, 1)
        want = fit(alone, torch.optim.SGD(alone.parameters(), lr=LR), x, y)
        out["worst"] = max((torch.tensor(w) - want).abs().max().item() for w in everyone)
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
