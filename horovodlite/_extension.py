"""Loads horovodlite._C, rebuilding it first in editable installs.

An editable install (``pip install --no-build-isolation -e .``) leaves
``_editable_build.json`` next to this file. On import we run the incremental CMake/Ninja build
so C++ changes take effect without reinstalling; a file lock serialises the ranks of an mpirun
job that import at the same moment. Set HOROVODLITE_NO_REBUILD=1 to skip it.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
from pathlib import Path

_MARKER = Path(__file__).with_name("_editable_build.json")


def _rebuild() -> None:
    info = json.loads(_MARKER.read_text())
    build_dir = Path(info["build_dir"])
    if not build_dir.is_dir():
        return
    with open(build_dir / ".rebuild.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        proc = subprocess.run(
            [info["cmake"], "--build", str(build_dir)], capture_output=True, text=True
        )
    if proc.returncode != 0:
        raise ImportError(
            "horovodlite: rebuilding the C++ extension failed:\n" + proc.stdout + proc.stderr
        )


def load():
    if _MARKER.exists() and os.environ.get("HOROVODLITE_NO_REBUILD") != "1":
        _rebuild()
    import torch  # noqa: F401  (loads libtorch before the extension that links it)

    from horovodlite import _C

    return _C
