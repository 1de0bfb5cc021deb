"""horovodlite past one machine, simulated: the control plane at 8-1,024 ranks, the launchers and
the rendezvous at 2,048. One JSON line per case and rank count (``--json``), else a table.

    python benchmarks/scale.py                              # 8,64,256,1024 and the launch rows
    python benchmarks/scale.py --ranks 8,64 --no-launch --json

**The control plane** (``case``: ``uncached``, ``cached``, ``late``): N ranks as threads in this
process, each running the real negotiation (core/controller: the response cache's bit vector,
the coordinator's gather and broadcast, the stall inspector) over the in-process fabric of
csrc/testing (LocalControlPlane) instead of MPI or Gloo. Every rank submits the 161 gradients of
ResNet-50 (benchmarks/train_step.py's model: their names and sizes) once per step and cycles
until all have responses.
- ``uncached``: no response cache, so every step negotiates as the first step of a job does;
- ``cached``: the steady state (one warm-up step fills the cache, then cached steps);
- ``late``: cached, and the last rank submits its step 1 s late while the others cycle, the stall
  inspector checking every 0.5 s.
Per line: ``worker_cpu_us_per_cycle`` (the median over ranks 1..N-1) and
``coordinator_cpu_us_per_cycle`` (rank 0) are the CPU time of the rank's thread per cycle
(CLOCK_THREAD_CPUTIME_ID: with hundreds of threads on a few cores, wall time is the
scheduler's), without the time inside the in-process fabric, which stands for the network and is
given apart (``*_fabric_cpu_us_per_cycle``: one mutex and condition variable that every thread
waits on, so it grows with N as no network transport would). ``bytes_per_rank_per_cycle`` and
``coordinator_bytes_per_cycle`` count what a rank would send and receive: its gather message
(the coordinator receives every rank's), the broadcast (received once by every rank), the bit
vector (out and back).

**The launchers** (``case``: ``launch``, ``elastic_round``, ``store_rendezvous``) at each of
``--ranks`` and always at 2,048 (``--no-launch`` skips them): benchmarks/scale_launch.py, whose
docstring says what runs for real and what stands in (a real ``horovodliterun --gloo`` and
``--elastic`` through a fake ssh adding 50 ms per connection, ranks as protocol-speaking
stand-ins; the elastic driver's round and a TCPStore rendezvous in process).

Targets (docs/scaling.md): the cached cycle's CPU per worker at 1,024 ranks at most 2x its value
at 8; the coordinator's uncached CPU per cycle at 1,024 at most 1.2 x 128 x its value at 8;
2,048 ranks launched and registered through the fake ssh in at most 30 s; a TCPStore rendezvous
of 2,048 in at most 10 s.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "unit"))
from cpp_testing import load_testing_module  # noqa: E402  (builds horovodlite._testing)

CASES = ("uncached", "cached", "late")
LAUNCH_RANKS = 2048


def resnet50_gradients() -> tuple[list, list]:
    """The names and element counts of ResNet-50's parameters, in registration order."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import train_step  # noqa: PLC0415  (torch; benchmarks/, beside this file)

    params = list(train_step.make_model("resnet50").named_parameters())
    return [f"allreduce.{name}" for name, _ in params], [p.numel() for _, p in params]


def control_plane_rows(ranks: list, cases=CASES, steps: int = 5, late_seconds: float = 1.0,
                       stall_seconds: float = 0.5) -> list:
    T = load_testing_module()
    names, sizes = resnet50_gradients()
    rows = []
    for n in ranks:
        for case in cases:
            row = dict(T.scale_control_plane(n, case, names, sizes, steps=steps,
                                             late_seconds=late_seconds,
                                             stall_seconds=stall_seconds))
            rows.append(row)
            yield_row(row)
    return rows


