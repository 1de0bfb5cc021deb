"""benchmarks/fault_tolerance.py, small: horovodlite's elastic job and torchrun restarting from
its checkpoints through the same seeded kills (torchft, a benchmark-only dependency, is left
out). What is checked is what the benchmark's figures rest on, never a time: every kill fired
and was recovered from, horovodlite redid no step and torchrun redid the ones since its
checkpoint, and both ended with the weights of one process training the same steps."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from horovodlite.common.basics import gloo_built

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(not gloo_built(), reason="this build has no Gloo controller")


def test_the_fault_tolerance_benchmark_runs_both_systems_through_the_same_kills(tmp_path):
    p = subprocess.run(
        [sys.executable, "benchmarks/fault_tolerance.py", "--systems", "hvdl", "torchrun",
         "--steps", "300", "--every", "3", "--back", "3", "--work", "0.01", "--runs", "1",
         "--seed", "5", "--timeout", "240", "--keep", str(tmp_path)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    out = p.stdout
    assert p.returncode == 0, out
    rows = {m[0]: m for m in re.findall(
        r"^run 0 (\w+) +wall ([\d.]+) s  kills (\d+)  redone (\d+)  discarded \d+  to training "
        r"again ([\d.-]+) s .*  max diff (\S+)$", out, re.M)}
    assert set(rows) == {"hvdl", "torchrun"}, out
    for system, (_, _, kills, _, _, diff) in rows.items():
        assert int(kills) >= 1, out
        assert float(diff) < 1e-9, (system, out)  # float64: only the sums' order
    assert rows["hvdl"][3] == "0", out  # at most the step in flight, which is never applied
    assert int(rows["torchrun"][3]) >= 1, out  # back to its checkpoint: steps done again
    assert "TIMED OUT" not in out and "torchrun wall / horovodlite wall:" in out, out
