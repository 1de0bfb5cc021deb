"""Training throughput: horovodlite's DistributedOptimizer vs PyTorch DDP (gloo) vs Horovod, as
shares of what the machine can do without communication - all measured in ONE invocation.

Every rank trains the same model on its own fixed random batch of ``--batch-size`` samples, one
torch thread per rank. ``--rounds`` rounds, each timing these one after the other, so slow drifts
of a shared machine hit every configuration alike:

1. the ceiling: every rank trains with the plain optimizer at the same time, no communication
   (they start together after a gloo barrier, which sleeps);
2. the synchronized ceiling: the same, but the ranks step together: each step ends with a
   4-byte allreduce (hvd.allreduce, ~25 us). No synchronous data-parallel library can beat
   it: a step lasts as long as the slower rank's, and on a shared machine the ranks' step times
   vary independently (the gap between the two ceilings);
3. horovodlite's DistributedOptimizer (gradients in flat buckets, docs/bucket_views.md), the
   same with each ready bucket held until the optimizer waits (``HOROVOD_BUCKET_SEND_NOW=0``),
   and with ``bucket_view=False`` (each gradient reduced on its own through the fusion buffer:
   the path before bucket views);
4. DDP on gloo, initialised with env:// (MASTER_ADDR/MASTER_PORT set here, rank and world size
   from hvd.rank()/hvd.size());
5. Horovod's DistributedOptimizer, if ``import horovod.torch`` works.

Each step is timed on every rank. For the synchronized configurations a step is over when the
slowest rank is done, and throughput is ``size * batch / median step``; for the ceiling each rank
counts its own steps (the sum of ``batch / median`` over ranks). The table shows the median and
interquartile range of the step, samples/s, the share of the ceiling (overall, and the lowest and
highest per round, each round against its own ceiling run) and the throughput ratios. A second
table breaks a step down per configuration (means over ranks and steps): forward+backward (the
gradient hooks included) and optimizer.step() (for horovodlite and Horovod: waiting for the
reductions, then the update), and the CPU time of the training thread, of horovodlite's
background thread and of all other threads, from /proc/self/task/*/schedstat. docs/performance.md
explains the figures.

Models: ``mlp`` (eight 512x512 layers, batch 64: 8 MiB of gradients per step, communication-
bound), ``cnn`` (default, compute-bound: a small ResNet on 32x32 images, batch 32) and ``wide``
(8.4 M parameters, batch 8: 34 MB of gradients, for links between hosts).

Run:  horovodliterun -np 2 python benchmarks/train_step.py
      horovodliterun -np 2 python benchmarks/train_step.py --model mlp --steps 60 --rounds 4

On GPUs (``--device cuda``; benchmarks/gpu_setup.py places the ranks): images/s of horovodlite's
DistributedOptimizer against DDP at the same np (NCCL with one GPU per rank; gloo on the CUDA
tensors when ranks share a GPU, horovodlite then staging through host memory) and against every
rank training alone without communication (at np 1: plain torch). Models ``resnet50`` (default on
CUDA: a ResNet-50 defined here - torchvision is not needed - on 224x224 images, 1000 classes,
batch 64) and ``mlp``; ``--amp bf16`` runs forward and loss under bfloat16 autocast. Each round
times ``--steps`` steps of every configuration as one block ending in torch.cuda.synchronize():

    horovodliterun -np 1 python benchmarks/train_step.py --device cuda [--amp bf16]
    horovodliterun -np 1 python benchmarks/train_step.py --device cuda --model mlp

Across hosts (docs/test_hosts.md), one rank per host, so that every rank has a core of this
2-core machine; the ceiling is then every host training on its own, and the shares are the
efficiency of 2 hosts over the test hosts' shaped links (1 Gbit/s by default):

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
    if kind == "resnet50":
        return ResNet50()
    if kind == "mlp":  # eight 512x512 layers: 2.1 M parameters, 8 MiB of gradients per step
        layers = []
        for _ in range(8):
            layers += [torch.nn.Linear(512, 512), torch.nn.ReLU()]
        return torch.nn.Sequential(*layers[:-1])
    return torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.ReLU(),
                               torch.nn.Linear(2048, 2048), torch.nn.ReLU(),
                               torch.nn.Linear(2048, 1024), torch.nn.ReLU(),
                               torch.nn.Linear(1024, 10))


class Bottleneck(torch.nn.Module):
    """ResNet-50's block: 1x1 reduce, 3x3 (carrying the stride), 1x1 expand x4, batch norms,
    and an identity or 1x1 projection shortcut."""

    def __init__(self, cin, width, stride):
        super().__init__()
        cout = 4 * width
        self.body = torch.nn.Sequential(
            torch.nn.Conv2d(cin, width, 1, bias=False), torch.nn.BatchNorm2d(width),
            torch.nn.ReLU(inplace=True),
            torch.nn.Conv2d(width, width, 3, stride, 1, bias=False), torch.nn.BatchNorm2d(width),
            torch.nn.ReLU(inplace=True),
            torch.nn.Conv2d(width, cout, 1, bias=False), torch.nn.BatchNorm2d(cout))
        self.shortcut = torch.nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = torch.nn.Sequential(torch.nn.Conv2d(cin, cout, 1, stride, bias=False),
                                                torch.nn.BatchNorm2d(cout))

    def forward(self, x):
        return F.relu(self.body(x) + self.shortcut(x))


class ResNet50(torch.nn.Module):
    """torchvision's resnet50 layout (stages of 3, 4, 6, 3 bottlenecks; 25.6 M parameters)."""

    def __init__(self, num_classes=1000):
        super().__init__()
        self.stem = torch.nn.Sequential(
            torch.nn.Conv2d(3, 64, 7, 2, 3, bias=False), torch.nn.BatchNorm2d(64),
            torch.nn.ReLU(inplace=True), torch.nn.MaxPool2d(3, 2, 1))
        blocks, cin = [], 64
        for i, (width, count) in enumerate([(64, 3), (128, 4), (256, 6), (512, 3)]):
            for b in range(count):
                blocks.append(Bottleneck(cin, width, 2 if b == 0 and i > 0 else 1))
                cin = 4 * width
        self.stages = torch.nn.Sequential(*blocks)
        self.fc = torch.nn.Linear(cin, num_classes)

    def forward(self, x):
        return self.fc(F.adaptive_avg_pool2d(self.stages(self.stem(x)), 1).flatten(1))


