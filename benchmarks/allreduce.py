"""Allreduce, side by side: raw mpi4py Allreduce, torch.distributed (gloo), Horovod (when it is
installed) and horovodlite, in one invocation, with ratios against raw MPI.

    horovodliterun -np 2 python benchmarks/allreduce.py            # full run (a few minutes)
    horovodliterun -np 2 python benchmarks/allreduce.py --quick    # smaller, for a quick look

Cases: single tensors from 4 B to 64 MiB (float32, Sum, in place); 200 tensors of 64 KiB
submitted together (the fusion case) against 200 separate MPI_Allreduce calls and against one
MPI_Allreduce of the same total bytes; the 4-byte round trip (latency). Extra checks: CPU used by
horovodlite's background thread while idle, RSS growth over many fusion steps, and the cost of
recording a timeline. Times are per operation, the slowest rank's, median of repeated
measurements; algbw = bytes / time, busbw = algbw * 2(n-1)/n (nccl-tests' definition).
These machines are noisy: compare ratios from one run, not absolute times across runs.

On GPUs (``--device cuda``): the single sizes from 4 B to 256 MiB and the fusion case on CUDA
tensors, against torch.distributed in the same run - NCCL with one GPU per rank, gloo on the same
CUDA tensors when the ranks share a GPU (then horovodlite stages through host memory,
HOROVOD_GPU_OPERATIONS=mpi; benchmarks/gpu_setup.py decides) - plus horovodlite on CPU tensors
of the same sizes for reference. Every timed call ends with torch.cuda.synchronize(), so a time
is the collective's whole latency for every library alike:

    horovodliterun -np 1 python benchmarks/allreduce.py --device cuda [--quick]
    horovodliterun -np 2 python benchmarks/allreduce.py --device cuda   # two ranks, one GPU

The controller without MPI (the Gloo controller, what torchrun, Ray and Spark start): part
``controllers`` restarts horovodlite on it and on MPI in alternation, every round, inside the same
mpirun job (mpi4py keeps the ranks together), and compares both with raw MPI and torch gloo;
``--controller gloo`` runs every other part on it:

    horovodliterun -np 2 python benchmarks/allreduce.py --only controllers
    horovodliterun -np 2 python benchmarks/allreduce.py --controller gloo --only single,fusion

Across hosts ``controllers`` prints the link's bound beside each time (--link-mbit, or the test
hosts' rate) and each time's share of it; ``connections`` (only when --only names it) times the
Gloo controller with HOROVOD_GLOO_CONNECTIONS = 1, 2 and 4 in alternation.

Across hosts (a job with the same number of ranks on several hosts, e.g. the test hosts of
docs/test_hosts.md) it first compares horovodlite's flat and hierarchical allreduce and allgather
(restarting horovodlite between them, alternately, every round) with raw MPI and gloo:

    tests/hosts/hostctl.sh up 2
    tests/hosts/hostctl.sh run hvdl-host0 horovodliterun -np 4 -H hvdl-host0:2,hvdl-host1:2 \
        --mpi-args "$(tests/hosts/hostctl.sh mpi-args)" python benchmarks/allreduce.py --only hosts
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch
from allreduce_common import (
    COMM,
    MPI,
    RANK,
    SIZE,
    Horovodlite,
    KiB,
    MiB,
    RawMPI,
    busbw,
    calibrate,
    compare,
    competitors,
    controller_env,
    fmt_bw,
    fmt_time,
    forget_gloo_port,
    hosts_link_mbit,
    link_bound,
    log,
    median_interval,
    restart_horovodlite,
    run_single_sizes,
    size_label,
)
from allreduce_cuda import CUDA_SIZES, run_cuda  # noqa: F401  (CUDA_SIZES: the tests read it)

import horovodlite.torch as hvd


def run_fusion(comps, count, nbytes, quick):
    log(f"\n== {count} tensors of {size_label(nbytes)} submitted together, np={SIZE} ==")
    total = count * nbytes
    fns = {"one call": RawMPI().single(total)}
    fns.update({c.name: c.many(count, nbytes) for c in comps})
    times = compare(fns, 3, 0.1 if quick else 0.3, 3 if quick else 9)
    one = times.pop("one call")
    rows = []
    log(f"{'library':>22} {'time':>12} {'busbw':>12} {'x one MPI_Allreduce':>20} "
        f"{'x 200 MPI calls':>16}")
    for name, t in [("mpi4py (one call)", one)] + [(k if k != "mpi4py" else "mpi4py (200 calls)", v)
                                                      for k, v in times.items()]:
        log(f"{name:>22} {fmt_time(t):>12} {fmt_bw(busbw(total, t)):>12} {t / one:20.2f} "
            f"{t / times['mpi4py']:16.2f}")
        rows.append(dict(case="fusion", library=name, seconds=t, busbw=busbw(total, t),
                         ratio_to_one_call=t / one, ratio_to_separate_calls=t / times["mpi4py"]))
    from horovodlite.common.basics import _stats  # noqa: PLC0415

    single_copy = _stats()["single_copy_transports"] > 0
    log("horovodlite's ring moved the fused batch by "
        + ("single copy (process_vm_readv)" if single_copy else "MPI messages"))
    return rows


# Across hosts, per collective: the knob that switches the hierarchical form, the stat that proves
# it ran, the competitors' function and the bus factor (nccl-tests' definitions).
ACROSS_HOSTS = {
    "allreduce": ("HOROVOD_HIERARCHICAL_ALLREDUCE", "hierarchical_allreduces", "single",
                  lambda n: 2 * (n - 1) / n),
    "allgather": ("HOROVOD_HIERARCHICAL_ALLGATHER", "hierarchical_allgathers", "gather",
                  lambda n: (n - 1) / n),
    # the controller without MPI only (on MPI, reducescatter is MPI's own)
    "reducescatter": ("HOROVOD_HIERARCHICAL_ALLREDUCE", "hierarchical_reducescatters", "scatter",
                      lambda n: (n - 1) / n),
}


def run_across_hosts(comps, sizes, quick, collective):
    """Across hosts: horovodlite's flat form of `collective` and its hierarchical one (restarted
    between the two, in alternation, every round) against raw MPI and gloo."""
    from horovodlite.common.basics import _stats  # noqa: PLC0415

    knob, stat, fn, factor = ACROSS_HOSTS[collective]
    log(f"\n== {collective} across hosts: {hvd.cross_size()} hosts x {hvd.local_size()} ranks, "
        f"float32 ==")
    others = {c.name: c for c in comps
              if c.name in ("mpi4py", "gloo", "horovod") and hasattr(c, fn)}
    modes = {"horovodlite flat": "0", "horovodlite hierarchical": "1"}
    rounds = 3 if quick else 5
    rows = []
    log(f"{'size':>8} {'library':>26} {'time':>12} {'busbw':>12} {'x raw MPI':>10} "
        f"{'x flat':>8}")
    for n in sizes:
        samples = {name: [] for name in [*others, *modes]}
        seconds = 0.05 if quick else 0.2
        for _ in range(rounds):
            times = compare({k: getattr(c, fn)(n) for k, c in others.items()}, 2, seconds, 1)
            for name, value in modes.items():
                restart_horovodlite(**{knob: value})
                times.update(compare({name: getattr(Horovodlite(), fn)(n)}, 2, seconds, 1))
                used = COMM.allreduce(_stats()[stat], op=MPI.MIN)
                assert (used > 0) == (value == "1"), f"{name}: hierarchical used {used} times"
            for k, v in times.items():
                samples[k].append(v)
        med = {k: statistics.median(v) for k, v in samples.items()}
        for k, t in med.items():
            bw = n / t * factor(SIZE)
            log(f"{size_label(n):>8} {k:>26} {fmt_time(t):>12} {fmt_bw(bw):>12} "
                f"{t / med['mpi4py']:10.2f} {t / med['horovodlite flat']:8.2f}")
            rows.append(dict(case=f"hosts {collective}", bytes=n, library=k, seconds=t, busbw=bw,
                             ratio_to_mpi=t / med["mpi4py"],
                             ratio_to_flat=t / med["horovodlite flat"]))
        log(f"{size_label(n):>8} hierarchical busbw / flat: "
            f"{med['horovodlite flat'] / med['horovodlite hierarchical']:.2f}x, / raw MPI: "
            f"{med['mpi4py'] / med['horovodlite hierarchical']:.2f}x")
    restart_horovodlite(**{knob: "auto"})
    return rows


def run_controllers(comps, sizes, quick, fusion=(200, 64 * KiB), link_mbit=None):
    """horovodlite on MPI and on the Gloo controller (restarted between the two, in alternation,
    every round), against raw MPI and torch gloo: single sizes, then the fusion case. Across
    hosts with `link_mbit`, each time's share of the link's bound (link_bound) too."""
    others = {c.name: c for c in comps if c.name in ("mpi4py", "gloo")}
    modes = {"hvdl on MPI": "mpi", "hvdl on Gloo": "gloo"}
    rounds = 3 if quick else 5
    rows = []
    log(f"\n== horovodlite's controllers: MPI and Gloo (no MPI), np={SIZE}, "
        f"{hvd.cross_size()} host(s), float32 Sum ==")
    log(f"{'case':>14} {'library':>14} {'time':>12} {'busbw':>12} {'x raw MPI':>10} "
        f"{'x on MPI':>9} {'x gloo':>8} {'link bound':>11} {'of bound':>9}")
    cases = [(size_label(n), n, "single", (n,)) for n in sizes]
    cases.append((f"{fusion[0]}x{size_label(fusion[1])}", fusion[0] * fusion[1], "many", fusion))
    for label, nbytes, fn, fn_args in cases:
        samples = {name: [] for name in [*others, *modes]}
        seconds = 0.05 if quick else 0.2
        for _ in range(rounds):
            times = compare({k: getattr(c, fn)(*fn_args) for k, c in others.items()}, 2,
                            seconds, 1)
            for name, controller in modes.items():
                restart_horovodlite(**controller_env(controller))
                assert hvd.gloo_enabled() == (controller == "gloo")
                times.update(compare({name: getattr(Horovodlite(), fn)(*fn_args)}, 2, seconds,
                                     1))
            for k, v in times.items():
                samples[k].append(v)
        med = {k: statistics.median(v) for k, v in samples.items()}
        bound = link_bound(nbytes, link_mbit)
        for k, t in med.items():
            share = bound / t if bound else None
            log(f"{label:>14} {k:>14} {fmt_time(t):>12} {fmt_bw(busbw(nbytes, t)):>12} "
                f"{t / med['mpi4py']:10.2f} {t / med['hvdl on MPI']:9.2f} "
                f"{t / med['gloo'] if 'gloo' in med else float('nan'):8.2f} "
                f"{fmt_time(bound) if bound else '-':>11} "
                f"{f'{share:.2f}' if share else '-':>9}")
            rows.append(dict(case=f"controllers {fn}", bytes=nbytes, library=k, seconds=t,
                             busbw=busbw(nbytes, t), ratio_to_mpi=t / med["mpi4py"],
                             ratio_to_hvdl_mpi=t / med["hvdl on MPI"], link_bound=bound,
                             share_of_bound=share))
    restart_horovodlite(**controller_env("mpi"))
    return rows


def run_connections(sizes, quick, counts=(1, 2, 4), link_mbit=None):
    """The Gloo controller with HOROVOD_GLOO_CONNECTIONS set to each of `counts` (restarted in
    alternation, every round): allreduce times, their ratio to one connection and their share
    of the link's bound."""
    rounds = 3 if quick else 5
    rows = []
    log(f"\n== the Gloo controller's connections per pair of ranks, np={SIZE}, "
        f"{hvd.cross_size()} host(s), float32 Sum ==")
    log(f"{'size':>10} {'connections':>12} {'time':>12} {'x one':>7} {'of bound':>9}")
    for nbytes in sizes:
        samples = {k: [] for k in counts}
        for _ in range(rounds):
            for k in counts:
                forget_gloo_port()  # a fresh rendezvous port for every start
                restart_horovodlite(**controller_env("gloo"), HOROVOD_GLOO_CONNECTIONS=k)
                t = compare({k: Horovodlite().single(nbytes)}, 2, 0.05 if quick else 0.2, 1)
                samples[k].append(t[k])
        med = {k: statistics.median(v) for k, v in samples.items()}
        bound = link_bound(nbytes, link_mbit)
        for k, t in med.items():
            log(f"{size_label(nbytes):>10} {k:>12} {fmt_time(t):>12} {t / med[counts[0]]:7.2f} "
                f"{f'{bound / t:.2f}' if bound else '-':>9}")
            rows.append(dict(case="connections", bytes=nbytes, connections=k, seconds=t,
                             ratio_to_one=t / med[counts[0]],
                             share_of_bound=bound / t if bound else None))
    os.environ.pop("HOROVOD_GLOO_CONNECTIONS", None)
    return rows


