"""horovodliterun's side of the rank reports (see ``task.py``): who started, who is alive, who
exited with what, and which hosts were lost; and the launcher's word to the survivors (a lost
host; under --gloo also a failed rank).

A rank is *lost* when its connection closes without an exit status (its processes were killed,
e.g. the machine crashed) or when nothing came from it for LOST_AFTER seconds (its network went
down). Lost ranks are announced once per host, naming the host and its ranks.

Every line either way is signed with the job's report token (``report_channel.py``); a
connection whose line is not (a stranger that reached the port, garbage) is closed, said once on
stderr, and changes nothing. The server listens on the address it is given: the job's address,
never every interface.

Connections that say nothing cannot hold the server's descriptors: one that has not sent a
signed hello within HELLO_SECONDS of its accept (``HVDL_REPORT_HELLO_SECONDS``; a rank's wrapper
sends its hello at once) is closed, and at most MAX_PENDING connections wait for their hello at
a time (the oldest is closed for a newer one). When ``accept`` still fails for lack of
descriptors (EMFILE: the process's other files), the server closes the oldest connection
waiting for its hello, or, with none, gives up a descriptor it holds in reserve for this, accepts
the waiting connection and closes it: each failure frees a descriptor, so the loop never spins
on a listening socket it cannot serve, and a real rank gets through once the flood is shed.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import secrets
import selectors
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass, field

from horovodlite.runner import report_channel

LOST_AFTER = 15.0
HEARTBEAT = 2.0
HELLO_SECONDS = 10.0  # a connection's bound from accept to its signed hello (see the top)
# connections waiting for their hello at once: as many as the listen backlog, so that a job's
# ranks all connecting at its start (thousands, each saying its hello within milliseconds of
# the challenge) are never closed for room
MAX_PENDING = 1024
ACCEPTS_PER_WAKE = 64  # accepts in one turn of the loop (the heartbeats go on under a flood)
_NO_DESCRIPTOR = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


def hello_seconds(env=os.environ) -> float:
    """``HVDL_REPORT_HELLO_SECONDS`` (a positive number), else HELLO_SECONDS."""
    try:
        value = float(env.get("HVDL_REPORT_HELLO_SECONDS", HELLO_SECONDS))
    except ValueError:
        return HELLO_SECONDS
    return value if value > 0 else HELLO_SECONDS


def interface_addresses(interfaces: list | None = None) -> list:
    """IPv4 addresses of this machine's interfaces (only `interfaces` if given), loopback last."""
    found = []
    for _, name in socket.if_nameindex():
        if interfaces and name not in interfaces:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:  # SIOCGIFADDR
                raw = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
            except OSError:
                continue  # no IPv4 address
        addr = socket.inet_ntoa(raw[20:24])
        found.append(addr)
    return sorted(set(found), key=lambda a: (a.startswith("127."), a))


@dataclass
class Rank:
    rank: int | None
    host: str
    pid: int
    status: int | None = None       # exit status, once reported
    retired: bool = False           # it left an elastic job on purpose (status 0)
    lost: str | None = None         # why it is considered lost
    connected: bool = True          # its report connection is open
    last_heard: float = field(default_factory=time.monotonic)
    added: bool = False             # started by an elastic job growing (not by mpirun)

    def label(self) -> str:
        return f"rank {self.rank}" + (" (added while training)" if self.added else "")


