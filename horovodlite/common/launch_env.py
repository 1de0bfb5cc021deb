"""The environment horovodliterun gives every rank: one definition for the launcher and the ranks.

The launcher (``horovodlite.runner``) writes these variables; the rank wrapper
(``runner/task.py``) and the runtime (``horovodlite.common``, ``horovodlite.torch``) read them.
This module imports neither the runner nor torch, so the runtime depends on it and not on the
launcher.

Written by horovodliterun (``runner/launch.py``) unless said otherwise:

- ``HVDL_ELASTIC``: ``1`` in an elastic job (``--elastic``, implied by the options below).
- ``HVDL_ELASTIC_MIN_NP``, ``HVDL_ELASTIC_MAX_NP``: ``--min-np`` (1), ``--max-np`` (``-np``).
- ``HVDL_ELASTIC_SLOTS``, ``HVDL_ELASTIC_HOSTS``: with ``-H``, its slots added up, its hosts.
- ``HVDL_DISCOVERY_SCRIPT``: ``--host-discovery-script``, as an absolute path.
- ``HVDL_BLACKLIST_COOLDOWN``: ``--blacklist-cooldown-range`` as ``MIN,MAX`` seconds.
- ``HVDL_DISCOVERY_INTERVAL``: seconds between runs of the discovery script (default 1); set
  by the user, forwarded like every ``HVDL_*`` variable.
- ``HVDL_REPORT_TO``, ``HVDL_REPORT_TOKEN``: where each rank's wrapper reports to
  (``ADDR[,ADDR...]:PORT``) and the token its reports carry.
- ``HVDL_OUTPUT_FILENAME``: ``--output-filename``, as an absolute path: the rank wrapper copies
  its command's output into ``rank.N/stdout`` and ``rank.N/stderr`` there.
- ``HVDL_NOTICE_FD``: written by the rank wrapper (``runner/task.py``): the read end of the pipe
  that carries the launcher's notices (a lost host) to the rank.

Written by the launchers that start Gloo-controller ranks themselves (``horovodliterun --gloo``,
``horovodlite.ray``, ``horovodlite.spark``), Horovod's names where Horovod has them (a rank reads
them through ``common/launchers.py``):

- ``HOROVOD_RANK``, ``HOROVOD_SIZE``, ``HOROVOD_LOCAL_RANK``, ``HOROVOD_LOCAL_SIZE``,
  ``HOROVOD_CROSS_RANK``, ``HOROVOD_CROSS_SIZE``: the rank's place in the job.
- ``HOROVOD_HOSTNAME``: the launcher's name for the rank's host (ranks with one name share memory).
- ``HOROVOD_GLOO_RENDEZVOUS_ADDR``, ``HOROVOD_GLOO_RENDEZVOUS_PORT``: the store the launcher hosts.
- ``HOROVOD_CONTROLLER``: ``gloo``.
- ``HVDL_RENDEZVOUS_SECRET``: the job's secret: the job's keys in the launcher's store are named
  and their values signed with it, and a worker of another job is refused
  (``common/signed_store.py``, ``common/rendezvous.py``).
- ``HOROVOD_GLOO_IFACE``: ``--network-interface`` (its first interface): the one the ranks' Gloo
  connections between hosts use.

``SECRETS`` (the rendezvous secret, the report token) never travel on a command line: a rank
that ``horovodliterun --gloo`` starts through ssh gets them on its stdin (``runner/remote.py``).

``HVDL_NOTICE_FD`` is also read by the C++ core (``csrc/core/launcher_notices.cc``), which cannot
share this definition. Besides these, the whole environment of the launcher reaches the ranks,
except a short list: ``common/env_travel.py`` decides it, for every launcher path.
"""

from __future__ import annotations

import os

