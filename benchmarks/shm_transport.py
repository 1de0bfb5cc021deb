"""Latency and bandwidth of the shared-memory transport and control plane (csrc/backends/shm)
between real processes of this host, one member per process, both sides actively waiting.

    python benchmarks/shm_transport.py            # from an editable install (builds _testing)
    python benchmarks/shm_transport.py --gloo     # plus torch.distributed gloo for comparison
    python benchmarks/shm_transport.py --pin same # every member on CPU 0 (sharing a core)

Figures (median of --repeats runs, each a fresh group of processes):
  ping-pong 4 B       round trip of a 4-byte message between members 0 and 1; one-way = half
  bitwise OR          one ShmControlPlane round (StartBitwiseOr + TestBitwiseOr until done)
  gather+broadcast    one ShmControlPlane Gather then Broadcast of short strings
  ring allreduce 4 B  RingAllreduce of one float64 over ShmTransport (the data half of a
                      4-byte allreduce; a negotiated one adds about one bitwise-OR round)
  stream 1/16 MiB     messages through the fragments (ShmTransport), and with single copy on
                      top (SingleCopyTransport: descriptors through the rings, bytes by
                      process_vm_readv)
These machines are noisy: compare figures from one run.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "unit"))
from cpp_testing import load_testing_module  # noqa: E402  (builds horovodlite._testing)

T = load_testing_module()
_count = 0


def _member(job, queue):
    pin = job.pop("pin", "none")
    if pin != "none":  # "same": every member on CPU 0; "spread": member r on CPU r mod cpus
        cpu = 0 if pin == "same" else job["rank"] % os.cpu_count()
        os.sched_setaffinity(0, {cpu})
    queue.put((job["rank"], T.shm_member(job)))


def run(n, **job):
    """One fresh group of n processes running `job`; member 0's result."""
    global _count
    _count += 1
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    name = f"/hvdl-bench-{os.getpid()}-{_count}"
    procs = [ctx.Process(target=_member, args=(dict(job, name=name, rank=r, size=n), queue))
             for r in range(n)]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=300) for _ in procs)
    for p in procs:
        p.join()
    for r, res in results.items():
        if res["error"]:
            raise RuntimeError(f"member {r}: {res['error']}")
    return results[0]


PIN = "none"


def median(repeats, key, n, **job):
    return statistics.median(run(n, pin=PIN, **job)[key] for _ in range(repeats))


def _gloo_member(rank, path, iters, queue):
    import time

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=2)
    x = torch.ones(1)
    for _ in range(100):
        dist.all_reduce(x)
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(x)
    queue.put((time.perf_counter() - start) / iters * 1e6)
    dist.destroy_process_group()


def gloo_allreduce_us(iters=2000):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "store")
        procs = [ctx.Process(target=_gloo_member, args=(r, path, iters, queue)) for r in (0, 1)]
        for p in procs:
            p.start()
        times = [queue.get(timeout=300) for _ in procs]
        for p in procs:
            p.join()
    return max(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--gloo", action="store_true", help="also time a 4-byte gloo allreduce")
    ap.add_argument("--pin", choices=["none", "same", "spread"], default="none",
                    help="CPU affinity of the members: as the scheduler likes, all on CPU 0 "
                         "(members that share a core), or member r on CPU r")
    args = ap.parse_args()
    global PIN
    PIN = args.pin
    k = args.repeats
    print(f"cpus: {os.cpu_count()}, load average: {os.getloadavg()[0]:.1f}, pin: {PIN}")
    rtt = median(k, "per_op_us", 2, action="pingpong", bytes=4, iterations=20000)
    print(f"ping-pong 4 B (np 2)            round trip {rtt:8.2f} us   one-way {rtt / 2:6.2f} us")
    for n in (2, 3):
        us = median(k, "per_op_us", n, plane="control", action="bor", iterations=20000)
        print(f"bitwise OR round (np {n})        {us:8.2f} us")
    for n in (2, 3):
        us = median(k, "per_op_us", n, plane="control", action="gather", iterations=2000)
        print(f"gather + broadcast (np {n})      {us:8.2f} us")
    for n in (2, 3):
        us = median(k, "per_op_us", n, action="allreduce", bytes=8, iterations=20000)
        print(f"ring allreduce 4 B (np {n})      {us:8.2f} us")
    for size, iters in ((1 << 20, 400), (16 << 20, 30)):
        for single_copy in (False, True):
            gbps = median(k, "gbps", 2, action="bandwidth", bytes=size, iterations=iters,
                          single_copy=single_copy)
            how = "single copy over shm" if single_copy else "fragments (shm only)"
            print(f"stream {size >> 20:2d} MiB, {how:22s} {gbps:6.2f} GB/s")
    if args.gloo:
        print(f"gloo allreduce 4 B (np 2)       {gloo_allreduce_us():8.2f} us")


if __name__ == "__main__":
    main()
