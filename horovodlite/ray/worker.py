"""The Ray actor behind each rank of a ``RayExecutor`` (wrapped with ``ray.remote`` there).

The executor creates the actors, asks each ``node_info()``, decides the ranks
(``topology.py``), then calls ``setup()`` on every actor with that rank's variables before any
user code runs; user code then calls ``hvd.init()``, which reads them (``HOROVOD_RANK``, ...,
``HOROVOD_GLOO_RENDEZVOUS_ADDR|PORT``, ``HVDL_RENDEZVOUS_SECRET``: the Gloo controller).
"""

from __future__ import annotations

import os
import socket

from horovodlite.common import launch_env
from horovodlite.runner.rank_call import call_as_rank, shutdown_runtime


class RankWorker:
    def __init__(self):
        self.executable = None
        self.rank = None

    def node_info(self) -> dict:
        import ray

        return {"node_id": ray.get_runtime_context().get_node_id(),
                "ip": ray.util.get_node_ip_address(), "hostname": socket.gethostname(),
                "gpu_ids": [str(g) for g in ray.get_gpu_ids()], "pid": os.getpid()}

    def setup(self, env: dict, executable_cls=None, args=(), kwargs=None) -> None:
        """This rank's variables (for the actor's life: it serves only this job), then the
        executable, whose constructor may already call ``hvd.init()``."""
        os.environ.update({k: str(v) for k, v in env.items()})
        self.rank = int(env[launch_env.GLOO_RANK])
        if executable_cls is not None:
            self.executable = call_as_rank(executable_cls, args, kwargs)

    def run(self, fn, args=(), kwargs=None):
        return call_as_rank(fn, args, kwargs)

    def execute(self, fn):
        return call_as_rank(fn, (self.executable,))

    def shutdown(self) -> None:
        shutdown_runtime()