class ReportServer:
    """Accepts the ranks' reports on a background thread; `on_lost(host, ranks, why)` is called
    (from that thread) once per host whose ranks were lost."""

    def __init__(self, bind: str, on_lost=None, tell_survivors: bool = True):
        self.token = secrets.token_hex(16)
        # Elastic jobs learn of lost ranks from MPI itself (ULFM) and go on without them: the
        # survivors must not be told to abort.
        self.tell_survivors = tell_survivors
        # An elastic Gloo job's current rendezvous round (its driver sets it): the news sent to
        # the survivors names it, so that a rank already in a later round ignores it.
        self.round: int | None = None
        self.on_lost = on_lost or (lambda host, ranks, why: None)
        # What a rank added while the job runs (an elastic MPI job's growth) gets of the job's
        # environment, over its host's (``report_channel.env_parts``); the launcher sets it.
        self.added_env: dict = {}
        self.ranks: list[Rank] = []
        self.lost_hosts: dict[str, str] = {}
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._sel = selectors.DefaultSelector()
        self._srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._srv.bind((bind, 0))
        self._srv.listen(MAX_PENDING)
        self._srv.setblocking(False)
        self._sel.register(self._srv, selectors.EVENT_READ, None)
        # -> [buffer, Rank or None, report_channel.Channel, the peer's "addr:port", accepted at]
        self._conns: dict[socket.socket, list] = {}
        self.refused = 0  # connections closed for a line not signed with the token
        self.hello_seconds = hello_seconds()
        self.closed_idle = 0  # connections closed for no hello within hello_seconds
        self.closed_for_room = 0  # closed to make room (MAX_PENDING, no descriptor left)
        self.accept_failures = 0  # accepts that failed for lack of a descriptor
        self._reserve: int | None = os.open(os.devnull, os.O_RDONLY)  # freed on EMFILE
        self._stop = threading.Event()
        self._ending = False  # mpirun has ended: connections closing now are no lost hosts
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return self._srv.getsockname()[1]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for conn in list(self._conns):
            conn.close()
        self._srv.close()
        if self._reserve is not None:
            os.close(self._reserve)
            self._reserve = None

    # -- the serving thread ------------------------------------------------------------------
    def _serve(self) -> None:
        next_beat = time.monotonic() + HEARTBEAT
        while not self._stop.is_set():
            for key, _ in self._sel.select(timeout=0.5):
                if key.fileobj is self._srv:
                    self._accept()
                else:
                    self._read(key.fileobj)
            now = time.monotonic()
            if now >= next_beat:
                next_beat = now + HEARTBEAT
                for conn, (_, rank, _, _, _) in list(self._conns.items()):
                    if rank is not None:
                        try:
                            conn.send(b"\n")
                        except OSError:
                            pass
            self._check_silence(now)

    def _accept(self) -> None:
        for _ in range(ACCEPTS_PER_WAKE):
            try:
                conn, peer = self._srv.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno not in _NO_DESCRIPTOR:
                    return  # (ECONNABORTED and the like: that connection is gone)
                self.accept_failures += 1
                if not self._close_oldest_pending():
                    self._shed_one()
                continue
            self._take(conn, peer)
            if self._pending() > MAX_PENDING:
                self._close_oldest_pending()

    def _take(self, conn, peer) -> None:
        value = report_channel.challenge()
        try:
            conn.sendall(report_channel.challenge_line(value))  # a fresh socket takes it whole
        except OSError:
            conn.close()
            return
        conn.setblocking(False)
        channel = report_channel.Channel(self.token, value, report_channel.LAUNCHER)
        self._conns[conn] = [b"", None, channel, f"{peer[0]}:{peer[1]}", time.monotonic()]
        self._sel.register(conn, selectors.EVENT_READ, None)

    def _pending(self) -> int:
        return sum(1 for state in self._conns.values() if state[1] is None)

    def _close_oldest_pending(self) -> bool:
        """Closes the connection that has waited longest for its hello; False with none."""
        waiting = [(state[4], id(conn), conn) for conn, state in self._conns.items()
                   if state[1] is None]
        if not waiting:
            return False
        self.closed_for_room += 1
        self._drop(min(waiting)[2])
        return True

    def _shed_one(self) -> None:
        """No descriptor left and none to free: the reserve one lets one waiting connection
        be accepted and closed (the listening socket would otherwise stay ready: a spin)."""
        if self._reserve is not None:
            os.close(self._reserve)
            self._reserve = None
        try:
            conn, _ = self._srv.accept()
            conn.close()
            self.closed_for_room += 1
        except OSError:
            pass
        try:
            self._reserve = os.open(os.devnull, os.O_RDONLY)
        except OSError:
            self._reserve = None  # taken again at the next failure (the ranks' own hold them)

    def _refuse(self, conn, why: str) -> None:
        """Closes a connection that spoke out of turn; says so (the job goes on)."""
        _, rank, _, peer, _ = self._conns[conn]
        self.refused += 1
        who = f"{rank.label()} on {rank.host}'s connection" if rank else "a connection"
        sys.stderr.write(f"horovodliterun: ignored {who} to the rank reports from {peer}: "
                         f"{why}; it is closed\n")
        sys.stderr.flush()
        self._drop(conn)

    def _drop(self, conn) -> None:
        self._sel.unregister(conn)
        _, rank, _, _, _ = self._conns.pop(conn)
        conn.close()
        if rank is not None:
            rank.connected = False
        if rank is not None and rank.status is None and not self._ending:
            self._mark_lost([rank], "its connection closed without an exit status (its "
                                    "processes were killed or the machine went down)")

    def _read(self, conn) -> None:
        try:
            data = conn.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(conn)
            return
        state = self._conns[conn]
        state[0] += data
        while b"\n" in state[0]:
            line, state[0] = state[0].split(b"\n", 1)
            if not line.strip():
                continue
            try:
                msg = json.loads(state[2].open(line))
                if not isinstance(msg, dict):
                    raise ValueError("a line that is no JSON object")
            except ValueError as e:
                self._refuse(conn, str(e).splitlines()[0][:200])
                return
            if not self._handle(conn, state, msg):
                self._refuse(conn, "a first line that is not a rank's hello")
                return
        if len(state[0]) > report_channel.MAX_LINE:
            self._refuse(conn, f"more than {report_channel.MAX_LINE} bytes without a line end")

    def _handle(self, conn, state, msg) -> bool:
        rank = state[1]
        if rank is None:
            if msg.get("event") != "started":
                return False
            rank = Rank(msg.get("rank"), str(msg.get("host")), int(msg.get("pid", 0)),
                        added=bool(msg.get("added", False)))
            state[1] = rank
            with self._lock:
                self.ranks.append(rank)
            try:
                conn.setblocking(True)
                with self._send_lock:
                    conn.sendall(state[2].seal({"event": "ok"}))
                    if rank.added:
                        for part in report_channel.env_parts(self.added_env):
                            conn.sendall(state[2].seal(part))
                conn.setblocking(False)
            except OSError:
                return False
            return True
        rank.last_heard = time.monotonic()
        if msg.get("event") == "exited":
            rank.status = int(msg.get("status", 1))
            rank.retired = bool(msg.get("retired", False))
        return True

    def tell_failed(self, rank: int, host: str, why: str) -> None:
        """Tells every rank still running that ``rank`` on ``host`` failed (``why``: "it exited
        with status 3"); each one's runtime then fails its collectives naming it (the Gloo
        launch: nothing else tells the ranks of other hosts at once)."""
        self._tell_survivors({"event": "failed", "rank": rank, "host": host, "why": why})

    def written_off(self, rank: int, why: str) -> None:
        """The launcher takes ``rank`` for lost (``why``) and kills it: its connection closing
        then says nothing of its host, and it is told nothing more."""
        with self._lock:
            for r in self.ranks:
                if r.rank == rank and r.status is None and r.lost is None:
                    r.lost = why

    def set_round(self, k: int) -> None:
        """The elastic driver's new round. Under the lock ``_mark_lost`` holds: news of a loss
        marked in round k is told as round k, never as the round the driver published on
        seeing it (a survivor already there would abort a live round for a loss of the last)."""
        with self._lock:
            self.round = k

    def _tell_survivors(self, message: dict, round_: int | None = None) -> None:
        round_ = self.round if round_ is None else round_
        if round_ is not None:  # an elastic job: the round the news concerns
            message = dict(message, round=round_)
        with self._send_lock:  # a channel numbers its lines: one sender at a time
            for conn, (_, rank, channel, _, _) in list(self._conns.items()):
                if rank is not None and rank.status is None and rank.lost is None:
                    try:
                        conn.send(channel.seal(message))
                    except OSError:
                        pass

    def _check_silence(self, now: float) -> None:
        idle = [conn for conn, state in self._conns.items()
                if state[1] is None and now - state[4] > self.hello_seconds]
        for conn in idle:
            self._drop(conn)
        if idle:
            self.closed_idle += len(idle)
            sys.stderr.write(f"horovodliterun: closed {len(idle)} connection"
                             f"{'s' if len(idle) > 1 else ''} to the rank reports that sent no "
                             f"signed hello within {self.hello_seconds:g} s "
                             "(HVDL_REPORT_HELLO_SECONDS)\n")
            sys.stderr.flush()
        silent = [r for _, r, _, _, _ in self._conns.values()
                  if r is not None and r.status is None and r.lost is None
                  and now - r.last_heard > LOST_AFTER]
        if silent:
            self._mark_lost(silent, f"nothing heard from it for {LOST_AFTER:.0f} s (its "
                                    "network or machine is down)")

    def _mark_lost(self, ranks: list, why: str) -> None:
        hosts: list[str] = []
        with self._lock:
            round_ = self.round  # before anyone can see the loss (set_round)
            for r in ranks:
                if r.lost is None:
                    r.lost = why
                    hosts += [r.host] if r.host not in hosts else []
            for host in hosts:
                if host in self.lost_hosts:
                    continue
                self.lost_hosts[host] = why
                # every rank on that host that has not exited is gone with it
                for other in self.ranks:
                    if other.host == host and other.status is None and other.lost is None:
                        other.lost = why
                names = sorted(o.rank for o in self.ranks if o.host == host and o.lost)
                self.on_lost(host, names, why)
                if self.tell_survivors:
                    self._tell_survivors({"event": "lost", "host": host, "ranks": names,
                                          "why": why}, round_)

    # -- after the job -----------------------------------------------------------------------
    def all_accounted_for(self, size: int) -> bool:
        """Every rank reported its exit or was lost: nothing of the job runs any more."""
        with self._lock:
            done = {r.rank for r in self.ranks if r.status is not None or r.lost is not None}
            running = any(r.status is None and r.lost is None for r in self.ranks)
        return len(done) >= size and not running  # (ranks added while training included)

    def expect_endings(self) -> None:
        """The launcher itself ends the job now (or has ended it): a connection that closes from
        here on is no lost host."""
        self._ending = True

    def wait_for_exits(self, timeout: float) -> None:
        """Once mpirun has ended: waits up to `timeout` s for the ranks still connected to report
        their exit status. After a lost host, mpirun may end before the survivors have raised
        and exited; their statuses are still worth reporting."""
        self.expect_endings()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if not any(r.connected and r.status is None and r.lost is None
                           for r in self.ranks):
                    return
            time.sleep(0.05)

    def summary(self, size: int) -> list:
        """Problems that mean the job did not complete (empty when every reported rank exited
        with status 0). Ranks that never reported are left to mpirun's status."""
        with self._lock:
            ranks = list(self.ranks)
        problems = []
        for host, why in self.lost_hosts.items():
            lost = sorted(r.rank for r in ranks if r.host == host and r.lost)
            problems.append(f"lost {host} (rank{'s' if len(lost) > 1 else ''} "
                            f"{', '.join(map(str, lost))}): {why}")
        failed = sorted((r.rank, r.host, r.status) for r in ranks
                        if r.status not in (None, 0) and not r.lost)
        for rank, host, status in failed:
            how = f"signal {-status}" if status < 0 else f"status {status}"
            problems.append(f"rank {rank} on {host} exited with {how}")
        vanished = sorted((r.rank, r.host) for r in ranks
                          if r.status is None and not r.lost and r.host not in self.lost_hosts)
        for rank, host in vanished:
            problems.append(f"rank {rank} on {host} ended without reporting its exit status")
        return problems

    def elastic_outcome(self, size: int, min_np: int) -> tuple[list, list]:
        """(problems, departures) of an elastic job: it completed if at least ``min_np`` ranks
        exited with status 0; every other rank is a departure (lost, killed, failed), which
        ends the job only when too few ranks finished."""
        with self._lock:
            ranks = list(self.ranks)
        # a rank number may be on two records: a rank lost, then one added under its number
        finished = [r for r in ranks if r.status == 0 and not r.lost and not r.retired]
        departures = []
        for r in sorted(ranks, key=lambda r: (r.rank is None, r.rank or 0, r.added)):
            if any(r is f for f in finished):
                continue
            if r.retired:
                departures.append(f"{r.label()} on {r.host} retired: its host left the host "
                                  "discovery output")
            elif r.lost:
                departures.append(f"{r.label()} on {r.host} was lost: {r.lost}")
            elif r.status is not None:
                how = f"signal {-r.status}" if r.status < 0 else f"status {r.status}"
                departures.append(f"{r.label()} on {r.host} exited with {how}")
            else:
                departures.append(f"{r.label()} on {r.host} ended without reporting its exit "
                                  "status")
        problems = []
        if len(finished) < min_np:
            added = sum(r.added for r in ranks)
            total = f"{size}" + (f" (and {added} added while training)" if added else "")
            problems = [f"only {len(finished)} of {total} ranks finished, fewer than --min-np "
                        f"{min_np}"] + departures
        return problems, departures

    def unconfirmed(self, size: int) -> list:
        """Ranks that never reported at all."""
        with self._lock:
            seen = {r.rank for r in self.ranks}
        return [r for r in range(size) if r not in seen]
