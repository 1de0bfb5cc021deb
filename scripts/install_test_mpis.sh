#!/usr/bin/env bash
# Installs the other MPIs that tests/test_install.py builds horovodlite against, beside the one
# the main install uses, without putting any of them first on PATH:
#   Debian's Open MPI 4 and MPICH (libopenmpi-dev openmpi-bin libmpich-dev mpich; as root with
#   apt-get: /usr/bin/mpicc.openmpi, /usr/bin/mpicc.mpich), what clusters typically have;
#   PyPI's mpich, into build/mpi/pypi-mpich (a prefix of its own: in this environment it would
#   overwrite the PyPI Open MPI's mpicc).
# Where one cannot be installed, the script says so and the tests of that MPI skip (outside CI).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
say() { echo "install_test_mpis.sh: $*"; }
mkdir -p build

debian=(libopenmpi-dev openmpi-bin libmpich-dev mpich)
if [[ -x /usr/bin/mpicc.openmpi && -x /usr/bin/mpicc.mpich ]]; then
  :
elif [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
  say "installing Debian's Open MPI and MPICH (${debian[*]})"
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
         --no-install-recommends "${debian[@]}"; } >build/apt-mpi.log 2>&1; then
    say "apt-get failed (build/apt-mpi.log); Debian's MPIs will not be tested"
  fi
else
  say "not root or no apt-get: Debian's MPIs will not be tested"
fi

if [[ ! -x build/mpi/pypi-mpich/bin/mpicc ]]; then
  say "installing MPICH from PyPI into build/mpi/pypi-mpich"
  "$PY" -m pip install --disable-pip-version-check -q --prefix build/mpi/pypi-mpich mpich \
    || say "pip could not install mpich; PyPI's MPICH will not be tested"
fi
exit 0
