"""The build refuses to make a module that carries its own libstdc++ (cmake/HvdlLibstdcxx.cmake).

A module linked with the static libstdc++ imports fine and crashed at its first collective on a
machine whose CXX was such a wrapper (docs/troubleshooting.md). Here, on the small project in
tests/unit/libstdcxx (the guard, and one module that formats a long through std::ostream, built
in about two seconds), with wrapper compilers made like that machine's:

* ``static``: ``g++ "$@" -static-libstdc++``;
* ``bdir``: ``g++ -B<folder holding only libstdc++.a> "$@"`` (the wrapper's own search path);
* ``nofix``: ``-static-libstdc++`` and no libstdc++.so to be found by name, which the guard
  cannot repair.

Each must give a module that defines none of libstdc++'s symbols and works, or stop at configure
time with the message naming the compiler variable, what it does and the fix. The same for
nvcc's host compiler (CUDAHOSTCXX) where nvcc exists. The post-link check of the real module
(the same file run as a script) is tried on a module linked statically behind the probe's back.
The whole project built with such a compiler: tests/test_libstdcxx_build.py (minutes).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROJECT = ROOT / "tests" / "unit" / "libstdcxx"
GUARD = ROOT / "cmake" / "HvdlLibstdcxx.cmake"
MARKER = "_ZNSo9_M_insertIlEERSoT_"  # std::ostream::_M_insert<long>, where the crash was

pytestmark = pytest.mark.skipif(
    not (shutil.which("g++") and shutil.which("cmake") and shutil.which("ninja")
         and shutil.which("nm")),
    reason="needs g++, cmake, ninja and nm")


def gxx() -> str:
    return shutil.which("g++")


def nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found is None and os.access("/usr/local/cuda/bin/nvcc", os.X_OK):
        found = "/usr/local/cuda/bin/nvcc"
    return found


def write_wrapper(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


@pytest.fixture(scope="module")
def wrappers(tmp_path_factory) -> dict:
    """The wrapper compilers, by name (plus ``plain``: g++ itself)."""
    folder = tmp_path_factory.mktemp("wrappers")
    archive = subprocess.run([gxx(), "-print-file-name=libstdc++.a"], capture_output=True,
                             text=True, check=True).stdout.strip()
    if not os.path.isabs(archive):
        pytest.skip("g++ has no libstdc++.a to link statically")
    only_archive = folder / "only-archive"
    only_archive.mkdir()
    shutil.copy(archive, only_archive / "libstdc++.a")
    return {
        "plain": gxx(),
        "static": write_wrapper(folder / "static-g++", f'exec {gxx()} "$@" -static-libstdc++\n'),
        "bdir": write_wrapper(folder / "bdir-g++", f'exec {gxx()} -B{only_archive}/ "$@"\n'),
        "nofix": write_wrapper(
            folder / "nofix-g++",
            "case \"$*\" in *-print-file-name=*) echo libstdc++.so; exit 0 ;; esac\n"
            f'exec {gxx()} "$@" -static-libstdc++\n'),
    }


def configure(build: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["cmake", "-S", str(PROJECT), "-B", str(build), "-G", "Ninja", *args],
                          capture_output=True, text=True, timeout=300)


def defined(library: Path) -> str:
    return subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True,
                          text=True, check=True).stdout


def needed(library: Path) -> str:
    return subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True,
                          check=True).stdout


def check_module(build: Path) -> None:
    """The module built in ``build`` uses the process's libstdc++ and formats a long."""
    proc = subprocess.run(["cmake", "--build", str(build)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    module = build / "guarded.so"
    assert MARKER not in defined(module)
    assert "libstdc++.so.6" in needed(module)
    out = ctypes.create_string_buffer(32)
    fmt = ctypes.CDLL(str(module)).guarded_format
    fmt.argtypes = [ctypes.c_long, ctypes.c_char_p, ctypes.c_int]
    assert fmt(-1234567890123, out, 32) == 16
    assert out.value == b"[-1234567890123]"


def assert_refused(proc: subprocess.CompletedProcess, variable: str, compiler: str) -> None:
    text = " ".join((proc.stdout + proc.stderr).split())  # CMake wraps its messages
    assert proc.returncode != 0, text
    assert f"{variable}={compiler} links libstdc++ statically" in text, text
    assert "CXX=/usr/bin/g++" in text and "docs/troubleshooting.md" in text, text


def test_the_distribution_compiler_needs_no_repair(tmp_path, wrappers):
    proc = configure(tmp_path, f"-DCMAKE_CXX_COMPILER={wrappers['plain']}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "statically" not in proc.stdout
    check_module(tmp_path)


@pytest.mark.parametrize("kind", ["static", "bdir"])
def test_a_static_libstdcxx_compiler_is_repaired(tmp_path, wrappers, kind):
    # What the wrapper alone makes: a library carrying libstdc++ (the premise of the test).
    probe = tmp_path / "alone.so"
    (tmp_path / "alone.cc").write_text(
        "#include <sstream>\nstd::string f(long v) { std::ostringstream s; s << v; "
        "return s.str(); }\n")
    subprocess.run([wrappers[kind], "-shared", "-fPIC", str(tmp_path / "alone.cc"), "-o",
                    str(probe)], check=True, capture_output=True)
    assert MARKER in defined(probe)

    build = tmp_path / "build"
    proc = configure(build, f"-DCMAKE_CXX_COMPILER={wrappers[kind]}")
    if proc.returncode != 0:  # refusing is allowed too, with the message
        assert_refused(proc, "CXX", wrappers[kind])
        return
    text = " ".join(proc.stdout.split())
    assert f"CXX={wrappers[kind]} links libstdc++ statically" in text
    assert "explicitly" in text
    check_module(build)


def test_an_unrepairable_compiler_stops_the_configure(tmp_path, wrappers):
    proc = configure(tmp_path, f"-DCMAKE_CXX_COMPILER={wrappers['nofix']}")
    assert_refused(proc, "CXX", wrappers["nofix"])
    assert not (tmp_path / "build.ninja").exists()


def test_static_link_flags_are_seen_too(tmp_path, wrappers):
    """LDFLAGS=-static-libstdc++ with the plain compiler reaches the probe as well."""
    proc = subprocess.run(["cmake", "-S", str(PROJECT), "-B", str(tmp_path), "-G", "Ninja",
                           f"-DCMAKE_CXX_COMPILER={wrappers['plain']}"], capture_output=True,
                          text=True, timeout=300,
                          env={**os.environ, "LDFLAGS": "-static-libstdc++"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "links libstdc++ statically" in " ".join(proc.stdout.split())
    check_module(tmp_path)


def test_the_post_link_check_deletes_a_module_carrying_libstdcxx(tmp_path, wrappers):
    # Link options the probe never sees: only the check after linking can catch them.
    proc = configure(tmp_path, f"-DCMAKE_CXX_COMPILER={wrappers['plain']}",
                     "-DHVDL_TEST_LINK_OPTIONS=-static-libstdc++")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for _ in range(2):  # and again: nothing is left behind that a rebuild would take as done
        built = subprocess.run(["cmake", "--build", str(tmp_path)], capture_output=True,
                               text=True, timeout=300)
        text = " ".join((built.stdout + built.stderr).split())
        assert built.returncode != 0, text
        assert "defines libstdc++'s own symbols" in text and MARKER in text, text
        assert "deleted it" in text and "CXX=/usr/bin/g++" in text, text
        assert not (tmp_path / "guarded.so").exists()


def test_the_check_script_passes_a_clean_module(tmp_path, wrappers):
    assert configure(tmp_path, f"-DCMAKE_CXX_COMPILER={wrappers['plain']}").returncode == 0
    check_module(tmp_path)
    proc = subprocess.run(["cmake", f"-DHVDL_MODULE={tmp_path / 'guarded.so'}", "-P",
                           str(GUARD)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "guarded.so").exists()


@pytest.mark.skipif(nvcc() is None, reason="needs nvcc")
@pytest.mark.parametrize("kind", ["plain", "static", "nofix"])
def test_nvcc_host_compiler(tmp_path, wrappers, kind):
    proc = configure(tmp_path, f"-DCMAKE_CXX_COMPILER={wrappers['plain']}", "-DHVDL_TEST_CUDA=ON",
                     f"-DCMAKE_CUDA_COMPILER={nvcc()}",
                     f"-DCMAKE_CUDA_HOST_COMPILER={wrappers[kind]}")
    text = " ".join((proc.stdout + proc.stderr).split())
    if kind == "nofix":
        assert_refused(proc, "CUDAHOSTCXX", wrappers[kind])
        return
    assert proc.returncode == 0, text
    repaired = f"CUDAHOSTCXX={wrappers[kind]} links libstdc++ statically" in text
    assert repaired == (kind == "static"), text
    libraries = text.split("CUDA standard libraries:", 1)[1]
    assert ("libstdc++.so" in libraries.split(" -- ", 1)[0]) == repaired, text
