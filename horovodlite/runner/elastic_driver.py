"""horovodliterun --elastic: the driver of an elastic job on the Gloo controller.

    horovodliterun --elastic -np 4 --min-np 2 -H node1:2,node2:2 python train.py
    horovodliterun --elastic -np 2 --max-np 4 --host-discovery-script ./hosts.sh python train.py

The launcher is the job's driver for its whole life. It starts each worker (here, or through
ssh or ``--ssh-agent``) with a worker number of its own and, as horovodrun, its start assignment
in HOROVOD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE, _CROSS_RANK, _CROSS_SIZE and its host's name
as ``-H`` or the discovery script gave it in HOROVOD_HOSTNAME (the rank a later round gives it is
``hvd.rank()``; the variables stay). The job starts on every slot there is, up to ``--max-np``
(``-np`` at least), on fixed hosts (``-H``) as with a discovery script. It hosts the job's store
(``rendezvous_server.py``); publishes who is in the job as rendezvous ROUNDS
(``common/elastic_rounds.py``: worker numbers in rank order); watches its workers through their
reports (``report.py``); and polls ``--host-discovery-script``. The workers meet in each round
under a fresh key prefix, with the rank it gives them (``common/elastic_worker.py``).

What changes the job, each said in one line and published as a new round:

- **Lost**: a worker that exits with an error, a worker whose core stopped beating for
  ``--elastic-heartbeat-timeout`` (2 s: stopped, frozen, or behind a cut link;
  ``elastic_beats.py``), or a host lost (its workers' report connections closed without an exit
  status: killed; or nothing heard for 15 s: a cut link). Its workers
  leave the job at once: the survivors are told (their collectives fail naming it, so
  ``hvd.elastic.run`` restores the last commit and asks for the next round), the host is
  blacklisted (``--blacklist-cooldown-range``, else for the rest of the job), and the next round
  is published without them. A worker that exits with an error takes its host's other workers
  out with it (they are stopped) while the job has workers on other hosts, as horovodrun drops a
  blacklisted host; on one host only the failed worker leaves.
- **A reset with nobody lost** (a worker's training failed, and it asked for a new round): once
  every worker of the round asked, or after HOROVOD_GLOO_TIMEOUT_SECONDS (the loss that caused
  it may not be known yet), the same workers meet again.
- **Growth**: the discovery script lists slots beyond the job's, up to ``--max-np``, on hosts
  not blacklisted: new workers start there and the next round lists them; the running workers
  learn of it at their next ``state.commit()`` (``HostsUpdatedInterrupt``).
- **Retirement**: a host the script no longer lists: its workers are left out of the next round
  (after one last sync, so what they processed counts) and exit as retired.

The job ends when its workers finish (exit 0 once every worker of the last round did), when
fewer than ``--min-np`` are left or ``--reset-limit`` rounds followed failures (a last round
that says so ends every worker), or on SIGINT/SIGTERM/SIGHUP. The driver's host is the job's
single point of failure: workers that lose its store end with an error naming it.
"""

from __future__ import annotations

import os
import signal
import socket
import time

from horovodlite.common import elastic_rounds, env_travel, launch_env, launchers
from horovodlite.runner import rank_output, remote
from horovodlite.runner.elastic_beats import BeatWatch
from horovodlite.runner.elastic_discovery import Discovery
from horovodlite.runner.elastic_places import Blacklist, Worker, start_places
from horovodlite.runner.gloo_launch import (
    POLL,
    TERM_GRACE,
    describe,
    job_address,
    rank_env,
    say,
    start_rank,
)
from horovodlite.runner.report import ReportServer, interface_addresses

LOOPBACK = ("localhost", "localhost.localdomain", "127.0.0.1", "::1")
EXIT_GRACE = 10.0  # after the job ended, for its workers to exit by themselves
FINISH_GRACE = 30.0  # after a worker finished, for the others to finish (see _finishing)
DEFAULT_ELASTIC_TIMEOUT = 600.0  # Horovod's --elastic-timeout default


