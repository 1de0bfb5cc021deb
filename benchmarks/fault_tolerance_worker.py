"""One worker of benchmarks/fault_tolerance.py: the same model, data and steps under horovodlite's
elastic training, torchft, or torchrun restarts with checkpoints.

    python benchmarks/fault_tolerance_worker.py hvdl --steps 600   (under horovodliterun --elastic)
    python benchmarks/fault_tolerance_worker.py torchft  --steps 600 --replica I --lighthouse ADDR
    python benchmarks/fault_tolerance_worker.py torchrun --steps 600 --checkpoint FILE  (torchrun)

Step s trains on global batch s (a seeded batch of GLOBAL rows), split among the workers that take
part in it. Lines on stdout, read by the harness (one write each):

- ``UP <pid> <wall>``: the worker started training (after its init);
- ``STEP <s> <wall> <workers> <generation> <pid>``: step s was applied (``s`` counts applied
  steps: 1 after the first); the generation is what a redone step is told apart by (the
  elastic round, the torchrun restart; torchft never redoes a step);
- ``DISCARD <s> <wall> <pid>``: torchft did not commit step s (a failure during it);
- ``FINAL <pid> <sum of the weights> <max abs diff from one process>``: horovodlite and torchrun,
  whose every step averages the whole global batch, are compared with one process training the
  same steps on it (torchft drops the batch share of a replica that is away, so it is not).

horovodlite: each rank's share is scaled so that the average over the ranks is the global batch's
mean gradient whatever the number of ranks (the events change who computes a step, never what
it computes); torchft and torchrun: each worker its fixed quarter of the batch, mean loss, as
their users write it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

D, GLOBAL, SEED, LR = 256, 64, 11, 0.05


def say(*words) -> None:
    """One line, one write (torchrun's workers share one pipe)."""
    sys.stdout.flush()
    os.write(1, (" ".join(str(w) for w in words) + "\n").encode())


def make_model():
    torch.manual_seed(SEED)
    # float64: in float32 the order of the sums alone (4 shares or one batch) moves this model's
    # weights by ~0.07 after 600 steps, and no comparison with one process would mean anything
    model = torch.nn.Sequential(torch.nn.Linear(D, D), torch.nn.ReLU(), torch.nn.Linear(D, D),
                                torch.nn.ReLU(), torch.nn.Linear(D, 1)).double()
    return model, torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)


def batch(s: int):
    g = torch.Generator().manual_seed(SEED * 1_000_003 + s)
    return (torch.randn(GLOBAL, D, generator=g, dtype=torch.float64),
            torch.randn(GLOBAL, 1, generator=g, dtype=torch.float64))


def reference(steps: int):
    model, opt = make_model()
    for s in range(steps):
        x, y = batch(s)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return model


def flat(model) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def work(seconds: float) -> None:
    """The rest of a training step (a larger model's compute), the same for every system."""
    if seconds > 0:
        time.sleep(seconds)


def run_hvdl(args) -> None:
    import horovodlite.torch as hvd
    from horovodlite.common import elastic_worker

    hvd.init()
    model, opt = make_model()
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, opt, step=0)
    say("UP", os.getpid(), f"{time.time():.3f}")

    @hvd.elastic.run
    def train(state):
        while state.step < args.steps:
            x, y = batch(state.step)
            n, r = hvd.size(), hvd.rank()
            opt.zero_grad()
            # rows r::n, scaled: the average over the n ranks is the global batch's mean gradient
            loss = torch.nn.functional.mse_loss(model(x[r::n]), y[r::n], reduction="sum")
            (loss * n / GLOBAL).backward()
            work(args.work)
            opt.step()
            state.step += 1
            say("STEP", state.step, f"{time.time():.3f}", n, elastic_worker.current().number,
                os.getpid())
            state.commit()

    train(state)
    rows = hvd.allgather(flat(model).unsqueeze(0), name="final.weights")
    agree = all(torch.equal(row, rows[0]) for row in rows)
    diff = (flat(model) - flat(reference(args.steps))).abs().max().item()
    say("FINAL", os.getpid(), f"{flat(model).sum().item():.9g}", f"{diff:.3g}",
        "agree" if agree else "DISAGREE")


