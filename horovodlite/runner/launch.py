"""horovodliterun: starts a horovodlite job, through mpirun or (``--gloo``) by itself.

    horovodliterun -np 4 -H node1:2,node2:2 --fusion-threshold-mb 64 python train.py
    horovodliterun --gloo -np 4 -H node1:2,node2:2 python train.py

Which: ``--mpi`` or ``--gloo``; by default MPI when this build has MPI and an mpirun is found,
else Gloo (``--verbose`` then says why). MPI mode (``mpi_launch.py``) runs mpirun with what
a user would otherwise have to remember; Gloo mode (``gloo_launch.py``) starts the ranks itself
- here, or through ssh/``--ssh-agent`` (``remote.py``) - and hosts their rendezvous. The
options, the rank reports and the outcome are the same in both modes; they may also come from
``--config-file`` (``config_file.py``). This module is the entry point: the options, the knobs
they set, and the environment both modes give the ranks: the HOROVOD_* knobs (set from the
flags), the Python environment, and huge pages for tensors (THP_MEM_ALLOC_ENABLE=1 for torch's
large allocations, GLIBC_TUNABLES for the rest, which makes single copies between ranks and
MPI's shared-memory copies faster). Jobs started by mpirun, srun or torchrun directly work the
same.
"""

from __future__ import annotations

import argparse
import os
import sys

import horovodlite
from horovodlite import _mpi_check
from horovodlite.common import launch_env
from horovodlite.runner import cluster, config_file, horovod_flags, mpi_launch
from horovodlite.runner.hosts import host_slots, read_hostfile

START_TIMEOUT = 30.0  # --start-timeout's default (HOROVOD_START_TIMEOUT overrides it), as Horovod

