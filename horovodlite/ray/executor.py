"""``RayExecutor``: a horovodlite job whose ranks are Ray actors (Horovod's ``horovod.ray`` API).

How a job starts (``start``):

1. A placement group reserves one bundle per worker, ``{"CPU": cpus_per_worker, "GPU":
   gpus_per_worker}`` (PACK by default; ``placement_strategy="SPREAD"`` spreads them), or with
   ``num_hosts`` one bundle per host holding ``num_workers_per_host`` workers (STRICT_SPREAD).
   Inside a placement group that the caller's task runs in, the workers use that one instead
   (``use_current_placement_group``). The group must be ready within
   ``placement_group_timeout_s``; otherwise the error says what was asked and what is free.
2. One actor per worker (``worker.RankWorker``) reports its node; ranks are ordered by node
   (``topology.py``).
3. The driver hosts the job's rendezvous (``runner/rendezvous_server.py``: a TCPStore on the
   driver's node IP as Ray sees it, with a per-job secret), and every actor gets its rank's
   variables (``launch_env.gloo_rank_settings``), the rendezvous timeout (``timeout_s``) and,
   with GPUs, ``CUDA_VISIBLE_DEVICES``. Then ``executable_cls`` is built on every actor.

User code calls ``hvd.init()``, which finds those variables and starts the Gloo controller.
``shutdown`` kills the actors, removes the placement group it created and closes the store.
A function that raises on one rank stops the runtime there with the reason, so the other
ranks' collectives fail naming that rank; ``run``/``execute`` raise the first failure.
"""

from __future__ import annotations

import dataclasses

from horovodlite.common import rendezvous
from horovodlite.ray import topology
from horovodlite.ray.worker import RankWorker
from horovodlite.runner.rendezvous_server import RendezvousServer

STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


def _ray():
    try:
        import ray
    except ImportError as e:
        raise ImportError(
            "horovodlite.ray needs Ray, which is not installed here: pip install 'ray[train]' "
            f"(into the environment that has horovodlite and torch). ({e})") from None
    return ray


@dataclasses.dataclass
class RaySettings:
    """What ``RayExecutor.create_settings`` returns (Horovod's settings object, kept small)."""

    timeout_s: float = 30  # how long ranks wait for each other at hvd.init()
    placement_group_timeout_s: float = 100  # how long start() waits for the resources
    nics: set | None = None  # one network interface for the Gloo transport between hosts
    ssh_identity_file: str | None = None  # accepted for Horovod's signature; no ssh is used
    ssh_str: str | None = None  # likewise


