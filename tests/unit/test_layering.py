"""The C++ layers include each other in one direction only (docs/architecture.md).

    python, torch   the bindings (python/ may include torch/, never the reverse)
    runtime         the composition root: the one place that picks and wires the backends
    core            Context, negotiation, executor: interfaces of comm/ only
    comm            interfaces and algorithms: nothing of a backend
    backends/<x>    one transport or device family each: comm/ and common/, never each other
    common          status, types, config
    testing         test-only bindings, built into their own module; nobody includes them

Build flags (#if HVDL_WITH_*) live in runtime/, in a backend's own folder and in CMake; test-only
code may ask them too.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

CSRC = Path(__file__).resolve().parents[2] / "csrc"
INCLUDE = re.compile(r'\s*#\s*include\s*"([a-z_]+)/([a-z_]+/)?')
SYSTEM = re.compile(r'\s*#\s*include\s*<(torch|ATen|c10|pybind11|mpi|cuda|nccl)')

# folder -> the project folders its files may include (besides their own)
ALLOWED = {
    "common": set(),
    "comm": {"common"},
    "core": {"common", "comm"},
    "backends/mpi": {"common", "comm"},
    "backends/nccl": {"common", "comm"},
    "backends/cuda": {"common", "comm"},
    "backends/shm": {"common", "comm"},
    "runtime": {"common", "comm", "core", "backends/mpi", "backends/nccl", "backends/cuda",
                "backends/shm"},
    "torch": {"common", "comm", "core", "runtime"},
    "python": {"common", "comm", "core", "runtime", "torch"},
    "testing": {"common", "comm", "core", "runtime", "backends/mpi", "backends/nccl",
                "backends/cuda", "backends/shm"},
}


def folder_of(path: Path) -> str:
    rel = path.relative_to(CSRC).parts
    return "/".join(rel[:2]) if rel[0] == "backends" else rel[0]


def sources():
    return [p for p in CSRC.rglob("*") if p.suffix in (".h", ".cc", ".cu")]


def includes(path: Path):
    for line in path.read_text().splitlines():
        m = INCLUDE.match(line)
        if m:
            top, sub = m.group(1), (m.group(2) or "").rstrip("/")
            yield (f"{top}/{sub}" if top == "backends" else top), line.strip()


def test_every_folder_is_placed():
    assert {folder_of(p) for p in sources()} <= set(ALLOWED) | {"torch/cpu", "torch/cuda"}


@pytest.mark.parametrize("folder", sorted(ALLOWED))
def test_includes_point_down_only(folder):
    offenders = []
    for path in sources():
        here = folder_of(path)
        if here != folder and not here.startswith(folder + "/"):
            continue
        for target, line in includes(path):
            if target != folder and target not in ALLOWED[folder]:
                offenders.append(f"{path.relative_to(CSRC)}: {line}")
    assert not offenders, "\n".join(offenders)


def test_core_and_comm_include_no_framework_or_transport_header():
    offenders = []
    for folder in ("core", "comm", "common"):
        for path in (CSRC / folder).glob("*"):
            for line in path.read_text().splitlines():
                if SYSTEM.match(line):
                    offenders.append(f"{folder}/{path.name}: {line.strip()}")
    assert not offenders, offenders


def test_build_flags_only_in_the_composition_root_and_backends():
    for path in sources():
        folder = folder_of(path)
        if folder in ("runtime", "testing") or folder.startswith("backends/"):
            continue
        assert "#if HVDL_WITH" not in path.read_text(), path.relative_to(CSRC)


def test_the_checker_sees_a_wrong_include(tmp_path, monkeypatch):
    # The rule fires: a comm/ file that includes a backend is reported.
    fake = tmp_path / "csrc"
    (fake / "comm").mkdir(parents=True)
    (fake / "comm" / "x.cc").write_text('#include "backends/mpi/mpi_world.h"\n')
    monkeypatch.setattr(__import__(__name__), "CSRC", fake)
    with pytest.raises(AssertionError, match="backends/mpi"):
        test_includes_point_down_only("comm")