# glibc's allocator for the ranks (HOROVOD_MALLOC_TUNING, on by default): freed blocks up to 32 MiB
# kept for reuse (what horovodlite's init sets with mallopt in jobs started otherwise) and, only
# settable before a process starts, its heap on transparent huge pages. Gradients are mostly
# smaller than torch's 2 MiB huge-page threshold; on 4 KiB pages the kernel pins every page it
# copies between ranks, which was 28% of the background thread's time in the 200 x 64 KiB fusion
# case (2.5 -> 1.5 ms per batch with huge pages; an MLP training step at np 2: -5%).
_GLIBC_TUNABLES = ("glibc.malloc.hugetlb=1:glibc.malloc.mmap_threshold=33554432:"
                   "glibc.malloc.trim_threshold=268435456")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="horovodliterun",
        description="Launch a horovodlite training job, with mpirun or (--gloo) by itself.",
        epilog="Everything after the options is the command each rank runs.",
        # the command's own options must reach it: with abbreviations, argparse took
        # `train.py --time` for an ambiguous --timeline-... and refused the command line
        allow_abbrev=False,
    )
    p.add_argument("-np", "--num-proc", type=int, help="number of ranks (required to launch)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--gloo", dest="controller", action="store_const", const="gloo",
                      help="start the ranks without MPI (the Gloo controller): here, or on "
                           "other hosts through ssh or --ssh-agent; the default when this build "
                           "has no MPI or no mpirun is found")
    mode.add_argument("--mpi", dest="controller", action="store_const", const="mpi",
                      help="start the ranks with mpirun (the default when this build has MPI "
                           "and an mpirun is found)")
    p.add_argument("--config-file", help="a YAML file of options (long names, e.g. "
                                         "`fusion-threshold-mb: 32`); the command line overrides "
                                         "it")
    p.add_argument("--start-timeout", type=float,
                   help="seconds every rank has to start (report to horovodliterun) before the "
                        f"job fails naming the others (default {START_TIMEOUT:g}, or "
                        "HOROVOD_START_TIMEOUT)")
    p.add_argument("--output-filename",
                   help="also write each rank's output to DIR/rank.N/stdout and "
                        "DIR/rank.N/stderr (on the rank's host)")
    p.add_argument("-p", "--ssh-port", type=int, help="ssh port of the other hosts")
    p.add_argument("-i", "--ssh-identity-file", help="ssh identity (private key) file")
    p.add_argument("--ssh-agent",
                   help="the command that reaches another host instead of ssh, called as "
                        "`CMD HOST COMMAND` (split as shell words; -p/-i are added to it); in MPI "
                        "mode Open MPI's plm_ssh_agent, MPICH's -launcher-exec")
    p.add_argument("-v", "--version", action="version",
                   version=f"horovodliterun (horovodlite) {horovodlite.__version__}")
    p.add_argument("-cb", "--check-build", action="store_true",
                   help="print what this build of horovodlite has (frameworks, controllers, "
                        "tensor operations) and run one allreduce on one rank on the CPU and, "
                        "with CUDA and a GPU, on the GPU; exit non-zero if anything failed")
    p.add_argument("-H", "--hosts", help="host1:slots,host2:slots (default: this machine)")
    p.add_argument("--hostfile", help="a file of hosts, one a line: `host slots=N` or `host:N` "
                                      "(# starts a comment); instead of -H")
    p.add_argument("--network-interface", "--nics",
                   help="interface(s) the job's TCP traffic uses, e.g. eth1 or eth1,eth2 (Open "
                        "MPI's and MPICH's)")
    p.add_argument("--no-rank-reports", action="store_true",
                   help="MPI mode: run the command on the ranks as is, without the wrapper that "
                        "reports each rank's exit to horovodliterun (then only mpirun's status "
                        "counts; no --start-timeout, no --output-filename)")
    horovod_flags.add_arguments(p)
    p.add_argument("--elastic", action="store_true",
                   help="keep training when workers or whole hosts are lost (implied by "
                        "--min-np, --max-np, --host-discovery-script): the survivors continue "
                        "from the last commit of hvd.elastic.run, and the job grows onto hosts "
                        "the discovery script adds. Runs without MPI: horovodliterun is the "
                        "job's driver and survives lost processes, hosts and cut links (not "
                        "the loss of its own host). With --mpi: Open MPI 5's ULFM, which "
                        "survives lost processes only; a lost host ends that job")
    p.add_argument("--reset-limit", type=int,
                   help="elastic (Gloo): end the job after this many resets that followed "
                        "failures (default: no limit)")
    p.add_argument("--elastic-timeout", type=float,
                   help="elastic (Gloo): how long a worker waits for the next rendezvous round "
                        "or for the workers of a round to meet (default 600 s)")
    p.add_argument("--elastic-rollback", choices=launch_env.ROLLBACKS,
                   help="elastic: after a failure, 'step' (the default) loses at most the step "
                        "in flight (the survivors keep their state); 'commit' goes back to the "
                        "last state.commit(), as Horovod does (HOROVOD_ELASTIC_ROLLBACK)")
    p.add_argument("--elastic-heartbeat-timeout", type=float, metavar="SECONDS",
                   help="elastic (Gloo): a worker whose heartbeats (from its core's own "
                        "thread, 8 per timeout) stop for this long - its process stopped or "
                        "frozen, its host hung, or its link cut - is lost: killed, named to the "
                        "others, whose collectives with it are aborted, and the job goes on "
                        "without it (default 2; 0: off) (HOROVOD_ELASTIC_HEARTBEAT_TIMEOUT)")
    p.add_argument("--min-np", type=int,
                   help="elastic: the fewest ranks to go on with (default 1)")
    p.add_argument("--max-np", type=int,
                   help="elastic: the most ranks the job may grow to (default: -np; with -H, "
                        "also at most the slots given)")
    p.add_argument("--host-discovery-script",
                   help="elastic: an executable printing host:slots lines; the job grows to the "
                        "slots it lists (up to --max-np), onto the -H hosts first, then onto "
                        "hosts it lists beyond them; the ranks of a host it stops listing "
                        "retire")
    p.add_argument("--blacklist-cooldown-range", type=float, nargs=2, metavar=("MIN", "MAX"),
                   help="elastic: a host where ranks were lost gets no new ranks for MIN "
                        "seconds, doubling with each further failure up to MAX (default: for "
                        "the rest of the job)")
    cluster.add_arguments(p)
    p.add_argument("--mpi-args", default="",
                   help="MPI mode: extra arguments passed to mpirun verbatim")
    p.add_argument("--verbose", action="store_true",
                   help="print the mode, and the mpirun command or each rank's command")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the program each rank runs")
    return p


def build_parser() -> argparse.ArgumentParser:
    """horovodliterun's argument parser: the one definition of its options (the docs' reference
    is generated from it)."""
    return _parser()


def rank_environment(args, base: dict) -> dict:
    """The environment mpirun starts the ranks with: ``base``, the knobs set by flags, and the
    allocator settings a user has not chosen otherwise."""
    env = dict(base)
    env.update(horovod_flags.knob_env(args))
    if getattr(args, "elastic_rollback", None):
        env[launch_env.ELASTIC_ROLLBACK] = args.elastic_rollback
    if getattr(args, "elastic_heartbeat_timeout", None) is not None:
        env[launch_env.ELASTIC_HEARTBEAT] = f"{args.elastic_heartbeat_timeout:g}"
    # Large tensors on transparent huge pages: MPI's shared-memory copies of torch-allocated
    # buffers are ~1.5x faster with them (NumPy already asks for them). Set it to 0 to opt out.
    env.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    if env.get("HOROVOD_MALLOC_TUNING", "1").strip().lower() not in ("0", "false", "no", "off", ""):
        env.setdefault("GLIBC_TUNABLES", _GLIBC_TUNABLES)
    return env


