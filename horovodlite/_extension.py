"""Loads horovodlite._C, rebuilding it first in editable installs.

An editable install (``pip install --no-build-isolation -e .``) leaves
``_editable_build.json`` next to this file. On import we run the incremental CMake/Ninja build
so C++ changes take effect without reinstalling; a file lock serialises the ranks of an mpirun
job that import at the same moment. Set HOROVODLITE_NO_REBUILD=1 to skip it.

Then the MPI is checked (horovodlite/_mpi_check.py): the library the loader picked and the
launcher that started the process must fit the MPI the extension was built against; a mismatch,
or an extension that cannot load its MPI library, is one ImportError naming both and the fix.
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import subprocess
from pathlib import Path

from horovodlite import _mpi_check

_MARKER = Path(__file__).with_name("_editable_build.json")


def _rebuild() -> None:
    info = json.loads(_MARKER.read_text())
    build_dir = Path(info["build_dir"])
    if not build_dir.is_dir() or info.get("package_dir", str(_MARKER.parent)) != str(
            _MARKER.parent):
        return  # a copy of the tree, or a build folder that is gone: nothing of ours to rebuild
    with open(build_dir / ".rebuild.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        proc = subprocess.run(
            [info["cmake"], "--build", str(build_dir)], capture_output=True, text=True
        )
    if proc.returncode != 0:
        raise ImportError(
            "horovodlite: rebuilding the C++ extension failed:\n" + proc.stdout + proc.stderr
        )


@functools.cache
def load():
    """The extension module, rebuilt first in an editable install, its MPI checked (once)."""
    if _MARKER.exists() and os.environ.get("HOROVODLITE_NO_REBUILD") != "1":
        _rebuild()
    import torch  # noqa: F401  (loads libtorch before the extension that links it)

    record = _mpi_check.read_record()
    try:
        from horovodlite import _C
    except ImportError as exc:
        message = _mpi_check.diagnose_import_failure(exc, record)
        if message is None:
            raise
        raise ImportError(message) from exc
    if record is not None and not _mpi_check.skipped():
        message = (_mpi_check.check_launcher(record, os.environ)
                   or _mpi_check.check_loaded_library(record, _C.mpi_library_version()))
        if message is not None:
            raise ImportError(message)
    return _C
