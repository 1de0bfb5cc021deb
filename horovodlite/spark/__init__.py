"""horovodlite on Spark: ``run(fn, ...)`` runs ``fn`` as a horovodlite job of Spark tasks
(Horovod's ``horovod.spark.run``), and ``hvd.init()`` works under ``TorchDistributor``.

    from pyspark.sql import SparkSession
    import horovodlite.spark

    spark = SparkSession.builder.master("local[2]").getOrCreate()

    def train(lr):
        import horovodlite.torch as hvd
        hvd.init()
        ...
        return hvd.rank()

    print(horovodlite.spark.run(train, args=(0.1,), num_proc=2))   # [0, 1], in rank order

How ``run`` works:

1. The driver hosts the job's rendezvous (``runner/rendezvous_server.py``: a TCPStore on the
   driver's address, ``spark.driver.host``, with a per-job secret).
2. One barrier stage of ``num_proc`` tasks (``rdd.barrier().mapPartitions``): Spark starts them
   all at once or not at all. Task ``i`` is rank ``i`` (its partition id); the executors'
   addresses (``BarrierTaskContext.getTaskInfos()``, in partition order) name the ranks' hosts,
   so ranks on one executor host share memory.
3. Each task runs ``fn(*args, **kwargs)`` with its rank's variables
   (``launch_env.gloo_rank_settings``, plus ``env``) in the environment; ``hvd.init()`` reads
   them (the Gloo controller). A raising rank stops the job's runtime with the reason, so the
   other ranks fail naming it. Afterwards every task waits at a barrier, shuts horovodlite down
   (Spark reuses its Python workers) and puts the environment back.
4. The driver returns every rank's result, in rank order, and closes the store.

A barrier stage that Spark retries after a rank started fails at once with a message (a
horovodlite job's ranks do not restart; run it again). ``stdout``, ``stderr``, ``verbose``,
``prefix_output_with_timestamp`` and ``executable`` are accepted for Horovod's signature and
have no effect (the ranks' output goes to the executors' logs). MPI (``use_mpi``,
``extra_mpi_args``) is not available here.
"""

from __future__ import annotations

from horovodlite.common import launch_env, rendezvous
from horovodlite.runner.rank_call import call_as_rank, rank_environment, shutdown_runtime
from horovodlite.runner.rendezvous_server import RendezvousServer

__all__ = ["run"]


def _spark_context():
    try:
        from pyspark import SparkContext
    except ImportError as e:
        raise ImportError(
            "horovodlite.spark needs PySpark, which is not installed here: pip install pyspark "
            f"(and a Java runtime, e.g. apt-get install default-jre-headless). ({e})") from None
    sc = SparkContext._active_spark_context
    if sc is None:
        raise RuntimeError("horovodlite.spark.run: no active SparkContext; create a "
                           "SparkSession first (SparkSession.builder...getOrCreate())")
    return sc


def _host(address: str) -> str:
    """'10.0.0.5:43211' -> '10.0.0.5' ('[::1]:43211' -> '::1')."""
    host = address.rpartition(":")[0] if ":" in address else address
    return host.strip("[]") or address


def _claim_rank(addr: str, port: int, rank: int, secret: str | None = None) -> None:
    """Refuses to start rank ``rank`` a second time: Spark retries a barrier stage whose task
    failed, and the retry would meet the first attempt's keys in the job's store. With the
    job's secret the claim is under a key only the secret names (``signed_store.py``)."""
    import datetime

    import torch.distributed as dist

    from horovodlite.common import signed_store

    store = dist.TCPStore(addr, port, None, False, datetime.timedelta(seconds=30))
    if secret:
        store = signed_store.job_store(store, secret, f"{addr}:{port}")
    if store.add(f"horovodlite/spark/started/{rank}", 1) > 1:
        raise RuntimeError(
            f"horovodlite.spark.run: Spark started rank {rank} again (it retried the job's "
            "barrier stage after a task failed); a horovodlite job does not restart its "
            "ranks. See the first attempt's error, and run the job again.")


def _rank_task(fn, args, kwargs, addr: str, port: int, secret: str, extra_env: dict):
    """The function each barrier task runs over its (empty) partition."""

    def run_partition(_):
        from pyspark import BarrierTaskContext

        ctx = BarrierTaskContext.get()
        rank = ctx.partitionId()
        _claim_rank(addr, port, rank, secret)
        hosts = [_host(info.address) for info in ctx.getTaskInfos()]
        env = launch_env.gloo_rank_settings(hosts, addr, port, secret)[rank]
        env.update(extra_env)
        with rank_environment(env):
            try:
                result = call_as_rank(fn, args, kwargs)
                ctx.barrier()  # every rank is done with its collectives before any shuts down
            finally:
                shutdown_runtime()
        yield rank, result

    return run_partition


def run(fn, args=(), kwargs=None, num_proc: int | None = None,
        start_timeout: float | None = None, use_mpi: bool | None = None,
        use_gloo: bool | None = None, extra_mpi_args: str | None = None,
        env: dict | None = None, stdout=None, stderr=None, verbose: int = 1,
        nics: set | None = None, prefix_output_with_timestamp: bool = False,
        executable: str | None = None) -> list:
    """Runs ``fn(*args, **kwargs)`` on ``num_proc`` Spark tasks as one horovodlite job (see
    the top); returns each rank's result, in rank order.

    num_proc: the number of ranks (default: the SparkContext's ``defaultParallelism``); the
    cluster must have that many task slots free at once (a barrier stage; with fewer, Spark
    waits, then fails the job: spark.scheduler.barrier.maxConcurrentTasksCheck.*).
    start_timeout: seconds the ranks wait for each other at ``hvd.init()`` (default 30,
    ``HOROVOD_GLOO_TIMEOUT_SECONDS``). env: variables added to each rank's environment.
    nics: one network interface for the Gloo transport between hosts.
    """
    if use_mpi or extra_mpi_args:
        raise ValueError("horovodlite.spark.run: the ranks use the Gloo controller; use_mpi "
                         "and extra_mpi_args are not supported")
    if use_gloo is False:
        raise ValueError("horovodlite.spark.run: use_gloo=False leaves no controller (the "
                         "ranks always use Gloo)")
    if nics is not None and len(nics) > 1:
        raise ValueError(f"nics={sorted(nics)}: horovodlite's Gloo transport uses one "
                         "interface (HOROVOD_GLOO_IFACE); give one")
    sc = _spark_context()
    num_proc = num_proc or sc.defaultParallelism
    if num_proc < 1:
        raise ValueError(f"horovodlite.spark.run: num_proc={num_proc}; need at least 1")
    extra = {k: str(v) for k, v in (env or {}).items()}
    if start_timeout is not None:
        extra[rendezvous.TIMEOUT_VAR] = str(start_timeout)
    if nics:
        extra[rendezvous.IFACE_VARS[0]] = next(iter(nics))
    addr = sc.getConf().get("spark.driver.host")
    with RendezvousServer(addr) as server:
        task = _rank_task(fn, tuple(args), dict(kwargs or {}), addr, server.port,
                          server.secret, extra)
        rdd = sc.parallelize(range(num_proc), num_proc).barrier().mapPartitions(task)
        results = dict(rdd.collect())
    return [results[r] for r in range(num_proc)]
