"""How the ranks of a launch without MPI meet: a c10d store, then the job's Gloo process group.

``meet(launch)`` (called by ``hvd.init()`` for the Gloo controller, see ``launchers.py``):

1. The store. A TCPStore that the launcher hosts (``horovodliterun --gloo``; torchrun's agent
   store), the store of torch.distributed's initialised default group, or one that rank 0 hosts.
   A store rank 0 hosts listens on the rendezvous address only (the socket is bound to that
   address and handed to the TCPStore), never on every interface.
2. The job's secret. ``horovodliterun --gloo`` (``--elastic``, ``horovodlite.ray``,
   ``horovodlite.spark``) generates one per job and passes it to its ranks
   (``HVDL_RENDEZVOUS_SECRET``); its store holds a marker signed with it under a key the secret
   names (``signed_store.py``). A worker whose secret differs (another job's, pointed at this
   rendezvous by mistake) finds no marker and is refused with a message saying so, instead of
   joining and corrupting both jobs.
3. The ranks: every rank publishes its host and pid under the job's fresh key prefix, and reads
   everyone's; the local layout (ranks that share a host, in rank order) and the cross layout
   (hosts in the order of their first rank) follow. With a secret, the prefix is an HMAC of the
   job id and round and every value is signed (``signed_store.SignedStore``): a value that fails
   the check is an error naming the key; without one (torchrun, a default group) the prefix is
   ``horovodlite/<job>/<round>/`` and values are plain, as torch's own rendezvous is.
4. Between hosts, the Gloo process group over that prefix, its device bound to the address this
   rank reaches the rendezvous from (or ``HOROVOD_GLOO_IFACE``), registered under a name the C++
   core resolves (``c10d::resolve_process_group``). Inside a host the ranks use shared memory,
   whose segments the core names from ``shm_prefix`` (the job, the round and the host); a job on
   one host creates no process group at all.

Waits are bounded by ``HOROVOD_GLOO_TIMEOUT_SECONDS`` (30 by default); a missing rank is named.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import socket
import time

from horovodlite.common import launch_env
from horovodlite.common.launchers import (
    STORE_CLIENT,
    STORE_DEFAULT_GROUP,
    STORE_HOST,
    Launch,
)

TIMEOUT_VAR = "HOROVOD_GLOO_TIMEOUT_SECONDS"
CONNECTIONS_VAR = "HOROVOD_GLOO_CONNECTIONS"
IFACE_VARS = (launch_env.GLOO_IFACE, "GLOO_SOCKET_IFNAME")

# What keeps the job's store and process group alive while the runtime uses them.
_held: dict = {}


class RendezvousError(RuntimeError):
    """The ranks could not meet; the message says which rendezvous and what went wrong."""


def timeout_seconds(env=None) -> float:
    env = os.environ if env is None else env
    value = env.get(TIMEOUT_VAR, "30")
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if seconds <= 0:
        raise ValueError(f"{TIMEOUT_VAR}={value!r}: expected a positive number of seconds")
    return seconds


def connections(env=None) -> int:
    """HOROVOD_GLOO_CONNECTIONS: the TCP connections per pair of ranks on different hosts (the
    Gloo group's contexts; large messages are striped over them, gloo_transport.h). auto: 1 -
    on the test hosts one connection filled a 1 Gbit/s link at 0.92-0.96 of its bound (see
    docs/performance.md), and each more costs a loop thread and a connection per pair at
    start-up."""
    env = os.environ if env is None else env
    value = env.get(CONNECTIONS_VAR, "auto").strip().lower()
    if value == "auto":
        return 1
    try:
        count = int(value)
    except ValueError:
        count = 0
    if not 1 <= count <= 16:
        raise ValueError(f"{CONNECTIONS_VAR}={value!r}: expected auto or 1 to 16")
    return count


def host_id() -> str:
    """This machine as the ranks tell machines apart: its host name (test hosts and containers
    each have one of their own)."""
    return socket.gethostname()


def listening_socket(addr: str, port: int) -> socket.socket:
    """A socket bound to the rendezvous address only, listening, for a TCPStore to take over."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    infos = socket.getaddrinfo(addr, port, family, socket.SOCK_STREAM)
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(infos[0][4])
    except OSError as e:
        sock.close()
        raise RendezvousError(
            f"cannot host the rendezvous at {addr}:{port}: {e.strerror}. Another job may be "
            "using the port (set MASTER_PORT / HOROVOD_GLOO_RENDEZVOUS_PORT), or the address is "
            "not this machine's (rank 0 must run on the rendezvous host).") from None
    sock.listen(128)
    return sock


def _tcp_store(launch: Launch, timeout: float, host: bool):
    import torch.distributed as dist

    delta = datetime.timedelta(seconds=timeout)
    where = f"{launch.addr}:{launch.port}"
    try:
        if host:
            sock = listening_socket(launch.addr, launch.port)
            try:
                return dist.TCPStore(launch.addr, launch.port, None, True, delta,
                                     wait_for_workers=False, master_listen_fd=sock.fileno())
            finally:
                sock.detach()  # the store's server owns the descriptor now
        return dist.TCPStore(launch.addr, launch.port, None, False, delta)
    except RendezvousError:
        raise
    except Exception as e:  # torch raises DistNetworkError/RuntimeError with its own wording
        raise RendezvousError(
            f"rank {launch.rank} cannot reach the rendezvous at {where} ({launch.why}) within "
            f"{timeout:g} s ({TIMEOUT_VAR}): {str(e).splitlines()[0]}") from None


def base_store(launch: Launch, timeout: float):
    import torch.distributed as dist

    if launch.worker:  # an elastic worker meets through the driver's store, round after round
        held = _held.get("driver_store")
        if held is None:
            held = _tcp_store(launch, timeout, host=False)
            check_secret(held, launch, timeout)
            _held["driver_store"] = held
        return held
    if launch.store == STORE_DEFAULT_GROUP:
        return dist.distributed_c10d._get_default_store()
    if launch.store == STORE_CLIENT:
        return _tcp_store(launch, timeout, host=False)
    if launch.store == STORE_HOST:
        if launch.rank != 0:
            return _tcp_store(launch, timeout, host=False)
        # rank 0 keeps hosting the store it made: an init after shutdown meets through it again
        # (in a fresh round), where hosting anew would find the port taken by it
        hosted = _held.get("hosted")
        if hosted is None or hosted[0] != (launch.addr, launch.port):
            hosted = ((launch.addr, launch.port), _tcp_store(launch, timeout, host=True))
            _held["hosted"] = hosted
        return hosted[1]
    return dist.HashStore()


def check_secret(store, launch: Launch, timeout: float) -> None:
    """Refuses a worker of another job (see the top). A store this rank hosts gets the marker;
    a launcher's has it before any rank starts, so a worker looks once."""
    from horovodlite.common import signed_store

    if not launch.secret:
        return
    where = f"{launch.addr}:{launch.port}"
    if launch.store == STORE_HOST and launch.rank == 0:
        signed_store.mark_job(store, launch.secret, where)
    wait = timeout if launch.store == STORE_HOST else None
    try:
        found = signed_store.check_job(store, launch.secret, where, wait)
    except signed_store.TamperedError as e:
        raise RendezvousError(f"rank {launch.rank}: {e}") from None
    except Exception as e:  # noqa: BLE001 - the store's own errors
        raise RendezvousError(f"rank {launch.rank}: the rendezvous at {where} does not answer: "
                              f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    if not found:
        raise RendezvousError(
            f"the rendezvous at {where} belongs to another horovodlite job, or to no horovodlite "
            "launcher (it holds no job signed with this worker's HVDL_RENDEZVOUS_SECRET"
            + (f" after {timeout:g} s" if wait else "") + "); this worker is refused. Check "
            "HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT: two jobs share the address.")


def namespace(store, launch: Launch, round_: int):
    """The store of one round's meeting (see the top, 3.)."""
    import torch.distributed as dist

    if not launch.secret:
        return dist.PrefixStore(f"horovodlite/{launch.job}/{round_}/", store)
    from horovodlite.common import signed_store

    return signed_store.SignedStore(
        store, launch.secret, (launch.job, round_),
        f"round {round_} of the rendezvous at {launch.addr}:{launch.port}")


def control_store(launch: Launch):
    """An elastic worker's view of the driver's rounds (``elastic_rounds.py``): signed where
    the job has a secret."""
    store = base_store(launch, timeout_seconds())
    if not launch.secret:
        return store
    from horovodlite.common import signed_store

    return signed_store.SignedStore(store, launch.secret, ("elastic",),
                                    f"the elastic driver's rounds at {launch.addr}:{launch.port}")


def _tcp_store_address(store) -> tuple:
    """(host, port) of the TCPStore under ``store`` (PrefixStores unwrapped), or (None, None)."""
    for _ in range(8):
        if hasattr(store, "host") and hasattr(store, "port"):
            try:
                return store.host, store.port
            except Exception:  # noqa: BLE001 - not a TCPStore after all
                return None, None
        store = getattr(store, "underlying_store", None)
        if store is None:
            break
    return None, None


def job_token(store) -> str:
    """A name for the job that its store holds: the first rank to ask draws it (compare-and-set),
    so two jobs whose launchers left nothing to tell them apart (a default group set up from a
    tcp:// address) never share key prefixes or shared-memory names on one host."""
    mine = os.urandom(6).hex()
    return store.compare_set("horovodlite/job-token", "", mine).decode()


class Superseded(RendezvousError):
    """An elastic job's driver published a newer round while this one was meeting."""


def _wait_all(ns, keys: list, timeout: float, superseded) -> bool:
    """Whether every key was set within ``timeout``; checks ``superseded()`` (a reason, or "")
    every 0.2 s while waiting, and raises Superseded with it."""
    if superseded is None:
        try:
            ns.wait(keys, datetime.timedelta(seconds=timeout))
            return True
        except Exception:
            return False
    deadline = time.monotonic() + timeout
    while not ns.check(keys):
        why = superseded()
        if why:
            raise Superseded(why)
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)
    return True


ABANDONED = b"abandoned"  # the value of ``ranks`` in an elastic round left before it met


def _claim(ns, key: str, value: bytes) -> bool:
    """Sets ``key`` only if nobody has (compare-and-set); whether this call did."""
    if hasattr(ns, "claim"):
        return ns.claim(key, value)
    return bytes(ns.compare_set(key, b"", value)) == value


def _leave(ns, launch: Launch, why: str) -> None:
    """An elastic round superseded while meeting: this rank leaves it, unless rank 0 already
    listed the ranks (the round met: every rank then stays in it). ``ranks`` is written once,
    by whoever comes first - rank 0's list or this tombstone - so no rank goes on in a round
    another one left (rank 0 initialising a world whose rank 1 went to the newer round)."""
    if _claim(ns, "ranks", ABANDONED) or ns.get("ranks") == ABANDONED:
        raise Superseded(why)


def gather_ranks(ns, launch: Launch, timeout: float, superseded=None,
                 extra: dict | None = None) -> list:
    """Every rank's {"host", "pid"} in rank order, once all have published. Rank 0 reads them
    all and publishes the list as one value (``ranks``), which the others read: the store serves
    2N reads and writes for the job, not N^2 (each rank reading every rank's key took 27 s for
    1,024 clients on one machine, benchmarks/scale_launch.py). ``superseded``: see ``_wait_all``
    (elastic jobs); ``extra``: more of this rank's settings for its record."""
    ns.set(f"rank/{launch.rank}", json.dumps({"host": launch.host or host_id(),
                                              "pid": os.getpid(), **(extra or {})}))
    keys = [f"rank/{r}" for r in range(launch.size)]
    first = launch.rank == 0
    try:
        met = _wait_all(ns, keys if first else ["ranks"], timeout, superseded)
    except Superseded as e:
        _leave(ns, launch, str(e))
        met = True  # rank 0 listed the ranks first: the round met
    if not met:
        missing = [r for r in range(launch.size) if not ns.check([f"rank/{r}"])]
        shown = ", ".join(str(r) for r in missing[:16]) + (" ..." if len(missing) > 16 else "")
        if not missing:  # (a rank other than 0: rank 0 did not list them)
            shown = "0 (all the others reached it; rank 0 did not list them)"
        raise RendezvousError(
            f"rank {launch.rank}: rank(s) {shown} of {launch.size} did not reach the "
            f"rendezvous at {launch.addr}:{launch.port} within {timeout:g} s "
            f"({'--elastic-timeout' if launch.worker else TIMEOUT_VAR}); were they started, "
            "with the same job settings?")
    try:
        if first:
            values = ns.multi_get(keys) if hasattr(ns, "multi_get") else [ns.get(k) for k in keys]
            ranks = [json.loads(v) for v in values]
            listed = json.dumps(ranks).encode()
            if superseded is None:
                ns.set("ranks", listed)
            elif not _claim(ns, "ranks", listed):  # a rank left for a newer round first
                raise Superseded(superseded() or "a rank left this round for a newer one")
            return ranks
        value = ns.get("ranks")
        if value == ABANDONED:
            raise Superseded(superseded() if superseded else "a rank left this round")
        ranks = json.loads(value)
    except Superseded:
        raise
    except RuntimeError as e:
        if getattr(ns, "tampered", ""):
            raise RendezvousError(f"rank {launch.rank}: {ns.tampered}") from None
        raise RendezvousError(  # e.g. the host of the store (rank 0) ended meanwhile
            f"rank {launch.rank}: the rendezvous at {launch.addr}:{launch.port} stopped "
            f"answering while the ranks met: {str(e).splitlines()[0]}") from None
    if len(ranks) != launch.size:
        raise RendezvousError(f"rank {launch.rank}: rank 0 of the rendezvous at {launch.addr}:"
                              f"{launch.port} lists {len(ranks)} ranks, not {launch.size}")
    return ranks


def layout(hosts: list, rank: int) -> dict:
    """Local and cross ranks from each rank's host: local ranks share a host, in rank order;
    hosts are ordered by their first rank."""
    mine = hosts[rank]
    local = [r for r, h in enumerate(hosts) if h == mine]
    order = list(dict.fromkeys(hosts))
    return {"local_rank": local.index(rank), "local_size": len(local),
            "cross_rank": order.index(mine), "cross_size": len(order)}


def device_address(launch: Launch) -> str | None:
    """The address other hosts reach this rank at: the one it reaches the rendezvous from; None
    when the rendezvous's address is unknown (then Gloo's default: this host name's address)."""
    if not launch.addr:
        return None
    try:
        family = socket.AF_INET6 if ":" in launch.addr else socket.AF_INET
        probe = socket.socket(family, socket.SOCK_DGRAM)
        try:
            probe.connect((launch.addr, launch.port or 9))
            return probe.getsockname()[0]
        finally:
            probe.close()
    except OSError:
        return "127.0.0.1"


def gloo_group(ns, launch: Launch, timeout: float, name: str, count: int = 1):
    """The job's Gloo process group, with `count` devices on one interface: as many contexts,
    each a TCP connection per pair and a loop thread of its own."""
    import torch
    import torch.distributed as dist
    from torch._C import _distributed_c10d as c10d

    options = dist.ProcessGroupGloo._Options()
    options._timeout = datetime.timedelta(seconds=timeout)
    iface = next((os.environ[v] for v in IFACE_VARS if os.environ.get(v)), None)
    addr = device_address(launch)

    def device():
        if iface:
            return dist.ProcessGroupGloo.create_device(interface=iface)
        if addr:
            return dist.ProcessGroupGloo.create_device(hostname=addr)
        return dist.ProcessGroupGloo.create_default_device()

    options._devices = [device() for _ in range(count)]
    try:  # the pairs' addresses come through ``ns``: verified where the job has a secret
        backend = dist.ProcessGroupGloo(dist.PrefixStore("gloo/", ns), launch.rank,
                                        launch.size, options)
    except RuntimeError:
        if getattr(ns, "tampered", ""):
            raise RendezvousError(f"rank {launch.rank}: {ns.tampered}") from None
        raise
    # the process group's store carries the C++ watchdog's heartbeats (a thread of its own)
    group = dist.ProcessGroup(_beats_store(ns), launch.rank, launch.size)
    group._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, backend)
    c10d._register_process_group(name, group)
    return group


