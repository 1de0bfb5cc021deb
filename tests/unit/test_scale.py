"""benchmarks/scale.py's control plane cases at small N (8 and 64), so the benchmark cannot rot:
the real negotiation over the in-process fabric, ranks as threads. Structure only, no timing:
what each case negotiates, what the cache saves, the bytes a rank carries, the stall report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cpp_testing import load_testing_module

ROOT = Path(__file__).resolve().parents[2]
T = load_testing_module()
NAMES = [f"allreduce.layer{i}.weight" for i in range(40)]
SIZES = [64 * (i + 1) for i in range(40)]


def case(n, kind, steps=3):
    return T.scale_control_plane(n, kind, NAMES, SIZES, steps=steps, late_seconds=0.3,
                                 stall_seconds=0.1)


@pytest.mark.parametrize("n", [8, 64])
def test_uncached_steps_each_negotiate_every_tensor(n):
    r = case(n, "uncached")
    assert r["ranks"] == n and r["tensors"] == 40
    assert r["negotiations"] == r["cycles"] == 3 and r["cache_hits"] == 0
    # the coordinator receives every other rank's requests: N - 1 times a worker's message
    assert r["coordinator_bytes_per_cycle"] > (n - 1) * 40 * 20
    assert r["worker_cpu_us_per_cycle"] > 0 and r["coordinator_cpu_us_per_cycle"] > 0


@pytest.mark.parametrize("n", [8, 64])
def test_cached_steps_carry_the_bit_vector_alone(n):
    r = case(n, "cached")
    assert r["cycles"] == 3 and r["negotiations"] == 1  # the warm-up step's
    assert r["cache_hits"] == 3 * 40
    # one 64-bit word out and back per cycle for 40 tensors (and the cache's control bits),
    # whatever the number of ranks
    assert r["bytes_per_rank_per_cycle"] == r["coordinator_bytes_per_cycle"]
    assert r["bytes_per_rank_per_cycle"] == case(2, "cached")["bytes_per_rank_per_cycle"]


@pytest.mark.parametrize("n", [8, 64])
def test_a_late_rank_keeps_the_others_cycling_until_it_comes(n):
    r = case(n, "late")
    assert r["cycles"] > 1 and r["cache_hits"] + 40 * r["negotiations"] >= 40


def test_the_benchmark_prints_json_lines_and_the_stall_report_groups_ranks():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "scale.py"), "--ranks", "8", "--no-launch",
         "--json", "--steps", "2", "--late-seconds", "1.5"],
        capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["case"] for r in rows if r["case"] != "target"] == ["uncached", "cached", "late"]
    assert all(r["ranks"] == 8 and r["tensors"] == 161 for r in rows if r["case"] != "target")
    # the late rank's stall, reported once per tensor with the waiting ranks as one range
    assert "submitted by: ranks 0-6 at train.py:42;" in proc.stderr
    assert "missing on: rank 7 (its last submission:" in proc.stderr
