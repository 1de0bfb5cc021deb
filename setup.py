"""Builds horovodlite._C by driving CMake + Ninja (the CMakeExtension/CMakeBuild shape).

Install with ``pip install --no-build-isolation -e .`` (or without ``-e``): the build compiles
against the torch that is already installed, so no other torch is ever pulled into an isolated
build environment. Editable installs record their CMake build folder in
``horovodlite/_editable_build.json``; importing horovodlite then re-runs the (incremental) build,
so C++ edits take effect on the next import.

GPU support is decided by CMake (cmake/HvdlCuda.cmake): on when the installed torch has CUDA and
nvcc (and NCCL) are found. The environment can force it: HVDL_WITH_CUDA=0|1, HVDL_WITH_NCCL=0|1,
HVDL_NCCL_ROOT=<folder with include/nccl.h>, HVDL_CUDA_ARCHITECTURES="80;90".
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).parent.resolve()


class CMakeExtension(Extension):
    def __init__(self, name: str) -> None:
        super().__init__(name, sources=[])


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"horovodlite needs `{name}` to build; pip install cmake ninja")
    return found


def _switch(var: str) -> str:
    """AUTO, ON or OFF from the environment variable ``var`` (unset: AUTO)."""
    value = os.environ.get(var, "auto").strip().lower()
    if value in ("1", "on", "true", "yes"):
        return "ON"
    if value in ("0", "off", "false", "no"):
        return "OFF"
    if value in ("", "auto"):
        return "AUTO"
    raise RuntimeError(f"{var}={os.environ[var]!r}: expected 0, 1 or auto")


class CMakeBuild(build_ext):
    def build_extension(self, ext: Extension) -> None:
        try:
            import torch
        except ImportError as exc:  # pragma: no cover - build-time guidance
            raise RuntimeError(
                "horovodlite builds against the installed torch: install torch first and use "
                "`pip install --no-build-isolation`"
            ) from exc
        editable = bool(getattr(self, "editable_mode", False) or self.inplace)
        regular = Path(self.get_ext_fullpath(ext.name)).resolve()
        out_dir = ROOT / "horovodlite" if editable else regular.parent
        tag = f"{sys.implementation.cache_tag}-{'editable' if editable else 'wheel'}"
        build_dir = ROOT / "build" / f"cmake-{tag}"
        cmake = _tool("cmake")
        configure = [
            cmake, "-S", str(ROOT), "-B", str(build_dir), "-G", "Ninja",
            f"-DCMAKE_MAKE_PROGRAM={_tool('ninja')}",
            f"-DCMAKE_BUILD_TYPE={os.environ.get('HVDL_BUILD_TYPE', 'Release')}",
            f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={out_dir}",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
        ]
        for var in ("HVDL_WITH_CUDA", "HVDL_WITH_NCCL"):  # always passed: no stale cache value
            configure.append(f"-D{var}={_switch(var)}")
        for var in ("HVDL_NCCL_ROOT", "HVDL_CUDA_ARCHITECTURES"):
            if os.environ.get(var):
                configure.append(f"-D{var}={os.environ[var]}")
        extra = os.environ.get("HVDL_CMAKE_ARGS", "").split()
        subprocess.run(configure + extra, check=True)
        subprocess.run([cmake, "--build", str(build_dir)], check=True)
        built = out_dir / regular.name
        marker = ROOT / "horovodlite" / "_editable_build.json"
        if editable:
            marker.write_text(json.dumps({"cmake": cmake, "build_dir": str(build_dir)}))
            if built != regular:  # setuptools copies regular -> in-tree afterwards
                regular.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(built, regular)
        elif marker.exists():
            marker.unlink()


setup(ext_modules=[CMakeExtension("horovodlite._C")], cmdclass={"build_ext": CMakeBuild})