class RayExecutor:
    """A group of Ray actors, one per rank, that run functions as one horovodlite job.

    settings: ``RayExecutor.create_settings(...)``. Either ``num_workers`` (one bundle each),
    or ``num_hosts`` x ``num_workers_per_host`` (one bundle per host, on distinct nodes).
    ``cpus_per_worker``, ``use_gpu``, ``gpus_per_worker`` (1 with ``use_gpu``) size each
    worker; ``placement_strategy``: PACK (default) or SPREAD, STRICT_PACK, STRICT_SPREAD.
    Elastic training (``min_workers``, ``max_workers``, ...) is not supported.
    """

    @classmethod
    def create_settings(cls, timeout_s: float = 30, ssh_identity_file: str | None = None,
                        ssh_str: str | None = None, placement_group_timeout_s: float = 100,
                        nics: set | None = None) -> RaySettings:
        if nics is not None and len(nics) > 1:
            raise ValueError(f"nics={sorted(nics)}: horovodlite's Gloo transport uses one "
                             "interface (HOROVOD_GLOO_IFACE); give one")
        return RaySettings(timeout_s, placement_group_timeout_s, set(nics) if nics else None,
                           ssh_identity_file, ssh_str)

    def __init__(self, settings: RaySettings | None = None, num_workers: int | None = None,
                 num_hosts: int | None = None, num_workers_per_host: int = 1,
                 cpus_per_worker: float = 1, use_gpu: bool = False,
                 gpus_per_worker: float | None = None, use_current_placement_group: bool = True,
                 placement_strategy: str = "PACK", min_workers: int | None = None,
                 max_workers: int | None = None, reset_limit: int | None = None,
                 cooldown_range: tuple | None = None, elastic_timeout: float = 600,
                 override_discovery: bool = True):
        elastic = {"min_workers": min_workers, "max_workers": max_workers,
                   "reset_limit": reset_limit, "cooldown_range": cooldown_range}
        given = [k for k, v in elastic.items() if v is not None]
        if given:  # elastic_timeout and override_discovery only matter with these
            raise ValueError(f"RayExecutor: elastic training ({', '.join(given)}) is not "
                             "supported by horovodlite.ray")
        if (num_workers is None) == (num_hosts is None):
            raise ValueError("RayExecutor: give num_workers, or num_hosts (with "
                             f"num_workers_per_host); got num_workers={num_workers}, "
                             f"num_hosts={num_hosts}")
        if placement_strategy not in STRATEGIES:
            raise ValueError(f"placement_strategy={placement_strategy!r}: expected one of "
                             f"{', '.join(STRATEGIES)}")
        if gpus_per_worker and not use_gpu:
            raise ValueError(f"gpus_per_worker={gpus_per_worker} needs use_gpu=True")
        self.settings = settings or self.create_settings()
        self.num_hosts = num_hosts
        self.num_workers_per_host = num_workers_per_host
        self.num_workers = num_workers if num_hosts is None else num_hosts * num_workers_per_host
        if self.num_workers < 1:
            raise ValueError(f"RayExecutor: {self.num_workers} workers; need at least 1")
        self.cpus_per_worker = cpus_per_worker
        self.use_gpu = use_gpu
        self.gpus_per_worker = (gpus_per_worker or 1) if use_gpu else 0
        self.use_current_placement_group = use_current_placement_group
        self.placement_strategy = placement_strategy
        self.workers: list = []  # actor handles, in rank order
        self.hosts: list = []  # each rank's host name, in rank order
        self._placement_group = None
        self._own_placement_group = False
        self._server = None

    # ------------------------------------------------------------------------------ start

    def _bundles(self) -> tuple:
        """(bundles, strategy, bundle index of each worker)."""
        per_bundle = 1 if self.num_hosts is None else self.num_workers_per_host
        count = self.num_workers // per_bundle
        bundle = {"CPU": self.cpus_per_worker * per_bundle}
        if self.gpus_per_worker:
            bundle["GPU"] = self.gpus_per_worker * per_bundle
        strategy = self.placement_strategy if self.num_hosts is None else "STRICT_SPREAD"
        return [dict(bundle) for _ in range(count)], strategy, \
            [i // per_bundle for i in range(self.num_workers)]

    def _place(self, ray) -> list:
        """The placement group (created or the caller's) and each worker's bundle index."""
        from ray.util.placement_group import get_current_placement_group, placement_group

        current = get_current_placement_group() if self.use_current_placement_group else None
        if current is not None:
            self._placement_group = current
            return [-1] * self.num_workers  # any bundle of the caller's group that fits
        bundles, strategy, index = self._bundles()
        pg = placement_group(bundles, strategy=strategy)
        self._placement_group, self._own_placement_group = pg, True
        if not pg.wait(self.settings.placement_group_timeout_s):
            self.shutdown()
            raise TimeoutError(
                f"RayExecutor: the placement group for {self.num_workers} workers ({strategy} "
                f"of {len(bundles)} x {bundles[0]}) was not ready after "
                f"{self.settings.placement_group_timeout_s:g} s (placement_group_timeout_s); "
                f"the cluster has {ray.cluster_resources()} in all, "
                f"{ray.available_resources()} free")
        return index

    def _environments(self, ray, nodes: list, order: list, extra_env_vars) -> list:
        hosts = topology.host_names(nodes)
        self.hosts = [hosts[i] for i in order]
        self._server = RendezvousServer(ray.util.get_node_ip_address(),
                                        timeout_seconds=max(300, self.settings.timeout_s))
        envs = self._server.rank_environment(self.hosts)
        devices = topology.visible_devices(nodes, order) if self.use_gpu else None
        for rank, env in enumerate(envs):
            env.update(extra_env_vars or {})
            env[rendezvous.TIMEOUT_VAR] = str(self.settings.timeout_s)
            if self.settings.nics:
                env[rendezvous.IFACE_VARS[0]] = next(iter(self.settings.nics))
            if devices is not None:
                env["CUDA_VISIBLE_DEVICES"] = devices[rank]
        return envs

    def start(self, executable_cls=None, executable_args: list | None = None,
              executable_kwargs: dict | None = None, extra_env_vars: dict | None = None) -> None:
        """Places and starts the workers; builds ``executable_cls(*args, **kwargs)`` on each
        (after the rank's variables are set: its constructor may call ``hvd.init()``)."""
        ray = _ray()
        if self.workers:
            raise RuntimeError("RayExecutor.start: already started (call shutdown first)")
        if not ray.is_initialized():
            ray.init()
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        index = self._place(ray)
        actor = ray.remote(RankWorker)
        actors = [actor.options(
            num_cpus=self.cpus_per_worker, num_gpus=self.gpus_per_worker,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                self._placement_group, placement_group_bundle_index=index[i])).remote()
            for i in range(self.num_workers)]
        self.workers = actors
        try:
            nodes = ray.get([a.node_info.remote() for a in actors])
            order = topology.rank_order(nodes)
            self.workers = [actors[i] for i in order]
            envs = self._environments(ray, nodes, order, extra_env_vars)
            self._get([w.setup.remote(env, executable_cls, tuple(executable_args or ()),
                                      executable_kwargs or {})
                       for w, env in zip(self.workers, envs)])
        except BaseException:
            self.shutdown()
            raise

    # -------------------------------------------------------------------------------- run

    def _check_started(self, what: str) -> None:
        if not self.workers:
            raise RuntimeError(f"RayExecutor.{what}: the executor is not started (call start)")

    @staticmethod
    def _get(refs: list) -> list:
        """Every result, in order; the first failure is raised as soon as it arrives (the
        other ranks, told by the failed one, fail soon after)."""
        ray = _ray()
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            try:
                ray.get(done)
            except Exception:
                # The other ranks' errors follow (they were told); collect them quietly, or
                # Ray logs each as unhandled.
                for ref in ray.wait(pending, num_returns=len(pending), timeout=5)[0]:
                    try:
                        ray.get(ref)
                    except Exception:
                        pass
                raise
        return ray.get(refs)

    def run_remote(self, fn, args: list | None = None, kwargs: dict | None = None) -> list:
        """``fn(*args, **kwargs)`` on every rank; returns the object refs, in rank order."""
        self._check_started("run_remote")
        return [w.run.remote(fn, tuple(args or ()), kwargs or {}) for w in self.workers]

    def run(self, fn, args: list | None = None, kwargs: dict | None = None,
            callbacks: list | None = None) -> list:
        """``fn(*args, **kwargs)`` on every rank; returns each rank's result, in rank order."""
        self._no_callbacks(callbacks)
        return self._get(self.run_remote(fn, args, kwargs))

    def execute(self, fn, callbacks: list | None = None) -> list:
        """``fn(executable)`` on every rank, with that rank's ``executable_cls`` instance
        (None when ``start`` had none); returns the results in rank order."""
        self._no_callbacks(callbacks)
        self._check_started("execute")
        return self._get([w.execute.remote(fn) for w in self.workers])

    def execute_single(self, fn):
        """``fn(executable)`` on rank 0 only; returns its result."""
        self._check_started("execute_single")
        return self._get([self.workers[0].execute.remote(fn)])[0]

    @staticmethod
    def _no_callbacks(callbacks) -> None:
        if callbacks:
            raise ValueError("RayExecutor: callbacks are not supported by horovodlite.ray; "
                             "return values from the function instead")

    def shutdown(self) -> None:
        """Kills the workers, removes the placement group it created, closes the store."""
        ray = _ray()
        for w in self.workers:
            try:
                ray.kill(w, no_restart=True)
            except Exception:
                pass
        self.workers = []
        if self._own_placement_group and self._placement_group is not None:
            from ray.util.placement_group import remove_placement_group

            try:
                remove_placement_group(self._placement_group)
            except Exception:
                pass
        self._placement_group, self._own_placement_group = None, False
        if self._server is not None:
            self._server.close()
            self._server = None
