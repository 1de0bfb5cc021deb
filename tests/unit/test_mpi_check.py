"""The MPI consistency checks (horovodlite/_mpi_check.py), on the strings real MPIs print.

The strings are what this machine's MPIs printed: PyPI's Open MPI 5.0.11 and MPICH 5.0.2,
Debian's Open MPI 4.1.4 and MPICH 4.0.2. Whole builds against each of them are in
tests/test_install.py.
"""

import os
import stat

import pytest

from horovodlite import _mpi_check as mc

OMPI5_LIB = ("Open MPI v5.0.11, package: Open MPI user@localhost Distribution, ident: 5.0.11, "
             "repo rev: v5.0.11rc1, Sep 16, 2026")
OMPI4_LIB = "Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4, repo rev: v4.1.4, May 26, 2022"
MPICH4_LIB = ("MPICH Version:\t4.0.2\nMPICH Release date:\tThu Apr  7 12:34:45 CDT 2022\n"
              "MPICH ABI:\t14:2:2")
MPICH5_LIB = "MPICH Version:      5.0.2\nMPICH Release date: Fri Sep 25 20:45:26 UTC 2026"
INTEL_LIB = "Intel(R) MPI Library 2021.10 for Linux* OS"
OMPI5_RUN = "mpirun (Open MPI) 5.0.11\n\nReport bugs to https://www.open-mpi.org/community/help/\n"
OMPI4_RUN = "mpirun.openmpi (OpenRTE) 4.1.4\n\nReport bugs to http://www.open-mpi.org/community/help/\n"
HYDRA_RUN = "HYDRA build details:\n    Version:                                 4.0.2\n    Release"

ENV_OMPI5 = {"OMPI_VERSION": "5.0.11", "PRTE_LAUNCHED": "1", "OMPI_COMM_WORLD_RANK": "0",
             "PMIX_RANK": "0"}
ENV_OMPI4 = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_MCA_orte_launch": "1",
             "OMPI_MCA_orte_hnp_uri": "2109014016.0;tcp://192.0.2.2:37333", "PMIX_RANK": "0"}
ENV_HYDRA = {"PMI_RANK": "0", "PMI_SIZE": "2", "PMI_FD": "6", "MPI_LOCALNRANKS": "1"}
ENV_SLURM = {"PMI_RANK": "0", "SLURM_JOB_ID": "12"}


def record(library_version, compiler="/opt/mpi/bin/mpicc"):
    return {"compiler": compiler, "library_version": library_version, "mpi_version": "3.1",
            "libraries": ["/opt/mpi/lib/libmpi.so"]}


@pytest.mark.parametrize("text, family, version", [
    (OMPI5_LIB, "Open MPI", "5.0.11"), (OMPI4_LIB, "Open MPI", "4.1.4"),
    (MPICH4_LIB, "MPICH", "4.0.2"), (MPICH5_LIB, "MPICH", "5.0.2"),
    (INTEL_LIB, "Intel MPI", "2021.10"), ("something else", None, None),
])
def test_library_versions_are_recognised(text, family, version):
    mpi = mc.parse_library_version(text)
    assert (mpi.family, mpi.version) == (family, version) if family else mpi is None


@pytest.mark.parametrize("text, expected", [
    (OMPI5_RUN, "Open MPI 5.0.11"), (OMPI4_RUN, "Open MPI 4.1.4"), (HYDRA_RUN, "MPICH 4.0.2"),
    ("", None),
])
def test_launcher_versions_are_recognised(text, expected):
    mpi = mc.parse_launcher_version(text)
    assert (str(mpi) if mpi else None) == expected


def test_compatibility_is_same_open_mpi_major_or_the_mpich_abi_family():
    ompi5, ompi4 = mc.Mpi("Open MPI", "5.0.11"), mc.Mpi("Open MPI", "4.1.4")
    mpich, intel = mc.Mpi("MPICH", "4.0.2"), mc.Mpi("Intel MPI", "2021.10")
    assert ompi5.compatible(mc.Mpi("Open MPI", "5.0.3"))
    assert not ompi5.compatible(ompi4) and not ompi4.compatible(ompi5)
    assert mpich.compatible(mc.Mpi("MPICH", "5.0.2")) and mpich.compatible(intel)
    assert not mpich.compatible(ompi5) and not ompi5.compatible(mpich)
    assert mpich.compatible(mc.Mpi("MPICH", ""))  # a Hydra launcher of unknown version


