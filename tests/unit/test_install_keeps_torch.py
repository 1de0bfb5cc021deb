"""`scripts/install.sh --test` keeps the installed torch, whatever its run-time version says.

PyPI's CUDA build of torch reports `2.13.0+cu130` as `torch.__version__`, while pip knows its
distribution as `2.13.0`. The install once pinned the run-time string for its test extras, a
wheel no index serves, and stopped before the suite started. The stand-in here is a tiny `torch`
whose distribution is `2.13.0` and whose module says `2.13.0+cu130`; a stand-in dependency that
requires torch (as Ray and Lightning do) must be installed beside it without replacing it.
Offline: every other requirement is already satisfied by this environment's site-packages.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NEEDS_TORCH = "hvdl-standin-needs-torch"


def _run(cmd, **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL, **kwargs)
    proc.output = proc.stdout + proc.stderr
    return proc


def _wheel(src: Path, wheels: Path, name: str, version: str, module: str, code: str,
           requires: list[str]) -> None:
    """Builds a one-module wheel with pip (setuptools, no build isolation, no index)."""
    (src / module).mkdir(parents=True)
    (src / module / "__init__.py").write_text(code)
    deps = ", ".join(f'"{r}"' for r in requires)
    (src / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=64"]\nbuild-backend = "setuptools.build_meta"\n'
        f'[project]\nname = "{name}"\nversion = "{version}"\ndependencies = [{deps}]\n'
        f'[tool.setuptools]\npackages = ["{module}"]\n')
    proc = _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                 "--no-index", "-w", str(wheels), str(src)])
    assert proc.returncode == 0, proc.output[-3000:]


def test_the_test_extras_keep_a_torch_whose_version_string_has_a_local_label(tmp_path):
    wheels = tmp_path / "wheels"
    _wheel(tmp_path / "torch-src", wheels, "torch", "2.13.0", "torch",
           '__version__ = "2.13.0+cu130"\nSTANDIN = True\n', [])
    _wheel(tmp_path / "needs-src", wheels, NEEDS_TORCH, "1.0", "hvdl_standin_needs_torch",
           "", ["torch>=2.1"])

    # The install's scripts and the project file, with the stand-in dependency in the test extra.
    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "scripts", tree / "scripts")
    # What the checkout's own `install.sh --test` fetched (the other MPIs, NCCL's headers), so that
    # this offline run finds them where the scripts look.
    for fetched in ("build/mpi", "build/nccl"):
        if (ROOT / fetched).is_dir():
            (tree / fetched).parent.mkdir(parents=True, exist_ok=True)
            (tree / fetched).symlink_to(ROOT / fetched)
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert "\ntest = [\n" in pyproject
    (tree / "pyproject.toml").write_text(
        pyproject.replace("\ntest = [\n", f'\ntest = [\n  "{NEEDS_TORCH}",\n', 1))

    # A venv that sees this environment's packages behind its own (a .pth file: under a venv,
    # --system-site-packages would show the base interpreter's instead).
    venv = tmp_path / "venv"
    assert _run([sys.executable, "-m", "venv", str(venv)]).returncode == 0
    python = str(venv / "bin" / "python")
    own = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout
    outer = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    Path(own.strip(), "outer.pth").write_text("\n".join(sorted(outer)) + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "HVDL_MPI"))}
    env.update(PATH=f"{venv / 'bin'}:{env['PATH']}", VIRTUAL_ENV=str(venv), PYTHON=python,
               HVDL_MPI="none", PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1",
               PIP_FIND_LINKS=str(wheels), PIP_DISABLE_PIP_VERSION_CHECK="1")
    proc = _run([python, "-m", "pip", "install", "-q", "--no-deps", "--ignore-installed",
                 "torch==2.13.0"], env=env)
    assert proc.returncode == 0, proc.output[-3000:]

    proc = _run(["bash", str(tree / "scripts/install.sh"), "--test", "--deps-only"], env=env,
                cwd=tmp_path)
    assert proc.returncode == 0, proc.output[-6000:]
    kept = next(line for line in proc.output.splitlines() if line.startswith("install.sh: keeping"))
    assert "torch==2.13.0" in kept.split(), kept  # the distribution's version, not "+cu130"
    assert "--deps-only: not building horovodlite" in proc.output, proc.output[-6000:]
    assert (tree / "build/keep-installed.txt").read_text().splitlines().count("torch==2.13.0")

    check = _run([python, "-c", "import importlib.metadata as m, torch\n"
                  f"print(torch.__version__, torch.STANDIN, m.version('torch'), "
                  f"m.version('{NEEDS_TORCH}'))"], env=env, cwd=tmp_path)
    assert check.returncode == 0, check.output
    assert check.stdout.split() == ["2.13.0+cu130", "True", "2.13.0", "1.0"], check.output


def test_unknown_install_options_are_refused():
    proc = _run(["bash", str(ROOT / "scripts/install.sh"), "--tests"])
    assert proc.returncode == 2
    assert "unknown option '--tests': expected --test and/or --deps-only" in proc.output
