"""The elastic driver's heartbeat watch: a worker whose core stopped beating is lost.

Every rank of an elastic Gloo job beats from its core's own watchdog thread (no Python, no GIL)
into the job's store - which the driver hosts - every ``beat_period`` s, under its round and rank
(``rendezvous.heartbeats``). The driver looks at the current round's beats every look (0.2 s):
a worker whose beat has not changed for ``--elastic-heartbeat-timeout`` s (2) is lost - its
process stopped (SIGSTOP) or frozen, its host hung, or its link cut - while the reports (their
heartbeats every 2 s, 15 s of silence) and the Gloo timeout would take much longer.

``met``: the workers seen beating in some round (they met its other workers): one the driver
added that never met any is not training (the driver stops it once the training finished).

What is not watched: a worker before its first beat of the round (still meeting), after it
wrote ``STOPPED`` (it shut down in order: a reset, the end of its training) and once it exited.
A driver that was itself not scheduled for half the timeout measures every silence afresh (a
starved driver must not take everyone for lost).
"""

from __future__ import annotations

from horovodlite.common import rendezvous


class BeatWatch:
    def __init__(self, store, secret: str, job: str, timeout: float):
        self.store, self.secret, self.job, self.timeout = store, secret, job, timeout
        self.workers: list = []  # the round's workers, rank order
        self.beats = None  # the round's heartbeats' store
        self.last: dict = {}  # worker -> (last beat seen, when it changed)
        self.looked = None  # when the driver last looked
        self.met: set = set()  # workers (as start_round got them) seen beating in a round

    def start_round(self, k: int, workers: list) -> None:
        """Round ``k`` was published with ``workers`` (rank order): watch its beats."""
        self.workers = list(workers)
        self.beats = rendezvous.heartbeats(self.store, self.secret, self.job, k)
        self.last = {}

    def silent(self, now: float, members: list) -> list:
        """(worker, seconds) of each of ``members`` of the round whose beat stopped for the
        timeout, as of ``now``; none while off (timeout 0)."""
        if self.beats is None:
            return []
        starved = self.looked is not None and now - self.looked > self.timeout / 2
        self.looked = now
        out = []
        for rank, worker in enumerate(self.workers):
            if worker not in members:
                continue
            key = rendezvous.HEARTBEAT_KEY.format(rank)
            seen = self.last.get(worker)
            if seen is None and not self.beats.check([key]):
                continue  # still meeting
            self.met.add(worker)
            value = bytes(self.beats.get(key))
            if value == rendezvous.STOPPED:
                continue
            if seen is None or seen[0] != value or starved:
                self.last[worker] = (value, now)
            elif 0 < self.timeout <= now - seen[1]:
                out.append((worker, now - seen[1]))
        return out
