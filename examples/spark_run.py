"""Data-parallel training as a Spark job with horovodlite.spark.run (Horovod's horovod.spark.run).

run() starts one Spark barrier task per rank (they start together or not at all), hosts the
job's rendezvous on the driver, and runs the function on every rank: here hvd.init(), then a
linear model trained on each rank's shard of a synthetic data set with hvd.DistributedOptimizer.
It returns every rank's result in rank order; --check compares every rank's weights with one
process training on the whole data set.

Run:  python examples/spark_run.py                              # local[2], 2 ranks
      python examples/spark_run.py --check                      # exit 1 unless ranks agree
      spark-submit --master spark://HOST:7077 examples/spark_run.py --num-proc 8
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
    p.add_argument("--num-proc", type=int, default=2)
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


def train(steps, lr):
    """Runs on every rank (a Spark task)."""
    import horovodlite.torch as hvd

    hvd.init()
    x, y = make_data()
    x, y = x[hvd.rank()::hvd.size()], y[hvd.rank()::hvd.size()]
    torch.manual_seed(hvd.rank())  # different starts on purpose: the broadcast aligns them
    model = torch.nn.Linear(FEATURES, 1)
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


def main():
    args = parse_args()
    from pyspark.sql import SparkSession

    import horovodlite.spark

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # the ranks need this Python
    builder = SparkSession.builder.appName("horovodlite spark_run")
    if args.master or "PYSPARK_GATEWAY_PORT" not in os.environ:  # not under spark-submit
        builder = builder.master(args.master or "local[2]")
    spark = builder.getOrCreate()
    try:
        results = horovodlite.spark.run(train, args=(args.steps, args.lr),
                                        num_proc=args.num_proc)
    finally:
        spark.stop()
    for r in results:
        print(f"rank {r['rank']}/{r['size']} (local {r['local_rank']} on {r['host']}): "
              f"loss {r['loss']:.4f}")
    if args.check:
        want = reference(args.steps, args.lr)
        worst = max(abs(a - b) for r in results for a, b in zip(r["weights"], want))
        ok = [r["rank"] for r in results] == list(range(args.num_proc)) and worst < 1e-4
        print(f"weights differ from one process on all the data by at most {worst:.2e}: "
              f"{'OK' if ok else 'WRONG'}")
        sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
