"""The GPU benchmarks' own logic, on a machine without a GPU.

* benchmarks/gpu_setup.py's placement: one GPU per rank when there are enough, else the ranks
  share (horovodlite staged through host memory, gloo as the peer).
* ``--device cuda`` without a GPU fails at once with one line saying so (both benchmarks).
* The argument handling: the CPU defaults stay what they were.
The CUDA code paths themselves run end to end with the CPU standing in for the GPU in
tests/test_training_examples.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_setup  # noqa: E402


@pytest.mark.parametrize("local_rank,local_size,gpus,device,shared", [
    (0, 1, 1, 0, False),
    (1, 2, 2, 1, False),
    (1, 2, 8, 1, False),
    (0, 2, 1, 0, True),
    (1, 2, 1, 0, True),
    (3, 4, 2, 1, True),
])
def test_placement(local_rank, local_size, gpus, device, shared):
    plan = gpu_setup.plan(local_rank, local_size, gpus)
    assert (plan.device, plan.shared) == (device, shared)
    assert plan.peer_backend == ("gloo" if shared else "nccl")
    assert ("sharing" in plan.describe()) == shared
    assert plan.torch_device == torch.device("cuda", device)


def test_the_stand_in_uses_the_cpu_and_gloo():
    plan = gpu_setup.plan(0, 1, 1, stand_in=True)
    assert plan.torch_device == torch.device("cpu") and plan.peer_backend == "gloo"
    assert plan.ddp_device_ids is None
    plan.synchronize()  # a no-op without a GPU


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible")
@pytest.mark.parametrize("script", ["benchmarks/allreduce.py", "benchmarks/train_step.py"])
def test_cuda_without_a_gpu_fails_with_one_line(script):
    proc = subprocess.run([sys.executable, script, "--device", "cuda"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"{script} --device cuda: torch sees no CUDA device (torch {torch.__version__}, built "
        f"with CUDA {torch.version.cuda}); run it on a GPU machine, or without --device cuda "
        "for the CPU benchmark"]


ALLREDUCE_ARGS = """
import json, sys
sys.path.insert(0, "benchmarks")
import allreduce
a = allreduce.parse_args([])
b = allreduce.parse_args(["--device", "cuda", "--sizes", "4,1048576"])
print(json.dumps([a.device, a.sizes, a.quick, b.device, b.sizes, allreduce.CUDA_SIZES]))
"""


def test_arguments():
    import train_step

    cpu = train_step.parse_args([])
    assert (cpu.device, cpu.model, cpu.batch_size, cpu.amp) == ("cpu", "cnn", 32, None)
    gpu = train_step.parse_args(["--device", "cuda", "--amp", "bf16"])
    assert (gpu.model, gpu.batch_size, gpu.amp) == ("resnet50", 64, "bf16")
    assert train_step.parse_args(["--device", "cuda", "--model", "mlp"]).batch_size == 64
    with pytest.raises(SystemExit):
        train_step.parse_args(["--amp", "bf16"])  # autocast is for the GPU run
    # In a child: importing allreduce starts MPI (mpi4py), which this process leaves to hvd.
    out = subprocess.run([sys.executable, "-c", ALLREDUCE_ARGS], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, check=True).stdout
    device, sizes, quick, cuda, cuda_sizes, defaults = json.loads(out.splitlines()[-1])
    assert (device, sizes, quick) == ("cpu", None, False)
    assert (cuda, cuda_sizes) == ("cuda", [4, 2**20])
    assert defaults[0] == 4 and defaults[-1] == 256 * 2**20


def test_resnet50_is_resnet50():
    import train_step

    model = train_step.make_model("resnet50")
    assert sum(p.numel() for p in model.parameters()) == 25_557_032  # torchvision's resnet50
    x, _ = train_step.make_batch("resnet50", 1, 0)
    assert model.eval()(x).shape == (1, 1000)
