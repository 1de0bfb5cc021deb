"""Rendezvous rounds of an elastic job on the Gloo controller: one definition for the driver
(``horovodliterun --gloo --elastic``) and its workers.

The driver hosts the job's store and decides who is in the job; it publishes each change as a
new ROUND. A worker has a stable id for its whole life (``HVDL_WORKER_ID``, e.g. ``host1:0``,
given at its start); its rank may change from round to round.

Keys (in the driver's store; the driver always has a secret, so they are reached through a
``signed_store.SignedStore``: their names are under a prefix only the secret gives, and every
value is signed):

- ``horovodlite/elastic/round``: the latest round number k (text).
- ``horovodlite/elastic/round/<k>``: that round's ``Round`` as JSON.
- ``horovodlite/elastic/reset/<k>/<worker>``: set by a worker whose training failed in round k;
  it waits for round k+1 (the driver publishes it once the job's membership is settled).
- ``horovodlite/elastic/resets/<k>``: a counter each such worker adds 1 to after its key, so
  that the driver, which looks every 0.2 s, reads one value while nobody asked instead of one
  key per worker (2,048 round trips a look at 2,048 workers).

A value that fails its signature (a process outside the job wrote it) is refused: the worker
says so on stderr, naming the key, and goes on waiting for the driver's own round; the driver
does not count a forged reset.

A round assigns ranks 0..size-1 to worker ids: the survivors of the previous round first, in
their old rank order (so rank 0 - whose state ``hvd.elastic`` broadcasts - stays rank 0 while it
lives), then the workers added by host discovery. A round may instead END the job (``end``: the
reason, e.g. fewer workers than ``--min-np``): every worker stops with that reason. Each round
is a fresh rendezvous prefix (``horovodlite/<job>/<k>/``) and fresh shared-memory segments, so
nothing of a world that lost ranks is reused.

Workers learn of a round in two ways: after a failure (``wait_round``, bounded by
``--elastic-timeout``), and at ``state.commit()`` when rank 0 sees a newer round than the job's
(``hvd.elastic``'s ``HostsUpdatedInterrupt``: the job grows or retires hosts between commits).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time

PREFIX = "horovodlite/elastic"
ROUND_KEY = f"{PREFIX}/round"


def round_key(k: int) -> str:
    return f"{PREFIX}/round/{k}"


def reset_key(k: int, worker: str) -> str:
    return f"{PREFIX}/reset/{k}/{worker}"


def resets_key(k: int) -> str:
    return f"{PREFIX}/resets/{k}"


_said: set = set()  # the refusals already said (a poll loop meets the same forgery again)


def refused(e: Exception) -> bool:
    """Whether ``e`` is a value that failed its signature; says so on stderr (once per message)."""
    from horovodlite.common.signed_store import TamperedError

    if not isinstance(e, TamperedError):
        return False
    if str(e) not in _said:
        _said.add(str(e))
        sys.stderr.write(f"horovodlite: {e}; waiting for the elastic driver's own round\n")
        sys.stderr.flush()
    return True


@dataclasses.dataclass
class Round:
    number: int
    workers: list  # worker ids, rank order
    hosts: list  # each rank's host, rank order
    reason: str = ""  # one line: why this round ("start", "lost host h1 (ranks 2, 3)", ...)
    end: str = ""  # non-empty: the job ends, for this reason
    retired: list = dataclasses.field(default_factory=list)  # workers leaving on purpose

    @property
    def size(self) -> int:
        return len(self.workers)

    def rank_of(self, worker: str) -> int | None:
        return self.workers.index(worker) if worker in self.workers else None

    def to_json(self) -> str:
        return json.dumps({"number": self.number, "workers": self.workers, "hosts": self.hosts,
                           "reason": self.reason, "end": self.end, "retired": self.retired})

    @classmethod
    def from_json(cls, text) -> Round:
        d = json.loads(text)
        return cls(d["number"], list(d["workers"]), list(d["hosts"]), d.get("reason", ""),
                   d.get("end", ""), list(d.get("retired", [])))


# ---------------------------------------------------------------------------------- the driver


def publish(store, r: Round) -> None:
    """Makes round ``r`` the job's latest (its assignment first, then the pointer to it)."""
    store.set(round_key(r.number), r.to_json())
    store.set(ROUND_KEY, str(r.number))


def resets_requested(store, k: int, workers: list) -> int:
    """How many of ``workers`` asked to leave round k after a failure (a forged request does not
    count). Nothing but the counter is read while it is 0."""
    if int(store.add(resets_key(k), 0)) == 0:
        return 0
    asked = 0
    for w in workers:
        key = reset_key(k, str(w))
        try:
            asked += store.check([key]) and store.get(key) == b"1"
        except Exception as e:  # noqa: BLE001 - a forgery is refused; the store's errors rise
            if not refused(e):
                raise
    return asked


# --------------------------------------------------------------------------------- the workers


def latest(store) -> int:
    """The latest round's number; -1 when there is none (or its pointer is forged: refused)."""
    try:
        return int(store.get(ROUND_KEY).decode()) if store.check([ROUND_KEY]) else -1
    except Exception as e:  # noqa: BLE001
        if refused(e):
            return -1
        raise


def read(store, k: int) -> Round:
    """Round k; raises TamperedError when its value is forged."""
    r = Round.from_json(store.get(round_key(k)).decode())
    if r.number != k:
        raise ValueError(f"round {k} of the elastic driver's store says it is round {r.number}")
    return r


def request_reset(store, k: int, worker: str) -> None:
    store.set(reset_key(k, worker), "1")
    store.add(resets_key(k), 1)


def wait_round(store, after: int, timeout: float, poll: float = 0.2) -> Round:
    """The first round newer than ``after`` (the latest, if several were published meanwhile).
    Raises TimeoutError after ``timeout`` seconds, ConnectionError if the store is gone."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            k = latest(store)
        except Exception as e:  # noqa: BLE001 - the store's own errors (DistNetworkError, ...)
            raise ConnectionError(f"the elastic driver's store is unreachable: {e}") from None
        if k > after:
            try:
                return read(store, k)
            except Exception as e:  # noqa: BLE001 - a forged round: the driver's comes
                if not refused(e):
                    raise
        if time.monotonic() >= deadline:
            raise TimeoutError(f"no new rendezvous round from the elastic driver within "
                               f"{timeout:g} s (--elastic-timeout)")
        time.sleep(poll)


def wait_listing(store, worker: str, timeout: float, poll: float = 0.2) -> Round:
    """The latest round that lists ``worker`` or ends the job: a worker's first round (one the
    driver added waits here until the job takes it in, at the others' next commit)."""
    after = -1
    deadline = time.monotonic() + timeout
    while True:
        r = wait_round(store, after, max(0.0, deadline - time.monotonic()), poll)
        if r.end or r.rank_of(worker) is not None:
            return r
        after = r.number


def parse_hosts(text: str) -> dict:
    """host -> slots of a host discovery script's output (Horovod's format: one ``host:slots``
    a line; a line without ``:slots`` counts as one slot), in its order."""
    hosts: dict = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        host, _, slots = line.partition(":")
        hosts[host.strip()] = hosts.get(host.strip(), 0) + (int(slots) if slots.strip() else 1)
    return hosts

