"""A training job that Slurm stops early and runs again (tests/test_slurm.py), with the recipe of
docs/clusters.md ("Time limits and preemption"):

- SIGTERM (preemption, the time limit, scancel) or SIGUSR1 (``sbatch --signal=USR1@SECONDS``)
  only sets a flag; the signal reaches each rank at a different point of its step;
- after each step the ranks agree whether any of them was signalled (one allreduce, Max), so
  they all stop after the same step; rank 0 writes the checkpoint (model, optimizer, step) and
  puts the job back into Slurm's queue (``scontrol requeue``: Slurm ends this run, and does not
  requeue a preempted job that ended by itself within the grace time);
- a job that finds the checkpoint resumes from it (``resumed at step N``).

At the end rank 0 prints ``RESULT {json}``: the step it resumed at, and how far the weights are
from one process that trained on every step's whole batch without stopping."""

import argparse
import json
import os
import signal
import subprocess
import sys
import time

import torch

import horovodlite.torch as hvd

sys.stdout.reconfigure(line_buffering=True)
FEATURES, BATCH, LR = 8, 48, 0.05


def batch(step):
    g = torch.Generator().manual_seed(step)
    x = torch.randn(BATCH, FEATURES, generator=g)
    return x, (x @ torch.linspace(-1, 1, FEATURES)).unsqueeze(1)


def step_once(model, optimizer, x, y):
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()


def make():
    torch.manual_seed(0)
    model = torch.nn.Linear(FEATURES, 1)
    return model, torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--step-seconds", type=float, default=0.2)
    p.add_argument("--checkpoint", required=True)
    args = p.parse_args()

    stop = {"signal": 0}

    def on_signal(signum, _frame):
        stop["signal"] = max(stop["signal"], signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGUSR1, on_signal)

    hvd.init()
    model, optimizer = make()
    first = 0
    if os.path.exists(args.checkpoint):
        saved = torch.load(args.checkpoint)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        first = saved["step"]
        print(f"rank {hvd.rank()}: resumed at step {first} (restart "
              f"{os.environ.get('SLURM_RESTART_COUNT', '0')})")
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    for step in range(first, args.steps):
        x, y = batch(step)
        step_once(model, optimizer, x[hvd.rank()::hvd.size()], y[hvd.rank()::hvd.size()])
        if hvd.rank() == 0:
            print(f"step {step + 1} done")
        time.sleep(args.step_seconds)
        signalled = int(hvd.allreduce(torch.tensor([stop["signal"]]), op=hvd.Max,
                                      name="stop_signal").item())
        if signalled and step + 1 < args.steps:
            if hvd.rank() == 0:
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                            "step": step + 1}, args.checkpoint + ".tmp")
                os.replace(args.checkpoint + ".tmp", args.checkpoint)
                print(f"signal {signal.Signals(signalled).name}: checkpoint at step {step + 1}")
            hvd.barrier()  # the checkpoint is written before any rank leaves
            print(f"rank {hvd.rank()} stops after step {step + 1}")
            if hvd.rank() == 0 and "SLURM_JOB_ID" in os.environ:
                # back into the queue: Slurm ends this run's tasks and starts the job again
                subprocess.run(["scontrol", "requeue", os.environ["SLURM_JOB_ID"]], check=True)
            hvd.shutdown()
            return
    # Trained to the end: a time-limit warning now has nothing to stop. Python puts the default
    # action back as it exits, so a SIGUSR1 that came during the exit killed the task and the
    # finished job ended FAILED (seen on the real Slurm with --signal=USR1@40). Ignored, it
    # cannot.
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    if hvd.rank() == 0:
        alone, alone_opt = make()
        for step in range(args.steps):
            step_once(alone, alone_opt, *batch(step))
        worst = max((a - b).abs().max().item()
                    for a, b in zip(model.parameters(), alone.parameters()))
        print("RESULT " + json.dumps({"first": first, "size": hvd.size(), "worst": worst}))
    hvd.shutdown()


if __name__ == "__main__":
    main()