# Per model: one sample's input shape, the number of classes, the default batch per rank.
BATCHES = {"cnn": ((3, 32, 32), 10, 32), "mlp": ((512,), 512, 64), "wide": ((1024,), 10, 8),
           "resnet50": ((3, 224, 224), 1000, 64)}
CEILING = "ceiling (no comm.)"
SYNC_CEILING = "ceiling, 4 B sync/step"


def make_batch(kind, batch, rank):
    shape, classes, _ = BATCHES[kind]
    g = torch.Generator().manual_seed(rank)
    return (torch.randn(batch, *shape, generator=g),
            torch.randint(0, classes, (batch,), generator=g))


def thread_cpu():
    """CPU time (s) of each thread of this process so far, by thread name ("main" for the
    Python thread), from /proc/self/task/*/schedstat (nanoseconds on the CPU)."""
    out = {}
    pid = os.getpid()
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                ns = int(f.read().split()[0])
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = "main" if int(tid) == pid else f.read().strip()
        except OSError:  # the thread ended meanwhile
            continue
        out[name] = out.get(name, 0.0) + ns / 1e9
    return out


class Run:
    """One configuration's timed steps on this rank: wall time per step, and where it went."""

    def __init__(self):
        self.times, self.fwd_bwd, self.opt_step = [], [], []
        self.cpu = {}


def time_steps(model, optimizer, batch, args, after_step=None):
    """Times ``steps`` steps after ``warmup`` untimed ones: each step's wall time, its forward +
    backward part (gradient hooks included) and its optimizer.step() part (for horovodlite and
    Horovod: waiting for the reductions, then the update; ``after_step`` counts in it), and each
    thread's CPU over them."""
    x, y = batch
    warmup, steps, set_to_none = args.warmup, args.steps, args.zero_grad == "none"
    run = Run()

    def step(record):
        t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=set_to_none)
        F.cross_entropy(model(x), y).backward()
        t1 = time.perf_counter()
        optimizer.step()
        if after_step is not None:
            after_step()
        t2 = time.perf_counter()
        if record:
            run.times.append(t2 - t0)
            run.fwd_bwd.append(t1 - t0)
            run.opt_step.append(t2 - t1)

    for _ in range(warmup):
        step(False)
    before = thread_cpu()
    for _ in range(steps):
        step(True)
    after = thread_cpu()
    run.cpu = {k: v - before.get(k, 0.0) for k, v in after.items()}
    return run