@pytest.mark.parametrize("env, expected", [
    (ENV_OMPI5, "Open MPI 5.0.11"), (ENV_OMPI4, "Open MPI 4"), (ENV_HYDRA, "MPICH"),
    (ENV_SLURM, None), ({}, None),
])
def test_the_launcher_is_recognised_from_its_environment(env, expected):
    mpi = mc.launcher_from_env(env)
    assert (str(mpi) if mpi else None) == expected


def test_another_mpis_launcher_is_named_with_both_sides_and_the_fix():
    message = mc.check_launcher(record(MPICH4_LIB, "/usr/bin/mpicc.mpich"), ENV_OMPI5)
    assert "built against MPICH 4.0.2 (/usr/bin/mpicc.mpich)" in message
    assert "started by Open MPI 5.0.11's mpirun" in message and "rank 0 of 1" in message
    assert "rebuild horovodlite against the MPI you run with" in message
    assert "Open MPI 4" in mc.check_launcher(record(OMPI5_LIB), ENV_OMPI4)
    assert "MPICH" in mc.check_launcher(record(OMPI5_LIB), ENV_HYDRA)


def test_the_own_launcher_and_unknown_ones_pass():
    assert mc.check_launcher(record(OMPI5_LIB), ENV_OMPI5) is None
    assert mc.check_launcher(record(OMPI4_LIB), ENV_OMPI4) is None
    assert mc.check_launcher(record(MPICH5_LIB), ENV_HYDRA) is None
    assert mc.check_launcher(record(OMPI5_LIB), ENV_SLURM) is None
    assert mc.check_launcher(record(OMPI5_LIB), {}) is None
    assert mc.check_launcher(record("an MPI nobody knows"), ENV_HYDRA) is None


def test_a_loaded_library_of_another_mpi_is_named():
    message = mc.check_loaded_library(record(OMPI5_LIB), OMPI4_LIB)
    assert "built against Open MPI 5.0.11" in message
    assert "loaded in this process is Open MPI 4.1.4" in message and "LD_LIBRARY_PATH" in message
    assert mc.check_loaded_library(record(OMPI5_LIB), OMPI5_LIB) is None
    assert mc.check_loaded_library(record(MPICH4_LIB), MPICH5_LIB) is None


def test_mpirun_of_another_mpi_is_refused_naming_both(tmp_path):
    message = mc.check_mpirun(record(OMPI5_LIB), "/usr/bin/mpirun", HYDRA_RUN)
    assert message.startswith("horovodliterun: /usr/bin/mpirun is MPICH 4.0.2's launcher")
    assert "built against Open MPI 5.0.11" in message
    assert mc.check_mpirun(record(OMPI5_LIB), "/x/mpirun", OMPI5_RUN) is None


def _executable(path):
    path.write_text("#!/bin/sh\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_the_builds_own_launcher_is_found_beside_its_compiler(tmp_path):
    compiler = _executable(tmp_path / "mpicc.openmpi")
    assert mc.matching_launcher(record(OMPI4_LIB, str(compiler))) is None
    launcher = _executable(tmp_path / "mpirun.openmpi")
    _executable(tmp_path / "mpirun")  # the generic name belongs to whichever MPI is default
    assert mc.matching_launcher(record(OMPI4_LIB, str(compiler))) == str(launcher)
    assert mc.matching_launcher(record(OMPI4_LIB, str(tmp_path / "cc"))) is None


def test_an_extension_that_cannot_load_its_mpi_is_explained():
    error = ImportError("/x/_C.so: undefined symbol: ompi_mpi_comm_world")
    message = mc.diagnose_import_failure(error, record(OMPI5_LIB))
    assert "undefined symbol: ompi_mpi_comm_world" in message
    assert "built against Open MPI 5.0.11 (/opt/mpi/bin/mpicc)" in message
    assert "/opt/mpi/lib/libmpi.so" in message
    missing = ImportError("libmpi.so.40: cannot open shared object file: No such file or directory")
    assert mc.diagnose_import_failure(missing, record(OMPI5_LIB)) is not None
    assert mc.diagnose_import_failure(ImportError("No module named 'numpy'"),
                                      record(OMPI5_LIB)) is None
    assert mc.diagnose_import_failure(error, None) is None


def test_this_build_recorded_the_mpi_it_was_built_against():
    rec = mc.read_record()
    assert rec is not None, "the build writes horovodlite/_mpi_build.json beside the extension"
    assert os.access(rec["compiler"], os.X_OK)
    assert mc.built_mpi(rec) is not None, rec["library_version"]
    from horovodlite._extension import load

    loaded = mc.parse_library_version(load().mpi_library_version())
    assert mc.built_mpi(rec).compatible(loaded)
