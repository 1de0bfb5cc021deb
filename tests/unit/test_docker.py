"""The Dockerfiles open with their build and run commands, and every file, command and flag those
commands (and the RUN steps) use exists in this repository. No Docker engine is needed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
DOCKERFILES = sorted((ROOT / "docker").glob("Dockerfile.*"))


def header(path: Path) -> str:
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line[1:].strip())
    return "\n".join(lines)


def test_both_images_exist():
    assert {p.name for p in DOCKERFILES} == {"Dockerfile.cpu", "Dockerfile.gpu"}
    assert (ROOT / "docker" / "README.md").is_file()


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_opens_with_exact_build_and_run_commands(path):
    text = header(path)
    assert f"docker build -f docker/{path.name} -t " in text
    assert "docker run --rm" in text
    if path.name.endswith("gpu"):
        assert "--gpus all" in text


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_every_referenced_path_exists(path):
    text = path.read_text() + (ROOT / "docker" / "README.md").read_text()
    paths = set(re.findall(r"\b((?:scripts|examples|tests)/[\w/.-]+\.(?:py|sh))\b", text))
    assert paths, "expected references to scripts/, examples/ or tests/"
    missing = sorted(p for p in paths if not (ROOT / p).is_file())
    assert not missing, missing
    assert "horovodliterun" in text
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'horovodliterun = "horovodlite.runner.launch:main"' in pyproject


def test_example_flags_used_by_the_images_exist():
    text = "".join(p.read_text() for p in DOCKERFILES) + (ROOT / "docker" / "README.md").read_text()
    used = set(re.findall(r"examples/pytorch_digits\.py((?: --[\w-]+)+)", text))
    flags = {f for group in used for f in group.split()}
    assert {"--check", "--cuda"} <= flags
    help_text = subprocess.run([sys.executable, str(ROOT / "examples" / "pytorch_digits.py"),
                                "--help"], capture_output=True, text=True, timeout=60).stdout
    for flag in flags:
        assert flag in help_text, flag


def test_build_context_leaves_out_build_outputs():
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert "build/" in ignored and "**/*.so" in ignored
