"""``HorovodLiteEnvironment``: Lightning's view of a horovodlite job (a ``ClusterEnvironment``).

Rank, size, local rank and node come from horovodlite, which already knows them from whatever
started the processes (horovodliterun with MPI or ``--gloo``, mpirun, torchrun, srun): Lightning
never starts processes here and never reads a launcher's variables itself. ``hvd.init()`` runs
on the first question, so the environment works before the strategy's setup.

The environment also serves Lightning strategies that need a ``torch.distributed`` rendezvous
(``DDPStrategy(cluster_environment=HorovodLiteEnvironment())`` runs DDP inside a horovodliterun
job): ``main_address``/``main_port`` are chosen by rank 0 and broadcast through horovodlite, so
every rank gets the same pair without any launcher variable. Under torchrun's agent store the
agent's ``MASTER_ADDR``/``MASTER_PORT`` are kept (torch's ``env://`` joins that store).
"""

from __future__ import annotations

import os
import socket

from lightning_fabric.plugins.environments import ClusterEnvironment

import horovodlite.torch as hvd


def _ensure_init() -> None:
    if not hvd.is_initialized():
        hvd.init()


def _free_port(address: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((address if address != "localhost" else "127.0.0.1", 0))
        return s.getsockname()[1]


class HorovodLiteEnvironment(ClusterEnvironment):
    """The processes of a horovodlite job, as Lightning's ``ClusterEnvironment``.

    Rank and sizes are horovodlite's; the setters Lightning calls are ignored (the job's layout
    is fixed by its launcher)."""

    def __init__(self) -> None:
        self._main = None  # (address, port), decided once, collectively

    @property
    def creates_processes_externally(self) -> bool:
        return True  # the launcher started every rank: Lightning must not start any

    @staticmethod
    def detect() -> bool:
        return hvd.is_initialized()

    def world_size(self) -> int:
        _ensure_init()
        return hvd.size()

    def set_world_size(self, size: int) -> None:
        pass

    def global_rank(self) -> int:
        _ensure_init()
        return hvd.rank()

    def set_global_rank(self, rank: int) -> None:
        pass

    def local_rank(self) -> int:
        _ensure_init()
        return hvd.local_rank()

    def node_rank(self) -> int:
        _ensure_init()
        return hvd.cross_rank()

    def _main_address_and_port(self) -> tuple:
        """Collective on first use (every rank asks at the same point: torch.distributed's
        rendezvous). Rank 0 decides; the others get its answer."""
        if self._main is None:
            _ensure_init()
            agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
            if agent and "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
                # torch's env:// joins the agent's store as a client: it must be that one
                self._main = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
            else:
                pair = None
                if hvd.rank() == 0:
                    one_host = hvd.local_size() == hvd.size()
                    address = "127.0.0.1" if one_host else socket.gethostname()
                    pair = (address, _free_port(address))
                self._main = tuple(hvd.broadcast_object(pair, 0, name="lightning.main_port"))
        return self._main

    @property
    def main_address(self) -> str:
        return self._main_address_and_port()[0]

    @property
    def main_port(self) -> int:
        return self._main_address_and_port()[1]
