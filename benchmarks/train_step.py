"""Training step time: horovodlite DistributedOptimizer vs PyTorch DDP (gloo) vs Horovod, and the
scaling efficiency against one process - all measured in ONE invocation.

Every rank trains the same model on its own fixed random batch of ``--batch-size`` samples (weak
scaling: the per-rank batch is the same in every configuration), one torch thread per rank.

``--rounds`` rounds, each timing these one after the other, so slow drifts of a shared machine
hit every configuration alike:

1. baseline: rank 0 runs the plain optimizer alone while the other ranks wait in a gloo barrier
   (which sleeps; a pending hvd.barrier() would make the background threads poll and take CPU
   from rank 0), so rank 0 has a core to itself;
2. horovodlite's DistributedOptimizer;
3. DDP on gloo, initialised with env:// (MASTER_ADDR/MASTER_PORT set here, rank and world size
   from hvd.rank()/hvd.size());
4. Horovod's DistributedOptimizer, if ``import horovod.torch`` works.

Each step is timed on every rank; a step's time is the slowest rank's (the step is over when
every rank is done), and the table shows the median and interquartile range over all timed steps,
samples/s over all ranks (``size * batch / median``), scaling efficiency (``t_1 / t_N``: 1.0 means
N ranks process N times the samples of one in the same time) and the ratio of throughputs.

Models: ``cnn`` (default, compute-bound: a small ResNet on 32x32 images) and ``mlp`` (communication-
heavy: 8.4 M parameters, tiny batch).

Run:  horovodliterun -np 2 python benchmarks/train_step.py
      horovodliterun -np 2 python benchmarks/train_step.py --model mlp

Across hosts (docs/test_hosts.md), one rank per host, so that every rank has a core of this
2-core machine and "1 process" is one host: the scaling column is then the efficiency from 1
host to 2 hosts over the test hosts' shaped links (1 Gbit/s by default):

    tests/hosts/hostctl.sh up 2
    tests/hosts/hostctl.sh run hvdl-host0 horovodliterun -np 2 -H hvdl-host0:1,hvdl-host1:1 \
        --mpi-args "$(tests/hosts/hostctl.sh mpi-args)" python benchmarks/train_step.py
"""

import argparse
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import horovodlite.torch as hvd

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from pytorch_synthetic_benchmark import ResNet  # noqa: E402  (same model as the example)


def make_model(kind):
    torch.manual_seed(0)
    if kind == "cnn":
        return ResNet(1, num_classes=10)
    return torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.ReLU(),
                               torch.nn.Linear(2048, 2048), torch.nn.ReLU(),
                               torch.nn.Linear(2048, 1024), torch.nn.ReLU(),
                               torch.nn.Linear(1024, 10))


def make_batch(kind, batch, rank):
    g = torch.Generator().manual_seed(rank)
    x = (torch.randn(batch, 3, 32, 32, generator=g) if kind == "cnn"
         else torch.randn(batch, 1024, generator=g))
    return x, torch.randint(0, 10, (batch,), generator=g)


def time_steps(model, optimizer, batch, warmup, steps):
    """Per-step wall times (seconds) after ``warmup`` untimed steps."""
    x, y = batch

    def step():
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()

    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return times


def slowest_rank(times):
    """Per step, the maximum over ranks (every rank's list travels by allgather_object)."""
    return [max(per_step) for per_step in zip(*hvd.allgather_object(times))]


def run_baseline(args):
    times = []
    if hvd.rank() == 0:
        model = make_model(args.model)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        batch = make_batch(args.model, args.batch_size, 0)
        times = time_steps(model, opt, batch, args.warmup, args.steps)
    # Wait in gloo, not in hvd.barrier(): while a horovodlite op is pending on some ranks only,
    # the background threads poll and would take CPU from rank 0 on a machine with few cores.
    dist.barrier()
    return hvd.broadcast_object(times, root_rank=0, name="baseline_times")


def run_horovodlite(args):
    model = make_model(args.model)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                                   named_parameters=model.named_parameters())
    batch = make_batch(args.model, args.batch_size, hvd.rank())
    return slowest_rank(time_steps(model, opt, batch, args.warmup, args.steps))


