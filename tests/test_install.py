"""Installs as users make them, against every MPI this machine has (whole builds: slow).

- One copy of the source tree is built against each MPI in turn - the suite's own MPI, Debian's
  Open MPI 4 and MPICH, PyPI's MPICH (scripts/install_test_mpis.sh installs them) - the way a
  user switches MPI: each build after the first must notice the change and reconfigure. After
  each build, a 2-rank allreduce runs under horovodliterun, which must pick that MPI's own
  launcher, and every rank checks the MPI library it loaded; another MPI's launcher must fail at
  import with the error naming both.
- An sdist built from the tree installs with plain `pip install` into a fresh venv that has
  torch and PyPI's Open MPI, its extension's RUNPATH names no path of any build environment, and
  the allreduce runs from another folder.
- A plain `pip install` without any MPI on PATH (the Gloo controller only) trains under
  torchrun; it installs from the checkout built in place above, so it also shows that a
  non-editable install from an editable checkout leaves the checkout's rebuild-on-import alone.

Outside CI an MPI that is not installed is skipped with the reason; under CI (CI=true) it fails.

These builds test how horovodlite installs, not how fast it runs: they compile without
optimisation (HVDL_BUILD_TYPE=None, passed through pip to setup.py), which takes about half the
time of the default Release build, and in batches (HVDL_UNITY_BUILD=1: CMake's unity build, 40%
of the CPU time again). The checkout's own build, which the rest of the suite uses, is a Release
build of one file at a time, as a user's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from horovodlite import _mpi_check

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("CMakeLists.txt", "MANIFEST.in", "README.md", "pyproject.toml", "setup.py", "cmake",
           "csrc", "horovodlite")
ALLREDUCE = (
    "import os, horovodlite, horovodlite.torch as hvd, torch\n"
    "from horovodlite import _mpi_check\n"
    "from horovodlite._extension import load\n"
    "hvd.init()\n"
    "out = hvd.allreduce(torch.full((5,), float(hvd.rank() + 1)), op=hvd.Sum, name='x')\n"
    "assert torch.equal(out, torch.full((5,), float(sum(range(1, hvd.size() + 1))))), out\n"
    "# A file per rank: mpirun may interleave the ranks' stdout mid-line.\n"
    "with open(f'result.{hvd.rank()}', 'w') as f:\n"
    "    print('RESULT', hvd.rank(), hvd.size(), horovodlite.__file__,\n"
    "          os.path.realpath(_mpi_check.loaded_library_path()),\n"
    "          load().mpi_library_version().splitlines()[0].split(',')[0], file=f)\n"
)


def _results(folder):
    files = sorted(folder.glob("result.*"))
    return [f.read_text().split() for f in files]


@dataclass
class Mpi:
    name: str
    mpicc: str
    mpirun: str


def _mpis() -> list[Mpi]:
    """The suite's own MPI first, then each other one this machine has (installed or not)."""
    own = _mpi_check.read_record()
    own_cc = own["compiler"] if own else str(Path(sys.prefix) / "bin/mpicc")
    own_run = (own and _mpi_check.matching_launcher(own)) or shutil.which("mpirun") or ""
    others = [
        Mpi("debian-openmpi", "/usr/bin/mpicc.openmpi", "/usr/bin/mpirun.openmpi"),
        Mpi("pypi-mpich", str(ROOT / "build/mpi/pypi-mpich/bin/mpicc"),
            str(ROOT / "build/mpi/pypi-mpich/bin/mpirun")),
        Mpi("debian-mpich", "/usr/bin/mpicc.mpich", "/usr/bin/mpirun.mpich"),
    ]
    return [Mpi("own", own_cc, own_run)] + [m for m in others if m.mpicc != own_cc]


MPIS = _mpis()


def _require(path: str, what: str) -> None:
    if os.access(path, os.X_OK):
        return
    message = f"{what} is not installed ({path}); scripts/install_test_mpis.sh installs it"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def _run(cmd, timeout=900, **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, **kwargs)
    proc.output = proc.stdout + proc.stderr
    return proc


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_COMM_WORLD", "PMI_", "PMIX_", "HVDL_MPICC"))
           and k != "HOROVODLITE_NO_REBUILD"}  # the copies' checkout rebuilds on import
    env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                "OMP_NUM_THREADS": "1", "HVDL_BUILD_TYPE": "None", "HVDL_UNITY_BUILD": "1"})
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """A copy of the sources, built by these tests without touching the checkout's build."""
    dest = tmp_path_factory.mktemp("install") / "horovodlite-src"
    ignore = shutil.ignore_patterns("*.so", "__pycache__", "_editable_build.json",
                                    "_mpi_build.json")
    for name in SOURCES:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=ignore)
        else:
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def _build_inplace(tree: Path, mpicc: str) -> subprocess.CompletedProcess:
    proc = _run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=tree,
                env=_env(HVDL_MPICC=mpicc))
    assert proc.returncode == 0, proc.output[-6000:]
    return proc


