"""horovodliterun --gloo: the launcher starts the ranks itself, without MPI.

    horovodliterun --gloo -np 4 -H node1:2,node2:2 python train.py

What it does, in order:

1. Placement: ranks by slot (node1 gets ranks 0 and 1), each rank's host named as in ``-H``
   (``HOROVOD_HOSTNAME``; ranks of one name share memory). Without ``-H`` every rank runs here.
2. The job's address: ``--network-interface``'s address; else, with other hosts, the address
   this machine reaches the first of them from; else 127.0.0.1. The rendezvous (a TCPStore with
   the job's secret, ``rendezvous_server.py``) and the rank reports (``report.py``) listen there
   only.
3. The ranks: each is the rank wrapper (``task.py``) around the command, started here as a
   child process when its host is this machine, otherwise through ssh or ``--ssh-agent``
   (``remote.py``), with the launcher's knobs and environment and its own Gloo variables
   (``launch_env.gloo_rank_settings``). Their output reaches the console line by line with a
   ``[rank]<stdout>:`` prefix (``rank_output.py``).
4. Watching: every rank reports "started" to the launcher; one that has not within
   ``--start-timeout`` seconds fails the job at once, naming it. When a rank fails (exits
   non-zero, is killed, or its host is lost), the launcher tells the others at once (the rank
   reports' notices: their runtime fails its collectives naming it, as the Gloo controller's
   own watchdog and shared-memory liveness checks would, later, on other hosts), and they get
   HOROVOD_GLOO_TIMEOUT_SECONDS (+ FAIL_GRACE) to raise HorovodInternalError and end by
   themselves; then whatever still runs is ended (SIGTERM, SIGKILL TERM_GRACE s later).
   SIGINT/SIGTERM/SIGHUP to the launcher end the ranks the same way.
5. The outcome, as in MPI mode: exit 0 only if every rank exited 0; otherwise each rank that
   failed, was killed, was lost or never started is named, and the exit status is that of the
   first failure the launcher saw (128 + N for signal N; 1 for a lost host).
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

from horovodlite.common import env_travel, launch_env
from horovodlite.runner import rank_output, remote
from horovodlite.runner.report import ReportServer, interface_addresses

FAIL_GRACE = 5.0  # beyond HOROVOD_GLOO_TIMEOUT_SECONDS, for the survivors of a failed rank
TERM_GRACE = 10.0  # after SIGTERM, before SIGKILL
EXIT_REPORT_GRACE = 3.0
POLL = 0.2


def place(num_proc: int, slots: list) -> list:
    """Each rank's host, by slot: [('a', 2), ('b', 2)] and 3 ranks give ['a', 'a', 'b']."""
    if not slots:
        return [socket.gethostname()] * num_proc
    total = sum(n for _, n in slots)
    if num_proc > total:
        raise SystemExit(f"horovodliterun: -np {num_proc} but the hosts given have {total} "
                         "slot(s); the Gloo launcher starts one rank per slot")
    hosts = [h for h, n in slots for _ in range(n)]
    return hosts[:num_proc]


def job_address(interface: str | None, remote_hosts: list) -> str:
    """Where the rendezvous and the reports listen (see the top)."""
    if interface:
        first = interface.split(",")[0]
        found = [a for a in interface_addresses([first])]
        if not found:
            raise SystemExit(f"horovodliterun: --network-interface {first}: this machine has "
                             "no IPv4 address on it")
        return found[0]
    if not remote_hosts:
        return "127.0.0.1"
    try:
        target = socket.getaddrinfo(remote_hosts[0], 22, socket.AF_INET, socket.SOCK_DGRAM)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(target[0][4])
            return probe.getsockname()[0]
    except OSError as e:
        raise SystemExit(f"horovodliterun: cannot find the address this machine reaches "
                         f"{remote_hosts[0]} from ({e}); name the interface with "
                         "--network-interface") from None


def rank_env(base: dict, settings: dict, policy: env_travel.Policy | None = None) -> dict:
    """A rank's environment here: the launcher's as ``env_travel`` lets it reach this host's
    ranks (no MPI identity: the launcher itself may run inside an MPI job), and ``settings``."""
    env = (policy or env_travel.Policy()).local(base)
    env.update(settings)
    return env