def yield_row(row: dict) -> None:
    if ARGS.json:
        print(json.dumps(row), flush=True)
        return
    print(f"{row['ranks']:>6} {row['case']:<9} cycles {row['cycles']:>5}  worker "
          f"{row['worker_cpu_us_per_cycle']:>9.1f} us (fabric "
          f"{row['worker_fabric_cpu_us_per_cycle']:.1f})  coordinator "
          f"{row['coordinator_cpu_us_per_cycle']:>10.1f} us (fabric "
          f"{row['coordinator_fabric_cpu_us_per_cycle']:.1f})  bytes/rank "
          f"{row['bytes_per_rank_per_cycle']:>8.0f}  coordinator bytes "
          f"{row['coordinator_bytes_per_cycle']:>10.0f}", flush=True)


def targets(rows: list) -> list:
    """The control plane's targets, where both ends were measured."""
    by = {(r["ranks"], r["case"]): r for r in rows if r["case"] in CASES}
    out = []
    lo, hi = by.get((8, "cached")), by.get((1024, "cached"))
    if lo and hi:
        ratio = hi["worker_cpu_us_per_cycle"] / lo["worker_cpu_us_per_cycle"]
        out.append(dict(target="cached worker CPU/cycle at 1024 <= 2x at 8",
                        value=round(ratio, 2), met=ratio <= 2.0))
    lo, hi = by.get((8, "uncached")), by.get((1024, "uncached"))
    if lo and hi:
        ratio = hi["coordinator_cpu_us_per_cycle"] / lo["coordinator_cpu_us_per_cycle"]
        out.append(dict(target="uncached coordinator CPU/cycle at 1024 <= 1.2 x 128 x at 8",
                        value=round(ratio, 1), met=ratio <= 1.2 * 128))
    for r in rows:
        if r["case"] == "launch" and r["ranks"] == LAUNCH_RANKS and "seconds" in r:
            out.append(dict(target=f"{r['launcher']}: 2048 ranks launched and registered <= 30 s",
                            value=round(r["seconds"], 2), met=r["seconds"] <= 30))
        if r["case"] == "store_rendezvous" and r["ranks"] == LAUNCH_RANKS and "seconds" in r:
            out.append(dict(target="TCPStore rendezvous of 2048 <= 10 s, every client's end "
                                   "(stand-in threads on 2 cores dominate)",
                            value=round(r["seconds"], 2), met=r["seconds"] <= 10))
            if "rank0" in r:
                out.append(dict(target="TCPStore rendezvous of 2048 <= 10 s, rank 0 has listed "
                                       "every rank", value=round(r["rank0"], 2),
                                met=r["rank0"] <= 10))
    return out


def main(argv=None) -> int:
    global ARGS
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", default="8,64,256,1024",
                   help="rank counts of the control plane cases (comma separated)")
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--steps", type=int, default=5, help="measured steps (uncached, cached)")
    p.add_argument("--late-seconds", type=float, default=1.0)
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument("--no-launch", action="store_true", help="skip the 2,048-rank launch rows")
    ARGS = p.parse_args(argv)
    ranks = [int(v) for v in ARGS.ranks.split(",")]
    cases = ARGS.cases.split(",")
    if set(cases) - set(CASES):
        p.error(f"--cases: some of {', '.join(CASES)}")
    rows = control_plane_rows(ranks, cases, ARGS.steps, ARGS.late_seconds)
    if not ARGS.no_launch:
        import scale_launch  # noqa: PLC0415  (benchmarks/, beside this file; prints its rows)

        rows += scale_launch.launch_rows(ranks, json_lines=ARGS.json, launch_ranks=LAUNCH_RANKS)
    for t in targets(rows):
        if ARGS.json:
            print(json.dumps(dict(case="target", **t)), flush=True)
        else:
            print(f"target: {t['target']}: {t['value']} ({'met' if t['met'] else 'NOT met'})")
    return 0


ARGS = argparse.Namespace(json=False)

if __name__ == "__main__":
    sys.exit(main())
