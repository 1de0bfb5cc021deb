"""What of the launcher's environment reaches the ranks: decided here, for every launcher path.

Every variable of the environment ``horovodliterun`` runs in reaches every rank, on every host,
under ``--gloo``, ``--elastic`` and ``--mpi`` - as with horovodrun: ``NCCL_SOCKET_IFNAME``,
``OMP_NUM_THREADS``, the user's own settings. ``RULES`` lists what does not, each with why:

- **everywhere** (this host's ranks too): MPI's and the scheduler's identity of the process
  that runs horovodliterun (``OMPI_COMM_WORLD_RANK``, ``PMIX_RANK``, ``SLURM_PROCID``, ...: a
  rank given them would take itself for that process; MPI's launcher gives each rank its own),
  horovodliterun's own notice pipe, and what ``--env-exclude`` names;
- **on other hosts only** (a rank here inherits it, as any child process does): the shell's
  own state (exported functions, ``OLDPWD``, ...), variables that name something of this host
  or this login (``HOSTNAME``, ``DISPLAY``, ``SSH_*``, ``TMPDIR``, ...: the other host's login
  gives its own), names a shell cannot assign, and ``CUDA_VISIBLE_DEVICES`` and its ROCm and
  oneAPI counterparts (``GPU_NUMBERING``: this host's GPU numbering; ``--env-include NAME``
  sends one).

``--env-include PATTERN`` sends what a rule leaves out (``--env-exclude`` still wins). Patterns
are ``fnmatch`` patterns over names, case-sensitive. The job's secrets (``launch_env.SECRETS``)
travel, never on a command line: on a remote rank's stdin (``runner/remote.py``), or by name
through mpirun (``-x NAME``: the value goes in MPI's launch message).

How a value travels, so that spaces, quotes, newlines and non-ASCII arrive exactly: to a rank
started through ssh, as one JSON line on its stdin (``encode_block``, read back by the rank
wrapper with ``read_block``), which no shell parses and ``ps`` does not show; through mpirun by
name only (Open MPI ``-x NAME``, MPICH ``-genvlist``: the value is taken from mpirun's own
environment; checked with Open MPI 4 and 5 and MPICH across test hosts). MPI's own settings
(``OMPI_MCA_*``, ``PRTE_MCA_*``, ``PMIX_MCA_*``) travel as any variable does; mpirun hands them
to its ranks by itself, so they are not in its ``-x`` list. The ranks mpirun starts on its own
host inherit its environment (``Policy.mpirun_env``, ``Policy.mpirun_unset``). To the ranks an
elastic MPI job spawns on a host added to it, from the launcher over the report channel
(``runner/report_channel.env_parts``), read by their wrapper: no value on their command line.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
from dataclasses import dataclass

from horovodlite.common import launch_env

EVERYWHERE = "everywhere"
REMOTE = "remote"
# MPI's settings: they travel (mpirun hands them to every rank by itself: Open MPI 4 and 5)
MPI_SETTINGS = ("OMPI_MCA_*", "PRTE_MCA_*", "PMIX_MCA_*")

MPI_IDENTITY = ("MPI's identity of the process running horovodliterun; MPI gives each rank "
                "its own")

# Which of this host's accelerators a process sees: CUDA's, ROCm's (ROCR_, HIP_, the OpenCL
# GPU_DEVICE_ORDINAL) and oneAPI Level Zero's. Another host numbers its own devices.
GPU_NUMBERING = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
                 "GPU_DEVICE_ORDINAL", "ZE_AFFINITY_MASK")

# (where, patterns, why) - the one list of what does not travel (see the top).
RULES = (
    (EVERYWHERE, MPI_SETTINGS, None),  # (the first match decides: these travel)
    (EVERYWHERE, ("OMPI_*", "PMIX_*", "PMI_*", "PRTE_*", "HYDRA_*", "MPI_LOCALRANKID",
                  "MPI_LOCALNRANKS", "MPIR_*"), MPI_IDENTITY),
    (EVERYWHERE, ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_TASK_PID",
                  "SLURM_GTIDS", "SLURM_STEPID", "SLURM_STEP_*", "SLURM_SRUN_COMM_*",
                  "SLURM_LAUNCH_NODE_IPADDR", "SLURM_CPU_BIND*", "SLURMD_NODENAME",
                  "SLURM_TOPOLOGY_ADDR*", "SLURM_PTY_*", "PBS_TASKNUM", "PBS_NODENUM",
                  "PBS_VNODENUM", "LS_JOBPID", "LSB_JOBRES_PID"),
     "the scheduler's identity of one task or node (the launcher's own)"),
    (EVERYWHERE, (launch_env.NOTICE_FD,), "horovodliterun's own notice pipe"),
    (REMOTE, ("BASH_FUNC_*",), "a shell function, not a variable"),
    (REMOTE, ("OLDPWD", "PWD", "SHLVL", "_"),
     "the shell's own state (a rank runs in the launcher's folder; its shell sets PWD)"),
    (REMOTE, ("HOSTNAME", "HOST"), "this machine's name"),
    (REMOTE, ("DISPLAY", "XAUTHORITY", "SSH_*", "XDG_RUNTIME_DIR", "XDG_SESSION_*", "TMUX*",
              "STY", "WINDOW", "TERM_SESSION_ID"),
     "this login's display, ssh connection, session or terminal"),
    (REMOTE, ("TMPDIR",), "per host: a scheduler or login gives each host its own (a "
                          "node-local folder here may not exist there)"),
    (REMOTE, GPU_NUMBERING,
     "this host's GPU numbering (--env-include NAME sends it)"),
)

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# What horovodliterun itself sets for the job: always sent (no pattern can leave a rank without
# its place in the job), the notice pipe aside.
OWN = frozenset(v for k, v in vars(launch_env).items() if k.isupper() and isinstance(v, str)
                and v.startswith(("HVDL_", "HOROVOD_")) and v != launch_env.NOTICE_FD)


def _matches(name: str, patterns) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


@dataclass(frozen=True)
class Policy:
    """The user's additions to ``RULES``: ``--env-exclude`` and ``--env-include`` patterns."""

    exclude: tuple = ()
    include: tuple = ()

    def why_not(self, name: str, remote: bool) -> str | None:
        """Why ``name`` does not reach a rank (on another host when ``remote``); None if it
        does."""
        if name in OWN:
            return None
        if _matches(name, self.exclude):
            return "--env-exclude"
        if _matches(name, self.include):
            return None
        for where, patterns, why in RULES:
            if (where == EVERYWHERE or remote) and _matches(name, patterns):
                return why  # (None for the settings that travel)
        if remote and not _NAME.match(name):
            return "not a name a shell can assign"
        return None

    def select(self, env: dict, remote: bool) -> tuple:
        """(what travels: name -> value, what is left out: [(name, why)]), both sorted."""
        kept, left = {}, []
        for name in sorted(env):
            why = self.why_not(name, remote)
            if why is None:
                kept[name] = env[name]
            else:
                left.append((name, why))
        return kept, left

    def user_excluded(self, name: str) -> bool:
        return name not in OWN and _matches(name, self.exclude)

    def mpirun_names(self, env: dict) -> list:
        """The names mpirun forwards to every rank (``-x NAME``, ``-genvlist``): what reaches
        other hosts, but MPI's own settings, which mpirun forwards by itself."""
        return [k for k in self.remote(env) if not _matches(k, MPI_SETTINGS)]

    def mpirun_env(self, env: dict) -> dict:
        """mpirun's own environment under ``--mpi``: all but ``--env-exclude``'s names. mpirun
        reads its settings there (``OMPI_ALLOW_RUN_AS_ROOT``, ``HYDRA_*``; the scheduler's
        launch interfaces read the task's identity: PBS's TM ``PBS_TASKNUM``/``PBS_NODENUM``)
        and sets each rank's MPI identity over it; what else the ranks it starts here must not
        inherit, ``mpirun_unset`` names."""
        return {k: v for k, v in env.items() if not self.user_excluded(k)}

    def mpirun_unset(self, env: dict) -> list:
        """The names of ``env`` a rank that mpirun starts must not keep from mpirun's
        environment (``env -u NAME`` before the rank's command): what a rule leaves out of every
        rank - the scheduler's identity of the launcher's task, its notice pipe - but MPI's
        variables, which mpirun replaces with each rank's own."""
        return sorted(k for k in env
                      if self.why_not(k, remote=False) not in (None, MPI_IDENTITY, "--env-exclude"))

    def local(self, env: dict) -> dict:
        """The environment of a rank started on this host."""
        return self.select(env, remote=False)[0]

    def remote(self, env: dict) -> dict:
        """The variables a rank on another host gets (over its login environment)."""
        return self.select(env, remote=True)[0]


