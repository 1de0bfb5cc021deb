"""What the allreduce benchmark's parts share (benchmarks/allreduce.py, allreduce_cuda.py): the
MPI job that keeps the ranks together, the paired timing, the competitors on CPU tensors and the
report's formatting. Importing it starts MPI (mpi4py)."""

from __future__ import annotations

import math
import os
import socket
import statistics
import time

import numpy as np
import torch
from mpi4py import MPI

import horovodlite.torch as hvd

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
KiB, MiB = 1024, 1024 * 1024


def log(*args):
    if RANK == 0:
        print(*args, flush=True)


def calibrate(fn, min_iters: int, min_seconds: float) -> int:
    """Calls per measurement so that one takes about `min_seconds`; the same on every rank (so
    collectives stay matched)."""
    fn()
    fn()
    COMM.Barrier()
    start = time.perf_counter()
    for _ in range(3):
        fn()
    per_call = COMM.allreduce((time.perf_counter() - start) / 3, op=MPI.MAX)
    return max(min_iters, int(min_seconds / max(per_call, 1e-9)) + 1)


def compare(fns: dict, min_iters: int, min_seconds: float, rounds: int) -> dict:
    """Per-call time of each function, the slowest rank's, median over `rounds` rounds. Each round
    measures every function back to back, so slow drifts of this noisy machine hit all of them
    alike and the ratios stay meaningful. The order reverses from round to round: a function
    measured right after another pays for the state that one leaves behind (caches, the heap;
    right after gloo's 200-tensor case, horovodlite's fusion case measured 1.40-1.73x of 200 MPI
    calls, with gloo left out 1.17x), so the neighbours of each function change, and each timed
    block starts after one untimed call (three runs: 1.13-1.17x with it, 1.19-1.27x without)."""
    iters = {k: calibrate(f, min_iters, min_seconds) for k, f in fns.items()}
    samples = {k: [] for k in fns}
    for i in range(rounds):
        for k in list(fns) if i % 2 == 0 else list(fns)[::-1]:
            f = fns[k]
            f()  # untimed: what the previous competitor left behind settles first
            COMM.Barrier()
            start = time.perf_counter()
            for _ in range(iters[k]):
                f()
            elapsed = (time.perf_counter() - start) / iters[k]
            samples[k].append(COMM.allreduce(elapsed, op=MPI.MAX))
    return {k: statistics.median(v) for k, v in samples.items()}


def median_interval(values):
    """A distribution-free 95% confidence interval for the median: the order statistics
    n/2 -+ 0.98 sqrt(n) (normal approximation of the binomial; fine for n >= 20)."""
    xs = sorted(values)
    k = max(0, int(len(xs) / 2 - 0.98 * math.sqrt(len(xs))))
    return xs[k], xs[min(len(xs) - 1, len(xs) - 1 - k)]


# ------------------------------------------------------------------------------- competitors


