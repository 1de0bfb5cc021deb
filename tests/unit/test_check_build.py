"""``horovodliterun --check-build``: the report, the allreduce it runs, and a crash reported.

The crash is made with HVDL_TEST_CHECK_BUILD_CRASH=PART, which makes that part's child process
kill itself with SIGSEGV (the way a module carrying its own libstdc++ died at its first
collective): the check must name the signal, point at docs/troubleshooting.md and exit 1.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from horovodlite.runner import check_build, launch

ROOT = Path(__file__).resolve().parents[2]


def run_check(**env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "horovodlite.runner.launch", "--check-build"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, **env})


def test_check_build_reports_and_runs_an_allreduce():
    import horovodlite
    from horovodlite.common import basics

    proc = run_check()
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert f"horovodlite v{horovodlite.__version__}" in out
    for line in ("Available frameworks:", f"[X] PyTorch {torch.__version__}",
                 "Available controllers:", "[X] MPI (", "Available tensor operations:",
                 "Running one allreduce on one rank:", "check-build: everything ran"):
        assert line in out, out
    assert f"{'[X]' if basics.gloo_built() else '[ ]'} Gloo" in out
    assert f"{'[X]' if basics.cuda_built() else '[ ]'} CUDA" in out
    assert f"{'[X]' if basics.nccl_built() else '[ ]'} NCCL" in out
    cpu = [line for line in out.splitlines() if "CPU: allreduce" in line]
    assert len(cpu) == 1 and cpu[0].strip().startswith("[X]") and "correct" in cpu[0], out
    gpu = [line for line in out.splitlines() if "GPU:" in line]
    assert len(gpu) == 1, out
    if not basics.cuda_built():
        assert "[ ] GPU: not run: this build has no CUDA" in gpu[0]
    elif not torch.cuda.is_available():
        assert "[ ] GPU: not run: no GPU visible" in gpu[0]
    else:
        assert gpu[0].strip().startswith("[X]") and "correct" in gpu[0], out


@pytest.mark.parametrize("part", ["cpu", "info"])
def test_a_crashing_child_is_reported_with_its_signal(part):
    proc = run_check(HVDL_TEST_CHECK_BUILD_CRASH=part)
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr
    assert "killed by signal 11 (SIGSEGV)" in out, out
    assert "docs/troubleshooting.md" in out and "_ZNSo9_M_insert" in out, out
    if part == "cpu":  # the report before it still came
        assert "Available tensor operations:" in out and "[!] CPU: FAILED" in out, out
    else:
        assert "[!] loading the extension: FAILED" in out, out
    assert "check-build: everything ran" not in out


def test_np_is_needed_to_launch_but_not_to_check():
    assert launch._parser().parse_args(["--check-build"]).check_build
    with pytest.raises(SystemExit) as err:
        launch.main(["python", "x.py"])
    assert err.value.code == 2


def test_nccl_version_codes():
    assert check_build.nccl_text(23203) == "2.32.3"
    assert check_build.nccl_text(21805) == "2.18.5"
    assert check_build.nccl_text(2708) == "2.7.8"


def test_describe_a_gpu_build():
    info = dict(version="9.9", module="/x/_C.so", torch="2.11.0+cu130", torch_cuda="13.0",
                mpi=True, mpi_library="Open MPI v5.0.11", transport="MPI 3.1 (Open MPI v5.0.11)",
                gloo=False, cuda=True, nccl=22803, gpus=1, gpu_operations="nccl")
    text = "\n".join(check_build.describe(info))
    for line in ("horovodlite v9.9 (/x/_C.so)", "[X] PyTorch 2.11.0+cu130 (CUDA 13.0)",
                 "[X] MPI (Open MPI v5.0.11)", "[ ] Gloo", "[X] NCCL 2.28.3", "[X] CUDA",
                 "[X] MPI 3.1 (Open MPI v5.0.11)"):
        assert line in text, text
