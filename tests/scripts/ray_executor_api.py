"""RayExecutor's API on a local Ray of 2 CPUs, one check per line ("ok: ..."); any failure
raises. Run by tests/test_integrations.py (needs Ray: pip install 'ray[train]')."""

import os
import sys
import time

import ray
import torch

from horovodlite.ray import RayExecutor

# A line is one write (the ranks share one pipe; unbuffered, print writes its parts apart).
sys.stdout.reconfigure(line_buffering=True, write_through=False)


class Counter:
    """An executable: built on every worker after its rank's variables are set."""

    def __init__(self, start):
        import horovodlite.torch as hvd

        hvd.init()
        self.value = start + hvd.rank()

    def total(self):
        import horovodlite.torch as hvd

        return hvd.allreduce(torch.tensor([float(self.value)]), op=hvd.Sum, name="total").item()


def whoami(tag=""):
    import horovodlite.torch as hvd

    hvd.init()
    return {"rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(),
            "env_rank": int(os.environ["HOROVOD_RANK"]), "host": os.environ["HOROVOD_HOSTNAME"],
            "tag": tag, "pid": os.getpid()}


def fails_on_rank_1():
    import horovodlite.torch as hvd

    hvd.init()
    if hvd.rank() == 1:
        raise ValueError("boom on rank 1")
    hvd.allreduce(torch.ones(1), name="never.completed")  # rank 1 never submits it


def ok(what):
    print("ok:", what, flush=True)


def stateful(settings):
    ex = RayExecutor(settings, num_workers=2, cpus_per_worker=1)
    ex.start(executable_cls=Counter, executable_args=[5])
    assert ex.execute(lambda c: c.total()) == [11.0, 11.0]
    assert ex.execute_single(lambda c: c.value) == 5
    ok("start(executable_cls) + execute + execute_single")
    refs = ex.run_remote(whoami, kwargs={"tag": "x"})
    assert len(refs) == 2 and all(isinstance(r, ray.ObjectRef) for r in refs)
    got = ray.get(refs)
    assert [g["rank"] for g in got] == [0, 1] and [g["env_rank"] for g in got] == [0, 1], got
    assert [g["local_rank"] for g in got] == [0, 1] and {g["size"] for g in got} == {2}, got
    assert {g["tag"] for g in got} == {"x"} and got[0]["host"] == got[1]["host"], got
    ok("run_remote: object refs, ranks in order, one host")
    started = time.monotonic()
    try:
        ex.run(fails_on_rank_1)
        raise AssertionError("run should have raised")
    except Exception as e:
        assert "boom on rank 1" in str(e) or "rank 1" in str(e), e
        took = time.monotonic() - started
        assert took < 20, f"the failure took {took:.1f} s to surface"
    ok(f"a rank's exception reaches run() in {took:.1f} s")
    workers = list(ex.workers)
    ex.shutdown()
    try:
        ray.get(workers[0].node_info.remote(), timeout=30)
        raise AssertionError("the actor survived shutdown")
    except ray.exceptions.RayActorError:
        pass
    deadline = time.monotonic() + 30
    while ray.available_resources().get("CPU", 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU", 0) == 2, ray.available_resources()
    ok("shutdown kills the actors and frees the placement group")


def per_host(settings):
    ex = RayExecutor(settings, num_hosts=1, num_workers_per_host=2, cpus_per_worker=1)
    ex.start()
    try:
        got = ex.run(whoami)
        assert [g["rank"] for g in got] == [0, 1] and got[0]["host"] == got[1]["host"], got
    finally:
        ex.shutdown()
    ok("num_hosts x num_workers_per_host")


def too_big():
    settings = RayExecutor.create_settings(timeout_s=30, placement_group_timeout_s=2)
    ex = RayExecutor(settings, num_workers=3, cpus_per_worker=1)
    try:
        ex.start()
        raise AssertionError("3 workers of 1 CPU cannot fit in 2 CPUs")
    except TimeoutError as e:
        assert "placement_group_timeout_s" in str(e) and "free" in str(e), e
    assert ray.available_resources().get("CPU", 0) == 2, ray.available_resources()
    ok("placement group timeout names the resources")


def main():
    ray.init(num_cpus=2, include_dashboard=False)
    settings = RayExecutor.create_settings(timeout_s=30)
    stateful(settings)
    per_host(settings)
    too_big()
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
