"""``benchmarks/train_step.py --device cuda``: training throughput on GPUs, all in one run.

Configurations, timed round by round in alternating order so that drifts hit all alike:

1. ``no communication``: every rank trains its own model at the same time, plain optimizer (at
   np 1 this is plain torch); its images/s is the sum over ranks;
2. ``horovodlite np=N``: hvd.DistributedOptimizer;
3. ``DDP <backend> np=N``: DistributedDataParallel on NCCL (one GPU per rank) or gloo (ranks
   sharing a GPU; benchmarks/gpu_setup.py decides).

A timed block is ``--steps`` steps after ``--warmup`` untimed ones, started together (barrier)
and ended by torch.cuda.synchronize(); a synchronized configuration's images/s is
N x batch x steps over the slowest rank's block. The same seed, model, batch and SGD everywhere.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import time

import gpu_setup
import torch
import torch.distributed as dist
import torch.nn.functional as F

import horovodlite.torch as hvd

ALONE = "no communication"


def init_peer(backend: str) -> None:
    """torch.distributed for DDP over env://; rank 0 picks a free port and shares it."""
    where = None
    if hvd.rank() == 0:
        addr = socket.gethostbyname(socket.gethostname())
        with socket.socket() as s:
            s.bind((addr, 0))
            where = (addr, s.getsockname()[1])
    addr, port = hvd.broadcast_object(where, root_rank=0, name="train_step_cuda.port")
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = addr, str(port)
    dist.init_process_group(backend, init_method="env://", rank=hvd.rank(),
                            world_size=hvd.size())


def timed_block(model, optimizer, batch, args, plan) -> float:
    """Seconds for ``args.steps`` steps on this rank (after the warm-up, all ranks together)."""
    x, y = batch

    def step():
        optimizer.zero_grad(set_to_none=True)
        with plan.autocast(args.amp):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()

    for _ in range(args.warmup):
        step()
    plan.synchronize()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    plan.synchronize()
    return time.perf_counter() - start


def one_round(name, args, make_model, make_batch, plan) -> list:
    """Every rank's block time for configuration ``name``."""
    device = plan.torch_device
    model = make_model(args.model).to(device)
    sgd = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if name.startswith("horovodlite"):
        opt = hvd.DistributedOptimizer(sgd, named_parameters=model.named_parameters())
    elif name.startswith("DDP"):
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=plan.ddp_device_ids)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    else:
        opt = sgd
    x, y = make_batch(args.model, args.batch_size, hvd.rank())
    seconds = timed_block(model, opt, (x.to(device), y.to(device)), args, plan)
    return hvd.allgather_object(seconds, name=f"train_step_cuda.{name}")


def images_per_second(name, blocks, args) -> float:
    """Median over rounds; alone: the sum of every rank's own rate."""
    per_round = []
    for ranks in blocks:
        if name == ALONE:
            per_round.append(sum(args.batch_size * args.steps / t for t in ranks))
        else:
            per_round.append(len(ranks) * args.batch_size * args.steps / max(ranks))
    return statistics.median(per_round)


def run(args, make_model, make_batch) -> int:
    plan = gpu_setup.setup("benchmarks/train_step.py", hvd)
    torch.backends.cudnn.benchmark = True
    init_peer(plan.peer_backend)
    n = hvd.size()
    names = [ALONE, f"horovodlite np={n}", f"DDP {plan.peer_backend} np={n}"]
    blocks = {name: [] for name in names}
    for r in range(args.rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            blocks[name].append(one_round(name, args, make_model, make_batch, plan))
    if hvd.rank() == 0:
        report(args, plan, names, blocks)
    dist.destroy_process_group()
    hvd.shutdown()
    return 0


def report(args, plan, names, blocks) -> None:
    rates = {name: images_per_second(name, blocks[name], args) for name in names}
    alone, ours, ddp = (rates[k] for k in names)
    print(f"\nmodel={args.model} batch/rank={args.batch_size} amp={args.amp or 'fp32'} "
          f"ranks={hvd.size()} on {plan.name()}: {plan.describe()}; "
          f"rounds={args.rounds} x {args.steps} timed steps (after {args.warmup} warm-up each)")
    unit = "images/s" if args.model in ("resnet50", "cnn") else "samples/s"
    print(f"{'configuration':<24}{unit:>11}{'ms/step':>10}{'of no comm.':>13}")
    for name in names:
        step_ms = 1e3 * args.batch_size * hvd.size() / rates[name]
        print(f"{name:<24}{rates[name]:>11.1f}{step_ms:>10.2f}{rates[name] / alone:>12.1%}")
    print(f"\nhorovodlite / no communication: {ours / alone:.1%}; DDP / no communication: "
          f"{ddp / alone:.1%}; horovodlite / DDP: {ours / ddp:.3f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(model=args.model, batch=args.batch_size, amp=args.amp or "fp32",
                           np=hvd.size(), gpu=plan.name(),
                           shared_gpu=plan.shared, peer=plan.peer_backend,
                           per_second=rates, unit=unit, horovodlite_of_alone=ours / alone,
                           ddp_of_alone=ddp / alone, horovodlite_over_ddp=ours / ddp), f,
                      indent=1)
