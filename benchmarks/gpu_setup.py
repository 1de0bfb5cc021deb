"""Where a benchmark rank runs with ``--device cuda`` (benchmarks/allreduce.py, train_step.py).

One GPU per rank when the host has at least as many GPUs as ranks (rank i on cuda:<local rank>),
with torch.distributed on NCCL as the peer. Otherwise the ranks share the GPUs (local rank mod
the GPU count: all on cuda:0 with one GPU): NCCL refuses two ranks on one GPU, so horovodlite
runs with HOROVOD_GPU_OPERATIONS=mpi (CUDA tensors staged through host memory and MPI) and the
peer is torch.distributed's gloo on the same CUDA tensors. The decision is taken by every rank
alike (any host short of GPUs makes the whole job share).

HVDL_BENCH_CUDA_STAND_IN=1 (tests only, on machines without a GPU) runs the same code with the
CPU standing in for one GPU: tensors on the CPU, gloo as the peer, synchronize() a no-op.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch


def stand_in() -> bool:
    return os.environ.get("HVDL_BENCH_CUDA_STAND_IN") == "1"


@dataclass(frozen=True)
class GpuPlan:
    device: int  # this rank's CUDA device index
    shared: bool  # ranks share a GPU: host staging for horovodlite, gloo for torch.distributed
    local_size: int
    gpus: int
    stand_in: bool = False  # the CPU plays the GPU (tests)

    @property
    def peer_backend(self) -> str:
        return "gloo" if self.shared or self.stand_in else "nccl"

    @property
    def torch_device(self) -> torch.device:
        return torch.device("cpu") if self.stand_in else torch.device("cuda", self.device)

    @property
    def ddp_device_ids(self):
        return None if self.stand_in else [self.device]

    def synchronize(self) -> None:
        if not self.stand_in:
            torch.cuda.synchronize(self.device)

    def name(self) -> str:
        return "CPU standing in for a GPU" if self.stand_in else torch.cuda.get_device_name(
            self.device)

    def autocast(self, amp):
        if not amp:
            return contextlib.nullcontext()
        return torch.autocast("cpu" if self.stand_in else "cuda", dtype=torch.bfloat16)

    def describe(self) -> str:
        if self.stand_in:
            return (f"{self.local_size} rank(s), the CPU standing in for the GPU (a test): "
                    "torch.distributed gloo")
        if self.shared:
            return (f"{self.local_size} ranks sharing {self.gpus} GPU(s): horovodlite staged "
                    "through host memory (HOROVOD_GPU_OPERATIONS=mpi), torch.distributed gloo on "
                    "CUDA tensors")
        return (f"one GPU per rank ({self.local_size} rank(s), {self.gpus} GPU(s)): horovodlite "
                "NCCL, torch.distributed NCCL")


def plan(local_rank: int, local_size: int, gpus: int, stand_in: bool = False) -> GpuPlan:
    """The device of local rank ``local_rank`` of ``local_size`` on a host with ``gpus``."""
    if gpus < 1:
        raise ValueError("no GPU")
    if gpus >= local_size:
        return GpuPlan(local_rank, False, local_size, gpus, stand_in)
    return GpuPlan(local_rank % gpus, True, local_size, gpus, stand_in)


def require_cuda(program: str, hvd) -> None:
    """Exits with one clear line unless torch sees a GPU and horovodlite was built with CUDA."""
    if stand_in():
        return
    if not torch.cuda.is_available():
        raise SystemExit(
            f"{program} --device cuda: torch sees no CUDA device (torch {torch.__version__}, "
            f"built with CUDA {torch.version.cuda}); run it on a GPU machine, or without "
            "--device cuda for the CPU benchmark")
    if not hvd.cuda_built():
        raise SystemExit(
            f"{program} --device cuda: this horovodlite was built without CUDA "
            "(hvd.cuda_built() is False); rebuild it with a CUDA torch and nvcc present "
            "(docs/gpu.md)")


def setup(program: str, hvd) -> GpuPlan:
    """Checks the GPU, starts horovodlite (again, with host staging, when ranks share a GPU)
    and makes this rank's GPU the current device."""
    require_cuda(program, hvd)
    hvd.init()
    gpus = 1 if stand_in() else torch.cuda.device_count()
    mine = plan(hvd.local_rank(), hvd.local_size(), gpus, stand_in())
    shared = hvd.allreduce(torch.tensor([int(mine.shared)]), op=hvd.Sum,
                           name="gpu_setup.shared").item() > 0
    if shared and not mine.shared:  # another host is short of GPUs: share alike everywhere
        mine = GpuPlan(mine.device, True, mine.local_size, mine.gpus, mine.stand_in)
    if shared and "HOROVOD_GPU_OPERATIONS" not in os.environ:
        os.environ["HOROVOD_GPU_OPERATIONS"] = "mpi"
        hvd.shutdown()
        hvd.init()
    if not mine.stand_in:
        torch.cuda.set_device(mine.device)
    return mine
