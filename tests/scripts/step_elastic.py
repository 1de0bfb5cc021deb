"""An elastic job written as Horovod's users write them (commit every ``--commit-every`` steps),
that loses a rank at a chosen point of a step, then checks where the survivors resumed, how
many steps each ran, and that their weights equal one process that trained on every step's
whole batch once.

    horovodliterun --elastic -np 3 python tests/scripts/step_elastic.py --kill 2:15:backward

``--kill RANK:STEP:WHERE``: that start rank SIGKILLs itself in step STEP,
- ``backward``: during its backward pass, while its gradients are being reduced;
- ``reduced``: after ``optimizer.synchronize()`` returned (its reductions completed, so the
  others' did too, or nearly), before its ``optimizer.step()``: it never votes for the step;
- ``applied``: after its update, before the next step.

Step s trains on a global batch of 12 rows made from seed s, split evenly over the ranks of the
moment (1, 2, 3 or 4 of them): the average of the ranks' gradients is the whole batch's, so a
step applied once, by whatever number of ranks, is the one-process step - and a step applied
twice, or skipped, or applied by some ranks only, shows in the weights.

Each survivor prints ``RESUMED rank R at step S`` after a reset, ``RAN rank R steps N`` (the
optimizer steps this process executed) and ``FINAL rank R size Z steps S`` once its weights
equal the reference (rtol 1e-12).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

import torch

import horovodlite.torch as hvd

sys.stdout.reconfigure(line_buffering=True)
ROWS, FEATURES, LR = 12, 5, 0.1


def global_batch(step: int):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(ROWS, FEATURES, generator=g, dtype=torch.float64)
    return x, x.sum(dim=1, keepdim=True).sin()


def make():
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 4), torch.nn.Tanh(),
                                torch.nn.Linear(4, 1)).double()
    return model, torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)


def loss_of(model, x, y):
    return torch.nn.functional.mse_loss(model(x), y)


def reference(steps: int):
    model, opt = make()
    for s in range(steps):
        opt.zero_grad()
        loss_of(model, *global_batch(s)).backward()
        opt.step()
    return model


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--commit-every", type=int, default=10)
    p.add_argument("--kill", action="append", default=[], help="RANK:STEP:WHERE")
    args = p.parse_args()
    torch.set_num_threads(1)

    hvd.init()
    start_rank = hvd.rank()
    kills = {}
    for spec in args.kill:
        r, s, where = spec.split(":")
        kills[(int(r), int(s))] = where
    model, inner = make()
    opt = hvd.DistributedOptimizer(inner, named_parameters=model.named_parameters())
    ran = [0]
    opt.register_step_post_hook(lambda *_: ran.__setitem__(0, ran[0] + 1))
    state = hvd.elastic.TorchState(model, opt, batch=0)
    resets = [0]
    state.register_reset_callbacks([lambda: resets.__setitem__(0, resets[0] + 1)])

    def die(step: int, where: str) -> None:
        print(f"KILLED rank {start_rank} in step {step} ({where})", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    @hvd.elastic.run
    def train(state):
        if resets[0]:
            print(f"RESUMED rank {hvd.rank()} at step {state.batch}", flush=True)
        while state.batch < args.steps:
            s = state.batch
            where = kills.get((start_rank, s))
            x, y = global_batch(s)
            opt.zero_grad()
            loss = loss_of(model, x[hvd.rank()::hvd.size()], y[hvd.rank()::hvd.size()])
            if where == "backward":
                model[0].weight.register_hook(lambda g, s=s, where=where: die(s, where))
            loss.backward()
            opt.synchronize()
            if where == "reduced":
                die(s, where)
            with opt.skip_synchronize():
                opt.step()
            if where == "applied":
                die(s, where)
            state.batch = s + 1
            if state.batch % args.commit_every == 0:
                state.commit()

    train(state)
    print(f"RAN rank {hvd.rank()} steps {ran[0]}", flush=True)
    expected = reference(args.steps)
    for got, want in zip(model.parameters(), expected.parameters()):
        torch.testing.assert_close(got.detach(), want.detach(), rtol=1e-12, atol=1e-14)
    print(f"FINAL rank {hvd.rank()} size {hvd.size()} steps {state.batch}", flush=True)


if __name__ == "__main__":
    main()