ELASTIC = "HVDL_ELASTIC"
ELASTIC_MIN_NP = "HVDL_ELASTIC_MIN_NP"
ELASTIC_MAX_NP = "HVDL_ELASTIC_MAX_NP"
ELASTIC_SLOTS = "HVDL_ELASTIC_SLOTS"
ELASTIC_HOSTS = "HVDL_ELASTIC_HOSTS"
DISCOVERY_SCRIPT = "HVDL_DISCOVERY_SCRIPT"
DISCOVERY_INTERVAL = "HVDL_DISCOVERY_INTERVAL"
BLACKLIST_COOLDOWN = "HVDL_BLACKLIST_COOLDOWN"
REPORT_TO = "HVDL_REPORT_TO"
REPORT_TOKEN = "HVDL_REPORT_TOKEN"
NOTICE_FD = "HVDL_NOTICE_FD"
OUTPUT_FILENAME = "HVDL_OUTPUT_FILENAME"
GLOO_RANK = "HOROVOD_RANK"
GLOO_SIZE = "HOROVOD_SIZE"
GLOO_LOCAL_RANK = "HOROVOD_LOCAL_RANK"
GLOO_LOCAL_SIZE = "HOROVOD_LOCAL_SIZE"
GLOO_CROSS_RANK = "HOROVOD_CROSS_RANK"
GLOO_CROSS_SIZE = "HOROVOD_CROSS_SIZE"
GLOO_HOSTNAME = "HOROVOD_HOSTNAME"
GLOO_RENDEZVOUS_ADDR = "HOROVOD_GLOO_RENDEZVOUS_ADDR"
GLOO_RENDEZVOUS_PORT = "HOROVOD_GLOO_RENDEZVOUS_PORT"
CONTROLLER = "HOROVOD_CONTROLLER"
RENDEZVOUS_SECRET = "HVDL_RENDEZVOUS_SECRET"
GLOO_IFACE = "HOROVOD_GLOO_IFACE"
WORKER_ID = "HVDL_WORKER_ID"  # an elastic Gloo job's worker: its number for the job's life
ELASTIC_TIMEOUT = "HVDL_ELASTIC_TIMEOUT"  # --elastic-timeout: how long a worker waits for a round
ELASTIC_ROLLBACK = "HOROVOD_ELASTIC_ROLLBACK"  # --elastic-rollback: step or commit (rollback())
ROLLBACKS = ("step", "commit")
# --elastic-heartbeat-timeout: an elastic Gloo job's driver takes a worker that has not beaten for
# this long for lost (heartbeat_timeout())
ELASTIC_HEARTBEAT = "HOROVOD_ELASTIC_HEARTBEAT_TIMEOUT"
SECRETS = (RENDEZVOUS_SECRET, REPORT_TOKEN)

# A rank's exit status when it left an elastic job on purpose (its host left the host discovery
# output): the rank wrapper reports it as "retired" with status 0 and itself exits 0, so mpirun
# sees a clean exit.
RETIRED_STATUS = 83


# ------------------------------------------------------------------------ the launcher writes


def elastic_settings(min_np: int, max_np: int, hosts: list | None, discovery_script: str | None,
                     cooldown: tuple | None) -> dict:
    """The variables of an elastic job. ``hosts``: ``-H`` as (host, slots) pairs, or None;
    ``cooldown``: ``--blacklist-cooldown-range`` (MIN, MAX) or None."""
    env = {ELASTIC: "1", ELASTIC_MIN_NP: str(min_np), ELASTIC_MAX_NP: str(max_np)}
    if hosts:  # mpirun places new ranks itself only on the slots it was given
        env[ELASTIC_SLOTS] = str(sum(n for _, n in hosts))
        env[ELASTIC_HOSTS] = ",".join(h for h, _ in hosts)
    if discovery_script:
        env[DISCOVERY_SCRIPT] = discovery_script
    if cooldown is not None:
        env[BLACKLIST_COOLDOWN] = ",".join(f"{v:g}" for v in cooldown)
    return env


