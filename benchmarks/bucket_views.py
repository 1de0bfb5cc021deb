"""Bucket views (docs/bucket_views.md) against the per-gradient path and raw MPI, side by side in
one run.

The model is ``--params`` parameters of ``--kib`` KiB each (float32) with a cheap backward
(gradient = a constant), so little communication overlaps with backward. Timed: from the end of
``loss.backward()`` to the end of ``optimizer.synchronize()``, two ways: ``own``, the slowest
rank's span from its own end of backward (what one rank's profile shows; it includes waiting for a
rank whose backward ended later), and ``after last``, from the moment the last rank finished
backward to the moment the last rank finished ``synchronize()`` (the time the reduction adds after
the last gradient exists; the ranks share one host, so one monotonic clock). Each round runs, one
after the other, ``--steps`` steps of: bucket views on (``zero_grad(set_to_none=False)``), on with
each ready bucket held until ``synchronize()`` waits (``on-held``, as
``HOROVOD_BUCKET_SEND_NOW=0``), on with ``set_to_none=True`` (a model and optimizer of its
own: autograd puts each gradient in a new tensor, which is reduced where it is), off
(``bucket_view=False``), and one raw ``MPI_Allreduce`` (mpi4py) of the same total bytes, and
``hvd.allreduce_`` of one tensor of those bytes (the core's best case: negotiation plus one
in-place MPI call); a round's figure is the median step. The tables give the median over rounds,
the range, and the ratio to raw MPI (timed the same way) of the same round. ``mpi-after-backward``
is raw MPI as a user without any library would get it from the end of backward: the same model with
its gradients set by hand to views of one flat tensor, backward, then ``MPI_Allreduce`` of that
tensor in place (a Sum, like the ``mpi`` row, which runs without a backward before it: memory and
caches are in another state after one). ``on-aligned`` is ``on`` with a barrier between the end of
backward and the timed span: the ranks' backward passes end at different times, and without it the
slowest rank's figure includes waiting for the other rank's backward (the raw MPI call starts
aligned).

A last table gives each configuration's whole step - zero_grad, forward, backward and
``synchronize()``, slowest rank - against the same step with a raw ``MPI_Allreduce`` after
backward: what a bucket sent during backward takes from backward counts there.

Memory: there are no allocator statistics for CPU tensors, so the report counts what holds
gradient bytes - the parameters' gradients (distinct storages) and the core's fusion buffer -
after bucket views alone have run (the fusion buffer only ever grows, so it is read before the
per-gradient path runs); for ``set_to_none=True`` also the buckets that still hold a flat tensor
besides the gradients.

    horovodliterun -np 2 python benchmarks/bucket_views.py
    horovodliterun -np 2 python benchmarks/bucket_views.py --rounds 7 --steps 20
    HOROVOD_HOLD_UNTIL_WAIT=0 horovodliterun -np 2 python benchmarks/bucket_views.py
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from mpi4py import MPI

import horovodlite.torch as hvd
from horovodlite._extension import load

_C = load()

COMM = MPI.COMM_WORLD
CONFIGS = ("on", "on-held", "on-aligned", "on-set_to_none", "off", "one-tensor", "mpi",
           "mpi-after-backward")


class Model(torch.nn.Module):
    def __init__(self, params: int, numel: int):
        super().__init__()
        self.ps = torch.nn.ParameterList(torch.nn.Parameter(torch.zeros(numel))
                                         for _ in range(params))

    def loss(self):
        return sum(p.sum() for p in self.ps)  # d loss / d p = ones: a cheap backward


def gradient_bytes(model) -> int:
    """Bytes of the distinct storages the gradients live in."""
    storages = {}
    for p in model.parameters():
        if p.grad is not None:
            s = p.grad.untyped_storage()
            storages[s.data_ptr()] = s.nbytes()
    return sum(storages.values())


def spans(begin: float, start: float, end: float) -> tuple:
    """(the slowest rank's own span, last end - last start, the slowest rank's whole step from
    `begin`) of one step, on every rank."""
    times = COMM.allgather((begin, start, end))
    return (max(e - s for _, s, e in times),
            max(e for _, _, e in times) - max(s for _, s, _ in times),
            max(e - b for b, _, e in times))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", type=int, default=200)
    ap.add_argument("--kib", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    numel = args.kib * 1024 // 4
    total = args.params * numel * 4
    models, opts = {}, {}
    for name, view in (("on", True), ("on-held", True), ("on-set_to_none", True),
                       ("off", False)):
        models[name] = Model(args.params, numel)
        opts[name] = hvd.DistributedOptimizer(
            torch.optim.SGD(models[name].parameters(), lr=0.0),
            named_parameters=models[name].named_parameters(), bucket_view=view)
    # HOROVOD_BUCKET_SEND_NOW=0 for this one: its bucket waits like other new work.
    opts["on-held"]._hvd_reducer.set_send_buckets_now(False)
    raw = torch.ones(total // 4)
    # Raw MPI after backward: gradients as views of one flat tensor, made by hand.
    by_hand = Model(args.params, numel)
    flat = torch.zeros(total // 4)
    for k, p in enumerate(by_hand.parameters()):
        p.grad = flat[k * numel:(k + 1) * numel]

    def step(name: str, set_to_none: bool, aligned: bool = False) -> tuple:
        model, opt = models[name], opts[name]
        begin = time.perf_counter()
        opt.zero_grad(set_to_none=set_to_none)
        model.loss().backward()
        if aligned:  # the ranks' ends of backward together: no rank's time waits for another's
            COMM.Barrier()
        t0 = time.perf_counter()
        opt.synchronize()
        t1 = time.perf_counter()
        with opt.skip_synchronize():
            opt.step()
        return begin, t0, t1

    def mpi_step() -> tuple:
        t0 = time.perf_counter()
        COMM.Allreduce(MPI.IN_PLACE, raw.numpy(), op=MPI.SUM)
        return t0, t0, time.perf_counter()

    def mpi_after_backward() -> tuple:
        begin = time.perf_counter()
        flat.zero_()
        by_hand.loss().backward()
        t0 = time.perf_counter()
        COMM.Allreduce(MPI.IN_PLACE, flat.numpy(), op=MPI.SUM)
        return begin, t0, time.perf_counter()

    one = torch.ones(total // 4)

    def one_tensor() -> tuple:  # the core's best case: one tensor of the same bytes, in place
        t0 = time.perf_counter()
        hvd.allreduce_(one, op=hvd.Sum, name="bucket_views.one_tensor")
        return t0, t0, time.perf_counter()

    runners = {"on": lambda: step("on", False), "on-held": lambda: step("on-held", False),
               "on-aligned": lambda: step("on", False, True),
               "on-set_to_none": lambda: step("on-set_to_none", True),
               "off": lambda: step("off", False), "one-tensor": one_tensor, "mpi": mpi_step,
               "mpi-after-backward": mpi_after_backward}

    # Memory, with bucket views alone run so far.
    for _ in range(args.warmup):
        runners["on"]()
    report = opts["on"].bucket_report()
    grads_on = gradient_bytes(models["on"])
    fusion_on = _C.stats()["fusion_buffer_bytes"]
    for name in CONFIGS:
        for _ in range(args.warmup):
            runners[name]()
    grads_off = gradient_bytes(models["off"])
    fusion_after = _C.stats()["fusion_buffer_bytes"]

    # per round: (median own span, median after-last span, median whole step)
    rounds = {c: [] for c in CONFIGS}
    copies, fresh = [], []
    for _ in range(args.rounds):
        for name in CONFIGS:
            COMM.Barrier()
            samples = [spans(*runners[name]()) for _ in range(args.steps)]
            rounds[name].append(tuple(statistics.median(s[i] for s in samples)
                                      for i in range(3)))
            if name in ("on", "on-set_to_none"):
                buckets = opts[name].bucket_report()["buckets"]
                (copies if name == "on" else fresh).append(sum(b["copies"] for b in buckets))
    fresh_report = opts["on-set_to_none"].bucket_report()
    grads_fresh = gradient_bytes(models["on-set_to_none"])
    held = sum(b["bytes"] for b in fresh_report["buckets"] if b["views"])
    if hvd.rank() != 0:
        hvd.shutdown()
        return
    mib = total / 2**20
    print(f"np {hvd.size()}: {args.params} params x {args.kib} KiB = {mib:.1f} MiB float32; "
          f"{args.rounds} rounds x {args.steps} steps; end of backward -> end of synchronize()")
    print(f"buckets: {len(report['buckets'])} "
          f"({', '.join(str(b['bytes'] // 1024) + ' KiB' for b in report['buckets'])}); "
          f"state {report['state']}; copies per step with set_to_none=False: {copies}")
    for i, label in enumerate(("own: the slowest rank, from its own end of backward",
                               "after last: from the last rank's end of backward")):
        print(label)
        print(f"{'config':<19}{'median ms':>10}{'range ms':>16}{'x raw MPI':>11}{'range x':>14}"
              f"{'x MPI after bwd':>17}{'range x':>14}")
        for name in CONFIGS:
            times = [r[i] for r in rounds[name]]
            cols = ""
            for ref in ("mpi", "mpi-after-backward"):
                ratios = [t[i] / m[i] for t, m in zip(rounds[name], rounds[ref])]
                width = 11 if ref == "mpi" else 17
                cols += (f"{statistics.median(ratios):>{width}.2f}"
                         f"{min(ratios):>7.2f}-{max(ratios):<6.2f}")
            print(f"{name:<19}{1e3 * statistics.median(times):>10.2f}"
                  f"{1e3 * min(times):>8.2f}-{1e3 * max(times):<7.2f}{cols}")
    print("whole step: the slowest rank's zero_grad, forward, backward and synchronize() "
          "(what moved into backward counts here)")
    print(f"{'config':<19}{'median ms':>10}{'range ms':>16}{'x MPI after bwd':>17}{'range x':>14}")
    for name in ("on", "on-held", "on-set_to_none", "off", "mpi-after-backward"):
        times = [r[2] for r in rounds[name]]
        ratios = [t[2] / m[2] for t, m in zip(rounds[name], rounds["mpi-after-backward"])]
        print(f"{name:<19}{1e3 * statistics.median(times):>10.2f}"
              f"{1e3 * min(times):>8.2f}-{1e3 * max(times):<7.2f}"
              f"{statistics.median(ratios):>17.2f}{min(ratios):>7.2f}-{max(ratios):<6.2f}")
    print(f"memory (bytes per rank): gradients on {grads_on} + fusion buffer {fusion_on} "
          f"= {(grads_on + fusion_on) / total:.3f}x the gradient bytes; "
          f"off: gradients {grads_off}, fusion buffer after both ran {fusion_after}")
    print(f"set_to_none=True: copies per step {fresh}; gradients {grads_fresh} bytes, buckets "
          f"still holding a flat tensor {held} bytes (gradients in their own tensors: "
          f"{sum(b['own'] for b in fresh_report['buckets'])} of {args.params})")
    hvd.shutdown()


if __name__ == "__main__":
    main()
