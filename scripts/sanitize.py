"""The sanitizer build of horovodlite, next to the normal one and never touching it.

    python scripts/sanitize.py build [--sanitize address,undefined]
    python scripts/sanitize.py run [--sanitize ...] -- python -m pytest tests/test_failures.py -q

`build` configures CMake with HVDL_SANITIZE (CMakeLists.txt) in build/sanitize-<kinds>/cmake and
puts the modules into a copy of the Python package, build/sanitize-<kinds>/pkg/horovodlite, with
an editable marker of its own: importing that copy rebuilds incrementally in the sanitizer build
folder, and tests/unit/cpp_testing.py builds `_testing` there too. `run` builds, then runs the
command with that copy first on PYTHONPATH and the sanitizer runtime preloaded (see `environment`),
so every process the command starts - the ranks of a job, a launcher's workers - loads the
sanitized module. The normal build folder, the in-tree module and its marker stay as they were.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = "address,undefined"


def folder(sanitize: str) -> Path:
    """build/sanitize-<kinds>, or under $HVDL_SANITIZE_ROOT (a folder outside the checkout)."""
    base = Path(os.environ.get("HVDL_SANITIZE_ROOT") or ROOT / "build")
    return base / f"sanitize-{sanitize.replace(',', '-')}"


def _normal_cache() -> dict[str, str]:
    """The normal editable build's cache entries we reuse (its MPI), when there is one."""
    out: dict[str, str] = {}
    for cache in (ROOT / "build").glob("cmake-*-editable/CMakeCache.txt"):
        for line in cache.read_text().splitlines():
            name, _, value = line.partition("=")
            if name.split(":")[0] in ("MPI_C_COMPILER", "HVDL_WITH_MPI"):
                out[name.split(":")[0]] = value
    return out


def _copy_package(pkg: Path) -> None:
    """The Python sources of horovodlite (not its modules or marker) into `pkg`/horovodlite."""
    ignore = shutil.ignore_patterns("*.so", "_editable_build.json", "__pycache__")
    shutil.copytree(ROOT / "horovodlite", pkg / "horovodlite", ignore=ignore, dirs_exist_ok=True)


def build(sanitize: str = DEFAULT, unity: bool | None = None) -> Path:
    """Configures (once) and builds the sanitized modules; returns the package copy's folder.
    ``unity``: a unity build (CMakeLists.txt's HVDL_UNITY_BUILD; default: HVDL_UNITY_BUILD=1
    in the environment), taken at the first configure."""
    import torch.utils

    if unity is None:
        unity = os.environ.get("HVDL_UNITY_BUILD") == "1"
    base = folder(sanitize)
    cmake_dir, pkg = base / "cmake", base / "pkg"
    _copy_package(pkg)
    cmake = shutil.which("cmake") or "cmake"
    cache = _normal_cache()
    configure = [
        cmake, "-S", str(ROOT), "-B", str(cmake_dir), "-G", "Ninja",
        f"-DCMAKE_MAKE_PROGRAM={shutil.which('ninja') or 'ninja'}",
        "-DCMAKE_BUILD_TYPE=Release",
        # -O1, as the sanitizers' own documentation advises: the torch-facing files compile in
        # about half the time of -O3 under ASan+UBSan (42 s against 82 s for the bindings on
        # 2 cores), and the lane's jobs wait on the network more than they compute.
        "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG",
        f"-DHVDL_SANITIZE={sanitize}",
        f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={pkg / 'horovodlite'}",
        f"-DPython_EXECUTABLE={sys.executable}",
        f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
        "-DHVDL_RELOCATABLE=OFF", "-DHVDL_WITH_CUDA=OFF", "-DHVDL_WITH_NCCL=OFF",
        f"-DHVDL_UNITY_BUILD={'ON' if unity else 'OFF'}",
    ]
    if cache.get("MPI_C_COMPILER"):
        configure.append(f"-DMPI_C_COMPILER={cache['MPI_C_COMPILER']}")
    configure.append(f"-DHVDL_WITH_MPI={cache.get('HVDL_WITH_MPI', 'AUTO')}")
    if not (cmake_dir / "CMakeCache.txt").exists():
        subprocess.run(configure, check=True, stdout=subprocess.DEVNULL)
    subprocess.run([cmake, "--build", str(cmake_dir)], check=True)
    subprocess.run([cmake, "--build", str(cmake_dir), "--target", "_testing"], check=True)
    if "thread" in sanitize.split(","):
        cmake = str(_cmake_without_preload(base, cmake))
    marker = pkg / "horovodlite" / "_editable_build.json"
    marker.write_text(json.dumps({"cmake": cmake, "build_dir": str(cmake_dir),
                                  "package_dir": str(marker.parent)}))
    return pkg


