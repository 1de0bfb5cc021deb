"""cmake/HvdlTorch.cmake: which torch the build links, against stand-in torch folders.

torch's own CMake config stops with a fatal error when torch was built with CUDA and no whole
CUDA toolkit is found - PyPI's torch on a machine without one. The build then links torch's CPU
libraries itself; with a CPU torch, or a CUDA torch and a toolkit, torch's config is used.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which("cmake") is None, reason="no cmake")

CONFIG = """\
set(HVDL_TEST_CONFIG_USED ON)
# What torch's config says of its ABI: -D_GLIBCXX_USE_CXX11_ABI=0 in older wheels.
set(TORCH_CXX_FLAGS "-D_GLIBCXX_USE_CXX11_ABI=0")
set(TORCH_INSTALL_PREFIX "${CMAKE_CURRENT_LIST_DIR}/../../..")
set(TORCH_LIBRARIES torch)
set(Torch_FOUND TRUE)
"""


def _torch(tmp_path: Path, cuda: str | None) -> Path:
    prefix = tmp_path / "site-packages" / "torch"
    (prefix / "share/cmake/Torch").mkdir(parents=True)
    (prefix / "share/cmake/Torch/TorchConfig.cmake").write_text(CONFIG)
    (prefix / "version.py").write_text(
        "__version__ = '2.13.0'\n" + (f"cuda: Optional[str] = '{cuda}'\n" if cuda else
                                      "cuda: Optional[str] = None\n"))
    (prefix / "lib").mkdir()
    for lib in ("libtorch.so", "libtorch_cpu.so", "libc10.so", "libtorch_cuda.so"):
        (prefix / "lib" / lib).write_bytes(b"")
    return prefix


def _configure(tmp_path: Path, prefix: Path, *options: str) -> dict:
    project = tmp_path / "project"
    project.mkdir()
    (project / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.19)\nproject(t LANGUAGES CXX)\n"
        f'include("{ROOT}/cmake/HvdlTorch.cmake")\n'
        'message(STATUS "RESULT cpu=${HVDL_TORCH_CPU_IMPORT} config=${HVDL_TEST_CONFIG_USED} '
        'prefix=${TORCH_INSTALL_PREFIX} flags=${TORCH_CXX_FLAGS} libs=${TORCH_LIBRARIES}")\n')
    proc = subprocess.run(
        ["cmake", "-S", str(project), "-B", str(tmp_path / "build"),
         f"-DCMAKE_PREFIX_PATH={prefix}/share/cmake", *options],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if "RESULT " in ln)
    result = dict(re.findall(r"(\w+)=(\S*)", line.split("RESULT ", 1)[1]))
    result["output"] = proc.stdout
    return result


def test_a_cuda_torch_without_a_cuda_toolkit_links_its_cpu_libraries(tmp_path):
    prefix = _torch(tmp_path, "13.0")
    got = _configure(tmp_path, prefix, "-DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON")
    assert got["cpu"] == "ON" and got["config"] == "", got["output"][-2000:]
    assert got["libs"].split(";") == [str(prefix / "lib/libtorch_cpu.so"),
                                      str(prefix / "lib/libc10.so")]
    assert got["flags"] == "-D_GLIBCXX_USE_CXX11_ABI=0"  # read from torch's config file
    assert Path(got["prefix"]) == prefix
    assert ("torch has CUDA 13.0, but no whole CUDA toolkit (nvcc, headers, cudart, NVRTC) was "
            "found: linking torch's CPU libraries only") in got["output"]


def test_a_cuda_torch_with_cuda_turned_off_needs_no_toolkit(tmp_path):
    got = _configure(tmp_path, _torch(tmp_path, "13.0"), "-DHVDL_WITH_CUDA=OFF")
    assert got["cpu"] == "ON" and got["config"] == "", got["output"][-2000:]
    assert "HVDL_WITH_CUDA=OFF: linking torch's CPU libraries only" in got["output"]


def test_a_cpu_torch_uses_torchs_own_config(tmp_path):
    got = _configure(tmp_path, _torch(tmp_path, None))
    assert got["cpu"] == "OFF" and got["config"] == "ON", got["output"][-2000:]
    assert got["libs"] == "torch"
