"""benchmarks/scaling_model.py, docs/scaling.md's cost model: its shape (not its parameters)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import scaling_model as M  # noqa: E402


def test_the_data_term_is_nccls_bus_bandwidth_and_only_latency_grows():
    net = M.H100_IB
    s = 128 * 2**20
    for n in (16, 1024):
        data = 2 * (n - 1) / n * s / (net.inter_GBps * 1e9) * 1e3
        ring = M.allreduce_ms(s, n, net, "ring")
        tree = M.allreduce_ms(s, n, net, "tree")
        assert abs(ring - data - 2 * (n - 1) * net.alpha_inter_us / 1e3) < 1e-9
        assert tree <= ring
    assert M.allreduce_ms(s, 1, net, "ring") == 0


def test_efficiency_falls_with_scale_and_the_tree_holds_up():
    cp = M.ControlPlane()
    for w in (M.RESNET50, M.TRANSFORMER):
        ring = [M.step(w, n, M.H100_IB, "ring", cp)["efficiency"] for n in M.GPUS]
        tree = [M.step(w, n, M.H100_IB, "tree", cp)["efficiency"] for n in M.GPUS]
        assert ring == sorted(ring, reverse=True) and all(0 < e <= 1 for e in ring)
        assert all(t >= r for t, r in zip(tree, ring))


def test_the_fit_reads_scale_py_lines(tmp_path):
    rows = [dict(case="cached", ranks=8, worker_cpu_us_per_cycle=50.0),
            dict(case="cached", ranks=1024, worker_cpu_us_per_cycle=90.0),
            dict(case="uncached", ranks=8, coordinator_cpu_us_per_cycle=2400.0),
            dict(case="uncached", ranks=1024, coordinator_cpu_us_per_cycle=300000.0)]
    path = tmp_path / "scale.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    cp = M.ControlPlane()
    cp.fit([json.loads(line) for line in path.read_text().splitlines()])
    assert cp.cached_worker_us == 90.0
    assert 290 < cp.uncached_coordinator_us_per_rank < 300  # dominated by the 1,024-rank point
    assert M.main(["--fit", str(path), "--markdown"]) == 0