def bg_thread_cpu_seconds() -> float:
    """CPU seconds used so far by horovodlite's background thread (named hvdl-bg)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().strip() != "hvdl-bg":
                    continue
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except OSError:
            continue
    return total


def run_idle(seconds: float):
    hvd.allreduce(torch.ones(1), name="idle.warmup")
    COMM.Barrier()
    time.sleep(0.5)
    c0, w0 = bg_thread_cpu_seconds(), time.perf_counter()
    time.sleep(seconds)
    share = (bg_thread_cpu_seconds() - c0) / (time.perf_counter() - w0)
    worst = COMM.allreduce(share, op=MPI.MAX)
    log(f"\n== idle: horovodlite background thread uses {100 * worst:.2f}% of one core "
        f"(worst rank, {seconds:.0f} s idle) ==")
    return dict(case="idle", cpu_share=worst)


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MiB


def run_rss(steps: int, count: int, nbytes: int):
    step = Horovodlite().many(count, nbytes)
    for _ in range(100):
        step()
    before = rss_mib()
    for _ in range(steps):
        step()
    growth = COMM.allreduce(rss_mib() - before, op=MPI.MAX)
    log(f"\n== memory: RSS growth over {steps} fusion steps: {growth:.2f} MiB (worst rank) ==")
    return dict(case="rss", steps=steps, growth_mib=growth)


def run_timeline_overhead(count, nbytes, quick, rounds):
    """The fusion case with the timeline recording vs not. Each round runs both, in alternating
    order (off/on, then on/off: the second run of a pair is favoured by a few percent, measured
    with the timeline off in both), and the overhead is the median of the per-round ratios
    (paired, so slow drifts cancel); the CPU time the process used per step (all its threads,
    the timeline's writer included) is compared the same way. Each run is about a second: the
    per-step cost of a long run is what is measured, so start_timeline() and stop_timeline()
    (one-time costs: creating the file, trimming it) are outside the timed part, and the
    writer's last round (at most 50 ms of records) falls outside it too, a few percent of its
    work at this length."""
    step = Horovodlite().many(count, nbytes)
    path = os.path.join(tempfile.gettempdir(), f"hvdl_bench_timeline_{os.getpid()}.json")
    iters = calibrate(step, 5, 0.1 if quick else 1.0)
    wall, cpu = [], []
    for round_ in range(6 if quick else rounds):
        pair_wall, pair_cpu = {}, {}
        for mode in (("off", "on"), ("on", "off"))[round_ % 2]:
            if mode == "on":
                hvd.start_timeline(path)
            COMM.Barrier()
            start, cpu0 = time.perf_counter(), time.process_time()
            for _ in range(iters):
                step()
            pair_cpu[mode] = COMM.allreduce((time.process_time() - cpu0) / iters, op=MPI.SUM)
            pair_wall[mode] = COMM.allreduce((time.perf_counter() - start) / iters, op=MPI.MAX)
            if mode == "on":
                hvd.stop_timeline()
        wall.append(pair_wall["on"] / pair_wall["off"])
        cpu.append(pair_cpu["on"] / pair_cpu["off"])
    if RANK == 0 and os.path.exists(path):
        os.unlink(path)
    w, c = statistics.median(wall) - 1, statistics.median(cpu) - 1
    lo, hi = median_interval(wall)
    log(f"\n== timeline overhead on the fusion case: wall time {100 * w:+.1f}% (95% interval "
        f"{100 * (lo - 1):+.1f}% to {100 * (hi - 1):+.1f}%), CPU time {100 * c:+.1f}% (median of "
        f"{len(wall)} paired rounds) ==")
    return dict(case="timeline", wall_overhead=w, wall_interval=(lo - 1, hi - 1), cpu_overhead=c)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer sizes and shorter measurements")
    p.add_argument("--rss-steps", type=int, default=10000)
    p.add_argument("--idle-seconds", type=float, default=5.0)
    p.add_argument("--timeline-rounds", type=int, default=60,
                   help="paired rounds of the timeline overhead measurement")
    p.add_argument("--json", help="write all measurements to this file (rank 0)")
    p.add_argument("--no-gloo", action="store_true",
                   help="leave gloo out: measured here, its 200-tensor case slows the function "
                        "timed after it (horovodlite's fusion case by ~8%%, even with the order "
                        "alternating and a warm-up call)")
    p.add_argument("--skip", default="", help="comma list of parts to skip: "
                                              "single,fusion,idle,rss,timeline,hosts")
    p.add_argument("--only", default="", help="comma list of the parts to run (default: all; "
                                              "hosts runs when the job spans several hosts "
                                              "with the same number of ranks on each)")
    p.add_argument("--controller", choices=["mpi", "gloo"], default="mpi",
                   help="the controller horovodlite runs on in every part but `controllers` "
                        "(gloo: the controller without MPI, started inside this mpirun job)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cuda: the single sizes and the fusion case on CUDA tensors against "
                        "torch.distributed NCCL (or gloo when ranks share a GPU)")
    p.add_argument("--no-cpu-reference", action="store_true",
                   help="--device cuda: leave out horovodlite on CPU tensors")
    p.add_argument("--link-mbit", type=float,
                   help="across hosts: each host's link rate in Mbit/s, for the `controllers` "
                        "part's bound (default: the test hosts' rate, when they are up)")
    p.add_argument("--sizes", type=lambda text: [int(v) for v in text.split(",")],
                   help="the single sizes in bytes, e.g. 4,1048576 (default: by --device and "
                        "--quick)")
    return p.parse_args(argv)


def main() -> int:
    args = parse_args()
    if args.device == "cuda":
        return run_cuda(args)
    torch.set_num_threads(1)
    os.environ.update({k: str(v) for k, v in controller_env(args.controller).items()})
    hvd.init()
    comps = competitors(gloo=not args.no_gloo)
    parts = {"single", "fusion", "idle", "timeline", "rss", "hosts", "controllers",
             "connections"}
    skip = set(filter(None, args.skip.split(",")))
    if args.only:
        skip |= parts - set(args.only.split(","))
    from horovodlite import _C  # noqa: PLC0415  (after hvd.init: the runtime is up)

    log(f"allreduce benchmark: np={SIZE}, {MPI.Get_library_version().splitlines()[0]}, "
        f"torch {torch.__version__}, {os.cpu_count()} CPUs, horovodlite on "
        f"{'the Gloo controller' if hvd.gloo_enabled() else _C.transport_version()}")
    sizes = args.sizes or ([4, 1 * KiB, 64 * KiB, 1 * MiB, 16 * MiB] if args.quick else
                           [4, 64, 1 * KiB, 16 * KiB, 64 * KiB, 256 * KiB, 1 * MiB, 4 * MiB,
                            16 * MiB, 64 * MiB])
    rows = []
    if "hosts" not in skip and hvd.cross_size() > 1 and hvd.local_size() > 1 and \
            hvd.is_homogeneous():
        for collective in ACROSS_HOSTS:
            if collective == "reducescatter" and not hvd.gloo_enabled():
                continue
            rows += run_across_hosts(comps, [16 * MiB] if args.quick else
                                     [1 * MiB, 16 * MiB, 64 * MiB], args.quick, collective)
    if "controllers" not in skip and hvd.gloo_built():
        rows += run_controllers(comps, args.sizes or ([4, 1 * MiB, 16 * MiB] if args.quick else
                                [4, 64 * KiB, 1 * MiB, 16 * MiB, 64 * MiB]), args.quick,
                                link_mbit=args.link_mbit or hosts_link_mbit())
        restart_horovodlite(**controller_env(args.controller))
    if "connections" in (args.only or "").split(",") and hvd.gloo_built():  # asked for only
        rows += run_connections(args.sizes or [16 * MiB, 64 * MiB], args.quick,
                                link_mbit=args.link_mbit or hosts_link_mbit())
        restart_horovodlite(**controller_env(args.controller))
    if "single" not in skip:
        rows += run_single_sizes(comps, sizes, args.quick)
    if "fusion" not in skip:
        rows += run_fusion(comps, 200, 64 * KiB, args.quick)
    if "idle" not in skip:
        rows.append(run_idle(args.idle_seconds))
    if "timeline" not in skip:
        rows.append(run_timeline_overhead(200, 64 * KiB, args.quick, args.timeline_rounds))
    if "rss" not in skip:
        rows.append(run_rss(1000 if args.quick else args.rss_steps, 200, 64 * KiB))
    if args.json and RANK == 0:
        with open(args.json, "w") as f:
            json.dump(dict(np=SIZE, rows=rows), f, indent=1)
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