def _cmake_without_preload(base: Path, cmake: str) -> Path:
    """ThreadSanitizer only: the cmake that the marker names (the import-time rebuild,
    tests/unit/cpp_testing.py's build of _testing), a wrapper that drops LD_PRELOAD first.

    cmake run with libtsan preloaded never returns: ninja runs its rules through /bin/sh, which
    crashes at start with the runtime preloaded (dash and bash both: a call through a null
    pointer from main), and cmake, waiting for ninja in select() (not intercepted), never gets
    the SIGCHLD that TSan's wrapped handler defers until the next intercepted call, nor the
    SIGTERM of a timeout. Every `cmake --build` here runs a rule (the CONFIGURE_DEPENDS globs'
    check), so a test module that imported the package hung silently in its collection. The
    wrapper is Python (a shell script would crash the same way), which starts fine under TSan.
    """
    wrapper = base / "cmake-without-preload"
    wrapper.write_text(
        f"#!{sys.executable}\n"
        "import os, sys\n"
        "env = {k: v for k, v in os.environ.items() if k != 'LD_PRELOAD'}\n"
        f"os.execve({cmake!r}, [{cmake!r}, *sys.argv[1:]], env)\n")
    wrapper.chmod(0o755)
    return wrapper


def _runtime(name: str) -> str:
    out = subprocess.run(["c++", f"-print-file-name={name}"], capture_output=True, text=True)
    return out.stdout.strip()


def environment(sanitize: str = DEFAULT, base: dict | None = None) -> dict[str, str]:
    """The environment that runs Python on the sanitized package.

    The interpreter is not sanitized, so the runtime must be the first library loaded
    (LD_PRELOAD; ASan refuses to start otherwise). detect_leaks=0: CPython and torch keep
    interned objects, arenas and registries alive until exit by design, so LeakSanitizer's
    exit-time report would be all theirs (thousands of blocks) and hide nothing of ours that
    the address checks do not already cover. Every other finding aborts the process
    (halt_on_error, -fno-sanitize-recover), so a test that hits one fails.
    """
    env = dict(os.environ if base is None else base)
    pkg = folder(sanitize) / "pkg"
    kinds = sanitize.split(",")
    preload = []
    if "address" in kinds:
        preload.append(_runtime("libasan.so"))
    if "thread" in kinds:
        preload.append(_runtime("libtsan.so"))
    if "undefined" in kinds:
        preload.append(_runtime("libubsan.so"))
    env["LD_PRELOAD"] = " ".join(p for p in preload + [env.get("LD_PRELOAD", "")] if p)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(pkg), str(ROOT / "tests"),
                                                    env.get("PYTHONPATH", "")) if p)
    env["ASAN_OPTIONS"] = ("detect_leaks=0:halt_on_error=1:abort_on_error=1:"
                           "detect_stack_use_after_return=0:allocator_may_return_null=1")
    env["UBSAN_OPTIONS"] = "print_stacktrace=1:halt_on_error=1"
    if "thread" in kinds:
        # The PyPI Open MPI that _C links loads UCX, whose libucm patches madvise(): glibc calls
        # it on a thread's stack as the thread exits, after TSan tore down the thread's state,
        # and TSan's pthread_rwlock_rdlock interceptor in libucm's hook segfaults, so the first
        # thread to end killed the process. No memory hooks: UCX is not used by these tests.
        env["UCX_MEM_MMAP_HOOK_MODE"] = "none"
        env["UCX_MEM_MALLOC_HOOKS"] = "no"
    env["HVDL_SANITIZED"] = sanitize
    return env


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("build", "run"))
    parser.add_argument("--sanitize", default=DEFAULT)
    parser.add_argument("command", nargs="*", help="run: the command, after --")
    # the command is everything after "--": options before it are ours wherever they stand
    # (argparse.REMAINDER took `build --sanitize thread`'s option for a command, silently
    # building the default)
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    command = args.command + argv[split + 1:]
    if args.what == "build" and command:
        parser.error(f"build takes no command: {' '.join(command)}")
    build(args.sanitize)
    if args.what == "build":
        print(folder(args.sanitize) / "pkg")
        return 0
    if (ROOT / "horovodlite").is_dir() and Path.cwd().resolve() == ROOT:
        # `python -m ...` and `python -c` put the working folder first on sys.path, before
        # PYTHONPATH: from the checkout that is the source tree's (unsanitized) package, whose
        # import also rebuilds the normal build folder.
        print("sanitize.py: run from tests/ (cd tests): from the checkout's root, `python -m` "
              "imports the source tree's unsanitized horovodlite", file=sys.stderr)
    return subprocess.run(command, env=environment(args.sanitize)).returncode


if __name__ == "__main__":
    sys.exit(main())