class RawMPI:
    name = "mpi4py"

    def single(self, nbytes):
        a = np.ones(max(nbytes // 4, 1), np.float32)
        return lambda: COMM.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM)

    def gather(self, nbytes):
        """Allgather of `nbytes` in all (each rank's share of it)."""
        a = np.ones(max(nbytes // 4 // SIZE, 1), np.float32)
        out = np.empty(a.size * SIZE, np.float32)
        return lambda: COMM.Allgather(a, out)

    def scatter(self, nbytes):
        """Reduce-scatter of `nbytes` in all (each rank gets its share of the sum)."""
        a = np.ones(max(nbytes // 4 // SIZE, 1) * SIZE, np.float32)
        out = np.empty(a.size // SIZE, np.float32)
        return lambda: COMM.Reduce_scatter_block(a, out, op=MPI.SUM)

    def many(self, count, nbytes):
        bufs = [np.ones(nbytes // 4, np.float32) for _ in range(count)]

        def run():
            for b in bufs:
                COMM.Allreduce(MPI.IN_PLACE, b, op=MPI.SUM)
        return run


class Gloo:
    name = "gloo"

    def __init__(self):
        import torch.distributed as dist

        # rank 0's address (on several hosts 127.0.0.1 would not do)
        where = COMM.bcast((_rank0_address(), _free_port()) if RANK == 0 else None)
        dist.init_process_group("gloo", init_method=f"tcp://{where[0]}:{where[1]}", rank=RANK,
                                world_size=SIZE)
        self.dist = dist

    def single(self, nbytes):
        t = torch.ones(max(nbytes // 4, 1))
        return lambda: self.dist.all_reduce(t)

    def gather(self, nbytes):
        t = torch.ones(max(nbytes // 4 // SIZE, 1))
        out = torch.empty(t.numel() * SIZE)
        # torch 2.13 renamed all_gather_into_tensor (deprecated) to all_gather_single
        gather = getattr(self.dist, "all_gather_single", None) or self.dist.all_gather_into_tensor
        return lambda: gather(out, t)

    def many(self, count, nbytes):
        ts = [torch.ones(nbytes // 4) for _ in range(count)]

        def run():
            works = [self.dist.all_reduce(t, async_op=True) for t in ts]
            for w in works:
                w.wait()
        return run


class Horovodlite:
    name = "horovodlite"

    def single(self, nbytes):
        t = torch.ones(max(nbytes // 4, 1))
        name = f"single.{nbytes}"
        return lambda: hvd.synchronize(hvd.allreduce_async_(t, name=name, op=hvd.Sum))

    def gather(self, nbytes):
        t = torch.ones(max(nbytes // 4 // SIZE, 1))
        return lambda: hvd.allgather(t, name=f"gather.{nbytes}")

    def scatter(self, nbytes):
        t = torch.ones(max(nbytes // 4 // SIZE, 1) * SIZE)
        return lambda: hvd.reducescatter(t, name=f"scatter.{nbytes}", op=hvd.Sum)

    def many(self, count, nbytes):
        ts = [torch.ones(nbytes // 4) for _ in range(count)]
        names = [f"many.{i}" for i in range(count)]

        def run():
            handles = [hvd.allreduce_async_(t, name=n, op=hvd.Sum) for t, n in zip(ts, names)]
            for h in handles:
                hvd.synchronize(h)
        return run


class Horovod(Horovodlite):
    name = "horovod"

    def __init__(self):
        import horovod.torch as horovod  # noqa: F401  (only when installed)

        self.hvd = horovod
        horovod.init()

    def single(self, nbytes):
        t = torch.ones(max(nbytes // 4, 1))
        name = f"single.{nbytes}"
        return lambda: self.hvd.synchronize(self.hvd.allreduce_async_(t, name=name,
                                                                      op=self.hvd.Sum))

    def gather(self, nbytes):
        t = torch.ones(max(nbytes // 4 // SIZE, 1))
        return lambda: self.hvd.allgather(t, name=f"gather.{nbytes}")

    def scatter(self, nbytes):
        t = torch.ones(max(nbytes // 4 // SIZE, 1) * SIZE)
        return lambda: self.hvd.reducescatter(t, name=f"scatter.{nbytes}", op=self.hvd.Sum)

    def many(self, count, nbytes):
        ts = [torch.ones(nbytes // 4) for _ in range(count)]

        def run():
            hs = [self.hvd.allreduce_async_(t, name=f"many.{i}", op=self.hvd.Sum)
                  for i, t in enumerate(ts)]
            for h in hs:
                self.hvd.synchronize(h)
        return run


def _rank0_address() -> str:
    """An address of this machine that other hosts reach: its first non-loopback IPv4 address
    (a test host's name resolves to 127.0.0.1 on that host itself)."""
    from horovodlite.runner.report import interface_addresses

    found = interface_addresses()
    return found[0] if found else socket.gethostbyname(socket.gethostname())


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def competitors(gloo: bool = True):
    out = [RawMPI(), Gloo(), Horovodlite()] if gloo else [RawMPI(), Horovodlite()]
    try:
        out.insert(2, Horovod())
    except Exception as exc:  # noqa: BLE001 - any import/init failure means "not available"
        log(f"horovod: not installed ({type(exc).__name__}: {exc})")
    return out


def restart_horovodlite(**env) -> None:
    """hvd.shutdown() and hvd.init() again with these HOROVOD_* variables (read at init)."""
    os.environ.update({k: str(v) for k, v in env.items()})
    hvd.shutdown()
    hvd.init()



_GLOO_PORT = None


def hosts_link_mbit() -> float | None:
    """The test hosts' link rate (tests/hosts/hostctl.sh keeps it, in tc units, in its state
    folder), in Mbit/s; None elsewhere."""
    path = os.path.join(os.environ.get("HVDL_HOSTS_STATE", "/run/hvdl-hosts"), "rate")
    try:
        with open(path) as f:
            text = f.read().strip().lower()
    except OSError:
        return None
    units = {"kbit": 1e-3, "mbit": 1.0, "gbit": 1e3, "tbit": 1e6}
    for unit, scale in units.items():
        if text.endswith(unit):
            try:
                return float(text[:-len(unit)]) * scale
            except ValueError:
                return None
    return None


def forget_gloo_port() -> None:
    """The next controller_env("gloo") draws a fresh rendezvous port."""
    global _GLOO_PORT
    _GLOO_PORT = None


def controller_env(controller: str) -> dict:
    """What makes the next hvd.init() start on `controller`: the Gloo controller gets the
    variables torchrun would give (rank 0 hosts the store; the address other hosts reach it at)."""
    global _GLOO_PORT
    if controller == "mpi":
        return {"HOROVOD_CONTROLLER": "mpi"}
    if _GLOO_PORT is None:
        _GLOO_PORT = COMM.bcast(_free_port() if RANK == 0 else None)
    addr = COMM.bcast(_rank0_address() if RANK == 0 else None)
    hosts = COMM.allgather(socket.gethostname())  # hosts by name, as the Gloo controller sees them
    local = [r for r, h in enumerate(hosts) if h == hosts[RANK]]
    return {"HOROVOD_CONTROLLER": "gloo", "RANK": RANK, "WORLD_SIZE": SIZE,
            "LOCAL_RANK": local.index(RANK), "LOCAL_WORLD_SIZE": len(local),
            "MASTER_ADDR": addr if len(set(hosts)) > 1 else "127.0.0.1",
            "MASTER_PORT": _GLOO_PORT - 1}  # rank 0 hosts the store at MASTER_PORT + 1


def link_bound(nbytes: int, link_mbit: float | None) -> float | None:
    """The least time an allreduce of `nbytes` can take when every host has one link of
    `link_mbit` each way: each host must send 2(H-1)/H of the data (reduce-scatter and allgather
    of the hosts' shares), whichever algorithm runs. None on one host or without a rate."""
    hosts = hvd.cross_size()
    if not link_mbit or hosts < 2:
        return None
    return 2 * (hosts - 1) / hosts * nbytes / (link_mbit * 1e6 / 8)


# ------------------------------------------------------------------------------------ report


def busbw(nbytes: float, seconds: float) -> float:
    return nbytes / seconds * 2 * (SIZE - 1) / SIZE if seconds > 0 else 0.0


def fmt_time(s: float) -> str:
    return f"{s * 1e6:9.1f} us" if s < 1e-3 else f"{s * 1e3:9.3f} ms"


def fmt_bw(b: float) -> str:
    return f"{b / 1e9:7.2f} GB/s"


def size_label(n: int) -> str:
    return f"{n // MiB} MiB" if n >= MiB else f"{n // KiB} KiB" if n >= KiB else f"{n} B"


def run_single_sizes(comps, sizes, quick, base="mpi4py", label="raw MPI", key="ratio_to_mpi",
                     where=""):
    """Each size, every competitor; ratios against ``base`` (raw MPI on the CPU)."""
    rows = []
    log(f"\n== single tensor, float32 Sum, in place, np={SIZE}{where} ==")
    log(f"{'size':>8} {'library':>12} {'time':>12} {'algbw':>12} {'busbw':>12} "
        f"{'x ' + label:>10}")
    for n in sizes:
        times = compare({c.name: c.single(n) for c in comps}, 5, 0.03 if quick else 0.1,
                        3 if quick else 7)
        for c in comps:
            t = times[c.name]
            ratio = t / times[base]
            log(f"{size_label(n):>8} {c.name:>12} {fmt_time(t):>12} {fmt_bw(n / t):>12} "
                f"{fmt_bw(busbw(n, t)):>12} {ratio:10.2f}")
            rows.append(dict(case="single", bytes=n, library=c.name, seconds=t,
                             busbw=busbw(n, t), **{key: ratio}))
    return rows