@pytest.mark.parametrize("mpi", MPIS, ids=[m.name for m in MPIS])
def test_builds_and_runs_on_each_mpi(mpi, tree, tmp_path):
    _require(mpi.mpicc, f"MPI {mpi.name}")
    _require(mpi.mpirun, f"the launcher of {mpi.name}")
    first = not (tree / "horovodlite/_mpi_build.json").exists()
    build = _build_inplace(tree, mpi.mpicc)
    record = _mpi_check.read_record(tree / "horovodlite/_mpi_build.json")
    assert record["compiler"] == mpi.mpicc, record
    if not first:  # the tree was built against another MPI just before
        assert "the MPI changed since the last build" in build.output, build.output[-3000:]

    job = _run([sys.executable, "-m", "horovodlite.runner.launch", "-np", "2", "--verbose",
                sys.executable, "-c", ALLREDUCE], timeout=300, cwd=tmp_path,
               env=_env(PYTHONPATH=str(tree)))
    assert job.returncode == 0, job.output[-6000:]
    # --verbose prints what of the environment stays behind, then the mpirun command line.
    assert any(line.startswith(f"horovodliterun: {mpi.mpirun} ")
               for line in job.output.splitlines()), job.output[:1500]
    results = _results(tmp_path)
    assert sorted(r[1] for r in results) == ["0", "1"] and {r[2] for r in results} == {"2"}
    built_dir = os.path.dirname(os.path.realpath(record["libraries"][0]))
    for _, rank, _, module, loaded, *version in results:
        assert module.startswith(str(tree)), module
        assert os.path.dirname(loaded) == built_dir, \
            f"rank {rank} loaded {loaded}, built against {record['libraries']}"
        assert _mpi_check.built_mpi(record).compatible(
            _mpi_check.parse_library_version(" ".join(version)))

    # Another MPI's launcher: every rank fails at import, naming both MPIs.
    foreign = [m for m in MPIS if os.access(m.mpirun, os.X_OK)
               and not _mpi_check.built_mpi(record).compatible(
                   _mpi_check.parse_launcher_version(_run([m.mpirun, "--version"]).output)
                   or _mpi_check.built_mpi(record))]
    if foreign:
        wrong = _run([foreign[0].mpirun, "-np", "2", sys.executable, "-c",
                      "import horovodlite.torch"], timeout=120, cwd=tmp_path,
                     env=_env(PYTHONPATH=str(tree)))
        assert wrong.returncode != 0
        assert f"horovodlite was built against {_mpi_check.describe_build(record)}" in \
            wrong.output, wrong.output[-3000:]
        assert "but this process was started by" in wrong.output