def meet(launch: Launch, round_: int = 0, wait: float | None = None, superseded=None) -> dict:
    """Meets the other ranks (see the top); returns what the C++ core's init_gloo takes.
    ``wait``: how long to wait for the others (HOROVOD_GLOO_TIMEOUT_SECONDS by default; an
    elastic round waits for ranks that join at their next commit); ``superseded``: see
    ``_wait_all``."""
    timeout = timeout_seconds()
    count = connections()  # a bad value fails every job, not only one across hosts
    store = base_store(launch, timeout)
    if not launch.worker:
        check_secret(store, launch, timeout)
    if launch.store == STORE_DEFAULT_GROUP:
        # the default group's TCPStore says where the job meets: the address to bind Gloo to
        # is the one this host reaches it from (across hosts 127.0.0.1 would not do)
        where = _tcp_store_address(store)
        launch = dataclasses.replace(launch, job=job_token(store),
                                     addr=launch.addr or where[0], port=launch.port or where[1])
    ns = namespace(store, launch, round_)
    ranks = gather_ranks(ns, launch, timeout if wait is None else wait, superseded,
                         extra={"connections": count})
    differ = [r for r, rec in enumerate(ranks) if rec.get("connections", count) != count]
    if differ:  # the group's contexts must match: every rank sees the same list and says so
        raise RendezvousError(
            f"rank {launch.rank}: {CONNECTIONS_VAR} differs between ranks: " +
            ", ".join(f"rank {r} {rec.get('connections')}" for r, rec in enumerate(ranks)
                      if r in differ or r == launch.rank) + "; set the same value everywhere")
    hosts = [r["host"] for r in ranks]
    found = {"rank": launch.rank, "size": launch.size, "hosts": hosts,
             "timeout_seconds": timeout, "process_group": "", **layout(hosts, launch.rank)}
    host_key = hashlib.sha256(hosts[launch.rank].encode()).hexdigest()[:8]
    found["shm_prefix"] = f"/hvdl-{launch.job}-{round_}-{host_key}"
    _held.update(store=store, ns=ns)
    found["connections"] = count
    if found["cross_size"] > 1:
        name = f"horovodlite-{launch.job}-{round_}"
        group = gloo_group(ns, launch, timeout, name, found["connections"])
        found["process_group"] = name
        _held.update(group=group, name=name)
    if launch.worker:  # an elastic job's driver watches the cores' heartbeats (elastic_beats.py)
        import torch.distributed as dist
        from torch._C import _distributed_c10d as c10d

        found["beat_seconds"] = launch_env.beat_period(launch_env.heartbeat_timeout())
        if found["cross_size"] == 1:  # no Gloo group: the heartbeats' store alone
            name = f"horovodlite-beats-{launch.job}-{round_}"
            beats = dist.ProcessGroup(_beats_store(ns), launch.rank, launch.size)
            c10d._register_process_group(name, beats)  # (the registry does not keep it alive)
            found["beats_group"] = name
            _held.update(beats=name, beats_group=beats)
    return found


