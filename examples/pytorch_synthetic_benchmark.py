"""Synthetic training throughput: images/second per rank and in total, on random data.

The shape of Horovod's pytorch_synthetic_benchmark.py (same flags, same report) with small
ResNet-style models defined here, so it runs on CPU without torchvision: every rank trains the
model on one fixed random batch with hvd.DistributedOptimizer, times ``--num-iters`` iterations of
``--num-batches-per-iter`` steps after ``--num-warmup-batches`` warm-up steps, and prints each
iteration's img/sec and the mean with a +-1.96 std band. ``--fp16-allreduce`` sends gradients as
float16; ``--use-adasum`` uses op=hvd.Adasum. Defaults finish in well under a minute at np=2 on
two CPU cores.

Run:  horovodliterun -np 2 python examples/pytorch_synthetic_benchmark.py
      horovodliterun -np 2 python examples/pytorch_synthetic_benchmark.py --model resnet14 \
          --batch-size 32 --fp16-allreduce
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import horovodlite.torch as hvd


class BasicBlock(torch.nn.Module):
    """Two 3x3 convolutions with batch norm and an identity (or 1x1 projection) shortcut."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(cout)
        self.conv2 = torch.nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(cout)
        self.shortcut = torch.nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = torch.nn.Sequential(torch.nn.Conv2d(cin, cout, 1, stride, bias=False),
                                                torch.nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet(torch.nn.Module):
    """CIFAR-style ResNet: a stem, three stages of ``blocks`` blocks, pooling, a classifier."""

    def __init__(self, blocks, widths=(16, 32, 64), num_classes=1000):
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, widths[0], 3, 1, 1, bias=False),
                                        torch.nn.BatchNorm2d(widths[0]), torch.nn.ReLU())
        layers, cin = [], widths[0]
        for i, width in enumerate(widths):
            for b in range(blocks):
                layers.append(BasicBlock(cin, width, 2 if (b == 0 and i > 0) else 1))
                cin = width
        self.stages = torch.nn.Sequential(*layers)
        self.fc = torch.nn.Linear(cin, num_classes)

    def forward(self, x):
        x = self.stages(self.stem(x))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


MODELS = {
    "resnet8": lambda: ResNet(1),
    "resnet14": lambda: ResNet(2),
    "resnet20": lambda: ResNet(3),
    "resnet20_wide": lambda: ResNet(3, widths=(32, 64, 128)),
}


def parse_args():
    p = argparse.ArgumentParser(description="horovodlite synthetic benchmark")
    p.add_argument("--model", default="resnet8", choices=sorted(MODELS))
    p.add_argument("--batch-size", type=int, default=16, help="input batch size per rank")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--num-warmup-batches", type=int, default=3)
    p.add_argument("--num-batches-per-iter", type=int, default=4)
    p.add_argument("--num-iters", type=int, default=5)
    p.add_argument("--fp16-allreduce", action="store_true", help="float16 gradients on the wire")
    p.add_argument("--use-adasum", action="store_true", help="op=hvd.Adasum")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    return p.parse_args()


def log(message):
    if hvd.rank() == 0:
        print(message, flush=True)


def main():
    args = parse_args()
    hvd.init()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = MODELS[args.model]()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.9)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression,
                                         op=hvd.Adasum if args.use_adasum else hvd.Average)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    data = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
    target = torch.randint(0, 1000, (args.batch_size,))

    def benchmark_step():
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        optimizer.step()

    params = sum(p.numel() for p in model.parameters())
    log(f"Model: {args.model} ({params / 1e6:.2f} M parameters)")
    log(f"Batch size: {args.batch_size} per rank, images {args.image_size}x{args.image_size}")
    log(f"Number of CPUs: {hvd.size()} (torch threads per rank: {args.threads})")
    log("Running warmup...")
    for _ in range(args.num_warmup_batches):
        benchmark_step()
    log("Running benchmark...")
    img_secs = []
    for i in range(args.num_iters):
        start = time.perf_counter()
        for _ in range(args.num_batches_per_iter):
            benchmark_step()
        rate = args.batch_size * args.num_batches_per_iter / (time.perf_counter() - start)
        log(f"Iter #{i}: {rate:.1f} img/sec per CPU")
        img_secs.append(rate)
    mean = statistics.mean(img_secs)
    conf = 1.96 * (statistics.stdev(img_secs) if len(img_secs) > 1 else 0.0)
    log(f"Img/sec per CPU: {mean:.1f} +-{conf:.1f}")
    log(f"Total img/sec on {hvd.size()} CPU(s): {hvd.size() * mean:.1f} +-{hvd.size() * conf:.1f}")
    hvd.shutdown()


if __name__ == "__main__":
    main()
