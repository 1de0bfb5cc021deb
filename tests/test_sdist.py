"""The sdist carries what a user of it reads and runs: the docs (error messages point into them),
the examples (the quick start runs one), the license, and one version.

Built with ``python -m build --sdist --no-isolation`` from a copy of the repository's tracked files
(the checkout's own build/ folder would shadow the ``build`` package, and building writes an
egg-info). Single-process and compiles nothing: the build lane (tests/conftest.py). Whether the
sdist then builds and installs is tests/test_install.py's.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=False)
    if out.returncode != 0:
        pytest.skip("not a git checkout: the sdist is built from the tracked files")
    return [name for name in out.stdout.decode().split("\0") if name]


@pytest.fixture(scope="module")
def sdist(tmp_path_factory):
    tree = tmp_path_factory.mktemp("tree")
    for name in _tracked_files():
        source = ROOT / name
        if source.is_file():  # a tracked file deleted in the working tree is not copied
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, tree / name)
    dist = tmp_path_factory.mktemp("dist")
    proc = subprocess.run([sys.executable, "-m", "build", "--sdist", "--no-isolation",
                           "--skip-dependency-check", "--outdir", str(dist), str(tree)],
                          cwd=dist, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    (archive,) = dist.glob("horovodlite-*.tar.gz")
    with tarfile.open(archive) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
        top = tar.getnames()[0].split("/", 1)[0]
        pkg_info = tar.extractfile(f"{top}/PKG-INFO").read().decode()
    return archive, names, pkg_info


def test_the_sdist_carries_the_docs_the_examples_and_the_license(sdist):
    _, names, _ = sdist
    tracked = set(_tracked_files())
    docs = {n for n in tracked if n.startswith("docs/")}
    examples = {n for n in tracked if n.startswith("examples/")}
    assert docs and examples
    assert docs <= names, f"docs missing from the sdist: {sorted(docs - names)}"
    assert examples <= names, f"examples missing from the sdist: {sorted(examples - names)}"
    assert {"LICENSE", "README.md", "CHANGELOG.md", "CONTRIBUTING.md", "pyproject.toml",
            "setup.py", "CMakeLists.txt", "horovodlite/_version.py",
            "csrc/core/context.cc"} <= names
    assert "Apache License" in (ROOT / "LICENSE").read_text()[:200]
    assert not any(n.startswith(("build/", "dist/")) or n.endswith((".so", ".pyc"))
                   for n in names), sorted(names)


def test_the_sdist_has_the_one_version(sdist):
    from horovodlite._version import __version__

    archive, _, pkg_info = sdist
    assert f"\nVersion: {__version__}\n" in pkg_info
    assert archive.name == f"horovodlite-{__version__}.tar.gz"
    assert "License" in pkg_info
