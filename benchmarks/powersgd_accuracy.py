"""What PowerSGD costs in accuracy: scikit-learn's bundled 8x8 digits (no download), an MLP
64-512-512-10 trained for ``--epochs`` epochs with SGD + momentum, uncompressed and with
``hvd.Compression.powersgd(rank=R)`` for each R of ``--ranks``, the same seeds, batches and
number of steps - all in ONE invocation. Prints the final test accuracy per configuration (mean,
and range over the seeds) and its difference from the uncompressed run.

Run:  horovodliterun -np 2 python benchmarks/powersgd_accuracy.py
      horovodliterun -np 2 python benchmarks/powersgd_accuracy.py --epochs 30 --seeds 0 1 2 3
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import horovodlite.torch as hvd


def data(seed: int):
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.int64)
    train, test = train_test_split(range(len(y)), test_size=0.25, random_state=seed,
                                   stratify=digits.target)
    return (x[train], y[train]), (x[test], y[test])


def model_for(seed: int):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(),
                               torch.nn.Linear(512, 512), torch.nn.ReLU(),
                               torch.nn.Linear(512, 10))


def train(seed: int, compression, args) -> float:
    """Test accuracy (percent) after ``args.epochs`` epochs; every rank trains on its share of
    each global batch (the same global batches for every configuration)."""
    (x, y), (xt, yt) = data(seed)
    model = model_for(seed)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9),
        named_parameters=model.named_parameters(), compression=compression)
    per = args.batch_size
    global_batch = per * hvd.size()
    g = torch.Generator().manual_seed(seed)
    for _ in range(args.epochs):
        order = torch.randperm(len(y), generator=g)
        for start in range(0, len(y) - global_batch + 1, global_batch):
            rows = order[start + hvd.rank() * per:start + (hvd.rank() + 1) * per]
            opt.zero_grad()
            F.cross_entropy(model(x[rows]), y[rows]).backward()
            opt.step()
    with torch.no_grad():
        return 100.0 * (model(xt).argmax(1) == yt).float().mean().item()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=16, help="per rank")
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--warmup-steps", type=int, default=10)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    hvd.init()
    configs = {"none": hvd.Compression.none}
    for r in args.ranks:
        configs[f"powersgd rank {r}"] = hvd.Compression.powersgd(
            rank=r, warmup_steps=args.warmup_steps)
    acc = {name: [train(seed, c, args) for seed in args.seeds] for name, c in configs.items()}
    if hvd.rank() == 0:
        base = statistics.mean(acc["none"])
        steps = args.epochs * (1347 // (args.batch_size * hvd.size()))
        print(f"# digits, MLP 64-512-512-10, {hvd.size()} ranks x batch {args.batch_size}, "
              f"{args.epochs} epochs ({steps} steps), seeds {args.seeds}")
        print("| compression | test accuracy % (mean) | range over seeds | vs none (points) |")
        print("|---|---|---|---|")
        for name, values in acc.items():
            mean = statistics.mean(values)
            print(f"| {name} | {mean:.2f} | {min(values):.2f}-{max(values):.2f} | "
                  f"{mean - base:+.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