def gather_runs(run):
    """Every rank's Run, on every rank."""
    return hvd.allgather_object(run)


def run_ceiling(args, synchronized=False):
    """Every rank trains on its own at the same time, no communication: what the machine can do.
    ``synchronized``: each step ends with a 4-byte allreduce, so the ranks step together."""
    model = make_model(args.model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    batch = make_batch(args.model, args.batch_size, hvd.rank())
    tiny = torch.zeros(1)
    sync = (lambda: hvd.allreduce_(tiny, name="step.sync", op=hvd.Sum)) if synchronized else None
    dist.barrier()  # start together (gloo's barrier sleeps; nothing of horovodlite is pending)
    run = time_steps(model, opt, batch, args, sync)
    dist.barrier()
    return gather_runs(run)


def run_horovodlite(args, bucket_view=True, send_now=True):
    model = make_model(args.model)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                                   named_parameters=model.named_parameters(),
                                   bucket_view=bucket_view)
    if not send_now:  # as HOROVOD_BUCKET_SEND_NOW=0: a ready bucket waits like other new work
        opt._hvd_reducer.set_send_buckets_now(False)
    batch = make_batch(args.model, args.batch_size, hvd.rank())
    return gather_runs(time_steps(model, opt, batch, args))


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
    return gather_runs(time_steps(model, opt, batch, args))


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
    return gather_runs(time_steps(model, opt, batch, args))


def step_times(runs, synchronized):
    """A configuration's step times over its rounds: per step the slowest rank's when the ranks
    step together; for the ceiling, where they do not, each rank's own times."""
    if synchronized:
        return [[max(per_step) for r in runs for per_step in zip(*(x.times for x in r))]]
    return [[t for r in runs for t in r[rank].times] for rank in range(len(runs[0]))]


def throughput(runs, synchronized, batch):
    """Samples per second over all ranks: for a synchronized configuration size * batch / median
    step; for the ceiling the sum over ranks of batch / that rank's median step."""
    per = step_times(runs, synchronized)
    if synchronized:
        return len(runs[0]) * batch / statistics.median(per[0])
    return sum(batch / statistics.median(t) for t in per)


def per_step_breakdown(runs):
    """Mean over ranks and rounds, per step, in ms: wall, forward+backward, optimizer.step, and
    CPU of the training thread, horovodlite's background thread and all other threads."""
    rows = {"wall": [], "fwd+bwd": [], "opt.step": [], "cpu main": [], "cpu hvdl-bg": [],
            "cpu other": []}
    for r in runs:
        for x in r:
            n = len(x.times)
            rows["wall"].append(sum(x.times) / n)
            rows["fwd+bwd"].append(sum(x.fwd_bwd) / n)
            rows["opt.step"].append(sum(x.opt_step) / n)
            rows["cpu main"].append(x.cpu.get("main", 0.0) / n)
            rows["cpu hvdl-bg"].append(x.cpu.get("hvdl-bg", 0.0) / n)
            rows["cpu other"].append(sum(v for k, v in x.cpu.items()
                                         if k not in ("main", "hvdl-bg")) / n)
    return {k: 1e3 * statistics.mean(v) for k, v in rows.items()}


