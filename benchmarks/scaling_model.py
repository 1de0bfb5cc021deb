"""The cost model of docs/scaling.md: per-step communication time and scaling efficiency of
data-parallel training from 8 to 1,024 GPUs, with NCCL's ring and tree, fitted to
benchmarks/scale.py's measurements of horovodlite's control plane.

    python benchmarks/scaling_model.py                        # the tables of docs/scaling.md
    python benchmarks/scaling_model.py --fit scale.jsonl      # refit the control plane
    python benchmarks/scaling_model.py --markdown             # as Markdown

Model (alpha-beta; every parameter below is printed with the tables):
- allreduce of S bytes over N GPUs in nodes of G, NCCL's bus-bandwidth view: the data term is
  2 (N-1)/N x S / B, where B is the bus bandwidth of the slowest link a ring crosses (NVLink
  inside one node, the GPU's share of the node's network beyond it), for ring and tree alike
  (NCCL's double binary tree pipelines to the same bus bandwidth); the latency term is
  2 (N-1) alpha for the ring and 2 log2(N) alpha for the tree;
- horovodlite fuses the gradients of a step into buckets of at most the fusion threshold, each
  one allreduce, the first launched while backward still runs: the communication overlaps
  backward (a share `overlap` of the compute time) except the last bucket's, which starts when
  backward ends (the tail);
- per step the control plane adds the cached cycle (the bit vector's allreduce: 2 log2(N) alpha
  on the network, plus the measured CPU, on the background thread beside training) and, once per
  job or per cache miss, the uncached negotiation (the coordinator's measured CPU, linear in N);
- efficiency = compute / (compute + exposed communication + control plane on the critical path).
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass

GPUS = (8, 16, 32, 64, 128, 256, 512, 1024)


@dataclass(frozen=True)
class Network:
    name: str
    gpus_per_node: int
    intra_GBps: float  # bus bandwidth inside a node (NVLink), per GPU
    inter_GBps: float  # bus bandwidth across nodes, per GPU (its share of the node's NICs)
    alpha_intra_us: float
    alpha_inter_us: float


@dataclass(frozen=True)
class Workload:
    name: str
    gradient_bytes: float
    compute_ms: float  # one step on one GPU, no communication
    overlap: float  # share of the step that communication can hide under (backward)
    fusion_bytes: float = 128 * 2**20  # HOROVOD_FUSION_THRESHOLD
    tensors: int = 161


# An H100 node: NVLink4 inside (nccl-tests allreduce busbw ~360-480 GB/s; 400 used) and 8 x 400
# Gbit/s InfiniBand across: NCCL runs a ring (or tree) per channel, each channel crossing a node
# boundary through its own NIC, so across nodes the bus bandwidth is the node's NICs together,
# 400 GB/s in theory; 180 GB/s is assumed (no SHARP; set your cluster's measured busbw).
H100_IB = Network("8x H100 SXM per node, NVLink + 8x400 Gbit/s IB (180 GB/s busbw assumed)", 8,
                  400.0, 180.0, 2.0, 6.0)
# Horovod's paper (2018): Pascal GPUs, 4 per server, 25 Gbit/s RoCE: one NIC per node, 2.8 GB/s
# of bus bandwidth (90 % of the link) and ~20 us per hop.
P100_25G = Network("4x P100 per node, 25 Gbit/s RoCE", 4, 20.0, 2.8, 5.0, 20.0)

# ResNet-50, batch 64 per GPU, fp32 gradients: 25.6 M parameters; plain torch ran 1,705 img/s
# on one H100 (docs/gpu_measurements.md) -> 37.5 ms per step; backward ~2/3 of it.
RESNET50 = Workload("ResNet-50, bs 64, fp32 gradients", 25.6e6 * 4, 37.5, 0.6)
# A 1.3 B-parameter transformer, bf16 gradients, 16 k tokens per GPU per step: 6 x 1.3e9 x 16384
# FLOPs at 400 TFLOP/s (40 % of an H100's dense bf16) -> 320 ms per step.
TRANSFORMER = Workload("1.3 B transformer, 16 k tokens/GPU, bf16 gradients", 1.3e9 * 2, 320.0,
                       0.6, tensors=292)
# Horovod's paper's anchor: ResNet-101 (44.5 M parameters, fp32), ~0.5 s per step on a P100.
RESNET101_P100 = Workload("ResNet-101 on P100 (Horovod paper)", 44.5e6 * 4, 500.0, 0.6)


@dataclass
class ControlPlane:
    """Fitted to benchmarks/scale.py: CPU microseconds per cycle."""
    cached_worker_us: float = 100.0  # roughly flat in N (1,024 ranks: 101 us; 8: 56 us)
    uncached_coordinator_us_per_rank: float = 280.0  # 1,024 ranks: 283 ms per negotiation

    def fit(self, rows: list) -> None:
        cached = [r for r in rows if r.get("case") == "cached"]
        uncached = [r for r in rows if r.get("case") == "uncached"]
        if cached:
            self.cached_worker_us = max(r["worker_cpu_us_per_cycle"] for r in cached)
        if uncached:  # least squares through the origin: coordinator CPU = k x ranks
            num = sum(r["ranks"] * r["coordinator_cpu_us_per_cycle"] for r in uncached)
            den = sum(r["ranks"] ** 2 for r in uncached)
            self.uncached_coordinator_us_per_rank = num / den


def allreduce_ms(nbytes: float, n: int, net: Network, algo: str) -> float:
    if n <= 1:
        return 0.0
    cross_nodes = n > net.gpus_per_node
    bus = net.inter_GBps if cross_nodes else net.intra_GBps
    alpha = net.alpha_inter_us if cross_nodes else net.alpha_intra_us
    data = 2 * (n - 1) / n * nbytes / (bus * 1e9) * 1e3
    hops = 2 * (n - 1) if algo == "ring" else 2 * math.ceil(math.log2(n))
    return data + hops * alpha / 1e3


def step(w: Workload, n: int, net: Network, algo: str, cp: ControlPlane) -> dict:
    buckets = max(1, math.ceil(w.gradient_bytes / w.fusion_bytes))
    per_bucket = w.gradient_bytes / buckets
    comm = sum(allreduce_ms(per_bucket, n, net, algo) for _ in range(buckets))
    # the last bucket cannot overlap; at least a quarter of a single bucket's gradients arrive
    # at the end of backward
    tail = allreduce_ms(per_bucket if buckets > 1 else w.gradient_bytes / 4, n, net, algo)
    exposed = max(comm - w.overlap * w.compute_ms, tail)
    # the cached cycle's bit vector: a tree allreduce of a few words (latency only)
    control = 2 * math.ceil(math.log2(max(n, 2))) * net.alpha_inter_us / 1e3
    total = w.compute_ms + exposed + control
    return dict(gpus=n, algo=algo, comm_ms=round(comm, 2), exposed_ms=round(exposed, 2),
                control_ms=round(control, 3), step_ms=round(total, 2),
                efficiency=round(w.compute_ms / total, 3),
                first_step_negotiation_ms=round(cp.uncached_coordinator_us_per_rank * n / 1e3, 1))


def tables(cp: ControlPlane) -> list:
    out = []
    for w in (RESNET50, TRANSFORMER):
        for algo in ("ring", "tree"):
            out += [dict(workload=w.name, network=H100_IB.name, **step(w, n, H100_IB, algo, cp))
                    for n in GPUS]
    out += [dict(workload=RESNET101_P100.name, network=P100_25G.name,
                 **step(RESNET101_P100, n, P100_25G, "ring", cp)) for n in (16, 64, 128)]
    return out


def markdown(rows: list) -> str:
    lines = []
    key = None
    for r in rows:
        if (r["workload"], r["network"], r["algo"]) != key:
            key = (r["workload"], r["network"], r["algo"])
            lines += ["", f"**{r['workload']}**, {r['network']}, NCCL {r['algo']}", "",
                      "| GPUs | allreduce per step | exposed | step | efficiency | "
                      "first-step negotiation |", "|---|---|---|---|---|---|"]
        lines.append(f"| {r['gpus']} | {r['comm_ms']} ms | {r['exposed_ms']} ms | "
                     f"{r['step_ms']} ms | {100 * r['efficiency']:.1f} % | "
                     f"{r['first_step_negotiation_ms']} ms |")
    return "\n".join(lines).lstrip() + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fit", help="benchmarks/scale.py --json output to fit the control plane to")
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args(argv)
    cp = ControlPlane()
    if args.fit:
        with open(args.fit) as f:
            cp.fit([json.loads(line) for line in f if line.strip().startswith("{")])
    print(f"control plane: cached cycle {cp.cached_worker_us:.0f} us CPU per worker; "
          f"uncached negotiation {cp.uncached_coordinator_us_per_rank:.0f} us per rank on the "
          "coordinator")
    rows = tables(cp)
    if args.markdown:
        print(markdown(rows), end="")
    else:
        for r in rows:
            print(json.dumps(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
