"""DistributedOptimizer's options in combination, many at a time: every case against one process
on the global batch (tests/parallel/combination_cases.py), at each number of ranks, then the
counts of equal / refused / wrong / error cases, overall and by option value.

    python scripts/combination_grid.py --np 2 3                 # the whole grid (hours)
    python scripts/combination_grid.py --np 2 3 --sample 500 --seed 7
    python scripts/combination_grid.py --np 3 --gloo --pairwise

Each job prints one line per case that is not equal (a replay command with its id) and the
tables at the end; the exit status is 1 if any case was wrong or an error.
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "parallel"))
import combination_cases as cases  # noqa: E402

STATUSES = ("equal", "refused", "wrong", "error")


def run_job(np_: int, gloo: bool, case_args: list, timeout: int) -> list:
    """(case, status, detail) of every case, from rank 0's output of one job."""
    cmd = [sys.executable, "-m", "horovodlite.runner.launch", "--gloo" if gloo else "--mpi",
           "-np", str(np_), sys.executable, str(ROOT / "tests/parallel/combination_cases.py"),
           *case_args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    out, last = [], None
    for line in proc.stdout.splitlines():
        if not line.startswith("[0]<stdout>:"):
            continue
        text = line[len("[0]<stdout>:"):]
        status, _, rest = text.partition(" ")
        if status in STATUSES:
            last = [cases.parse_id(rest.strip()), status, ""]
            out.append(last)
        elif text.startswith("    ") and last is not None:
            last[2] += text.strip() + " "
    if not out:
        raise RuntimeError(f"np {np_}: the job reported no case (exit {proc.returncode}):\n"
                           + (proc.stdout + proc.stderr)[-3000:])
    return out


def tables(results: list) -> str:
    total = collections.Counter(status for _, status, _ in results)
    lines = ["| | " + " | ".join(STATUSES) + " |", "|---" * (len(STATUSES) + 1) + "|",
             "| all | " + " | ".join(str(total[s]) for s in STATUSES) + " |"]
    for option, values in cases.OPTIONS.items():
        for value in values:
            seen = collections.Counter(s for c, s, _ in results if c[option] == value)
            lines.append(f"| {option}={value} | "
                         + " | ".join(str(seen[s]) for s in STATUSES) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--np", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--gloo", action="store_true", help="the controller without MPI")
    parser.add_argument("--sample", type=int, help="a seeded random sample instead of the grid")
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--pairwise", action="store_true", help="the pairwise-covering set")
    parser.add_argument("--jobs", type=int, default=1, help="jobs per number of ranks")
    parser.add_argument("--timeout", type=int, default=6 * 3600)
    args = parser.parse_args()
    if args.pairwise:
        what = ["--pairwise"]
    elif args.sample:
        what = ["--seed", str(args.seed), "--sample", str(args.sample)]
    else:
        what = ["--all"]
    results = []
    for np_ in args.np:
        mine = []
        for k in range(args.jobs):
            mine += run_job(np_, args.gloo, [*what, "--part", f"{k}/{args.jobs}"],
                            args.timeout)
        for case, status, detail in mine:
            if status in ("wrong", "error"):
                print(f"np {np_} {status}: horovodliterun -np {np_} python "
                      f"tests/parallel/combination_cases.py --case {cases.case_id(case)}\n"
                      f"    {detail}")
        counts = collections.Counter(s for _, s, _ in mine)
        print(f"np {np_}: " + ", ".join(f"{counts[s]} {s}" for s in STATUSES), flush=True)
        results += mine
    print(tables(results))
    return 1 if any(s in ("wrong", "error") for _, s, _ in results) else 0


if __name__ == "__main__":
    sys.exit(main())
