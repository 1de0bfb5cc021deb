"""PowerSGD against the link: the step time of a communication-bound model with horovodlite's
``hvd.Compression.powersgd(rank=R)``, uncompressed, with fp16, and with DDP on gloo with and
without torch's ``powerSGD_hook`` at the same rank - all in ONE invocation, rounds alternating.

Model ``linear4`` (default): four Linear(2048, 2048) layers with ReLU between, batch 16 - 64 MiB
of float32 gradients per step, nearly all of it in matrices. Every rank trains on its own fixed
batch, one torch thread per rank. Each configuration is built fresh in each round, runs
``--warmup`` untimed steps (PowerSGD's warm-up included: its ``warmup_steps`` and DDP's
``start_powerSGD_iter`` are both ``--psgd-warmup``), then ``--steps`` timed steps; a step's time
is the slowest rank's (the ranks start together after a barrier). Configurations:

- ``alone``: each rank trains with the plain optimizer, no communication (the ceiling);
- ``hvdl``, ``hvdl-fp16``, ``hvdl-powersgd``: horovodlite's DistributedOptimizer;
- ``ddp``, ``ddp-powersgd``: DistributedDataParallel on gloo (env://), the latter with
  ``powerSGD_hook`` (``PowerSGDState(matrix_approximation_rank=R, start_powerSGD_iter=...,
  use_error_feedback=True, warm_start=True)``) and all gradients in one bucket (with several,
  gloo aborted on a collective mismatch across hosts).

Printed: per configuration the median step time and its range over rounds (each round's median),
samples/s, the ratio to ``hvdl``, and the effective bandwidth: gradient bytes reduced per second
divided by the link's rate (``--link-gbit``): uncompressed, a ring between two hosts cannot pass 1.

Across the test hosts (docs/test_hosts.md), two hosts with two ranks each, 1 Gbit/s links:

    tests/hosts/hostctl.sh up 2
    tests/hosts/hostctl.sh run hvdl-host0 horovodliterun -np 4 -H hvdl-host0:2,hvdl-host1:2 \\
        --mpi-args "$(tests/hosts/hostctl.sh mpi-args)" python benchmarks/powersgd.py
    (add --gloo for the controller without MPI)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import horovodlite.torch as hvd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_step import init_gloo  # noqa: E402

CONFIGS = ["alone", "hvdl", "hvdl-fp16", "hvdl-powersgd", "ddp", "ddp-powersgd"]


def make_model(width: int, layers: int):
    torch.manual_seed(0)
    mods = []
    for i in range(layers):
        mods.append(torch.nn.Linear(width, width))
        if i + 1 < layers:
            mods.append(torch.nn.ReLU())
    return torch.nn.Sequential(*mods)


def build(config: str, args):
    """(model, optimizer) of one configuration, fresh."""
    model = make_model(args.width, args.layers)
    if config == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    elif config == "ddp-powersgd":
        # One bucket: with several, the hook's chained allreduces (P, then Q, per bucket) reach
        # gloo in different orders on different ranks across hosts, and gloo aborts ("Received
        # data size doesn't match expected size", torch 2.13, 2 hosts x 2 ranks).
        model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1024)
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
        state = psgd.PowerSGDState(process_group=None,
                                   matrix_approximation_rank=args.rank,
                                   start_powerSGD_iter=args.psgd_warmup,
                                   use_error_feedback=True, warm_start=True)
        model.register_comm_hook(state, psgd.powerSGD_hook)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    if config.startswith("hvdl"):
        compression = {"hvdl": hvd.Compression.none, "hvdl-fp16": hvd.Compression.fp16,
                       "hvdl-powersgd": hvd.Compression.powersgd(
                           rank=args.rank, warmup_steps=args.psgd_warmup)}[config]
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                       compression=compression)
    return model, opt


def time_config(config: str, args) -> float:
    """The median step time of ``config`` over ``--steps`` steps (the slowest rank's)."""
    model, opt = build(config, args)
    g = torch.Generator().manual_seed(hvd.rank())
    x = torch.randn(args.batch_size, args.width, generator=g)
    y = torch.randn(args.batch_size, args.width, generator=g)

    def step():
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()

    for _ in range(args.warmup):
        step()
    dist.barrier()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    dist.barrier()
    every = hvd.allgather_object(times, name=f"powersgd.bench.{config}")
    return statistics.median(max(ts) for ts in zip(*every))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--rank", type=int, default=4, help="PowerSGD's rank (both libraries)")
    parser.add_argument("--psgd-warmup", type=int, default=2,
                        help="uncompressed steps first (torch needs at least 2)")
    parser.add_argument("--warmup", type=int, default=4, help="untimed steps per configuration")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--link-gbit", type=float, default=1.0)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    args = parser.parse_args(argv)
    args.warmup = max(args.warmup, args.psgd_warmup + 2)
    configs = args.configs.split(",")
    torch.set_num_threads(1)
    hvd.init()
    init_gloo()
    results = {c: [] for c in configs}
    for _ in range(args.rounds):
        for config in configs:
            results[config].append(time_config(config, args))
    if hvd.rank() == 0:
        report(args, results)
    dist.destroy_process_group()
    return 0


def report(args, results) -> None:
    grad_bytes = sum(p.numel() for p in make_model(args.width, args.layers).parameters()) * 4
    link = args.link_gbit * 1e9 / 8
    base = statistics.median(results["hvdl"]) if "hvdl" in results else None
    print(f"# {hvd.size()} ranks; {grad_bytes / 2**20:.1f} MiB of gradients per step; "
          f"batch {args.batch_size} per rank; PowerSGD rank {args.rank}; "
          f"{args.rounds} rounds x {args.steps} steps")
    print("| configuration | step ms (median) | range over rounds | samples/s | vs hvdl "
          "| effective bandwidth / link |")
    print("|---|---|---|---|---|---|")
    for config, times in results.items():
        med = statistics.median(times)
        ratio = f"{med / base:.2f}x" if base else "-"
        eff = "-" if config == "alone" else f"{grad_bytes / med / link:.2f}"
        print(f"| {config} | {med * 1e3:.0f} | {min(times) * 1e3:.0f}-{max(times) * 1e3:.0f} | "
              f"{hvd.size() * args.batch_size / med:.0f} | {ratio} | {eff} |")
    if "hvdl-powersgd" in results and "ddp-powersgd" in results:
        ours, theirs = (statistics.median(results[c]) for c in ("hvdl-powersgd", "ddp-powersgd"))
        rounds = [d / h for h, d in zip(results["hvdl-powersgd"], results["ddp-powersgd"])]
        print(f"hvdl-powersgd throughput / ddp-powersgd: {theirs / ours:.2f}x "
              f"(per round {min(rounds):.2f}-{max(rounds):.2f})")


if __name__ == "__main__":
    sys.exit(main())