def parse_args(argv: list | None = None) -> argparse.Namespace:
    """The command line, over --config-file's options (the command line wins)."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.config_file:
        parser.set_defaults(**config_file.defaults(parser, args.config_file))
        args = parser.parse_args(argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if args.start_timeout is None:
        value = os.environ.get("HOROVOD_START_TIMEOUT", "")
        try:
            args.start_timeout = float(value) if value else START_TIMEOUT
        except ValueError:
            parser.error(f"HOROVOD_START_TIMEOUT={value!r}: expected seconds")
    return args


def mpi_built() -> bool:
    """Whether this build has MPI: the build's record says (cheaply); an older build without a
    record is asked."""
    record = _mpi_check.read_record()
    if record is not None:
        return record.get("mpi") != "false"
    from horovodlite._extension import load  # noqa: PLC0415

    return bool(load().mpi_built())


def choose_controller(args) -> str:
    """'mpi' or 'gloo' (see the top); with --verbose, says why when the default is Gloo."""
    built = mpi_built()
    if args.controller == "mpi" and not built:
        _parser().error("--mpi: this horovodlite was built without MPI; use --gloo (or rebuild "
                        "with an MPI: bash scripts/install.sh)")
    if args.controller:
        return args.controller
    mpirun = mpi_launch.find_mpirun(_mpi_check.read_record()) if built else None
    if built and mpirun:
        chosen, why = "mpi", f"this build has MPI and {mpirun} is there"
    elif built:
        chosen, why = "gloo", "this build has MPI but no mpirun or mpiexec is on PATH"
    else:
        chosen, why = "gloo", "this build has no MPI"
    if args.verbose and chosen == "gloo":  # (MPI mode's --verbose shows the mpirun command)
        print(f"horovodliterun: Gloo mode: {why} (--mpi/--gloo choose)", flush=True)
    return chosen


def main(argv: list | None = None) -> int:
    args = parse_args(argv)
    if args.check_build:
        from horovodlite.runner.check_build import check_build  # noqa: PLC0415

        return check_build()
    if args.num_proc is None:
        _parser().error("the following arguments are required: -np/--num-proc")
    horovod_flags.check(args, _parser().error)
    if not args.command:
        _parser().error("missing the command to run, e.g. `python train.py`")
    if args.num_proc < 1:
        _parser().error("-np must be at least 1")
    if args.hostfile:
        if args.hosts:
            _parser().error("give -H or --hostfile, not both")
        args.hosts = read_hostfile(args.hostfile, args.slots_per_host or 1)
    if args.hosts:
        args.hosts = horovod_flags.with_slots(args.hosts, args.slots_per_host)
    if args.min_np is not None or args.max_np is not None or args.host_discovery_script:
        args.elastic = True
    if args.elastic and args.controller is None:
        args.controller = "gloo"  # elastic jobs run without MPI unless --mpi says otherwise
    if (args.reset_limit is not None or args.elastic_timeout is not None) and (
            args.controller == "mpi"):
        _parser().error("--reset-limit and --elastic-timeout are for elastic jobs without MPI "
                        "(--elastic without --mpi)")
    controller = choose_controller(args)
    cluster.prepare(args, controller, _parser().error)  # hosts from the allocation; --verbose
    if controller == "gloo":
        if args.elastic:
            mpi_launch.check_elastic(args, _parser().error)
        return _main_gloo(args)
    if args.slots_per_host and args.host_discovery_script:
        _parser().error("--slots-per-host with --mpi --host-discovery-script: the ranks read the "
                        "script's output themselves; print host:slots lines")
    return mpi_launch.run(args, rank_environment(args, os.environ), _parser().error)


def _main_gloo(args) -> int:
    from horovodlite.runner import gloo_launch  # noqa: PLC0415

    for given, flag in ((args.mpi_args, "--mpi-args"), (args.no_rank_reports,
                                                        "--no-rank-reports")):
        if given:
            _parser().error(f"--gloo: {flag} is for MPI mode")
    horovod_flags.check_gloo(args, _parser().error)
    env = rank_environment(args, os.environ)
    slots = host_slots(args.hosts) if args.hosts else []
    if args.elastic:
        from horovodlite.runner import elastic_driver  # noqa: PLC0415

        return elastic_driver.run(args, slots, env)
    return gloo_launch.run(args, slots, env)


__all__ = ["main", "build_parser", "parse_args", "choose_controller", "mpi_built",
           "rank_environment", "host_slots", "read_hostfile"]


if __name__ == "__main__":
    sys.exit(main())
