"""DistributedOptimizer(shard=...) against the unsharded path and torch's ZeroRedundancyOptimizer
over DDP, side by side in one run (issue 47).

Run under the launcher, e.g.::

    horovodliterun -np 2 python benchmarks/sharded_optimizer.py            # memory and time
    horovodliterun -np 2 python benchmarks/sharded_optimizer.py --equality  # 200-step equality

Memory: per-rank bytes of the optimizer state (every tensor of ``opt.state``; for ZeRO its local
optimizer's state); for ``shard="gradients"``, of the reduced gradient kept after an explicit
synchronize(); and the peak of one step's gradients, buffers and optimizer temporaries
(``step_peak``; not for ZeRO, whose DDP buckets it cannot see). Time: the median of ``--steps``
measured steps (forward, backward, step) after warm-up steps; the ranks start each step together
(a barrier), the competitors take turns step by step (in a rotating order) and rank 0 prints.
``--equality`` trains a smaller float32 model for 200 steps through the unsharded and the
sharded optimizer from the same start and prints the largest difference of the parameters
relative to the largest parameter, and whether they are bit-identical, per optimizer and option.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import tempfile
import time

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import horovodlite.torch as hvd


def make_model(width, layers, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])


def state_bytes(state):
    return sum(v.numel() * v.element_size() for s in state.values() for v in s.values()
               if isinstance(v, torch.Tensor))


def batch(width, rows, step):
    g = torch.Generator().manual_seed(1000 * step + hvd.rank())
    return torch.randn(rows, width, generator=g), torch.randn(rows, width, generator=g)


def one_step(model, opt, args, step):
    x, y = batch(args.width, args.rows, step)
    hvd.barrier()
    t0 = time.perf_counter()
    opt.zero_grad()
    F.mse_loss(model(x), y).backward()
    opt.step()
    return time.perf_counter() - t0


def build_hvd(args, shard, overlap="0"):
    os.environ["HOROVOD_SHARDED_OVERLAP_BUCKETS"] = overlap  # read by the constructor
    model = make_model(args.width, args.layers)
    opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-4),
                                   named_parameters=model.named_parameters(), shard=shard)
    return (model, opt, lambda: state_bytes(opt.state), lambda: kept_grads(model, opt, args),
            lambda: step_peak(model, opt, args))


def step_peak(model, opt, args):
    """Peak bytes of what one step adds to the parameters and optimizer state: before the
    inner optimizer's step (gradients and communication buffers), and over the whole step
    (with the optimizer's temporaries). The gradient storage held from the
    last step after zero_grad(set_to_none=False) (buckets whose views .grad are), plus the
    highest the CPU allocator's bytes rose above that during forward, backward and step, from
    torch.profiler's memory events."""
    opt.zero_grad(set_to_none=False)
    tensors = [p.grad for p in model.parameters() if p.grad is not None]
    for b in getattr(opt, "_shard_buckets", []):
        tensors += [t for t in (b.flat, b.grad) if t is not None]
    held = sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for t in tensors}.values())
    x, y = batch(args.width, args.rows, 0)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        F.mse_loss(model(x), y).backward()
        opt.step()
    events = sorted(prof.profiler.kineto_results.events(), key=lambda e: e.start_ns())
    # the inner optimizer's step (torch's profiler names it Optimizer.step#<class>.step)
    inner = [e.start_ns() for e in events
             if e.name() == "Optimizer.step#Adam.step"]
    inner_at = inner[-1] if inner else math.inf
    now = peak = before = 0
    for e in events:
        if e.name() == "[memory]":
            now += e.nbytes()
            peak = max(peak, now)
            if e.start_ns() < inner_at:
                before = peak
    return held + before, held + peak


def kept_grads(model, opt, args):
    """Bytes of reduced gradient kept after synchronize() with shard="gradients"."""
    if getattr(opt, "_shard_mode", None) != "gradients":
        return 0
    opt.zero_grad()
    x, y = batch(args.width, args.rows, 0)
    F.mse_loss(model(x), y).backward()
    opt.synchronize()
    # each storage once: the parameters crossing this rank's range have .grad views of the
    # span kept around the range (for GradScaler), which b.grad is a view of too
    tensors = [b.grad for b in opt._shard_buckets]
    tensors += [p.grad for p in model.parameters() if p.grad is not None]
    kept = sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for t in tensors}.values())
    opt.step()
    return kept


def build_zero(args):
    import torch.distributed as dist
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel
    if not dist.is_initialized():
        path = hvd.broadcast_object(tempfile.mktemp(prefix="hvdl_zero_") if hvd.rank() == 0
                                    else None)
        dist.init_process_group("gloo", init_method=f"file://{path}", rank=hvd.rank(),
                                world_size=hvd.size())
    model = DistributedDataParallel(make_model(args.width, args.layers))
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=1e-4)
    return (model, opt, lambda: state_bytes(opt.optim.state), lambda: 0,
            lambda: (math.nan, math.nan))