class ElasticJob(Discovery):
    def __init__(self, args, slots: list, base_env: dict):
        self.args = args
        self.base_env = base_env
        self.policy = env_travel.from_args(args)  # what of base_env a worker gets, everywhere
        self.min_np = args.min_np or 1
        self.max_np = args.max_np or args.num_proc
        self.elastic_timeout = args.elastic_timeout or DEFAULT_ELASTIC_TIMEOUT
        self.reset_limit = args.reset_limit
        self.names = remote.local_names(interface_addresses())
        self.slots: dict = {}  # host -> slots: -H, then the discovery script's
        for host, n in slots:
            self.slots[self.name(host)] = self.slots.get(self.name(host), 0) + n
        from horovodlite.common.rendezvous import timeout_seconds

        try:
            self.gloo_timeout = timeout_seconds(base_env)
            self.heartbeat_timeout = launch_env.heartbeat_timeout(base_env)
        except ValueError as e:
            raise SystemExit(f"horovodliterun: {e}") from None
        # the Slurm job's nodes, followed by their states (slurm_steps.usable) when no script
        self.allocated = {} if args.host_discovery_script else {
            h: self.slots[h] for h in getattr(args, "slurm_nodes", []) if h in self.slots}
        if args.host_discovery_script:
            found = self.discover()
            if found is None:
                raise SystemExit("horovodliterun: --host-discovery-script failed at the start")
            self.slots = found
        elif self.allocated:
            found = self.discover()
            if found:  # a node drained before the start gets no rank
                self.slots = found
        others = [h for h in self.slots if not self.local(h)]
        self.addr = job_address(args.network_interface, others)
        self.workers: dict[int, Worker] = {}
        self.members: list[int] = []  # the current round's workers, rank order
        self.pending: list[int] = []  # started for growth, not ready yet (Discovery.newcomers)
        self.pending_since = 0.0  # when the first of them was started
        self.round = -1
        self.resets: elastic_rounds.ResetRequests | None = None  # this round's requests read
        self.finishing_since: float | None = None  # when a worker first finished (status 0)
        self.blacklist = Blacklist(args.blacklist_cooldown_range)
        self.failure_rounds = 0
        self.ended = ""  # why the driver ended the job
        self.first_status: int | None = None  # the first failed worker's status
        self.forwarder = rank_output.Forwarder()
        self.seen_lost: set = set()
        self.next_discovery = 0.0
        self.reset_since: float | None = None
        self.server = None
        self.reports = None
        self.beats: BeatWatch | None = None

    # -- hosts ---------------------------------------------------------------------------------
    def local(self, host: str) -> bool:
        return host in LOOPBACK or remote.is_local(host, self.names)

    @staticmethod
    def name(host: str) -> str:
        """A host's name in the job: as ``-H`` or the discovery script gives it (the workers'
        HOROVOD_HOSTNAME, as horovodrun sets it). ``localhost`` and ``127.0.0.1`` are then two
        hosts of the job, both on this machine (Horovod's way of testing host failures)."""
        return host.strip()

    def running_on(self, host: str) -> int:
        return sum(1 for w in self.members + self.pending if self.workers[w].host == host)

    # -- workers -------------------------------------------------------------------------------
    def spawn(self, host: str, place: dict) -> int:
        """Starts a worker on ``host``; ``place``: its start assignment (``start_places``)."""
        number = len(self.workers)
        settings = launch_env.elastic_worker_settings(
            number, host, self.server.addr, self.server.port, self.server.secret, self.min_np,
            self.max_np, self.elastic_timeout)
        settings.update(place)
        settings.update(launch_env.report_settings([self.addr], self.reports.port,
                                                   self.reports.token))
        if self.args.network_interface:
            settings[launch_env.GLOO_IFACE] = self.args.network_interface.split(",")[0]
        if self.args.output_filename:
            settings[launch_env.OUTPUT_FILENAME] = os.path.abspath(self.args.output_filename)
        here = self.local(host)
        proc = start_rank(number, host, here, rank_env(self.base_env, settings, self.policy),
                          self.args, self.forwarder)
        self.workers[number] = Worker(number, host, here, proc)
        return number

    def publish(self, reason: str, end: str = "", retired: list = ()) -> None:
        self.round += 1
        for w in self.members:
            if self.workers[w].first_round < 0:
                self.workers[w].first_round = self.round
        hosts = [self.workers[w].host for w in self.members]
        elastic_rounds.publish(self.server.control, elastic_rounds.Round(
            self.round, [str(w) for w in self.members], hosts, reason, end,
            [str(w) for w in retired]))
        self.reset_since = None
        self.reports.set_round(self.round)
        if self.beats is not None:  # (none: a driver without its store, in the unit tests)
            self.beats.start_round(self.round, self.members)
        if end:
            say(f"round {self.round}: the job ends: {end}")
            self.ended = end
        else:
            layout = ", ".join(f"{h}:{hosts.count(h)}" for h in dict.fromkeys(hosts))
            say(f"round {self.round}: {len(self.members)} worker"
                f"{'s' if len(self.members) != 1 else ''} ({layout})" +
                (": the job starts" if self.round == 0 else ": they reset and go on"))

    def rank_names(self, workers: list) -> str:
        """'ranks 2, 3' (their ranks in the current round; worker numbers of those not in it)."""
        ranks = [self.members.index(w) if w in self.members else w for w in workers]
        return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, sorted(ranks)))}"

    # -- watching ------------------------------------------------------------------------------
    def _statuses(self) -> None:
        """Each worker's exit status, from its report (the real one, behind ssh) or its process."""
        reported = {r.rank: r for r in self.reports.ranks}
        for w in self.workers.values():
            if w.status is not None:
                continue
            r = reported.get(w.number)
            if r is not None and r.status is not None:
                w.status, w.retired = r.status, r.retired
            elif not w.running() and (r is None or not r.connected):
                w.status = w.proc.poll()
                w.status = 128 - w.status if w.status < 0 else w.status

    def _losses(self, now: float) -> list:
        """What left the job since the last look, one line each; removes it from the members."""
        lines = []
        round_members = list(self.members)  # the round's ranks, before this look removes any
        # lost workers (the reports mark every worker of a lost host), grouped by host; a host
        # lost again after its cooldown is told to the survivors here (the reports announce a
        # host once)
        records = {r.rank: r for r in self.reports.ranks}
        by_host: dict = {}
        for number in self.members:
            r = records.get(number)
            if r is not None and r.lost:
                by_host.setdefault(self.workers[number].host, []).append((number, r.lost))
        for host, gone in by_host.items():
            why = gone[0][1]
            names = self.rank_names([w for w, _ in gone])
            for w, _ in gone:
                self.workers[w].left = f"lost with its host: {why}"
                if host in self.seen_lost:
                    self.reports.tell_failed(w, host, why)
                # one that still runs there (a Slurm step of it killed) waits no more
                self.workers[w].signal(signal.SIGTERM)
            self.seen_lost.add(host)
            self.members = [w for w in self.members if w not in dict(gone)]
            lines.append(f"lost {host} ({names}): {why}; blacklisted "
                         f"{self.blacklist.add(host, now)}")
        failed_on: list = []  # the hosts where a worker failed in this look
        for number in list(self.members):
            w = self.workers[number]
            if w.status is None or w.status == 0:
                continue
            failed_on.append(w.host)
            names = self.rank_names([number])
            self.members.remove(number)
            w.left = f"exited with {describe(w.status)}"
            if self.first_status is None:
                self.first_status = w.status
            self.reports.tell_failed(number, w.host, f"it exited with {describe(w.status)}")
            lines.append(f"{names} (worker {number}) on {w.host} exited with "
                         f"{describe(w.status)}; {w.host} blacklisted "
                         f"{self.blacklist.add(w.host, now)}")
        for number, silence in (self.beats.silent(now, self.members) if self.beats else []):
            lines.append(self._silent(number, silence, now))
            failed_on.append(self.workers[number].host)
        return lines + self._leave_with_host(failed_on, round_members)

    def _silent(self, number: int, silence: float, now: float) -> str:
        """Worker ``number`` stopped beating (elastic_beats.py): it leaves the job - killed
        (a stopped process too; one behind a cut link may not hear it) - and the others are
        told, so that their collectives with it end now."""
        w = self.workers[number]
        names = self.rank_names([number])
        why = (f"no heartbeat for {silence:.1f} s (--elastic-heartbeat-timeout "
               f"{self.heartbeat_timeout:g}): its process is stopped or frozen, its host hung, "
               "or its link cut")
        self.members.remove(number)
        w.left = f"lost: {why}"
        self.reports.written_off(number, why)
        self.reports.tell_failed(number, w.host, why)
        w.signal(signal.SIGKILL if w.local else signal.SIGTERM)
        return (f"lost {names} (worker {number}) on {w.host}: {why}; killed; {w.host} "
                f"blacklisted {self.blacklist.add(w.host, now)}")

    def _leave_with_host(self, hosts: list, round_members: list) -> list:
        """A worker failed on each of ``hosts``: while the job has workers on other hosts, the
        host's other workers leave it too (stopped: SIGTERM), as with horovodrun, which drops a
        blacklisted host's slots - a host where a worker failed is not trusted with the job.
        A job of one host keeps its other workers there (it has nowhere else to go)."""
        lines = []
        for host in dict.fromkeys(hosts):
            rest = [w for w in self.members if self.workers[w].host == host]
            if not rest or all(self.workers[w].host == host for w in self.members):
                continue
            ranks = ", ".join(f"{round_members.index(w)} (worker {w})" for w in rest)
            self.members = [w for w in self.members if w not in rest]
            for number in rest:
                self.workers[number].left = (f"stopped: a worker failed on its host {host}, "
                                             "which left the job")
                self.workers[number].signal(signal.SIGTERM)
            lines.append(f"rank{'s' if len(rest) > 1 else ''} {ranks} on {host} leave"
                         f"{'' if len(rest) > 1 else 's'} the job with its host (a worker failed "
                         "there; the job goes on on its other hosts)")
        return lines

    def _reset_wanted(self, now: float) -> bool:
        """A reset asked for with nobody lost: meet again once all asked, or after the timeout."""
        if self.resets is None or self.resets.k != self.round:
            self.resets = elastic_rounds.ResetRequests(self.server.control, self.round)
        asked = self.resets.count([str(w) for w in self.members])
        if asked == 0:
            return False
        if self.reset_since is None:
            self.reset_since = now
        return asked >= len(self.members) or now - self.reset_since >= self.gloo_timeout

    def step(self, now: float) -> None:
        """One look at the job; publishes a round when it changed."""
        self._statuses()
        if self._finishing(now):
            return
        lost = self._losses(now)
        retire, _ = self._discovery(now) if not lost else ([], [])
        grown = self.newcomers(now) if not lost and not retire else []
        reasons = list(lost)
        if retire:
            hosts = sorted({self.workers[w].host for w in retire})
            source = ("the host discovery output" if self.args.host_discovery_script else
                      "the nodes Slurm offers (sinfo: drained, down or not responding)")
            reasons.append(f"{', '.join(hosts)} left {source}: {self.rank_names(retire)} retire")
            self.members = [w for w in self.members if w not in retire]
            for w in retire:
                self.workers[w].left = f"retired: its host left {source}"
        if grown:
            hosts = ", ".join(f"{h}:{grown.count(h)}" for h in dict.fromkeys(grown))
            reasons.append(f"added {len(grown)} worker{'s' if len(grown) > 1 else ''} on {hosts} "
                           f"({self.growth_source()}); they join at the next commit")
        if not reasons and self._reset_wanted(now):
            reasons.append("a worker's training failed; the same workers meet again")
            lost = ["reset"]
        for line in reasons:
            say(line)
        if not reasons:
            return
        if lost:
            self.failure_rounds += 1
        if not self.members or len(self.members) < self.min_np:
            self.publish("; ".join(reasons), end=f"{len(self.members)} worker"
                         f"{'s' if len(self.members) != 1 else ''} left, fewer than --min-np "
                         f"{self.min_np}")
        elif self.reset_limit is not None and self.failure_rounds > self.reset_limit:
            self.publish("; ".join(reasons), end=f"more than --reset-limit {self.reset_limit} "
                                                 "resets")
        else:
            self.publish("; ".join(reasons), retired=retire)

    def _finishing(self, now: float) -> bool:
        """Whether the training finished: a worker of the round exited with status 0 (its
        script returned). The job then neither grows nor publishes rounds: the others are
        finishing too. A worker still running FINISH_GRACE s later that a round after the first
        added and that either never met a round (no heartbeat of it seen, elastic_beats.py) or
        came with the newest round is one the discovery script added as the training ended (it
        waits to meet a round the others never joined): it is stopped and leaves the job, which
        completes without it. Any other worker still running is finishing (rank 0 saving a
        checkpoint): it is waited for, and the job fails naming it if it does not exit 0."""
        if not any(self.workers[w].status == 0 and not self.workers[w].retired
                   for w in self.members):
            return False
        if self.finishing_since is None:
            self.finishing_since = now
        if now - self.finishing_since < FINISH_GRACE:
            return True
        for number in [w for w in self.members if self.workers[w].status is None
                       and 0 < self.workers[w].first_round
                       and (self.round == self.workers[w].first_round
                            or (self.beats is not None and w not in self.beats.met))]:
            worker = self.workers[number]
            self.members.remove(number)
            worker.left = "stopped: the training finished without it (added as it ended)"
            say(f"worker {number} on {worker.host} is stopped: the training finished without "
                "it (added as it ended)")
            worker.signal(signal.SIGTERM)
        for number in self.pending:  # started for growth, never ready: not in any round
            self.workers[number].left = "stopped: the training finished before it joined"
            self.workers[number].signal(signal.SIGTERM)
        self.pending = []
        return True

    def done(self) -> bool:
        """Every worker of the job has finished (or none runs any more)."""
        if not any(w.running() for w in self.workers.values()):
            return True
        return bool(self.members) and all(self.workers[w].status == 0 for w in self.members)

    def signal_all(self, sig) -> None:
        for w in self.workers.values():
            w.signal(sig)

    def run(self, initial: list) -> int:
        from horovodlite.runner.rendezvous_server import RendezvousServer

        asked: list = []
        previous = {sig: signal.signal(sig, lambda s, _f: asked.append(s))
                    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        self.reports = ReportServer(bind=self.addr, on_lost=lambda *_: None)
        try:
            with RendezvousServer(self.addr, timeout_seconds=self.elastic_timeout) as server:
                self.server = server
                self.beats = BeatWatch(server.store, server.secret,
                                       launchers.elastic_job(server.secret),
                                       self.heartbeat_timeout)
                self.members = [self.spawn(h, p) for h, p in zip(initial,
                                                                   start_places(initial))]
                self.publish("the job starts")
                self.next_discovery = time.monotonic() + launch_env.discovery_interval(
                    self.base_env)
                self._watch(asked)
                self.forwarder.join(3.0)
                self.reports.wait_for_exits(3.0)
                self._statuses()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.signal_all(signal.SIGKILL)
            self.reports.close()
        return self.outcome()

    def _watch(self, asked: list) -> None:
        """Until no worker runs: looks at the job every POLL s; once it ended (or finished with
        workers out of it still running, e.g. behind a cut link), SIGTERM to what still runs,
        SIGKILL TERM_GRACE s later."""
        deadline = None
        stage = 0
        while any(w.running() for w in self.workers.values()):
            now = time.monotonic()
            if asked and not self.ended:
                self.publish("", end=f"horovodliterun was asked to stop "
                                     f"({signal.Signals(asked[0]).name})")
                deadline = now
            if not self.ended:
                self.step(now)
            if deadline is None and self.ended:
                deadline = now + EXIT_GRACE  # the workers end themselves on the last round
            elif deadline is None and self.done():
                deadline = now
            if deadline is not None and now >= deadline:
                self.reports.expect_endings()
                if stage == 2:
                    return
                stage += 1
                self.signal_all(signal.SIGTERM if stage == 1 else signal.SIGKILL)
                deadline = now + TERM_GRACE
            time.sleep(POLL)

    def outcome(self) -> int:
        finished = [w for w in self.members if self.workers[w].status == 0]
        departures = [f"worker {w.number} on {w.host}: {w.left}"
                      for w in self.workers.values() if w.left]
        # the last round's workers that failed after the job's last look (or after its end)
        failed = [self.workers[n] for n in self.members
                  if self.workers[n].status not in (None, 0) and not self.workers[n].left]
        departures += [f"worker {w.number} on {w.host}: exited with {describe(w.status)}"
                       for w in failed]
        if self.first_status is None and failed:
            self.first_status = failed[0].status
        if self.ended or len(finished) < self.min_np or len(finished) < len(self.members):
            why = self.ended or (f"{len(finished)} of the last round's {len(self.members)} "
                                 "workers finished")
            say(f"the elastic job did not complete: {why}")
            for line in departures:
                say(f"  {line}")
            return self.first_status if self.first_status and self.first_status > 0 else 1
        if departures:
            say(f"the elastic job completed with {len(finished)} workers, without:")
            for line in departures:
                say(f"  {line}")
        return 0


def run(args, slots: list, base_env: dict) -> int:
    """Runs the elastic job (see the top); returns horovodliterun's exit status."""
    job = ElasticJob(args, slots, base_env)
    hosts = job.slots
    initial: list = []
    for host, n in hosts.items():
        initial += [host] * n
    if not initial:  # no -H and no discovery script: every worker here
        initial = [socket.gethostname()] * args.num_proc
    if len(initial) < args.num_proc:
        raise SystemExit(f"horovodliterun: -np {args.num_proc} but the hosts given have "
                         f"{len(initial)} slot(s); the Gloo launcher starts one worker per slot")
    # as horovodrun: the job starts on every slot there is, up to --max-np (-np at least)
    return job.run(initial[:max(args.num_proc, min(job.max_np, len(initial)))])
