"""horovodlite inside Ray Train's TorchTrainer: hvd.init() in the training function.

Ray Train starts the workers and sets up torch.distributed (gloo on CPU, NCCL on GPU) before the
training function runs; hvd.init() then finds that initialised default process group and meets
the other ranks through its store (horovodlite/common/launchers.py), so the ranks, their number
and the local ranks are Ray Train's. The function trains a linear model on each rank's shard of a
synthetic data set with hvd.DistributedOptimizer and reports the loss with ray.train.report;
rank 0 also reports every rank's weights (hvd.allgather_object) in a checkpoint, which --check
compares with one process training on the whole data set.

Run:  python examples/ray_torch_trainer.py                       # a local Ray, 2 workers
      python examples/ray_torch_trainer.py --check               # exit 1 unless ranks agree
      python examples/ray_torch_trainer.py --address auto --num-workers 8 --use-gpu
"""

import argparse
import json
import os
import sys
import tempfile

import torch

SAMPLES, FEATURES = 240, 8


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--address", default=None, help="Ray cluster (default: start a local one)")
    p.add_argument("--num-cpus", type=int, default=None, help="CPUs of a local Ray")
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--use-gpu", action="store_true")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--storage-path", default=os.path.join(tempfile.gettempdir(), "ray_results"))
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


def train_func(config):
    """Runs on every Ray Train worker, after Ray Train set up torch.distributed."""
    import ray.train
    from ray.train.torch import get_device

    import horovodlite.torch as hvd

    hvd.init()  # reuses Ray Train's process group store: no launcher variables needed
    device = get_device()  # this worker's GPU (Ray Train's choice), or CPU
    if device.type == "cuda":
        torch.cuda.set_device(device)
    x, y = make_data()
    x, y = x[hvd.rank()::hvd.size()].to(device), y[hvd.rank()::hvd.size()].to(device)
    torch.manual_seed(hvd.rank())  # different starts on purpose: the broadcast aligns them
    model = torch.nn.Linear(FEATURES, 1).to(device)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=config["lr"]),
                                         named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    loss = fit(model, optimizer, x, y, config["steps"])
    everyone = hvd.allgather_object({"rank": hvd.rank(), "local_rank": hvd.local_rank(),
                                     "weights": weights(model)})
    metrics = {"loss": loss, "size": hvd.size(), "train_world_size":
               ray.train.get_context().get_world_size()}
    if hvd.rank() == 0:
        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, "ranks.json"), "w") as f:
                json.dump(everyone, f)
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(folder))
    else:
        ray.train.report(metrics)


def reference(steps, lr):
    """One process on the whole data set, from rank 0's start."""
    torch.manual_seed(0)
    model = torch.nn.Linear(FEATURES, 1)
    x, y = make_data()
    fit(model, torch.optim.SGD(model.parameters(), lr=lr), x, y, steps)
    return weights(model)


def main():
    args = parse_args()
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    ray.init(address=args.address, num_cpus=args.num_cpus)
    trainer = TorchTrainer(
        train_func, train_loop_config={"steps": args.steps, "lr": args.lr},
        scaling_config=ScalingConfig(num_workers=args.num_workers, use_gpu=args.use_gpu),
        run_config=RunConfig(storage_path=args.storage_path, name="horovodlite_example"))
    result = trainer.fit()
    with result.checkpoint.as_directory() as folder:
        with open(os.path.join(folder, "ranks.json")) as f:
            ranks = json.load(f)
    print(f"{result.metrics['size']} ranks (Ray Train: {result.metrics['train_world_size']}), "
          f"rank 0's loss {result.metrics['loss']:.4f}")
    if args.check:
        want = reference(args.steps, args.lr)
        worst = max(abs(a - b) for r in ranks for a, b in zip(r["weights"], want))
        ok = ([r["rank"] for r in ranks] == list(range(args.num_workers))
              and result.metrics["size"] == args.num_workers and worst < 1e-4)
        print(f"weights differ from one process on all the data by at most {worst:.2e}: "
              f"{'OK' if ok else 'WRONG'}")
        sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