def test_sdist_installs_with_plain_pip_into_a_fresh_venv(tree, tmp_path):
    dist = tmp_path / "dist"
    proc = _run([sys.executable, "-m", "build", "--sdist", "--no-isolation",
                 "--skip-dependency-check", "--outdir", str(dist), str(tree)], env=_env(),
                cwd=tmp_path)  # not the checkout: its build/ folder would shadow `build`
    assert proc.returncode == 0, proc.output[-4000:]
    (sdist,) = dist.glob("horovodlite-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {"CMakeLists.txt", "cmake/HvdlMpiRecord.cmake", "csrc/core/context.cc",
            "setup.py"} <= names
    assert not any(n.endswith((".so", "_editable_build.json", "_mpi_build.json")) for n in names)

    venv = tmp_path / "venv"
    assert _run([sys.executable, "-m", "venv", str(venv)]).returncode == 0
    vbin = venv / "bin"
    env = _env(PATH=f"{vbin}:{os.environ['PATH']}", VIRTUAL_ENV=str(venv))
    env.pop("PYTHONPATH", None)
    pip = [str(vbin / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    proc = _run(pip + ["torch==2.13.0", "openmpi"], env=env)
    assert proc.returncode == 0, proc.output[-4000:]
    proc = _run(pip + [str(sdist)], env=env)  # build isolation on, as a plain pip user has it
    assert proc.returncode == 0, proc.output[-6000:]

    package = Path(_run([str(vbin / "python"), "-c", "import horovodlite, os; print(os.path."
                         "dirname(horovodlite.__file__))"], env=env, cwd=tmp_path).stdout.strip())
    assert package.is_relative_to(venv), package
    assert not (package / "_editable_build.json").exists()
    assert (package / "_mpi_build.json").exists()  # the MPI it was built against, for import
    (module,) = package.glob("_C*.so")
    runpath = _runpath(module)
    assert "$ORIGIN/../torch/lib" in runpath, runpath
    assert "$ORIGIN/../../.." in runpath, runpath  # the venv's lib/, where PyPI's libmpi lives
    for entry in runpath:
        assert not entry.startswith(("/tmp", str(venv), str(tree), sys.prefix)), runpath

    job = _run([str(vbin / "horovodliterun"), "-np", "2", str(vbin / "python"), "-c", ALLREDUCE],
               timeout=300, cwd=tmp_path, env=env)
    assert job.returncode == 0, job.output[-6000:]
    assert sorted(r[1] for r in _results(tmp_path)) == ["0", "1"], job.output


def _runpath(module: Path) -> list[str]:
    dynamic = _run(["readelf", "-d", str(module)]).stdout
    for line in dynamic.splitlines():
        if "RUNPATH" in line or "RPATH" in line:
            return line.split("[", 1)[1].rstrip("]").split(":")
    return []


GLOO_ALLREDUCE = (
    "import os, horovodlite.torch as hvd, torch\n"
    "hvd.init()\n"
    "assert hvd.gloo_enabled() and not hvd.mpi_built(), (hvd.gloo_enabled(), hvd.mpi_built())\n"
    "out = hvd.allreduce(torch.full((5,), float(hvd.rank() + 1)), op=hvd.Sum, name='x')\n"
    "assert torch.equal(out, torch.full((5,), float(sum(range(1, hvd.size() + 1))))), out\n"
    "with open(f'result.{hvd.rank()}', 'w') as f:\n"
    "    print('RESULT', hvd.rank(), hvd.size(), file=f)\n"
)


def _path_without_mpi(tmp_path: Path) -> list:
    """PATH with every MPI program hidden: folders that hold one are replaced by a folder of
    links to everything else in them (the compilers live beside Debian's mpicc in /usr/bin)."""
    out = []
    for i, folder in enumerate(p for p in os.environ["PATH"].split(":") if p):
        if not Path(folder, "mpicc").exists() and not Path(folder, "mpirun").exists():
            out.append(folder)
            continue
        shadow = tmp_path / f"path{i}"
        shadow.mkdir()
        for entry in Path(folder).iterdir():
            if not entry.name.startswith(("mpi", "ompi", "orte", "prte", "hydra")):
                (shadow / entry.name).symlink_to(entry)
        out.append(str(shadow))
    return out


def test_a_fresh_venv_without_mpi_installs_and_trains(tree, tmp_path):
    """No MPI on PATH (no mpicc, no mpirun): plain `pip install` builds the Gloo controller
    only, and torchrun starts a 2-rank job that trains together. The install is from the
    checkout that the tests above built in place (as `pip install -e` does), so it is also the
    regular install from an editable checkout: that leaves the checkout's own build and its
    rebuild-on-import alone."""
    if not (tree / "horovodlite/_editable_build.json").exists():
        _build_inplace(tree, MPIS[0].mpicc)
    venv = tmp_path / "venv"
    assert _run([sys.executable, "-m", "venv", str(venv)]).returncode == 0
    vbin = venv / "bin"
    path = [str(vbin)] + _path_without_mpi(tmp_path)
    env = _env(PATH=":".join(path), VIRTUAL_ENV=str(venv))
    env.pop("HVDL_MPI", None)
    env.pop("PYTHONPATH", None)
    pip = [str(vbin / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    proc = _run(pip + ["torch==2.13.0"], env=env)
    assert proc.returncode == 0, proc.output[-4000:]
    proc = _run(pip + [str(tree)], env=env)
    assert proc.returncode == 0, proc.output[-6000:]
    package = Path(_run([str(vbin / "python"), "-c", "import horovodlite, os; print(os.path."
                         "dirname(horovodlite.__file__))"], env=env, cwd=tmp_path).stdout.strip())
    (module,) = package.glob("_C*.so")
    assert "libmpi" not in _run(["ldd", str(module)]).stdout
    assert not (package / "_editable_build.json").exists()
    assert (tree / "horovodlite/_editable_build.json").exists()
    # The checkout still rebuilds its extension on import after a C++ change.
    (checkout_module,) = (tree / "horovodlite").glob("_C*.so")
    before = checkout_module.stat().st_mtime_ns
    (tree / "csrc/core/fusion.cc").touch()
    proc = _run([sys.executable, "-c", "import horovodlite.torch"], cwd=tmp_path,
                env=_env(PYTHONPATH=str(tree)))
    assert proc.returncode == 0, proc.output[-4000:]
    assert checkout_module.stat().st_mtime_ns > before
    script = tmp_path / "job.py"
    script.write_text(GLOO_ALLREDUCE)
    job = _run([str(vbin / "torchrun"), "--standalone", "--nproc_per_node=2", str(script)],
               timeout=300, cwd=tmp_path, env=env)
    assert job.returncode == 0, job.output[-6000:]
    assert sorted(r[1] for r in _results(tmp_path)) == ["0", "1"], job.output
