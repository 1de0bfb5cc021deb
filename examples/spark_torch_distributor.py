"""horovodlite under Spark's TorchDistributor: hvd.init() in the training function.

TorchDistributor starts the training function with torchrun (local_mode=True: on the driver;
otherwise in Spark barrier tasks), so each process has torchrun's variables and hvd.init() meets
the others through torchrun's store (horovodlite/common/launchers.py). The function trains a
linear model on each rank's shard of a synthetic data set with hvd.DistributedOptimizer and
gathers every rank's weights (hvd.allgather_object); TorchDistributor returns rank 0's result,
which --check compares with one process training on the whole data set.

Run:  python examples/spark_torch_distributor.py                # local[2], 2 processes
      python examples/spark_torch_distributor.py --check        # exit 1 unless ranks agree
      spark-submit --master spark://HOST:7077 examples/spark_torch_distributor.py \\
          --num-processes 8 --cluster-mode [--use-gpu]
Needs PySpark and Java 17 (apt-get install default-jre-headless).
"""

import argparse
import os
import sys

import torch

SAMPLES, FEATURES = 240, 8


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--master", default=None, help="default: spark-submit's, else local[2]")
    p.add_argument("--num-processes", type=int, default=2)
    p.add_argument("--cluster-mode", action="store_true",
                   help="run in Spark tasks (local_mode=False) instead of on the driver")
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


def train_fn(steps, lr, use_gpu):
    """Runs in every process torchrun starts."""
    import horovodlite.torch as hvd

    hvd.init()  # torchrun's variables: rank, size, local rank and its store
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
    ranks = hvd.allgather_object({"rank": hvd.rank(), "weights": weights(model)})
    return {"size": hvd.size(), "loss": loss, "ranks": ranks}


def reference(steps, lr):
    """One process on the whole data set, from rank 0's start."""
    torch.manual_seed(0)
    model = torch.nn.Linear(FEATURES, 1)
    x, y = make_data()
    fit(model, torch.optim.SGD(model.parameters(), lr=lr), x, y, steps)
    return weights(model)


def main():
    args = parse_args()
    from pyspark.ml.torch.distributor import TorchDistributor
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName("horovodlite spark_torch_distributor")
    if args.master or "PYSPARK_GATEWAY_PORT" not in os.environ:  # not under spark-submit
        builder = builder.master(args.master or "local[2]")
    spark = builder.getOrCreate()
    try:
        out = TorchDistributor(num_processes=args.num_processes,
                               local_mode=not args.cluster_mode, use_gpu=args.use_gpu
                               ).run(train_fn, args.steps, args.lr, args.use_gpu)
    finally:
        spark.stop()
    print(f"{out['size']} ranks, rank 0's loss {out['loss']:.4f}")
    if args.check:
        want = reference(args.steps, args.lr)
        worst = max(abs(a - b) for r in out["ranks"] for a, b in zip(r["weights"], want))
        ok = (out["size"] == args.num_processes and worst < 1e-4
              and [r["rank"] for r in out["ranks"]] == list(range(args.num_processes)))
        print(f"weights differ from one process on all the data by at most {worst:.2e}: "
              f"{'OK' if ok else 'WRONG'}")
        sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