def memory_and_time(args):
    """Every competitor built first; then each round runs one step of each, in an order that
    rotates, so load changes on the machine hit them alike."""
    params = sum(p.numel() for p in make_model(args.width, args.layers).parameters())
    builders = {"unsharded": lambda: build_hvd(args, None),
                "shard=optimizer_state": lambda: build_hvd(args, "optimizer_state"),
                "shard=gradients": lambda: build_hvd(args, "gradients"),
                "shard=gradients, overlap all": lambda: build_hvd(args, "gradients", "all")}
    if not args.no_zero:
        builders["torch ZeRO over DDP"] = lambda: build_zero(args)
    runs = {name: build() for name, build in builders.items()}
    names = list(runs)
    times = {name: [] for name in names}
    for r in range(args.warmup + args.steps):
        for name in names[r % len(names):] + names[:r % len(names)]:
            model, opt, _, _, _ = runs[name]
            t = one_step(model, opt, args, r)
            if r >= args.warmup:
                times[name].append(t)
    rows = {}
    for name in names:
        _, _, state, grads, peak = runs[name]
        step_bytes = peak()  # before grads(): its synchronize() changes how the next step goes
        values = [statistics.median(times[name]), state(), grads(), *step_bytes]
        rows[name] = hvd.allgather(torch.tensor([values], dtype=torch.float64))
    if hvd.rank() == 0:
        n = hvd.size()
        full = rows["unsharded"][0, 1].item()
        base = rows["unsharded"][0, 0].item()
        print(f"np {n}: {params * 4 / 2 ** 20:.1f} MiB of fp32 parameters, Adam, "
              f"{args.rows} rows/rank, median of {args.steps} rounds")
        print("| optimizer | state MiB/rank (max) | x unsharded | x 1/N | grads kept MiB/rank "
              "| grads+comm peak MiB/rank | step peak MiB/rank | step s (rank 0) "
              "| x unsharded |")
        print("|---|---|---|---|---|---|---|---|---|")
        for name, g in rows.items():
            state = g[:, 1].max().item()
            print(f"| {name} | {state / 2 ** 20:.1f} | {state / full:.3f} | "
                  f"{state / full * n:.3f} | {g[:, 2].max().item() / 2 ** 20:.1f} | "
                  f"{g[:, 3].max().item() / 2 ** 20:.1f} | {g[:, 4].max().item() / 2 ** 20:.1f} | "
                  f"{g[0, 0].item():.3f} | {g[0, 0].item() / base:.2f} |")


EQUALITY = {
    "SGD momentum": lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9),
    "Adam": lambda ps: torch.optim.Adam(ps, lr=1e-3),
    "AdamW": lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.01),
}


def train_for_equality(make_opt, shard, option, steps):
    model = make_model(256, 4, seed=3)
    opt = hvd.DistributedOptimizer(make_opt(model.parameters()),
                                   named_parameters=model.named_parameters(), shard=shard)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8) if "GradScaler" in option else None
    for s in range(steps):
        x, y = batch(256, 8, s)
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        (scaler.scale(loss) if scaler else loss).backward()
        if option == "plain":
            opt.step()
            continue
        opt.synchronize()
        if scaler:
            scaler.unscale_(opt)
        if "clip" in option:
            if shard:
                opt.clip_grad_norm_(0.1)
            else:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
        if shard:
            scaler.step(opt) if scaler else opt.step()
        else:
            with opt.skip_synchronize():
                scaler.step(opt) if scaler else opt.step()
        if scaler:
            scaler.update()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def equality(args):
    for name, make_opt in EQUALITY.items():
        for option in ("plain", "clip", "GradScaler", "GradScaler+clip"):
            ref = train_for_equality(make_opt, None, option, args.equality_steps)
            for shard in ("optimizer_state", "gradients"):
                got = train_for_equality(make_opt, shard, option, args.equality_steps)
                # Largest difference relative to the largest parameter (an element-wise ratio
                # is dominated by parameters that pass near zero).
                rel = ((got - ref).abs().max() / ref.abs().max()).item()
                same = hvd.allreduce(torch.tensor([float(torch.equal(got, ref))]), op=hvd.Min)
                worst = hvd.allreduce(torch.tensor([rel], dtype=torch.float64), op=hvd.Max)
                if hvd.rank() == 0:
                    print(f"| {name} | {option} | {shard} | {worst.item():.2e} | "
                          f"{'yes' if same.item() else 'no'} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=4, help="4 x 2048^2 fp32 = 64 MiB")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--no-zero", action="store_true", help="skip torch's ZeRO")
    parser.add_argument("--equality", action="store_true")
    parser.add_argument("--equality-steps", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    hvd.init()
    if args.equality:
        if hvd.rank() == 0:
            print(f"np {hvd.size()}: {args.equality_steps} steps, max |sharded - unsharded| "
                  "/ max |unsharded| over the parameters")
            print("| optimizer | option | shard | max diff / max param | bit-identical |")
            print("|---|---|---|---|---|")
        equality(args)
    else:
        memory_and_time(args)
    hvd.shutdown()


if __name__ == "__main__":
    main()
