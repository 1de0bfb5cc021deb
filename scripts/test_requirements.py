"""Prints the `test` extra of pyproject.toml, one requirement a line: the test suite's
dependencies, the one list of them, as `scripts/install.sh --test` installs them.

usage: python scripts/test_requirements.py [--only NAME ...] [--without NAME ...]
"""

import argparse
import re
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python < 3.11: pip carries the same parser
    from pip._vendor import tomli as tomllib

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def requirement_name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0].lower()


def test_requirements(only=(), without=()) -> list[str]:
    extra = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]["test"]
    return [r for r in extra
            if (not only or requirement_name(r) in only) and requirement_name(r) not in without]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="*", default=(), help="keep only these packages")
    p.add_argument("--without", nargs="*", default=(), help="leave these packages out")
    a = p.parse_args()
    print("\n".join(test_requirements({n.lower() for n in a.only}, {n.lower() for n in a.without})))


if __name__ == "__main__":
    main()
