"""Launches tests/parallel/test_gpu_collectives.py on a GPU machine, in the configurations that
matter (skipped as a whole when torch.cuda.is_available() is False or the build has no CUDA):

  nccl-np1            one rank, NCCL
  nccl-hier-np1       one rank, HOROVOD_HIERARCHICAL_ALLREDUCE=1 (reduce-scatter, allgather)
  staged-np2          two ranks sharing GPU 0 through host memory (HOROVOD_GPU_OPERATIONS=mpi)
  nccl-np2            two ranks with NCCL, when there are two GPUs
  nccl-hier-np2       two ranks, hierarchical, when there are two GPUs
"""

from __future__ import annotations

import pytest
import torch
from test_parallel import run_parallel

import horovodlite.torch as hvd

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(not hvd.cuda_built(), reason="horovodlite was built without CUDA"),
]

TARGET = "tests/parallel/test_gpu_collectives.py"
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0

CONFIGS = [
    pytest.param(1, {}, id="nccl-np1"),
    pytest.param(1, {"HOROVOD_HIERARCHICAL_ALLREDUCE": "1"}, id="nccl-hier-np1"),
    pytest.param(2, {"HOROVOD_GPU_OPERATIONS": "mpi"}, id="staged-np2"),
    pytest.param(2, {}, id="nccl-np2",
                 marks=pytest.mark.skipif(GPUS < 2, reason="NCCL needs one GPU per rank")),
    pytest.param(2, {"HOROVOD_HIERARCHICAL_ALLREDUCE": "1"}, id="nccl-hier-np2",
                 marks=pytest.mark.skipif(GPUS < 2, reason="NCCL needs one GPU per rank")),
]


@pytest.mark.parametrize("np_,env", CONFIGS)
def test_gpu_collectives(np_, env):
    proc = run_parallel(np_, TARGET, extra_env=env)
    if proc.returncode != 0:
        pytest.fail(f"np={np_} {env} failed (exit {proc.returncode}):\n{proc.stdout[-10000:]}")
