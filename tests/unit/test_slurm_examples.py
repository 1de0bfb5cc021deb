"""The Slurm job scripts in examples/slurm/ (no Slurm here): they parse (bash -n), open with what
they do and how to run them, every horovodliterun option and example option they use exists,
every HOROVOD_* variable they set is one horovodlite reads, and the srun script's settings make
its tasks meet without MPI even where srun hands them PMIx variables."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from horovodlite._extension import load
from horovodlite.common import launch_env, launchers
from horovodlite.runner import launch

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "examples" / "slurm").glob("*.sbatch"))
# what the scripts' variables stand for when their command lines are checked
VALUES = {"SLURM_NTASKS": "8", "IFACE": "eth0", "SLURM_JOB_ID": "1234",
          "SLURM_CPUS_PER_TASK": "8"}


def commands(path: Path) -> list:
    """The script's command lines, continuation lines joined, comments and #SBATCH left out."""
    text = re.sub(r"\\\n\s*", " ", path.read_text())
    return [line.strip() for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def words(line: str) -> list:
    expanded = re.sub(r"\$\{?(\w+)\}?", lambda m: VALUES.get(m.group(1), m.group(0)), line)
    return shlex.split(expanded, comments=True)


def exports(path: Path) -> dict:
    return dict(re.findall(r"^export (\w+)=(\S+)", path.read_text(), re.M))


def test_both_scripts_are_there():
    assert {p.name for p in SCRIPTS} == {"train_srun.sbatch", "train_horovodliterun.sbatch"}


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_script_parses_and_says_what_it_does(path):
    subprocess.run(["bash", "-n", str(path)], check=True)
    head = path.read_text().split("#SBATCH", 1)[0]
    assert head.startswith("#!/bin/bash\n# Trains ") and "# Run:   sbatch examples/slurm/" in head


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_options_and_variables_exist(path):
    known = {name for name, _, _ in load().knobs()}
    known |= {getattr(launch_env, n) for n in dir(launch_env) if n.isupper()
              and isinstance(getattr(launch_env, n), str)}
    for name in exports(path):
        if name.startswith("HOROVOD_"):
            assert name in known, f"{path.name}: {name} is no variable horovodlite reads"
    ran = []
    for line in commands(path):
        argv = words(line)
        if argv[0] == "horovodliterun":
            args = launch.parse_args(argv[1:])  # an unknown option exits here
            assert args.num_proc == 8 and args.command[0] == "python"
            argv = args.command
        elif argv[0] == "srun":
            argv = argv[argv.index("python"):]
        if argv[0] == "python":
            ran.append(argv[1:])
    assert ran, f"{path.name} runs no example"
    # "$@": the script's arguments, else the defaults it sets (`(($#)) || set -- ...`)
    defaults = re.search(r"^\(\(\$#\)\) \|\| set -- (.+)$", path.read_text(), re.M)
    assert defaults, f"{path.name} sets no default arguments for the example"
    for script, *options in ran:
        if options == ["$@"]:
            options = shlex.split(defaults.group(1))
        assert script == "examples/pytorch_digits.py", script
        declared = set(re.findall(r'add_argument\("(--[\w-]+)"', (ROOT / script).read_text()))
        used = {o for o in options if o.startswith("--")}
        assert used and used <= declared, (script, used - declared)


def test_srun_tasks_meet_without_mpi_even_with_pmix_variables():
    """What each of the srun script's tasks sees (its exports over srun's variables, PMIx's too
    should the cluster's srun add them): rank and size from Slurm, the Gloo controller."""
    script = ROOT / "examples" / "slurm" / "train_srun.sbatch"
    env = {k: words(v)[0] for k, v in exports(script).items()}
    env.update(SLURM_PROCID="5", SLURM_NTASKS="8", SLURM_LOCALID="1", SLURM_NODEID="1",
               SLURM_NNODES="2", SLURM_JOB_ID="1234", SLURM_STEP_ID="0",
               SLURM_JOB_NODELIST="gpu[01-02]", SLURM_STEP_NODELIST="gpu[01-02]",
               SLURM_STEP_TASKS_PER_NODE="4(x2)", SLURMD_NODENAME="gpu02",
               PMIX_RANK="5", PMIX_SIZE="8")
    found = launchers.detect(env, mpi_built=True, default_group=False)
    assert (found.controller, found.rank, found.size, found.local_rank) == ("gloo", 5, 8, 1)
    assert found.addr == "gpu01"
