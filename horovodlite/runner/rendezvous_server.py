"""The rendezvous a launcher hosts for the Gloo-controller ranks it starts.

``horovodliterun --gloo``, ``horovodlite.ray.RayExecutor`` and ``horovodlite.spark.run`` start
their ranks themselves; each hosts one of these for the job's life:

    server = RendezvousServer(addr)          # addr: the job's interface address
    env = server.rank_environment(hosts)     # one dict per rank (HOROVOD_RANK, ..., secret)
    ...start the ranks with env[r]...
    server.close()

The store is torch's c10d TCPStore, serving on a socket bound to ``addr`` only (never on every
interface). A secret is generated per job and every rank gets it in its environment; the store
holds a marker signed with it under a key it names, so a worker of another job pointed here by
mistake is refused (``horovodlite/common/rendezvous.py``), and everything the job writes is
under keys and signatures only the secret gives (``horovodlite/common/signed_store.py``).
``control`` is the signed view an elastic driver publishes its rounds through.
"""

from __future__ import annotations

import datetime
import secrets
import socket

from horovodlite.common import launch_env, signed_store
from horovodlite.common.rendezvous import listening_socket


def free_port(addr: str) -> int:
    """A port free on ``addr`` right now."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


class RendezvousServer:
    def __init__(self, addr: str = "127.0.0.1", port: int = 0, timeout_seconds: float = 300):
        import torch.distributed as dist

        self.addr = addr
        sock = listening_socket(addr, port)
        self.port = sock.getsockname()[1]
        self.secret = secrets.token_hex(16)
        try:
            self.store = dist.TCPStore(addr, self.port, None, True,
                                       datetime.timedelta(seconds=timeout_seconds),
                                       wait_for_workers=False, master_listen_fd=sock.fileno())
        finally:
            sock.detach()  # the store's server owns the descriptor now
        where = f"{addr}:{self.port}"
        signed_store.mark_job(self.store, self.secret, where)
        self.control = signed_store.SignedStore(self.store, self.secret, ("elastic",),
                                                f"the elastic driver's rounds at {where}")

    def rank_environment(self, hosts: list) -> list:
        """The variables of each rank (in rank order) of a job whose rank r runs on hosts[r]."""
        return launch_env.gloo_rank_settings(hosts, self.addr, self.port, self.secret)

    def close(self) -> None:
        self.control = None
        self.store = None  # the TCPStore's server stops with its last reference

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
