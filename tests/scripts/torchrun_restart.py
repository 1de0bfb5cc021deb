"""hvd.elastic.run under torchrun's own elasticity (``--max-restarts K``): a worker dies, torchrun
restarts every worker, and they resume from the last checkpoint the script wrote at a commit.

    torchrun --standalone --nproc_per_node 2 --max-restarts 1 torchrun_restart.py CKPT

On the first attempt rank 1 SIGKILLs itself at step KILL_AT. The survivors' collective fails,
hvd.elastic.run ends them (under torchrun --max-restarts a reset would wait for the dead), and
torchrun starts both again (TORCHELASTIC_RESTART_COUNT=1): they load the checkpoint, train to
STEPS, and check their weights against the same training done here without interruption (every
rank feeds the same batch, so the average gradient is the one-process gradient).
"""

from __future__ import annotations

import os
import signal
import sys

import torch

import horovodlite.torch as hvd

# A line is one write (the ranks share one pipe; unbuffered, print writes its parts apart).
sys.stdout.reconfigure(line_buffering=True, write_through=False)

STEPS, KILL_AT = 20, 7


def make():
    torch.manual_seed(3)
    model = torch.nn.Linear(4, 1).double()
    return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def batch(step):
    g = torch.Generator().manual_seed(step)
    x = torch.randn(8, 4, generator=g, dtype=torch.float64)
    return x, x.sum(dim=1, keepdim=True)


def loss_at(model, step):
    x, y = batch(step)
    return torch.nn.functional.mse_loss(model(x), y)


def main():
    ckpt = sys.argv[1]
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    torch.set_num_threads(1)
    hvd.init()
    model, opt = make()
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, opt, step=0)
    if os.path.exists(ckpt):  # a restart: the last commit the job saved
        saved = torch.load(ckpt)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        state.step = saved["step"]
    print(f"START rank {hvd.rank()} restart {restart} step {state.step}", flush=True)

    @hvd.elastic.run
    def train(state):
        while state.step < STEPS:
            opt.zero_grad()
            loss_at(model, state.step).backward()
            if restart == 0 and hvd.rank() == 1 and state.step == KILL_AT:
                os.kill(os.getpid(), signal.SIGKILL)
            opt.step()
            state.step += 1
            state.commit()
            if hvd.rank() == 0:  # the checkpoint a restart resumes from
                torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                            "step": state.step}, ckpt + ".tmp")
                os.replace(ckpt + ".tmp", ckpt)

    train(state)
    ref, ref_opt = make()
    for step in range(STEPS):
        ref_opt.zero_grad()
        loss_at(ref, step).backward()
        ref_opt.step()
    for got, want in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(got.detach(), want.detach(), rtol=1e-12, atol=1e-12)
    print(f"FINAL rank {hvd.rank()} restart {restart} steps {state.step} match", flush=True)


if __name__ == "__main__":
    main()
