#!/usr/bin/env bash
# Unpacks NCCL's headers and libnccl.so.2 from the PyPI wheel nvidia-nccl-cu<CUDA major> into
# build/nccl/cu<major>/ for the CUDA/NCCL compile-and-link check (tests/unit/test_cuda_build.py).
# Does nothing where nvcc is missing, or where the files are already there.
#
#   bash scripts/fetch_nccl.sh                                  # pip download (~300 MB), unpack
#   HVDL_NCCL_WHEEL=/path/to/nvidia_nccl_cu13-...whl bash scripts/fetch_nccl.sh   # no download
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
NCCL_VERSION=2.32.3

NVCC=$(command -v nvcc || true)
if [[ -z "$NVCC" && -x /usr/local/cuda/bin/nvcc ]]; then NVCC=/usr/local/cuda/bin/nvcc; fi
if [[ -z "$NVCC" ]]; then
  echo "fetch_nccl: no nvcc, so no CUDA compile check: nothing to fetch"
  exit 0
fi
MAJOR=$("$NVCC" --version | sed -n 's/.*release \([0-9][0-9]*\)\..*/\1/p')
if [[ "$MAJOR" != "12" && "$MAJOR" != "13" ]]; then
  echo "fetch_nccl: CUDA ${MAJOR:-?} has no pinned nvidia-nccl wheel here; skipping"
  exit 0
fi
if "$PY" -c "import nvidia.nccl as n, os, sys; \
    sys.exit(not os.path.isfile(os.path.join(list(n.__path__)[0], 'include', 'nccl.h')))" \
    2>/dev/null; then
  echo "fetch_nccl: the installed nvidia-nccl package has the headers: nothing to fetch"
  exit 0
fi
DEST="build/nccl/cu$MAJOR"
if [[ -f "$DEST/nvidia/nccl/include/nccl.h" ]]; then
  echo "fetch_nccl: NCCL already in $DEST"
  exit 0
fi

WHEEL=${HVDL_NCCL_WHEEL:-}
DOWNLOADED=""
if [[ -z "$WHEEL" ]]; then
  mkdir -p build/wheels
  "$PY" -m pip download --disable-pip-version-check -q --no-deps \
    "nvidia-nccl-cu$MAJOR==$NCCL_VERSION" -d build/wheels
  WHEEL=$(find build/wheels -name "nvidia_nccl_cu${MAJOR}-${NCCL_VERSION}-*.whl" | head -n 1)
  DOWNLOADED=$WHEEL
fi
mkdir -p "$DEST"
"$PY" - "$WHEEL" "$DEST" <<'PYEOF'
import sys
import zipfile

wheel, dest = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    keep = [m for m in z.namelist()
            if m.startswith("nvidia/nccl/include/") or m.startswith("nvidia/nccl/lib/libnccl.so")]
    z.extractall(dest, keep)
PYEOF
if [[ -n "$DOWNLOADED" ]]; then rm -f "$DOWNLOADED"; fi  # the unpacked files are all we need
echo "fetch_nccl: NCCL $NCCL_VERSION (nvidia-nccl-cu$MAJOR) headers and library in $DEST"
