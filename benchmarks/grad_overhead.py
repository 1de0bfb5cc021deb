"""The per-gradient cost of the training path, side by side in one run: plain torch, horovodlite's
DistributedOptimizer (C++ gradient hooks, the default), the same with a Python hook per gradient
(``HOROVOD_NATIVE_GRADIENT_HOOKS=0``, horovodlite restarted in between), and DDP on gloo.

The model is ``--layers`` tiny Linear(8, 8) layers (two parameters each, 320 by default): the
compute is negligible, so a step is the framework's cost per gradient. One step = zero_grad +
forward + backward + step. Each round times every configuration one after the other
(``--steps`` steps after ``--warmup``), so slow drifts of a shared machine hit each alike; the
table gives the median step over rounds (min-max across rounds), the cost per gradient over plain
torch ((step - plain) / parameters; at np > 1 plain runs on every rank at once, without
communication) and each step's ratio to DDP's. Times are the slowest rank's. One torch thread.

    horovodliterun -np 1 python benchmarks/grad_overhead.py
    horovodliterun -np 2 python benchmarks/grad_overhead.py --rounds 7
    horovodliterun -np 2 python benchmarks/grad_overhead.py --json     # one JSON line per round
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist

import horovodlite.torch as hvd

CONFIGS = ("plain", "hvdl", "hvdl-python", "ddp")
KNOB = "HOROVOD_NATIVE_GRADIENT_HOOKS"


def make_model(layers: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(layers)])


def restart(native: bool) -> None:
    """horovodlite again, with C++ or Python gradient hooks (the knob is read at init)."""
    hvd.shutdown()
    os.environ[KNOB] = "1" if native else "0"
    hvd.init()


def build(config: str, layers: int):
    model = make_model(layers)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    if config.startswith("hvdl"):
        restart(native=config == "hvdl")
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    elif config == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    return model, opt


def time_config(config: str, args) -> float:
    """The median step of this rank, in microseconds."""
    model, opt = build(config, args.layers)
    x = torch.randn(4, 8)

    def step():
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()

    for _ in range(args.warmup):
        step()
    hvd.barrier()  # every rank starts timing together
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return 1e6 * statistics.median(times)


def slowest(us: float) -> float:
    return float(hvd.allreduce(torch.tensor([us], dtype=torch.float64), op=hvd.Max,
                               name="grad_overhead.slowest")[0])


def init_ddp() -> None:
    where = None
    if hvd.rank() == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            where = s.getsockname()[1]
    port = hvd.broadcast_object(where, root_rank=0, name="grad_overhead.port")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=hvd.rank(),
                            world_size=hvd.size())


def report(rounds: list, params: int, size: int) -> None:
    def med(c):
        return statistics.median(r[c] for r in rounds)

    def span(c):
        return f"{min(r[c] for r in rounds):8.1f}-{max(r[c] for r in rounds):<8.1f}"

    def per_grad(r, c):
        return (r[c] - r["plain"]) / params

    print(f"np {size}, {params} parameters, {len(rounds)} rounds; step in us (median, min-max "
          "over rounds); per gradient = (step - plain) / parameters")
    print(f"{'config':<12} {'step':>9} {'range':>18} {'per grad':>9} {'range':>14} {'/ ddp':>7}")
    for c in CONFIGS:
        grads = [per_grad(r, c) for r in rounds]
        ratios = [r[c] / r["ddp"] for r in rounds]
        print(f"{c:<12} {med(c):9.1f} {span(c):>18} {statistics.median(grads):9.2f} "
              f"{min(grads):6.2f}-{max(grads):<7.2f} {statistics.median(ratios):7.3f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=160)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", action="store_true", help="also print one JSON line per round")
    args = p.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    init_ddp()
    params = 2 * args.layers
    rounds = []
    for i in range(args.rounds):
        row = {c: slowest(time_config(c, args)) for c in CONFIGS}
        rounds.append(row)
        if args.json and hvd.rank() == 0:
            print(json.dumps({"round": i, "np": hvd.size(), "params": params,
                              **{f"{c}_step_us": round(v, 1) for c, v in row.items()}}),
                  flush=True)
    if hvd.rank() == 0:
        report(rounds, params, hvd.size())
    dist.destroy_process_group()
    hvd.shutdown()


if __name__ == "__main__":
    main()
