"""The test-only C++ module ``horovodlite._testing`` (csrc/testing), built on demand.

It is not part of the default build or of a wheel: in an editable install this builds its CMake
target in the extension's build folder (incrementally, under the same lock as the import-time
rebuild), then imports it. Elsewhere the tests that need it are skipped, saying why.
"""

from __future__ import annotations

import fcntl
import functools
import json
import subprocess
from pathlib import Path

import pytest

import horovodlite
from horovodlite._extension import load


@functools.cache
def _build() -> str | None:
    """None once the module is built, else why it cannot be."""
    load()  # _C first: rebuilt in an editable install, torch loaded, MPI checked
    marker = Path(horovodlite.__file__).with_name("_editable_build.json")
    if not marker.exists():
        return ("horovodlite._testing is built only in an editable install "
                "(bash scripts/install.sh --test)")
    info = json.loads(marker.read_text())
    build_dir = Path(info["build_dir"])
    with open(build_dir / ".rebuild.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        proc = subprocess.run([info["cmake"], "--build", str(build_dir), "--target", "_testing"],
                              capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError("building horovodlite._testing failed:\n" + proc.stdout + proc.stderr)
    return None


def load_testing_module():
    """The built module; skips the calling test module when it cannot be built here."""
    why = _build()
    if why is not None:
        pytest.skip(why, allow_module_level=True)
    from horovodlite import _testing

    return _testing
