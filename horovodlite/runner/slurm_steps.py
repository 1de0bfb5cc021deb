"""Inside a Slurm allocation, horovodliterun's Gloo and elastic ranks on other nodes start as job
steps (``srun``), not over ssh, and an elastic job follows the nodes Slurm still offers.

Why steps: many clusters refuse ssh to compute nodes, or let it in outside the job's cgroup;
a step is Slurm's own way to start a process on a node of the allocation, it is accounted to the
job, ``scancel`` reaches it, and it ends with the job. horovodliterun calls this module the way
it calls an ``--ssh-agent``:

    python -m horovodlite.runner.slurm_steps HOST 'cd CWD && exec env ... python -m ...task ...'

which becomes ``srun --overlap --nodes=1 --ntasks=1 --nodelist=HOST --mpi=none ... /bin/sh -c
LINE`` (``--overlap``: the step shares the CPUs of the job's other steps and of the batch
script; ``--mpi=none``: the rank is a Gloo rank, whatever the cluster's ``MpiDefault``; the
rank's environment still comes on stdin, which srun forwards to its one task).

Which nodes Slurm still offers (``usable``): ``sinfo``'s state of each node of the allocation.
A node being drained (``scontrol update nodename=... state=drain``), down, failing or not
responding leaves the list, and an elastic job's ranks there retire at the next commit, as with
a host that left a discovery script's output; a node resumed comes back, and the job grows onto
it again.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys

# sinfo's short states (%t) of a node that should get no more work; a trailing "*" (not
# responding), "~" (powered off) or "#" (powering up) also leaves it out
GONE_STATES = ("drain", "drng", "down", "fail", "failg", "maint", "unk", "npc", "futr", "pow_dn",
               "inval")
GONE_MARKS = ("*", "~", "#", "%", "!")


def agent() -> str:
    """horovodliterun's ``--ssh-agent`` that starts a rank as a step of this job."""
    return shlex.join([sys.executable, "-m", "horovodlite.runner.slurm_steps"])


def available(env=os.environ) -> bool:
    """Whether ranks may start as steps here: inside a job (SLURM_JOB_ID), with srun on PATH."""
    return bool(env.get("SLURM_JOB_ID")) and shutil.which("srun") is not None


def step_command(host: str, line: str, env=os.environ) -> list:
    """srun's command line that runs the shell line ``line`` as one task on ``host``."""
    cmd = ["srun", "--overlap", "--nodes=1", "--ntasks=1", f"--nodelist={host}", "--mpi=none",
           "--kill-on-bad-exit=1", "--job-name=horovodlite-rank"]
    cpus = env.get("SLURM_CPUS_PER_TASK")
    if cpus:  # srun of Slurm 22.05 does not take it from the job by itself
        cmd.append(f"--cpus-per-task={cpus}")
    return [*cmd, "/bin/sh", "-c", line]


def usable(nodes: list, run=subprocess.run) -> list | None:
    """The nodes of ``nodes`` that Slurm still offers (see the top), in their order; None when
    sinfo cannot say (the caller keeps its last list)."""
    try:
        out = run(["sinfo", "--noheader", "--Node", f"--nodes={','.join(nodes)}",
                   "--format=%N %t"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    gone, seen = set(), set()
    for row in out.stdout.splitlines():
        words = row.split()
        if len(words) != 2:
            continue
        node, state = words
        seen.add(node)
        if state.rstrip("".join(GONE_MARKS)) in GONE_STATES or state.endswith(GONE_MARKS):
            gone.add(node)  # a node in several partitions: any of its lines leaves it out
    if not seen:
        return None
    return [n for n in nodes if n in seen and n not in gone]


def main(argv=None) -> int:
    """As an ssh-like agent: ``HOST LINE`` (ssh's -p and -i mean nothing to srun)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 2 or argv[0].startswith("-"):
        print("usage: python -m horovodlite.runner.slurm_steps HOST 'SHELL LINE' (horovodliterun "
              "calls it inside a Slurm job)", file=sys.stderr)
        return 2
    cmd = step_command(argv[0], argv[1])
    try:
        os.execvp(cmd[0], cmd)
    except OSError as e:
        print(f"horovodliterun: cannot start a Slurm step on {argv[0]}: srun: {e.strerror}",
              file=sys.stderr)
        return 127
    return 0  # not reached


__all__ = ["agent", "available", "step_command", "usable", "GONE_STATES"]


if __name__ == "__main__":
    sys.exit(main())