def init_gloo():
    """torch.distributed on gloo over env://; rank 0 picks a free port and shares it."""
    where = None
    if hvd.rank() == 0:  # rank 0's address as its hostname resolves (several hosts: not loopback)
        addr = socket.gethostbyname(socket.gethostname())
        with socket.socket() as s:
            s.bind((addr, 0))
            where = (addr, s.getsockname()[1])
    addr, port = hvd.broadcast_object(where, root_rank=0, name="master_port")
    os.environ["MASTER_ADDR"] = addr
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", init_method="env://", rank=hvd.rank(),
                            world_size=hvd.size())


def run_ddp(args):
    model = torch.nn.parallel.DistributedDataParallel(make_model(args.model))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    batch = make_batch(args.model, args.batch_size, hvd.rank())
    return slowest_rank(time_steps(model, opt, batch, args.warmup, args.steps))


def load_horovod():
    try:
        import horovod.torch as horovod  # noqa: PLC0415
    except ImportError:
        return None
    horovod.init()
    return horovod


def run_horovod(horovod, args):
    model = make_model(args.model)
    opt = horovod.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
        named_parameters=model.named_parameters())
    batch = make_batch(args.model, args.batch_size, hvd.rank())
    return slowest_rank(time_steps(model, opt, batch, args.warmup, args.steps))


def summary(times, ranks, batch):
    q1, med, q3 = statistics.quantiles(times, n=4)[0], statistics.median(times), \
        statistics.quantiles(times, n=4)[2]
    return {"median": med, "iqr": q3 - q1, "samples": ranks * batch / med}


def print_table(args, results, horovod_missing):
    n = hvd.size()
    base = summary(results["1 process"], 1, args.batch_size)
    print(f"\nmodel={args.model} batch/rank={args.batch_size} ranks={n} "
          f"({hvd.cross_size()} host(s) x {hvd.local_size()}) threads/rank=1 "
          f"timed steps={args.steps * args.rounds} (after {args.warmup} warm-up per run)")
    header = f"{'configuration':<22}{'median ms':>11}{'IQR ms':>9}{'samples/s':>11}{'scaling':>9}"
    print(header)
    print("-" * len(header))
    stats = {}
    for name, times in results.items():
        s = summary(times, 1 if name == "1 process" else n, args.batch_size)
        stats[name] = s
        eff = base["median"] / s["median"]
        print(f"{name:<22}{s['median'] * 1e3:>11.2f}{s['iqr'] * 1e3:>9.2f}"
              f"{s['samples']:>11.1f}{eff:>9.2f}")
    if horovod_missing:
        print(f"{'Horovod':<22}{'not installed':>11}")
    ours = stats[f"horovodlite np={n}"]["samples"]
    ddp = stats[f"DDP gloo np={n}"]["samples"]
    print(f"\nthroughput horovodlite / DDP: {ours / ddp:.2f}x")
    hv = stats.get(f"Horovod np={n}")
    print("throughput horovodlite / Horovod: "
          + (f"{ours / hv['samples']:.2f}x" if hv else "n/a (Horovod not installed)"))


def parse_args():
    p = argparse.ArgumentParser(description="horovodlite vs DDP vs Horovod train step")
    p.add_argument("--model", choices=["cnn", "mlp"], default="cnn")
    p.add_argument("--batch-size", type=int, default=None, help="per rank (cnn 32, mlp 8)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=20, help="timed steps per run")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    if args.batch_size is None:
        args.batch_size = 32 if args.model == "cnn" else 8
    return args


def main():
    args = parse_args()
    hvd.init()
    torch.set_num_threads(1)
    n = hvd.size()
    horovod = load_horovod()
    init_gloo()
    results = {"1 process": [], f"horovodlite np={n}": [], f"DDP gloo np={n}": []}
    if horovod is not None:
        results[f"Horovod np={n}"] = []
    for _ in range(args.rounds):
        results["1 process"] += run_baseline(args)
        results[f"horovodlite np={n}"] += run_horovodlite(args)
        dist.barrier()
        results[f"DDP gloo np={n}"] += run_ddp(args)
        if horovod is not None:
            results[f"Horovod np={n}"] += run_horovod(horovod, args)
    if hvd.rank() == 0:
        print_table(args, results, horovod is None)
    dist.destroy_process_group()
    hvd.shutdown()


if __name__ == "__main__":
    main()
