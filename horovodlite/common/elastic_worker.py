"""A worker of an elastic Gloo job (``horovodliterun --elastic``): which rendezvous round it is
in, and how it moves to the next one. The protocol is ``elastic_rounds.py``; the driver is
``runner/elastic_driver.py``.

- ``join(launch)`` (``hvd.init``): the round to meet in - the one a reset chose, else the
  latest that lists this worker (a worker the driver added waits for it) - and the launch with
  this worker's rank, size and host in it.
- ``next_round(failed)`` (``hvd.elastic.run``'s reset, after shutdown): after a failure, asks
  the driver for a new round and waits for it (``--elastic-timeout``); after
  ``HostsUpdatedInterrupt`` the newer round is there already.
- ``newer_round()`` (rank 0, at ``state.commit()``): whether the driver published a round since
  this one (the job grows or retires workers between commits).
"""

from __future__ import annotations

import dataclasses
import socket

from horovodlite.common import elastic_rounds, launch_env
from horovodlite.common.exceptions import HorovodInternalError

_current: elastic_rounds.Round | None = None  # the round of the running (or last) init
_chosen: elastic_rounds.Round | None = None  # the round the next init joins (after a reset)
_launch = None  # the worker's launchers.Launch (rank and size unset)


class JobEnded(HorovodInternalError):
    """The driver ended the job (fewer workers than --min-np, the reset limit, ...), or it is
    unreachable: ``hvd.elastic.run`` stops instead of resetting again."""


class NotInJob(HorovodInternalError):
    """The driver went on without this worker (it was taken for lost: e.g. its link was cut)."""


def active() -> bool:
    return bool(launch_env.worker_id())


def current() -> elastic_rounds.Round | None:
    return _current


def _store():
    """The driver's rounds, signed (``rendezvous.control_store``)."""
    from horovodlite.common import rendezvous

    return rendezvous.control_store(_launch)


def _check(r: elastic_rounds.Round, worker: str) -> None:
    if r.end:
        raise JobEnded(f"the elastic job ended (round {r.number}): {r.end}")
    if r.rank_of(worker) is None:
        raise NotInJob(
            f"worker {worker} on {socket.gethostname()} is not in round {r.number} of the "
            f"elastic job ({r.reason}): the driver went on without it (taken for lost, e.g. "
            "its link was cut); it stops")


def join(launch):
    """(the launch with this worker's place in it, the round number) for ``hvd.init``."""
    global _current, _chosen, _launch
    _launch = launch
    r, _chosen = _chosen, None
    if r is None:
        try:
            store = _store()
            elastic_rounds.say_ready(store, launch.worker)  # a newcomer is listed only now
            r = elastic_rounds.wait_listing(store, launch.worker, launch_env.elastic_timeout())
        except (TimeoutError, ConnectionError) as e:
            raise JobEnded(f"worker {launch.worker}: {e}") from None
    _check(r, launch.worker)
    _current = r
    rank = r.rank_of(launch.worker)
    return dataclasses.replace(launch, rank=rank, size=r.size, host=r.hosts[rank]), r.number


def superseded() -> str:
    """While meeting: why the round being met is no longer the job's ("" while it is)."""
    try:
        k = elastic_rounds.latest(_store(), _current.number if _current else -1)
    except Exception as e:  # noqa: BLE001 - the store's own errors
        return f"the elastic driver's store is unreachable: {e}"
    return f"the driver published round {k}" if _current and k > _current.number else ""


def next_round(failed: bool) -> elastic_rounds.Round:
    """After a shutdown: the round to continue in (see the top). Raises JobEnded or NotInJob
    when there is none for this worker."""
    global _chosen
    after = _current.number if _current else -1
    try:
        store = _store()
        if failed:
            elastic_rounds.request_reset(store, after, _launch.worker)
        r = elastic_rounds.wait_round(store, after, launch_env.elastic_timeout())
    except TimeoutError as e:
        raise JobEnded(f"worker {_launch.worker}: {e}") from None
    except Exception as e:  # noqa: BLE001 - the store's own errors (DistNetworkError, ...)
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise JobEnded(f"worker {_launch.worker} on {socket.gethostname()}: the elastic "
                       f"driver's store is unreachable ({first}): its host (horovodliterun's) "
                       "is lost or the link to it cut; the job cannot go on") from None
    if not r.end and r.rank_of(_launch.worker) is not None:
        _chosen = r
    return r


def leaving(r: elastic_rounds.Round) -> bool:
    """Whether this worker retires in round ``r``: its host left the discovery output."""
    return not r.end and r.rank_of(_launch.worker) is None and bool(
        _current and _launch.worker in r.retired)


def newer_round() -> int:
    """The driver's latest round if it is newer than this worker's, else -1 (rank 0 asks at
    commit, and broadcasts the answer)."""
    try:
        k = elastic_rounds.latest(_store(), _current.number if _current else -1)
    except Exception:  # noqa: BLE001 - an unreachable driver shows at the next collective
        return -1
    return k if _current is not None and k > _current.number else -1


_announced = -1  # the newer round rank 0 announced at the last commit


def announce(k: int) -> None:
    """Every rank: the newer round rank 0 saw at this commit (``newer_round``)."""
    global _announced
    _announced = k


def retiring() -> bool:
    """Whether the round announced at the last commit retires some of this round's workers
    (the same answer on every rank: they read the same round)."""
    if _announced < 0 or _current is None:
        return False
    try:
        r = elastic_rounds.read(_store(), _announced)
    except Exception as e:  # noqa: BLE001 - a forged round retires nobody
        if elastic_rounds.refused(e):
            return False
        raise
    return any(w in r.retired for w in _current.workers)


__all__ = ["active", "current", "join", "next_round", "newer_round", "superseded", "leaving",
           "announce", "retiring",
           "JobEnded", "NotInJob"]
