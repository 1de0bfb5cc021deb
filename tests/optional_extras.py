"""What tests/test_lightning.py and tests/test_keras.py share: an optional extra of
pyproject.toml, and whether the installed packages are inside the ranges it declares."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python < 3.11: pip carries the same parser
    from pip._vendor import tomli as tomllib

from packaging.requirements import Requirement

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def extras() -> dict:
    return tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]


def declared(extra: str) -> list:
    """The requirements of the extra ``extra``, e.g. ``[Requirement('keras>=3.15,<3.16')]``."""
    return [Requirement(r) for r in extras()[extra]]


def assert_installed_within(extra: str) -> dict:
    """Asserts every distribution of the extra is installed within its range, the range has
    an upper bound (a release the tests have not seen is outside it), and the test extra
    installs the same requirement. Returns {name: installed version}."""
    test_extra = [str(Requirement(r)) for r in extras()["test"]]
    versions = {}
    for req in declared(extra):
        assert any(s.operator in ("<", "<=", "==", "~=") for s in req.specifier), (
            f"horovodlite[{extra}]'s {req} has no upper bound: bound it to the releases tested")
        try:
            version = importlib.metadata.version(req.name)
        except importlib.metadata.PackageNotFoundError:
            raise AssertionError(f"{req.name} is not installed: horovodlite[{extra}] declares "
                                 f"{req} (scripts/install.sh --test installs it)") from None
        assert req.specifier.contains(version, prereleases=True), (
            f"{req.name} {version} is installed, outside horovodlite[{extra}]'s {req.specifier}:"
            " test the new release and widen the range in pyproject.toml, or install one inside it")
        assert str(req) in test_extra, (
            f"the test extra must install {req} (scripts/install.sh --test installs the test "
            "extra)")
        versions[req.name] = version
    return versions
