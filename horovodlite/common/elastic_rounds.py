"""Rendezvous rounds of an elastic job on the Gloo controller: one definition for the driver
(``horovodliterun --gloo --elastic``) and its workers.

The driver hosts the job's store and decides who is in the job; it publishes each change as a
new ROUND. A worker has a stable id for its whole life (``HVDL_WORKER_ID``, e.g. ``host1:0``,
given at its start); its rank may change from round to round.

Keys (in the driver's store; the driver always has a secret, so they are reached through a
``signed_store.SignedStore``: their names are under a prefix only the secret gives, and every
value is signed):

- ``horovodlite/elastic/round/<k>``: round k's ``Round`` as JSON. Written once (the driver
  never changes a published round), and its signature binds the value to the key's name, so
  a value a stranger saw on the wire and writes back is the same value: these keys cannot be
  rolled back. Workers find the latest round by looking at ``round/<k+1>``, ``round/<k+2>``
  ... from the round they know, never by trusting a pointer alone.
- ``horovodlite/elastic/round``: the latest round number k (text), signed: a HINT only, for a
  worker that knows no round yet (it starts its scan there instead of at round 0). A signed
  pointer can still be rolled back (a stranger writes an older signed value back under the
  same name); a rolled-back hint only makes the scan start earlier.
- ``horovodlite/elastic/resets/<k>/<i>``: reset request slot i of round k, claimed write-once
  (compare-and-set) by a worker whose training failed in round k, its value the worker's id;
  the worker then waits for round k+1 (the driver publishes it once the job's membership is
  settled). The driver reads slot after slot from the first it has not read, so a look while
  nobody asked is one round trip (``check`` of the next slot) at any number of workers. A
  c10d counter would be cheaper still but cannot be signed: a stranger who saw its name could
  add -1 after each +1 and hide every request.

- ``horovodlite/elastic/ready/<worker>``: the worker has started and imported what it needs and
  waits for a round that lists it (set by ``hvd.init``, signed). The driver lists a worker it
  started for growth in a round only then: the running workers, who stop for a newcomer at
  their next commit, never wait for its interpreter to start.

A value that fails its signature (a process outside the job wrote it) is refused: the worker
says so on stderr, naming the key, and goes on waiting for the driver's own round; the driver
does not count a forged reset (it skips the slot). What a stranger who reaches the store can
still do is deny service (delete keys, or overwrite the next slot or round with garbage until
the driver overwrites it back): it cannot make a worker take a round the driver did not publish
or the driver miss a request that stays in the store.

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


def ready_key(worker: str) -> str:
    return f"{PREFIX}/ready/{worker}"


def say_ready(store, worker: str) -> None:
    """This worker waits for a round that lists it (see the top)."""
    store.set(ready_key(worker), "1")


def is_ready(store, worker: str) -> bool:
    """Whether ``worker`` said it waits for a round (a forged key does not count)."""
    if not store.check([ready_key(worker)]):
        return False
    try:
        store.get(ready_key(worker))
    except Exception as e:  # noqa: BLE001 - a forgery is not the worker's word
        if refused(e):
            return False
        raise
    return True


def round_key(k: int) -> str:
    return f"{PREFIX}/round/{k}"


def resets_key(k: int) -> str:
    """The counter of round k's requests before slots replaced it: read by nothing (a test
    adds to it as a stranger would, to show that nothing depends on it)."""
    return f"{PREFIX}/resets/{k}"


def reset_slot_key(k: int, i: int) -> str:
    return f"{PREFIX}/resets/{k}/{i}"


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
    """Makes round ``r`` the job's latest (its assignment first, then the hint to it)."""
    store.set(round_key(r.number), r.to_json())
    store.set(ROUND_KEY, str(r.number))


def _claim(store, key: str, value: str) -> bool:
    """Sets ``key`` write-once: signed where the store is (``SignedStore.claim``)."""
    if hasattr(store, "claim"):
        return store.claim(key, value)
    return bytes(store.compare_set(key, b"", value.encode())) == value.encode()


class ResetRequests:
    """The driver's view of round k's reset requests: reads each slot once, in order."""

    def __init__(self, store, k: int):
        self.store, self.k = store, k
        self.next = 0  # the first slot not read
        self.asked: set = set()

    def count(self, workers: list) -> int:
        """How many of ``workers`` asked to leave round k after a failure (a forged or
        replayed request does not count, a worker asking twice counts once)."""
        while self.store.check([reset_slot_key(self.k, self.next)]):
            try:
                self.asked.add(self.store.get(reset_slot_key(self.k, self.next)).decode())
            except Exception as e:  # noqa: BLE001 - a forgery is skipped; the store's errors rise
                if not refused(e):
                    raise
            self.next += 1
        return len(self.asked & {str(w) for w in workers})


def resets_requested(store, k: int, workers: list) -> int:
    """``ResetRequests(store, k).count(workers)`` for one look (reads every slot)."""
    return ResetRequests(store, k).count(workers)


# --------------------------------------------------------------------------------- the workers


def _hint(store) -> int:
    """The driver's pointer (see the top: a hint only); -1 when there is none or it is forged."""
    try:
        return int(store.get(ROUND_KEY).decode()) if store.check([ROUND_KEY]) else -1
    except Exception as e:  # noqa: BLE001
        if refused(e):
            return -1
        raise


def newest(store, after: int = -1) -> Round | None:
    """The newest round the driver published after round ``after`` (None: none yet). Scans
    the write-once rounds from ``after + 1`` (or from the hint, when the worker knows none and
    the hint is further on) while they exist, then takes the newest whose signature holds
    (a forged one is refused, said once on stderr)."""
    k = after + 1
    if after < 0:
        k = max(k, _hint(store))
    top = k - 1
    while store.check([round_key(top + 1)]):
        top += 1
    for j in range(top, after, -1):
        try:
            return read(store, j)
        except Exception as e:  # noqa: BLE001 - a forged round: an older one, or none yet
            if not refused(e):
                raise
    return None


def latest(store, after: int = -1) -> int:
    """The latest round's number (``newest``); ``after`` when there is none newer (-1: none)."""
    r = newest(store, after)
    return r.number if r is not None else after


def read(store, k: int) -> Round:
    """Round k; raises TamperedError when its value is forged."""
    r = Round.from_json(store.get(round_key(k)).decode())
    if r.number != k:
        raise ValueError(f"round {k} of the elastic driver's store says it is round {r.number}")
    return r


def request_reset(store, k: int, worker: str) -> None:
    """Claims the first free reset slot of round k for ``worker`` (see the top)."""
    i = 0
    while not _claim(store, reset_slot_key(k, i), worker):
        i += 1


def wait_round(store, after: int, timeout: float, poll: float = 0.2) -> Round:
    """The first round newer than ``after`` (the latest, if several were published meanwhile).
    Raises TimeoutError after ``timeout`` seconds, ConnectionError if the store is gone."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            r = newest(store, after)
        except Exception as e:  # noqa: BLE001 - the store's own errors (DistNetworkError, ...)
            raise ConnectionError(f"the elastic driver's store is unreachable: {e}") from None
        if r is not None:
            return r
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

