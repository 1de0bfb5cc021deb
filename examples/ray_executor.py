"""Data-parallel training on Ray with horovodlite.ray.RayExecutor (Horovod's horovod.ray API).

The executor starts one Ray actor per rank (a placement group reserves their CPUs/GPUs), hosts
the job's rendezvous on the driver, and runs a function on every rank: here hvd.init(), then a
linear model trained on each rank's shard of a synthetic data set with hvd.DistributedOptimizer.
run() returns every rank's result in rank order; --check compares every rank's weights with one
process training on the whole data set (averaged shard gradients are the full-batch gradient).

Run:  python examples/ray_executor.py                           # a local Ray, 2 workers
      python examples/ray_executor.py --check                   # exit 1 unless ranks agree
      python examples/ray_executor.py --address auto --num-workers 8 --use-gpu   # a cluster
"""

import argparse
import os
import sys

import torch

SAMPLES, FEATURES = 240, 8


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--address", default=None, help="Ray cluster (default: start a local one)")
    p.add_argument("--num-cpus", type=int, default=None, help="CPUs of a local Ray")
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--cpus-per-worker", type=float, default=1)
    p.add_argument("--use-gpu", action="store_true")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--check", action="store_true", help="exit 1 unless training is right")
    return p.parse_args()


def make_data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, FEATURES, generator=g)
    y = x @ torch.linspace(-1, 1, FEATURES) + 0.1 * torch.randn(SAMPLES, generator=g)
    return x, y.unsqueeze(1)


def fit(model, optimizer, x, y, steps):
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
    return loss.item()


def weights(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()


def train(steps, lr, use_gpu=False):
    """Runs on every rank (a Ray actor)."""
    import horovodlite.torch as hvd

    hvd.init()
    device = hvd.local_device() if use_gpu else torch.device("cpu")  # this rank's GPU
    if use_gpu:
        torch.cuda.set_device(device)  # one GPU per rank
    x, y = make_data()
    x, y = x[hvd.rank()::hvd.size()].to(device), y[hvd.rank()::hvd.size()].to(device)
    torch.manual_seed(hvd.rank())  # different starts on purpose: the broadcast aligns them
    model = torch.nn.Linear(FEATURES, 1).to(device)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr),
                                         named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    loss = fit(model, optimizer, x, y, steps)
    return {"rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(),
            "host": os.environ.get("HOROVOD_HOSTNAME"), "loss": loss, "weights": weights(model)}


def reference(steps, lr):
    """One process on the whole data set, from rank 0's start."""
    torch.manual_seed(0)
    model = torch.nn.Linear(FEATURES, 1)
    x, y = make_data()
    fit(model, torch.optim.SGD(model.parameters(), lr=lr), x, y, steps)
    return weights(model)


def check(results, steps, lr) -> bool:
    want = reference(steps, lr)
    worst = max(abs(a - b) for r in results for a, b in zip(r["weights"], want))
    ok = ([r["rank"] for r in results] == list(range(len(results)))
          and SAMPLES % len(results) == 0 and worst < 1e-4)
    print(f"{len(results)} ranks, weights differ from one process on all the data by at most "
          f"{worst:.2e}: {'OK' if ok else 'WRONG'}")
    return ok


def main():
    args = parse_args()
    import ray

    from horovodlite.ray import RayExecutor

    ray.init(address=args.address, num_cpus=args.num_cpus)
    settings = RayExecutor.create_settings(timeout_s=60)
    executor = RayExecutor(settings, num_workers=args.num_workers,
                           cpus_per_worker=args.cpus_per_worker, use_gpu=args.use_gpu)
    executor.start()
    try:
        results = executor.run(train, args=[args.steps, args.lr, args.use_gpu])
    finally:
        executor.shutdown()
    for r in results:
        print(f"rank {r['rank']}/{r['size']} (local {r['local_rank']} on {r['host']}): "
              f"loss {r['loss']:.4f}")
    if args.check and not check(results, args.steps, args.lr):
        sys.exit(1)


if __name__ == "__main__":
    main()