def report_settings(addresses: list, port: int, token: str) -> dict:
    """The variables that tell each rank's wrapper where to report to."""
    return {REPORT_TO: f"{','.join(addresses)}:{port}", REPORT_TOKEN: token}


def gloo_rank_settings(hosts: list, addr: str, port: int, secret: str) -> list:
    """The variables of every rank of a Gloo-controller job, in rank order. ``hosts``: each
    rank's host name, ranks of one host given consecutively or not (local ranks count the ranks
    of a host in rank order; hosts are numbered in the order of their first rank)."""
    order = list(dict.fromkeys(hosts))
    seen: dict = {}
    out = []
    for rank, host in enumerate(hosts):
        local = seen.get(host, 0)
        seen[host] = local + 1
        out.append({GLOO_RANK: str(rank), GLOO_SIZE: str(len(hosts)),
                    GLOO_LOCAL_RANK: str(local), GLOO_CROSS_RANK: str(order.index(host)),
                    GLOO_CROSS_SIZE: str(len(order)), GLOO_HOSTNAME: host,
                    GLOO_RENDEZVOUS_ADDR: addr, GLOO_RENDEZVOUS_PORT: str(port),
                    CONTROLLER: "gloo", RENDEZVOUS_SECRET: secret})
    for env in out:
        env[GLOO_LOCAL_SIZE] = str(seen[env[GLOO_HOSTNAME]])
    return out


def elastic_worker_settings(worker: int, host: str, addr: str, port: int, secret: str,
                            min_np: int, max_np: int, elastic_timeout: float) -> dict:
    """The variables of one worker of an elastic Gloo job (``horovodliterun --elastic``): no
    rank or size - each rendezvous round gives them (``common/elastic_rounds.py``) - but the
    worker's number, its host's name, and where the driver's store is."""
    return {WORKER_ID: str(worker), GLOO_HOSTNAME: host, GLOO_RENDEZVOUS_ADDR: addr,
            GLOO_RENDEZVOUS_PORT: str(port), CONTROLLER: "gloo", RENDEZVOUS_SECRET: secret,
            ELASTIC: "1", ELASTIC_MIN_NP: str(min_np), ELASTIC_MAX_NP: str(max_np),
            ELASTIC_TIMEOUT: f"{elastic_timeout:g}"}


# --------------------------------------------------------------------------- the ranks read


def is_elastic(env=os.environ) -> bool:
    return env.get(ELASTIC) == "1"


def worker_id(env=os.environ) -> str:
    """An elastic Gloo job's worker number ("" outside one)."""
    return env.get(WORKER_ID, "")


def elastic_timeout(env=os.environ) -> float:
    """``--elastic-timeout``: how long a worker waits for the driver's next round (600 s)."""
    return float(env.get(ELASTIC_TIMEOUT, "600"))


def _count(name: str, env) -> int | None:
    value = env.get(name, "")
    return int(value) if value.isdigit() else None


def min_np(env=os.environ) -> int:
    """``--min-np``; 1 when not given."""
    value = _count(ELASTIC_MIN_NP, env)
    return 1 if value is None else value


def rollback(env=os.environ) -> str:
    """What ``hvd.elastic.run`` goes back to after a failure (``--elastic-rollback``):
    ``step`` (the default), no further than the step in flight - the survivors keep their state;
    ``commit``, the last ``state.commit()``, as Horovod does. ValueError naming the setting for
    anything else."""
    value = env.get(ELASTIC_ROLLBACK, "").strip().lower() or ROLLBACKS[0]
    if value not in ROLLBACKS:
        raise ValueError(f"{ELASTIC_ROLLBACK}={env[ELASTIC_ROLLBACK]!r}: expected "
                         f"{' or '.join(ROLLBACKS)}")
    return value