def print_table(args, results, horovod_missing):
    n = hvd.size()
    print(f"\nmodel={args.model} batch/rank={args.batch_size} ranks={n} "
          f"({hvd.cross_size()} host(s) x {hvd.local_size()}) threads/rank=1 "
          f"rounds={args.rounds} x {args.steps} timed steps (after {args.warmup} warm-up each)")
    header = (f"{'configuration':<22}{'median ms':>11}{'IQR ms':>9}{'samples/s':>11}"
              f"{'of ceiling':>12}{'rounds':>14}")
    print(header)
    print("-" * len(header))
    stats = {}
    for name, runs in results.items():
        sync = name != CEILING
        times = [t for per in step_times(runs, sync) for t in per]
        q = statistics.quantiles(times, n=4)
        stats[name] = throughput(runs, sync, args.batch_size)
        # the share of the ceiling per round (each round's ceiling run ran just before it)
        shares = [throughput([r], sync, args.batch_size) /
                  throughput([c], False, args.batch_size)
                  for r, c in zip(runs, results[CEILING])]
        share = stats[name] / stats[CEILING]
        print(f"{name:<22}{statistics.median(times) * 1e3:>11.2f}{(q[2] - q[0]) * 1e3:>9.2f}"
              f"{stats[name]:>11.1f}{share:>11.0%} {min(shares):>6.0%}-{max(shares):.0%}")
    if horovod_missing:
        print(f"{'Horovod':<22}{'not installed':>11}")
    ours = stats[f"horovodlite np={n}"]
    ddp = stats[f"DDP gloo np={n}"]
    print(f"\nthroughput horovodlite / synchronized ceiling: {ours / stats[SYNC_CEILING]:.0%} "
          f"(DDP: {ddp / stats[SYNC_CEILING]:.0%})")
    print(f"throughput horovodlite / DDP: {ours / ddp:.2f}x")
    per_grad = stats[f"hvdl per-gradient np={n}"]
    print(f"throughput horovodlite (bucket views) / per-gradient path: {ours / per_grad:.2f}x")
    held = stats[f"hvdl buckets held np={n}"]
    print(f"throughput horovodlite / buckets held until the optimizer waits: {ours / held:.2f}x")
    hv = stats.get(f"Horovod np={n}")
    print("throughput horovodlite / Horovod: "
          + (f"{ours / hv:.2f}x" if hv else "n/a (Horovod not installed)"))
    print("\nper step, mean over ranks (ms): wall = forward+backward + optimizer.step; "
          "CPU by thread")
    cols = ["wall", "fwd+bwd", "opt.step", "cpu main", "cpu hvdl-bg", "cpu other"]
    print(f"{'configuration':<22}" + "".join(f"{c:>12}" for c in cols))
    for name, runs in results.items():
        b = per_step_breakdown(runs)
        print(f"{name:<22}" + "".join(f"{b[c]:>12.2f}" for c in cols))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="horovodlite vs DDP vs Horovod train step")
    p.add_argument("--model", choices=list(BATCHES), default=None,
                   help="default: cnn on the CPU, resnet50 on CUDA")
    p.add_argument("--batch-size", type=int, default=None,
                   help="per rank (cnn 32, mlp 64, wide 8, resnet50 64)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=20, help="timed steps per run")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--zero-grad", choices=["none", "zeros"], default="none",
                   help="how each step clears the gradients: zero_grad(set_to_none=True), torch's "
                        "default (autograd then puts each gradient in a new tensor, which bucket "
                        "views reduce where it is on the CPU), or set_to_none=False (zeroed in "
                        "place)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cuda: horovodlite vs DDP (NCCL) vs no communication on GPUs")
    p.add_argument("--amp", choices=["bf16"], default=None,
                   help="--device cuda: forward and loss under bfloat16 autocast")
    p.add_argument("--json", help="--device cuda: write the figures to this file (rank 0)")
    args = p.parse_args(argv)
    if args.model is None:
        args.model = "resnet50" if args.device == "cuda" else "cnn"
    if args.amp and args.device != "cuda":
        p.error("--amp needs --device cuda")
    if args.batch_size is None:
        args.batch_size = BATCHES[args.model][2]
    return args


def main():
    args = parse_args()
    if args.device == "cuda":
        import train_step_cuda  # noqa: PLC0415  (benchmarks/, beside this file)

        return train_step_cuda.run(args, make_model, make_batch)
    hvd.init()
    torch.set_num_threads(1)
    n = hvd.size()
    horovod = load_horovod()
    init_gloo()
    results = {CEILING: [], SYNC_CEILING: [], f"horovodlite np={n}": [],
               f"hvdl buckets held np={n}": [], f"hvdl per-gradient np={n}": [],
               f"DDP gloo np={n}": []}
    if horovod is not None:
        results[f"Horovod np={n}"] = []
    for _ in range(args.rounds):  # each entry: one round's Run of every rank
        results[CEILING].append(run_ceiling(args))
        results[SYNC_CEILING].append(run_ceiling(args, synchronized=True))
        results[f"horovodlite np={n}"].append(run_horovodlite(args))
        results[f"hvdl buckets held np={n}"].append(run_horovodlite(args, send_now=False))
        results[f"hvdl per-gradient np={n}"].append(run_horovodlite(args, bucket_view=False))
        dist.barrier()
        results[f"DDP gloo np={n}"].append(run_ddp(args))
        if horovod is not None:
            results[f"Horovod np={n}"].append(run_horovod(horovod, args))
    if hvd.rank() == 0:
        print_table(args, results, horovod is None)
    dist.destroy_process_group()
    hvd.shutdown()


if __name__ == "__main__":
    main()
