"""What ``state.commit()`` costs a training step, under rollback ``commit`` (Horovod's: a
barrier, a deep copy of the model and the optimizer, a barrier) and rollback ``step`` (the
default: no copy), against training without commits - all in ONE invocation, alternating.

Every rank trains the same model with ``DistributedOptimizer(Adam)`` on its own fixed batch.
``--rounds`` rounds, each timing, one after the other, ``--steps`` steps of:

1. ``none``: no commit;
2. ``commit/1`` and ``commit/10``: rollback ``commit``, a commit after every step, and after
   every 10th (what Horovod's users do to keep the copies' cost down, and lose up to 10 steps);
3. ``step/1``: rollback ``step``, a commit after every step (every step is a commit anyway),
   each step with the vote ``hvd.elastic.run`` adds under rollback ``step`` (one allreduce of
   one integer before the update).

A step is timed on every rank (the slower rank's counts); the table gives the mean step (the
commits' cost spread over the steps), the median and the interquartile range, and the mean
against ``none``.

Run:  horovodliterun -np 2 python benchmarks/elastic_commit.py
      horovodliterun -np 2 python benchmarks/elastic_commit.py --width 2048 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

import horovodlite.torch as hvd
from horovodlite.torch import step_vote

CONFIGS = (("none", None, 0), ("commit/1", "commit", 1), ("commit/10", "commit", 10),
           ("step/1", "step", 1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--width", type=int, default=1024, help="layer width (4 layers)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    torch.manual_seed(0)
    layers = []
    for _ in range(4):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers)
    opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-4),
                                   named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, opt, step=0)
    x = torch.randn(args.batch, args.width)
    params = sum(p.numel() for p in model.parameters())

    def step():
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
        state.step += 1

    times: dict = {name: [] for name, _, _ in CONFIGS}
    for _ in range(2):  # warm-up: Adam's state exists, the buckets are laid out
        step()
    for _ in range(args.rounds):
        for name, mode, every in CONFIGS:
            if mode:
                os.environ["HOROVOD_ELASTIC_ROLLBACK"] = mode
            hvd.barrier()
            for i in range(args.steps):
                start = time.perf_counter()
                with step_vote.voting(mode == "step"):
                    step()
                    if every and (i + 1) % every == 0:
                        state.commit()
                took = time.perf_counter() - start
                times[name].append(max(hvd.allgather_object(took, name="commit.t")))
    if hvd.rank() == 0:
        print(f"{hvd.size()} rank(s), {params / 1e6:.1f} M parameters "
              f"({params * 12 / 2**20:.0f} MiB with Adam's state), {args.rounds} rounds of "
              f"{args.steps} steps")
        base = statistics.fmean(times["none"])
        print(f"{'config':<10} {'mean ms':>8} {'median ms':>10} {'IQR ms':>14} {'vs none':>8}")
        for name, _, _ in CONFIGS:
            q = statistics.quantiles(times[name], n=4)
            mean, med = statistics.fmean(times[name]), statistics.median(times[name])
            print(f"{name:<10} {mean * 1e3:8.2f} {med * 1e3:10.2f} "
                  f"{q[0] * 1e3:6.2f}-{q[2] * 1e3:<7.2f} {mean / base:8.2f}")


if __name__ == "__main__":
    main()
