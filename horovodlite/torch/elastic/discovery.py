"""Host discovery for elastic jobs (``horovodliterun --host-discovery-script S``): growing onto
new slots, and retiring the ranks of hosts that left.

Rank 0 runs the script (Horovod's format: one ``host:slots`` a line; a line without ``:slots``
counts as one slot) every ``HVDL_DISCOVERY_INTERVAL`` seconds on a background thread. At each
``state.commit()`` rank 0 decides, and every rank learns it with one broadcast:

- **retire**: hosts that run ranks of the job but are no longer listed. ``commit`` raises
  ``HostsUpdatedInterrupt``; the reset in ``hvd.elastic.run`` syncs the state once more with
  every rank (so what the leaving ranks processed counts), then the ranks on those hosts leave
  the job (they exit; horovodliterun reports them as retired, not failed) and the others
  continue as a smaller job. An output listing none of the job's hosts is taken for a broken
  script and ignored. Not with ``hvd.init(comm=...)``: the ranks leave the job's communicator.
- **grow**, when nothing retires: the slots listed, capped at ``--max-np`` (default ``-np``)
  and at the slots of ``-H``, minus the current size. If positive, ``commit`` raises
  ``HostsUpdatedInterrupt`` and the reset starts the new ranks (MPI_Comm_spawn, placed by
  mpirun on the job's hosts) and merges them into the job; they receive the state by the sync
  that follows. When that is 0 but the job is below ``--max-np`` and the script lists a host
  outside the job's allocation (not in ``-H``, running none of its ranks, not added before),
  the new ranks go to the first such host - as many as it has slots, up to ``--max-np`` - which
  MPI adds to the job (one such host per commit).

A job's host is "listed" when the script gives its hostname, or its short name (before the first
dot) matches a listed name's, or the script lists ``localhost`` (one machine). The names are
compared as the ranks' ``socket.gethostname()``.

**Blacklist**: a host on which the job lost ranks (their processes died: a crash, an OOM kill)
gets no new ranks - its slots no longer count for growth - so a host whose ranks keep failing
does not make the job fail, shrink and regrow until ``reset_limit``. As on Horovod, for the rest
of the job by default; with ``horovodliterun --blacklist-cooldown-range MIN MAX`` a host comes
back after MIN seconds, then 2 x MIN, 4 x MIN... for each further failure, at most MAX. Its
ranks that still run keep running (retiring is for hosts the script stops listing). Every rank
keeps the same blacklist (they all see the same losses); rank 0's decides.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time

from horovodlite.common import basics, launch_env
from horovodlite.common.elastic_rounds import parse_hosts

_poller = None
_requested = 0  # ranks to add, as agreed at the last check
_retiring: list = []  # hosts whose ranks leave at the next reset, as agreed at the last check
_job_hosts: list | None = None  # every rank's host in the current job (gathered once per job)
_warned_unlisted = False
_placement = ""  # the host outside the allocation the agreed growth goes to ("": mpirun places)
_added: set = set()  # hosts this job grew onto beyond -H (now part of its allocation)
_failures: dict = {}  # host -> how many times the job lost ranks on it
_blocked_until: dict = {}  # blacklisted host -> time.monotonic() it comes back (inf: never)
_lost_seen = 0  # entries of the runtime's lost-host record already counted


def parse_slots(text: str) -> int:
    """Total slots of a discovery script's output."""
    return sum(parse_hosts(text).values())


_LOOPBACK = ("localhost", "localhost.localdomain", "127.0.0.1", "::1")


def listed(host: str, hosts) -> bool:
    """Whether ``host`` (a rank's hostname) is among ``hosts`` (names from the script). A
    loopback name (``localhost:4``, the usual output for one machine) lists every host."""
    short = host.split(".")[0]
    return (host in hosts or any(h.split(".")[0] == short for h in hosts)
            or any(h in _LOOPBACK for h in hosts))


def removed_hosts(job_hosts, found: dict) -> list:
    """The job's hosts the script no longer lists (none if it lists none of them)."""
    global _warned_unlisted
    gone = sorted({h for h in job_hosts if not listed(h, found)})
    if gone and len(gone) == len(set(job_hosts)):
        if not _warned_unlisted:
            sys.stderr.write(f"hvd.elastic: the host discovery script lists none of the job's "
                             f"hosts ({', '.join(sorted(set(job_hosts)))}; it lists "
                             f"{', '.join(found) or 'nothing'}): not retiring them all\n")
            _warned_unlisted = True
        return []
    return gone