def heartbeat_timeout(env=os.environ) -> float:
    """``--elastic-heartbeat-timeout`` (2 s): the driver of an elastic Gloo job takes a worker
    whose core has not beaten for this long - its process stopped or frozen, its host hung, its
    link cut - for lost (0: only the Gloo timeout and the reports notice). ValueError naming the
    setting for anything but a number >= 0."""
    value = env.get(ELASTIC_HEARTBEAT, "").strip() or "2"
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:
        raise ValueError(f"{ELASTIC_HEARTBEAT}={env[ELASTIC_HEARTBEAT]!r}: expected a number of "
                         "seconds >= 0 (0: off)")
    return seconds


def beat_period(timeout: float) -> float:
    """How often a rank's watchdog beats when the driver takes ``timeout`` s of silence for a
    loss: eight beats in it, at most one a second."""
    return min(1.0, timeout / 8) if timeout > 0 else 1.0


def max_np(env=os.environ) -> int | None:
    """``--max-np`` (``-np`` when not given) of an elastic job; None outside one."""
    return _count(ELASTIC_MAX_NP, env)


def slots(env=os.environ) -> int | None:
    """The slots of ``-H`` added up; None without ``-H``."""
    return _count(ELASTIC_SLOTS, env)


def allocated_hosts(env=os.environ) -> set:
    """The ``-H`` hosts (empty without ``-H``)."""
    return {h for h in env.get(ELASTIC_HOSTS, "").split(",") if h}


def discovery_script(env=os.environ) -> str:
    """``--host-discovery-script`` ("" without one)."""
    return env.get(DISCOVERY_SCRIPT, "")


def discovery_interval(env=os.environ, default: float = 1.0) -> float:
    return float(env.get(DISCOVERY_INTERVAL, default))


def cooldown_range(env=os.environ) -> tuple | None:
    """(MIN, MAX) seconds of ``--blacklist-cooldown-range``, or None (blacklisted for the rest
    of the job)."""
    value = env.get(BLACKLIST_COOLDOWN, "")
    if not value:
        return None
    low, _, high = value.partition(",")
    return float(low), float(high)


def reports_to(env=os.environ) -> str:
    """``HVDL_REPORT_TO`` ("" when the ranks do not report: plain mpirun, --no-rank-reports)."""
    return env.get(REPORT_TO, "")


def parse_report_to(value: str) -> list:
    """'10.0.0.1,127.0.0.1:4567' -> [('10.0.0.1', 4567), ('127.0.0.1', 4567)]."""
    hosts, _, port = value.rpartition(":")
    if not hosts or not port.isdigit():
        raise ValueError(f"{REPORT_TO}={value!r} is not ADDR[,ADDR...]:PORT")
    return [(h, int(port)) for h in hosts.split(",") if h]


__all__ = [
    "ELASTIC", "ELASTIC_MIN_NP", "ELASTIC_MAX_NP", "ELASTIC_SLOTS", "ELASTIC_HOSTS",
    "DISCOVERY_SCRIPT", "DISCOVERY_INTERVAL", "BLACKLIST_COOLDOWN", "REPORT_TO", "REPORT_TOKEN",
    "NOTICE_FD", "OUTPUT_FILENAME", "RETIRED_STATUS",
    "GLOO_RANK", "GLOO_SIZE", "GLOO_LOCAL_RANK", "GLOO_LOCAL_SIZE", "GLOO_CROSS_RANK",
    "GLOO_CROSS_SIZE", "GLOO_HOSTNAME", "GLOO_RENDEZVOUS_ADDR", "GLOO_RENDEZVOUS_PORT",
    "CONTROLLER", "RENDEZVOUS_SECRET", "GLOO_IFACE", "SECRETS", "gloo_rank_settings",
    "WORKER_ID", "ELASTIC_TIMEOUT", "elastic_worker_settings", "worker_id", "elastic_timeout",
    "elastic_settings", "report_settings", "is_elastic",
    "min_np", "max_np", "slots", "allocated_hosts", "discovery_script", "discovery_interval",
    "cooldown_range", "reports_to", "parse_report_to",
]