# Where the C++ watchdog (csrc/backends/gloo/gloo_watchdog.cc) of rank r beats - a counter - in
# the store of _beats_store; STOPPED when it left the round in order
HEARTBEAT_KEY = "hvdl-heartbeat/{}"
STOPPED = b"stopped"


def _beats_store(ns):
    """The store of the C++ watchdog's heartbeats under a round's namespace: the hidden prefix,
    unsigned (see docs/security.md)."""
    import torch.distributed as dist

    return ns.raw("gloo/") if hasattr(ns, "raw") else dist.PrefixStore("gloo/", ns)


def heartbeats(store, secret: str, job: str, round_: int):
    """The heartbeats' store of round ``round_`` of a job with a secret, for its elastic driver
    (``store``: the driver's own)."""
    from horovodlite.common import signed_store

    return _beats_store(signed_store.SignedStore(store, secret, (job, round_), f"round {round_}"))


def release() -> None:
    """After shutdown: the process group leaves the registry; the stores are kept (a later init
    of an elastic job meets again through them)."""
    from torch._C import _distributed_c10d as c10d

    for name in (_held.pop("name", None), _held.pop("beats", None)):
        if name is not None:
            try:
                c10d._unregister_process_group(name)
            except Exception:
                pass
    _held.pop("group", None)
    _held.pop("beats_group", None)
    _held.pop("ns", None)