def from_args(args) -> Policy:
    """The policy of horovodliterun's ``--env-exclude`` / ``--env-include`` options."""
    return Policy(tuple(getattr(args, "env_exclude", None) or ()),
                  tuple(getattr(args, "env_include", None) or ()))


def describe_left_out(policy: Policy, env: dict, mpirun: bool = False) -> list:
    """``--verbose``'s lines: what does not reach the ranks, here and on other hosts. Under
    ``--mpi`` (``mpirun``) MPI's variables stay in mpirun's environment (``Policy.mpirun_env``):
    said on a line of their own."""
    everywhere = dict(policy.select(env, remote=False)[1])
    elsewhere = [(n, w) for n, w in policy.select(env, remote=True)[1] if n not in everywhere]
    to_mpirun = sorted((n, w) for n, w in everywhere.items() if mpirun and w == MPI_IDENTITY)
    everywhere = {n: w for n, w in everywhere.items() if (n, w) not in to_mpirun}
    lines = []
    for title, items in (("not given to any rank", sorted(everywhere.items())),
                         ("not given to ranks on other hosts", elsewhere),
                         ("given to mpirun only, which reads its settings there and sets each "
                          "rank's own identity over them (the ranks it starts here inherit "
                          "the others)", to_mpirun)):
        by_why: dict = {}
        for name, why in items:
            by_why.setdefault(why, []).append(name)
        lines += [f"{title} - {why}: {', '.join(names)}" for why, names in by_why.items()]
    return lines