class _Poller:
    def __init__(self, script: str, interval: float) -> None:
        self.script = script
        self.interval = interval
        self.hosts: dict | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="hvdl-discovery")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                out = subprocess.run([self.script], capture_output=True, text=True, timeout=30,
                                     check=True).stdout
                self.hosts = parse_hosts(out)
            except (OSError, subprocess.SubprocessError, ValueError) as exc:
                sys.stderr.write(f"hvd.elastic: host discovery script {self.script} failed: "
                                 f"{exc}\n")
            self._stop.wait(self.interval)


def note_lost(hosts, now: float | None = None) -> list:
    """Counts a failure for each host in ``hosts`` (the hosts of ranks just lost; one failure
    per host per call) and blacklists it; returns (host, seconds blacklisted - inf: for the rest
    of the job - and its failures so far) for each."""
    now = time.monotonic() if now is None else now
    cooldown = launch_env.cooldown_range()
    out = []
    for host in sorted(set(hosts)):
        _failures[host] = _failures.get(host, 0) + 1
        seconds = float("inf")
        if cooldown is not None:
            seconds = min(cooldown[1], cooldown[0] * 2 ** (_failures[host] - 1))
        _blocked_until[host] = now + seconds
        out.append((host, seconds, _failures[host]))
    return out


def note_runtime_losses() -> list:
    """note_lost for the ranks the runtime lost since the last call (every rank calls this after
    a recovery, so every rank keeps the same blacklist)."""
    global _lost_seen
    lost = list(basics._C.lost_hosts())
    new, _lost_seen = lost[_lost_seen:], len(lost)
    return note_lost(new) if new else []


def blacklisted(now: float | None = None) -> list:
    """The hosts blacklisted now."""
    now = time.monotonic() if now is None else now
    return sorted(h for h, until in _blocked_until.items() if until > now)


def usable(found: dict, now: float | None = None) -> dict:
    """``found`` without the names that list a blacklisted host (a loopback name lists every
    host: blacklisting the one machine blacklists ``localhost`` too)."""
    blocked = blacklisted(now)
    return {name: slots for name, slots in found.items()
            if not any(listed(host, [name]) for host in blocked)}


def active() -> bool:
    return bool(launch_env.discovery_script()) and basics.is_initialized()


def new_host(found: dict, allocation, room: int) -> tuple:
    """(host, ranks) for growth beyond the allocation: the first listed host outside it, as many
    ranks as its slots up to ``room``; ("", 0) if none or no room."""
    if room <= 0:
        return "", 0
    for host, slots in found.items():
        if host in _LOOPBACK or slots <= 0 or listed(host, allocation):
            continue
        return host, min(slots, room)
    return "", 0


def updates_agreed() -> tuple:
    """Collective when discovery is active: (ranks to add, hosts whose ranks retire), the same
    on every rank. At most one of the two is non-empty."""
    global _poller, _requested, _retiring, _job_hosts, _placement
    from horovodlite.torch.functions import allgather_object, broadcast_object

    if _job_hosts is None:
        _job_hosts = allgather_object(socket.gethostname(), name="elastic.hosts")
    add, gone, host = 0, [], ""
    if basics.rank() == 0:
        if _poller is None:
            _poller = _Poller(launch_env.discovery_script(), launch_env.discovery_interval())
        caps = [c for c in (launch_env.max_np(), launch_env.slots()) if c is not None]
        found = _poller.hosts
        if found is not None:
            # retiring splits the job's communicator: not for init(comm=...) on a subset of it
            whole_job = basics._init_args[0] is None
            gone = removed_hosts(_job_hosts, found) if whole_job else []
            growable = usable(found)  # blacklisted hosts get no new ranks
            if not gone:
                add = max(0, min([sum(growable.values()), *caps]) - basics.size())
            if not gone and add == 0:
                allocation = launch_env.allocated_hosts() | set(_job_hosts) | _added
                room = (launch_env.max_np() or 0) - basics.size()
                host, add = new_host(growable, allocation, room)
    add, gone, host = broadcast_object((add, gone, host), 0, name="elastic.host_updates")
    _requested, _retiring, _placement = int(add), list(gone), str(host)
    return _requested, _retiring


def take_request() -> tuple:
    """The growth agreed at the last check, once (the reset that acts on it calls this):
    (ranks to add, the host outside the allocation to start them on or "")."""
    global _requested, _placement
    add, host, _requested, _placement = _requested, _placement, 0, ""
    if add and host:
        _added.add(host)
    return add, host


def retiring() -> list:
    """The hosts agreed at the last check to retire (empty: none)."""
    return list(_retiring)


def take_retirement() -> list:
    """The hosts to retire agreed at the last check, once (the reset calls this)."""
    global _retiring
    gone, _retiring = _retiring, []
    return gone


def forget_job() -> None:
    """The job changed (a reset): gather its hosts again at the next check."""
    global _job_hosts
    _job_hosts = None