def run_torchft(args) -> None:
    from datetime import timedelta

    import torch.distributed as dist
    import torchft

    model, opt = make_model()
    store = dist.TCPStore("localhost", 0, is_master=True, wait_for_workers=False)

    def load_state_dict(sd):
        model.load_state_dict(sd["model"])
        opt.load_state_dict(sd["optim"])

    def state_dict():
        return {"model": model.state_dict(), "optim": opt.state_dict()}

    manager = torchft.Manager(
        pg=torchft.ProcessGroupGloo(timeout=timedelta(seconds=10)), min_replica_size=1,
        load_state_dict=load_state_dict, state_dict=state_dict,
        replica_id=f"replica{args.replica}", store_addr="localhost", store_port=store.port,
        rank=0, world_size=1, lighthouse_addr=args.lighthouse, timeout=timedelta(seconds=10),
        init_sync=False)  # every replica starts from the same seed
    # (torchft.DistributedDataParallel: its comm hook's `assert fut._fut` failed on every
    # survivor when a peer was lost, torchft 0.2.0 on Gloo; so the gradients go through
    # Manager.allreduce as one flat tensor, which reports the error and discards the step)
    optim = torchft.Optimizer(manager, opt)
    params = list(model.parameters())
    say("UP", os.getpid(), f"{time.time():.3f}")
    while manager.current_step() < args.steps:
        s = manager.current_step()
        optim.zero_grad()  # starts the step's quorum
        x, y = batch(s)
        i = args.replica
        torch.nn.functional.mse_loss(model(x[i::4]), y[i::4]).backward()
        grads = torch.cat([p.grad.flatten() for p in params])
        manager.allreduce(grads).wait()  # the average over the step's participants
        offset = 0
        for p in params:
            p.grad.copy_(grads[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        work(args.work)
        optim.step()  # applied only if every participant says it should commit
        if manager.current_step() > s:
            say("STEP", manager.current_step(), f"{time.time():.3f}",
                manager.num_participants(), 0, os.getpid())
        else:
            say("DISCARD", s + 1, f"{time.time():.3f}", os.getpid())
    say("FINAL", os.getpid(), f"{flat(model).sum().item():.9g}", "nan", "-")
    manager.shutdown(wait=False)


def run_torchrun(args) -> None:
    from datetime import timedelta

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    r, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    generation = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    # under a key prefix of this restart's own: with init_process_group("gloo") alone, the
    # restarted workers read the killed generation's addresses from the agent's store and
    # failed to connect (torch 2.13, --standalone), restart after restart
    base = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), n, False,
                         timedelta(seconds=60))
    dist.init_process_group("gloo", store=dist.PrefixStore(f"ft-bench/{generation}/", base),
                            rank=r, world_size=n)
    model, opt = make_model()
    step = 0
    if os.path.exists(args.checkpoint):
        saved = torch.load(args.checkpoint)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optim"])
        step = saved["step"]
    ddp = DistributedDataParallel(model)
    say("UP", os.getpid(), f"{time.time():.3f}")
    while step < args.steps:
        x, y = batch(step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x[r::n]), y[r::n]).backward()
        work(args.work)
        opt.step()
        step += 1
        say("STEP", step, f"{time.time():.3f}", n, generation, os.getpid())
        if step % args.every == 0 and r == 0:
            tmp = args.checkpoint + ".tmp"
            torch.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": step},
                       tmp)
            os.replace(tmp, args.checkpoint)
    diff = (flat(model) - flat(reference(args.steps))).abs().max().item() if r == 0 else 0.0
    say("FINAL", os.getpid(), f"{flat(model).sum().item():.9g}", f"{diff:.3g}", "-")
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("system", choices=["hvdl", "torchft", "torchrun"])
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--work", type=float, default=0.05, help="seconds of other work per step")
    p.add_argument("--replica", type=int, default=0, help="torchft: this replica's number")
    p.add_argument("--lighthouse", help="torchft: the lighthouse's address")
    p.add_argument("--checkpoint", help="torchrun: the checkpoint file")
    p.add_argument("--every", type=int, default=50, help="torchrun: steps between checkpoints")
    args = p.parse_args()
    torch.set_num_threads(1)
    {"hvdl": run_hvdl, "torchft": run_torchft, "torchrun": run_torchrun}[args.system](args)


if __name__ == "__main__":
    main()