# ------------------------------------------------------------------ the block on a rank's stdin


def encode_block(env: dict) -> bytes:
    """``env`` as one line for a remote rank's stdin: JSON with every non-ASCII character
    escaped, so the line holds no newline of a value, and bytes that are not UTF-8 (Python's
    surrogate escapes) come back as they were."""
    return json.dumps(env, ensure_ascii=True, sort_keys=True).encode("ascii") + b"\n"


def read_block(stream) -> dict:
    """The environment a launcher wrote with ``encode_block`` on ``stream`` (binary); {} at
    the end of the stream."""
    line = stream.readline()
    if not line.strip():
        return {}
    env = json.loads(line.decode("ascii"))
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise ValueError("the launcher's environment block is not a JSON object of strings")
    return env


def job_environment(env=os.environ) -> list:
    """``VAR=value`` of what this rank passes on to the ranks an elastic MPI job starts on a
    host added to it (that host's MPI daemon has no copy of the job's environment, and
    MPI_Comm_spawn passes none), as chosen for this rank: the variables that reach other hosts,
    but values with a newline (``torch/elastic/runner.growth_command`` sets the job's secrets
    among them through the spawn's environment info; the rest through env(1) only where the
    rank wrapper cannot get them from the launcher: ``--no-rank-reports``)."""
    return [f"{k}={v}" for k, v in Policy().remote(env).items() if "\n" not in v]


__all__ = ["RULES", "Policy", "from_args", "describe_left_out", "encode_block", "read_block",
           "job_environment", "EVERYWHERE", "REMOTE"]
