"""The allreduce benchmark on CUDA tensors (``benchmarks/allreduce.py --device cuda``): the
single sizes and the fusion case against torch.distributed (NCCL with one GPU per rank, gloo on
the same CUDA tensors when the ranks share a GPU), plus horovodlite on CPU tensors for reference.
Every timed call ends with torch.cuda.synchronize()."""

from __future__ import annotations

import json
import os
import socket

import torch
from allreduce_common import (
    COMM,
    RANK,
    SIZE,
    KiB,
    MiB,
    _free_port,
    busbw,
    compare,
    fmt_bw,
    fmt_time,
    log,
    run_single_sizes,
    size_label,
)

import horovodlite.torch as hvd
from horovodlite.runner.check_build import nccl_text


def _sync_after(fn, plan):
    """``fn`` followed by torch.cuda.synchronize(): a collective's whole latency on a GPU."""
    def run():
        fn()
        plan.synchronize()
    return run


class TorchDistCuda:
    """torch.distributed on CUDA tensors: NCCL (one GPU per rank) or gloo (ranks share one)."""

    def __init__(self, plan):
        import torch.distributed as dist

        where = COMM.bcast((socket.gethostbyname(socket.gethostname()), _free_port())
                           if RANK == 0 else None)
        dist.init_process_group(plan.peer_backend, init_method=f"tcp://{where[0]}:{where[1]}",
                                rank=RANK, world_size=SIZE)
        self.dist, self.plan, self.name = dist, plan, f"torch {plan.peer_backend}"

    def single(self, nbytes):
        t = torch.ones(max(nbytes // 4, 1), device=self.plan.torch_device)
        return _sync_after(lambda: self.dist.all_reduce(t), self.plan)

    def many(self, count, nbytes):
        ts = [torch.ones(nbytes // 4, device=self.plan.torch_device) for _ in range(count)]

        def run():
            works = [self.dist.all_reduce(t, async_op=True) for t in ts]
            for w in works:
                w.wait()
        return _sync_after(run, self.plan)


class HorovodliteCuda:
    """horovodlite on the plan's CUDA tensors, or (``plan`` None) on CPU tensors for reference."""

    def __init__(self, plan):
        self.plan = plan
        self.device = plan.torch_device if plan is not None else None
        self.name = "horovodlite" if plan is not None else "hvdl on CPU"

    def _tensor(self, elements):
        return torch.ones(elements, device=self.device or "cpu")

    def single(self, nbytes):
        t = self._tensor(max(nbytes // 4, 1))
        name = f"single.{self.device}.{nbytes}"
        fn = lambda: hvd.synchronize(hvd.allreduce_async_(t, name=name, op=hvd.Sum))
        return _sync_after(fn, self.plan) if self.plan is not None else fn

    def many(self, count, nbytes):
        ts = [self._tensor(nbytes // 4) for _ in range(count)]
        names = [f"many.{self.device}.{i}" for i in range(count)]

        def run():
            handles = [hvd.allreduce_async_(t, name=n, op=hvd.Sum) for t, n in zip(ts, names)]
            for h in handles:
                hvd.synchronize(h)
        return _sync_after(run, self.plan) if self.plan is not None else run


def run_cuda_fusion(comps, peer, count, nbytes, quick):
    """The fusion case on the GPU: against one call of the peer on the same total bytes and
    against ``count`` separate calls of the peer."""
    log(f"\n== {count} tensors of {size_label(nbytes)} submitted together, np={SIZE}, CUDA ==")
    total = count * nbytes
    fns = {"one call": peer.single(total)}
    fns.update({c.name: c.many(count, nbytes) for c in comps})
    times = compare(fns, 3, 0.1 if quick else 0.3, 3 if quick else 9)
    one = times.pop("one call")
    rows = []
    log(f"{'library':>26} {'time':>12} {'busbw':>12} {'x one ' + peer.name + ' call':>22} "
        f"{f'x {count} calls':>14}")
    for name, t in [(f"{peer.name} (one call)", one)] + [
            (k if k != peer.name else f"{peer.name} ({count} calls)", v)
            for k, v in times.items()]:
        log(f"{name:>26} {fmt_time(t):>12} {fmt_bw(busbw(total, t)):>12} {t / one:22.2f} "
            f"{t / times[peer.name]:14.2f}")
        rows.append(dict(case="fusion", library=name, seconds=t, busbw=busbw(total, t),
                         ratio_to_one_call=t / one, ratio_to_separate_calls=t / times[peer.name]))
    return rows


CUDA_SIZES = [4, 64, 1 * KiB, 16 * KiB, 64 * KiB, 256 * KiB, 1 * MiB, 4 * MiB, 16 * MiB,
              64 * MiB, 256 * MiB]
CUDA_SIZES_QUICK = [4, 64 * KiB, 1 * MiB, 16 * MiB, 64 * MiB, 256 * MiB]


def run_cuda(args) -> int:
    """``--device cuda``: single sizes and the fusion case on CUDA tensors (see the top)."""
    import gpu_setup  # noqa: PLC0415  (benchmarks/, beside this file)

    plan = gpu_setup.setup("benchmarks/allreduce.py", hvd)
    peer = TorchDistCuda(plan)
    comps = [peer, HorovodliteCuda(plan)]
    if not args.no_cpu_reference:
        comps.append(HorovodliteCuda(None))
    nccl = hvd.nccl_built()
    try:
        torch_nccl = ".".join(map(str, torch.cuda.nccl.version()))
    except (AttributeError, RuntimeError):
        torch_nccl = "none"
    log(f"allreduce benchmark on CUDA: np={SIZE}, {plan.name()}, "
        f"{plan.describe()}; torch {torch.__version__} (CUDA {torch.version.cuda}, NCCL "
        f"{torch_nccl}), horovodlite NCCL {nccl_text(nccl) if nccl else 'not built'}, "
        f"HOROVOD_GPU_OPERATIONS={os.environ.get('HOROVOD_GPU_OPERATIONS', 'nccl')}")
    skip = set(filter(None, args.skip.split(",")))
    if args.only:
        skip |= {"single", "fusion"} - set(args.only.split(","))
    rows = []
    if "single" not in skip:
        sizes = args.sizes or (CUDA_SIZES_QUICK if args.quick else CUDA_SIZES)
        rows += run_single_sizes(comps, sizes, args.quick, base=peer.name, label=peer.name,
                                 key="ratio_to_peer", where=f", CUDA, peer {peer.name}")
    if "fusion" not in skip:
        rows += run_cuda_fusion(comps, peer, 200, 64 * KiB, args.quick)
    if args.json and RANK == 0:
        with open(args.json, "w") as f:
            json.dump(dict(np=SIZE, device="cuda", gpu=plan.name(),
                           shared_gpu=plan.shared, peer=peer.name, rows=rows), f, indent=1)
    peer.dist.destroy_process_group()
    hvd.shutdown()
    return 0
