"""What horovodliterun settles about the cluster before it starts anything: which environment
reaches the ranks (``--env-exclude``, ``--env-include``; the rules are ``common/env_travel.py``)
and, with neither -H nor --hostfile, the hosts of the allocation it runs in (``allocation.py``).
In a Slurm job, Gloo and elastic ranks on the other nodes then start as job steps, and an elastic
job follows the nodes Slurm still offers (``slurm_steps.py``).
"""

from __future__ import annotations

import os
import sys

from horovodlite.common import env_travel
from horovodlite.runner import allocation, slurm_steps


def add_arguments(p) -> None:
    p.add_argument("--env-exclude", action="append", default=[], metavar="PATTERN",
                   help="leave the variables whose names match PATTERN (fnmatch, e.g. "
                        "'WANDB_*'; repeatable) out of every rank's environment. Every other "
                        "variable of this environment reaches every rank, but a short list "
                        "(--verbose prints it; docs/clusters.md says why)")
    p.add_argument("--env-include", action="append", default=[], metavar="PATTERN",
                   help="send the variables matching PATTERN to every rank although the rules "
                        "leave them out, e.g. CUDA_VISIBLE_DEVICES to other hosts (repeatable; "
                        "--env-exclude wins)")


def prepare(args, controller: str, error, env=os.environ) -> None:
    """Hosts from the allocation when none were given (``args.hosts``; ``args.job_hosts``: the
    hosts the ranks may run on, for the launcher's address), and ``--verbose``'s list of what
    does not travel. ``error(message)`` exits."""
    args.job_hosts = []
    args.slurm_nodes = []  # the Slurm job's nodes an elastic job follows (slurm_steps.usable)
    # hosts placed by mpirun's own options in --mpi-args (--host, a rankfile) are the user's
    # choice: the allocation's are not added to them (mpirun merges two lists)
    placed = controller == "mpi" and allocation.placing_option(args.mpi_args)
    if not args.hosts and not getattr(args, "host_discovery_script", None) and not placed:
        try:
            found = allocation.find(env, args.mpi_args)
        except ValueError as e:
            error(f"reading the allocation's hosts: {e}; name the hosts with -H or --hostfile")
        if found is not None:
            print(found.describe(), file=sys.stderr, flush=True)
            args.job_hosts = [h for h, _ in found.hosts]
            if controller == "gloo" or not found.mpirun_has_it:
                args.hosts = found.spec()
            if controller == "gloo" and found.scheduler == "slurm":
                _slurm_steps(args, found, env)
            slots = sum(n for _, n in found.hosts)
            if controller == "gloo" and (args.num_proc or 0) > slots:
                first = found.hosts[0][0]
                error(f"-np {args.num_proc} but the allocation ({found.source}: {found.spec()}) "
                      f"has {slots} slot(s), and --gloo starts one rank per slot: ask the "
                      f"scheduler for {args.num_proc} tasks, or name the hosts with -H (e.g. "
                      f"-H {first}:{args.num_proc})")
    if args.verbose:
        for line in env_travel.describe_left_out(env_travel.from_args(args), env,
                                                 mpirun=controller == "mpi"):
            print(f"horovodliterun: environment: {line}", flush=True)


def _slurm_steps(args, found, env) -> None:
    """Gloo ranks on other nodes of this Slurm job start as its steps, unless the user chose how
    to reach hosts (--ssh-agent, -p, -i); an elastic job follows the nodes' states."""
    if (getattr(args, "ssh_agent", None) or getattr(args, "ssh_port", None) is not None
            or getattr(args, "ssh_identity_file", None)):
        return
    if not slurm_steps.available(env):
        return
    args.ssh_agent = slurm_steps.agent()
    print(f"horovodliterun: ranks on the other nodes start as steps of Slurm job "
          f"{env.get('SLURM_JOB_ID')} (srun), not over ssh", file=sys.stderr, flush=True)
    if getattr(args, "elastic", False):
        args.slurm_nodes = [h for h, _ in found.hosts]


__all__ = ["add_arguments", "prepare"]
