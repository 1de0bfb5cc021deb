"""The CUDA/NCCL build, on machines without a GPU.

* CMake's detection says what it found and what it did not, and HVDL_WITH_CUDA=ON with a torch
  that has no CUDA is a configure error saying so (CPU-only torch only).
* Where nvcc exists: -DHVDL_CUDA_COMPILE_CHECK=ON compiles every CUDA and NCCL source of the
  project (csrc/backends/cuda/*.cu|*.cc, csrc/backends/nccl/*.cc, csrc/torch/cuda/*.cc against
  the installed torch's headers) and links ``hvdl_cuda_check`` - the whole runtime - against
  libcudart and libnccl. It then runs the program: without a GPU it only loads the libraries and
  prints the NCCL versions; with one it also checks the kernels against the CPU reference.
  NCCL comes from HVDL_NCCL_ROOT, an installed nvidia-nccl-cu* package, or build/nccl/ where
  ``bash scripts/install.sh --test`` (scripts/fetch_nccl.sh) puts it.
The build folder build/cuda-check is kept, so later runs are incremental.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).parents[2]
CHECK_DIR = ROOT / "build" / "cuda-check"


def nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found is None and os.access("/usr/local/cuda/bin/nvcc", os.X_OK):
        found = "/usr/local/cuda/bin/nvcc"
    return found


def cuda_major() -> str:
    out = subprocess.run([nvcc(), "--version"], capture_output=True, text=True).stdout
    match = re.search(r"release (\d+)\.", out)
    return match.group(1) if match else ""


def nccl_root() -> Path | None:
    candidates = []
    if os.environ.get("HVDL_NCCL_ROOT"):
        candidates.append(Path(os.environ["HVDL_NCCL_ROOT"]))
    try:
        import nvidia.nccl as pip_nccl

        candidates.append(Path(list(pip_nccl.__path__)[0]))
    except ImportError:
        pass
    candidates.append(ROOT / "build" / "nccl" / f"cu{cuda_major()}" / "nvidia" / "nccl")
    for c in candidates:
        if (c / "include" / "nccl.h").is_file() and list((c / "lib").glob("libnccl.so*")):
            return c
    return None


def configure(build_dir: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = ["cmake", "-S", str(ROOT), "-B", str(build_dir),
           f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
           f"-DPython_EXECUTABLE={sys.executable}", *args]
    if shutil.which("ninja"):
        cmd += ["-G", "Ninja"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def status_line(output: str) -> str:
    lines = [ln for ln in output.splitlines() if "horovodlite: CUDA" in ln]
    assert lines, output
    return lines[0]


@pytest.mark.skipif(torch.version.cuda is not None, reason="torch has CUDA here")
def test_cuda_on_with_a_cpu_torch_is_a_clear_configure_error(tmp_path):
    proc = configure(tmp_path, "-DHVDL_WITH_CUDA=ON")
    out = " ".join((proc.stdout + proc.stderr).split())  # CMake wraps error messages
    assert proc.returncode != 0
    assert "HVDL_WITH_CUDA=ON" in out
    assert f"torch {torch.__version__} was built without CUDA (torch.version.cuda is None)" in out
    assert "-DHVDL_WITH_CUDA=OFF" in out  # the way out


@pytest.mark.skipif(torch.version.cuda is not None, reason="torch has CUDA here")
def test_default_configure_names_what_it_found_and_what_not(tmp_path):
    proc = configure(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = status_line(proc.stdout)
    assert "CUDA OFF (HVDL_WITH_CUDA=AUTO)" in line and "NCCL OFF" in line
    found, missing = line.split("Not found:")
    assert "built without CUDA" in missing and "NCCL not searched (needs CUDA)" in missing
    if nvcc():
        assert "nvcc" in found
    else:
        assert "nvcc" in missing


@pytest.mark.skipif(nvcc() is None, reason="nvcc not found: the CUDA compile check needs it")
def test_every_cuda_and_nccl_source_compiles_and_links(tmp_path):
    root = nccl_root()
    if root is None:
        pytest.skip("NCCL headers not found: run `bash scripts/install.sh --test` (fetches the "
                    "nvidia-nccl-cu wheel), pip install nvidia-nccl-cu13, or set HVDL_NCCL_ROOT")
    arch = os.environ.get("HVDL_CHECK_CUDA_ARCHITECTURES", "80")
    proc = configure(CHECK_DIR, "-DHVDL_CUDA_COMPILE_CHECK=ON", f"-DHVDL_NCCL_ROOT={root}",
                     f"-DCMAKE_CUDA_ARCHITECTURES={arch}", "-DCMAKE_BUILD_TYPE=")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = status_line(proc.stdout)
    assert "CUDA ON" in line and "NCCL ON" in line and "compile check" in line
    jobs = str(max(2, os.cpu_count() or 2))
    build = subprocess.run(["cmake", "--build", str(CHECK_DIR), "-j", jobs], capture_output=True,
                           text=True, timeout=600)
    assert build.returncode == 0, build.stdout[-6000:] + build.stderr[-4000:]

    # Every CUDA/NCCL source of the project went through a compiler.
    compiled = {Path(c["file"]).resolve()
                for c in json.loads((CHECK_DIR / "compile_commands.json").read_text())}
    sources = [p for pattern in ("csrc/backends/cuda/*.cu", "csrc/backends/cuda/*.cc",
                                 "csrc/backends/cuda/check/*.cc", "csrc/backends/nccl/*.cc",
                                 "csrc/torch/cuda/*.cc") for p in ROOT.glob(pattern)]
    assert any(p.suffix == ".cu" for p in sources)
    missing = [str(p.relative_to(ROOT)) for p in sources if p.resolve() not in compiled]
    assert not missing, f"not compiled: {missing}"

    # The program links against the CUDA runtime and NCCL, and loads them.
    exe = CHECK_DIR / "hvdl_cuda_check"
    needed = subprocess.run(["readelf", "-d", str(exe)], capture_output=True, text=True).stdout
    assert re.search(r"NEEDED.*\[libcudart\.so\.\d+\]", needed), needed
    assert "[libnccl.so.2]" in needed, needed
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    version = re.search(r"#define NCCL_VERSION_CODE (\d+)",
                        (root / "include" / "nccl.h").read_text()).group(1)
    assert f"NCCL headers {version}, NCCL library" in run.stdout
    assert ("link check only" in run.stdout or
            "batched ScaleCopy kernel vs CPU reference: ok" in run.stdout), run.stdout
