"""What tests/test_lightning.py and tests/test_keras.py share: an optional extra of
pyproject.toml, and whether the installed package is inside the range it declares."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python < 3.11: pip carries the same parser
    from pip._vendor import tomli as tomllib

from packaging.requirements import Requirement

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def declared(extra: str) -> Requirement:
    """The one requirement of the extra ``extra``, e.g. ``keras>=3.0,<3.16``."""
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    (requirement,) = extras[extra]
    return Requirement(requirement)


def assert_installed_within(extra: str) -> str:
    """Asserts the installed distribution is within the extra's range (and that the test extra
    installs the same range); returns the installed version."""
    req = declared(extra)
    version = importlib.metadata.version(req.name)
    assert req.specifier.contains(version, prereleases=True), (
        f"{req.name} {version} is installed, outside horovodlite[{extra}]'s {req.specifier}: "
        "test the new release and widen the range in pyproject.toml, or install one inside it")
    test_extra = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]["test"]
    assert str(req) in [str(Requirement(r)) for r in test_extra], (
        f"the test extra must install {req} (scripts/install.sh --test installs the test extra)")
    return version