def start_rank(label: int, host: str, here: bool, env: dict, args, forwarder) -> subprocess.Popen:
    """Starts one rank (the wrapper ``task.py`` around the command) here or on ``host`` through
    ssh or ``--ssh-agent``; its output goes to ``forwarder`` prefixed with ``[label]``."""
    cwd = os.getcwd()
    wrapper = [sys.executable, "-m", "horovodlite.runner.task"]
    if here:
        argv = [*wrapper, "--", *args.command]
    else:
        argv = remote.remote_command(
            host, [*wrapper, "--env-on-stdin", "--", *args.command], env, cwd,
            args.ssh_agent, args.ssh_port, args.ssh_identity_file)
    if args.verbose:
        print(f"horovodliterun: rank {label} on {host}: {shlex.join(argv)}", flush=True)
    try:
        proc = subprocess.Popen(
            argv, env=env if here else None, cwd=cwd,
            stdin=subprocess.DEVNULL if here else subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    except OSError as e:
        raise SystemExit(f"horovodliterun: cannot start rank {label} on {host}: "
                         f"{argv[0]}: {e.strerror}") from None
    if not here:
        try:
            proc.stdin.write(remote.stdin_block(env, env_travel.from_args(args)))
            proc.stdin.close()
        except OSError:
            pass  # it ended already: its status says why
    forwarder.add(label, "stdout", proc.stdout)
    forwarder.add(label, "stderr", proc.stderr)
    return proc


@dataclass
class RankProcess:
    rank: int
    host: str
    local: bool
    proc: subprocess.Popen

    def running(self) -> bool:
        return self.proc.poll() is None

    def status(self) -> int | None:
        code = self.proc.poll()
        return None if code is None else (128 - code if code < 0 else code)


class GlooJob:
    """One job's ranks, from start to outcome (see the top)."""

    def __init__(self, args, hosts: list, base_env: dict):
        self.args = args
        self.hosts = hosts
        self.size = len(hosts)
        self.base_env = base_env
        names = remote.local_names(interface_addresses())
        self.local = [remote.is_local(h, names) for h in hosts]
        others = list(dict.fromkeys(h for h, here in zip(hosts, self.local) if not here))
        self.addr = job_address(args.network_interface, others)
        from horovodlite.common.rendezvous import timeout_seconds

        try:
            self.grace = timeout_seconds(base_env) + FAIL_GRACE
        except ValueError as e:
            raise SystemExit(f"horovodliterun: {e}") from None
        self.start_timeout = args.start_timeout
        self.ranks: list[RankProcess] = []
        self.not_started: list[int] = []  # ranks the start timeout caught
        self.first_failure: tuple | None = None  # failure(): the first the launcher saw
        self.killed: list[int] = []  # ranks still running after SIGTERM, killed
        self.forwarder = rank_output.Forwarder()

    # -- starting ------------------------------------------------------------------------------
    def settings(self, server, reports) -> list:
        extra = launch_env.report_settings([self.addr], reports.port, reports.token)
        if self.args.network_interface:
            extra[launch_env.GLOO_IFACE] = self.args.network_interface.split(",")[0]
        if self.args.output_filename:
            extra[launch_env.OUTPUT_FILENAME] = os.path.abspath(self.args.output_filename)
        return [dict(s, **extra) for s in server.rank_environment(self.hosts)]

    def start(self, server, reports) -> None:
        for rank, settings in enumerate(self.settings(server, reports)):
            proc = start_rank(rank, self.hosts[rank], self.local[rank],
                              rank_env(self.base_env, settings, env_travel.from_args(self.args)),
                              self.args, self.forwarder)
            self.ranks.append(RankProcess(rank, self.hosts[rank], self.local[rank], proc))

    # -- watching ------------------------------------------------------------------------------
    def failure(self, reports) -> tuple | None:
        """The first sign that the job failed: (rank or None, exit status or None, in words,
        host or None); None while there is none."""
        if reports.lost_hosts:
            host, why = next(iter(reports.lost_hosts.items()))
            return None, None, f"lost {host}: {why}", None
        for r in sorted(reports.ranks, key=lambda r: r.last_heard):  # the earliest exit first
            if r.status not in (None, 0):
                return r.rank, r.status, f"rank {r.rank} on {r.host} exited with " \
                                         f"{describe(r.status)}", r.host
        for p in self.ranks:
            if p.status() not in (None, 0):
                return p.rank, p.status(), f"rank {p.rank} on {p.host} exited with " \
                                           f"{describe(p.status())}", p.host
        return None

    def unstarted(self, reports) -> list:
        """Ranks still running that have not reported "started"."""
        missing = set(reports.unconfirmed(self.size))
        return [p.rank for p in self.ranks if p.rank in missing and p.running()]

    def signal_all(self, stage: int) -> None:
        """Stage 1: SIGTERM to every wrapper (it passes it on) or ssh still running; stage 2:
        SIGKILL to their process groups."""
        for p in self.ranks:
            if not p.running():
                continue
            try:
                if stage == 1:
                    p.proc.send_signal(signal.SIGTERM)
                else:
                    self.killed.append(p.rank)
                    os.killpg(p.proc.pid, signal.SIGKILL)
            except OSError:
                pass

    def wait(self, reports) -> None:
        """Until every rank's process has ended (see the top for when the launcher ends them)."""
        began = time.monotonic()
        asked: list = []
        deadline = None
        stage = 0
        previous = {sig: signal.signal(sig, lambda s, _f: asked.append(s))
                    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        try:
            while any(p.running() for p in self.ranks):
                now = time.monotonic()
                if asked and deadline is None:
                    say(f"asked to stop ({signal.Signals(asked[0]).name}): ending the ranks")
                    deadline = now
                if deadline is None:
                    deadline = self._check(reports, now - began, now)
                if deadline is not None and now >= deadline and stage < 2:
                    stage += 1
                    if stage == 2:  # a wrapper killed reports nothing: no lost host for that
                        reports.expect_endings()
                    self.signal_all(stage)
                    deadline = now + TERM_GRACE
                time.sleep(POLL)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if any(p.running() for p in self.ranks):
                self.signal_all(2)

    def _check(self, reports, elapsed: float, now: float) -> float | None:
        """When to start ending the ranks, if now is the time to decide it; else None."""
        failure = self.failure(reports)
        if failure is not None:
            self.first_failure = failure
            rank, status, _, host = failure
            if rank is not None:  # a lost host was told to the survivors already
                reports.tell_failed(rank, host, f"it exited with {describe(status)}")
            if rank in reports.unconfirmed(self.size):  # the others cannot even meet
                say(f"{failure[2]} before it started; ending the job")
                return now
            if any(p.running() for p in self.ranks):
                say(f"{failure[2]}; the other ranks get {self.grace:g} s to end")
            return now + self.grace
        if self.start_timeout and elapsed >= self.start_timeout:
            late = self.unstarted(reports)
            if late:
                self.not_started = late
                say(f"rank(s) {', '.join(map(str, late))} did not start within "
                    f"{self.start_timeout:g} s (--start-timeout); ending the job")
                return now
        return None

    # -- the outcome ---------------------------------------------------------------------------
    def outcome(self, reports) -> tuple:
        """(problems, exit status) once every rank has ended."""
        killed = {f"rank {p.rank} on {p.host} ended without reporting its exit status": p
                  for p in self.ranks if p.rank in self.killed}
        problems = [p if p not in killed else
                    f"rank {killed[p].rank} on {killed[p].host} was killed by horovodliterun: it "
                    f"was still running {TERM_GRACE:g} s after SIGTERM"
                    for p in reports.summary(self.size)]
        seen = {r.rank for r in reports.ranks}
        for p in self.ranks:
            if p.rank in seen:
                continue
            how = "it" if p.local else ("its --ssh-agent" if self.args.ssh_agent else "its ssh")
            if p.rank in self.not_started:
                problems.append(f"rank {p.rank} on {p.host} did not start within "
                                f"{self.start_timeout:g} s (--start-timeout)")
            elif p.status():
                problems.append(f"rank {p.rank} on {p.host} never started: {how} exited with "
                                f"{describe(p.status())} (its output is above)")
        if not problems:
            return [], 0
        # the status of the failure the launcher saw first (survivors often exit 1 before the
        # failed rank's own status arrives, so this is no verdict on who failed first)
        first = (self.first_failure or self.failure(reports) or (None, None))[1]
        if self.not_started:  # the launcher ended the others itself
            first = None
        return problems, exit_status(first)


def exit_status(status: int | None) -> int:
    """horovodliterun's status for a job whose first failed rank ended with ``status`` (a
    report's: negative for a signal): that status, 128 + the signal, or 1."""
    if not status:
        return 1
    return 128 - status if status < 0 else status


def describe(status: int) -> str:
    """A rank's status as reports give it (negative: killed by that signal) or as a shell does
    (128 + signal)."""
    if status < 0:
        return f"signal {-status}"
    return f"status {status}"


def say(text: str) -> None:
    sys.stderr.write(f"horovodliterun: {text}\n")
    sys.stderr.flush()


def _say_lost(host: str, ranks: list, why: str) -> None:
    say(f"lost {host} (rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}): {why}")


def run(args, slots: list, base_env: dict) -> int:
    """Runs the job (see the top); returns horovodliterun's exit status."""
    from horovodlite.runner.rendezvous_server import RendezvousServer

    job = GlooJob(args, place(args.num_proc, slots), base_env)
    reports = ReportServer(bind=job.addr, on_lost=_say_lost)
    try:
        with RendezvousServer(job.addr) as server:
            if args.verbose:
                print(f"horovodliterun: rendezvous at {server.addr}:{server.port}, reports at "
                      f"{job.addr}:{reports.port}", flush=True)
            try:
                job.start(server, reports)
            except BaseException:
                job.signal_all(1)  # the ranks started so far would wait for the others
                job.wait(reports)
                raise
            job.wait(reports)
            job.forwarder.join(EXIT_REPORT_GRACE)
            reports.wait_for_exits(EXIT_REPORT_GRACE)
    finally:
        reports.close()
    problems, status = job.outcome(reports)
    if problems:
        sys.stderr.write("horovodliterun: the job did not complete:\n" +
                         "".join(f"  {p}\n" for p in problems))
    return status
