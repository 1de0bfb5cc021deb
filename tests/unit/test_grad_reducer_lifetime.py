"""DistributedOptimizer's C++ gradient hooks (csrc/torch/grad_reducer, accumulator_hook) at the
ends of their reducer's life, in a child process (tests/scripts/reducer_lifetime.py) since the
defect this guards against crashed the process: a reducer destroyed inside its own hook, and
optimizers wrapped, detached and dropped while another thread runs backward."""

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "reducer_lifetime.py"
MODES = ["drop-in-hook", "drop-in-user-hook", "threads"]


def test_a_reducer_dropped_inside_its_hook_or_beside_a_backward_thread_never_crashes():
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"}
    proc = subprocess.run([sys.executable, str(SCRIPT), *MODES], env=env, capture_output=True,
                          text=True, timeout=240)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{out[-4000:]}"
    for mode in MODES:
        assert f"ok {mode}" in proc.stdout, out[-4000:]
