"""The hosts of the allocation horovodliterun runs in, when neither -H nor --hostfile names them.

Looked for in this order; the first found is used, and horovodliterun says which (one line):

1. a hostfile handed to mpirun in ``--mpi-args`` (``--hostfile``, ``-hostfile``,
   ``--machinefile``, ``-machinefile``, ``-f``, ``--default-hostfile``; ``--opt=value`` too);
2. Open MPI's and PRRTE's default hostfile settings in the environment
   (``OMPI_MCA_orte_default_hostfile``, ``OMPI_MCA_rmaps_default_hostfile``,
   ``PRTE_MCA_prte_default_hostfile``, ``PRTE_MCA_rmaps_default_hostfile``);
3. Slurm: ``SLURM_JOB_NODELIST`` (a host list expression: ``node[01-03,07],gpu5``) with
   ``SLURM_TASKS_PER_NODE`` (``2(x3),1``), else ``SLURM_JOB_CPUS_PER_NODE`` (same form), else
   one slot per node;
4. PBS / Torque: ``PBS_NODEFILE`` (a host per line, once per slot);
5. LSF: ``LSB_MCPU_HOSTS`` (``hostA 4 hostB 2``), else ``LSB_DJOB_HOSTFILE`` (a host per line,
   once per slot).

A hostfile of mpirun's stays mpirun's under ``--mpi`` (horovodliterun adds no ``-H``); its hosts
tell horovodliterun where its ranks are, so that its rank reports and rendezvous listen on an
address those hosts reach. ``spans_unknown_hosts`` says when mpirun may place ranks on hosts
horovodliterun cannot know (``--host`` or a rankfile in ``--mpi-args``, an allocation of a kind
not read here): the launcher then listens on an address other hosts can reach.
"""

from __future__ import annotations

import os
import shlex
import socket
from dataclasses import dataclass

from horovodlite.common.slurm_lists import expand_counts, expand_nodelist
from horovodlite.runner.hosts import host_slots, read_hostfile
from horovodlite.runner.report import interface_addresses

# mpirun's options that name a hostfile (Open MPI, PRRTE, MPICH's Hydra)
HOSTFILE_OPTIONS = ("--hostfile", "-hostfile", "--machinefile", "-machinefile", "-f",
                    "--default-hostfile", "-default-hostfile")
# mpirun's options that place ranks on hosts given otherwise (not read here)
HOST_OPTIONS = ("-H", "--host", "-host", "--hosts", "-hosts", "--rankfile", "-rf", "-rankfile",
                "--dvm", "-configfile", "--app")
MPI_HOSTFILE_SETTINGS = ("OMPI_MCA_orte_default_hostfile", "OMPI_MCA_rmaps_default_hostfile",
                         "PRTE_MCA_prte_default_hostfile", "PRTE_MCA_rmaps_default_hostfile")
# allocations of schedulers whose host lists are not read here
OTHER_SCHEDULERS = ("PE_HOSTFILE", "FLUX_JOB_ID", "COBALT_NODEFILE", "OAR_NODEFILE")


@dataclass
class Allocation:
    hosts: list  # [(host, slots)], in the allocation's order, each host once
    source: str  # where they came from, in words
    mpirun_has_it: bool = False  # a hostfile mpirun reads by itself (no -H for it)
    scheduler: str = ""  # "slurm" for a Slurm job's nodes (slurm_steps.py starts ranks there)

    def spec(self) -> str:
        """As -H: 'a:2,b:2'."""
        return ",".join(f"{h}:{n}" for h, n in self.hosts)

    def describe(self) -> str:
        return f"horovodliterun: hosts from {self.source}: {self.spec()}"


def merged(hosts) -> list:
    """[(host, slots)] with each host once (slots added up), in order of first appearance."""
    out: dict = {}
    for host, n in hosts:
        out[host] = out.get(host, 0) + n
    return list(out.items())


def from_slurm(env) -> Allocation | None:
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        return None
    nodes = expand_nodelist(nodelist)
    for name in ("SLURM_TASKS_PER_NODE", "SLURM_JOB_CPUS_PER_NODE"):
        if env.get(name):
            counts = expand_counts(env[name])
            if len(counts) != len(nodes):
                raise ValueError(f"{name}={env[name]} counts {len(counts)} node(s), "
                                 f"SLURM_JOB_NODELIST={nodelist} has {len(nodes)}")
            return Allocation(merged(zip(nodes, counts)),
                              f"Slurm (SLURM_JOB_NODELIST, {name})", scheduler="slurm")
    return Allocation(merged((n, 1) for n in nodes), "Slurm (SLURM_JOB_NODELIST, one slot a node)",
                      scheduler="slurm")


def _slot_lines(path: str, what: str) -> list:
    try:
        lines = open(path).read().split()
    except OSError as e:
        raise ValueError(f"{what}={path}: {e.strerror}") from None
    if not lines:
        raise ValueError(f"{what}={path} names no host")
    return merged((h, 1) for h in lines)


def from_pbs(env) -> Allocation | None:
    path = env.get("PBS_NODEFILE")
    if not path:
        return None
    return Allocation(_slot_lines(path, "PBS_NODEFILE"), f"PBS (PBS_NODEFILE={path})")


def from_lsf(env) -> Allocation | None:
    hosts = env.get("LSB_MCPU_HOSTS", "").split()
    if hosts:
        if len(hosts) % 2 or not all(n.isdigit() for n in hosts[1::2]):
            raise ValueError(f"LSB_MCPU_HOSTS={env['LSB_MCPU_HOSTS']!r} is not 'host n host n'")
        return Allocation(merged(zip(hosts[::2], map(int, hosts[1::2]))),
                          "LSF (LSB_MCPU_HOSTS)")
    path = env.get("LSB_DJOB_HOSTFILE")
    if path:
        return Allocation(_slot_lines(path, "LSB_DJOB_HOSTFILE"),
                          f"LSF (LSB_DJOB_HOSTFILE={path})")
    return None


def _option_value(words: list, options) -> str | None:
    """The value of the first of ``options`` in ``words`` (``-o v`` or ``-o=v``)."""
    for i, word in enumerate(words):
        name, eq, value = word.partition("=")
        if name in options:
            if eq:
                return value
            if i + 1 < len(words):
                return words[i + 1]
    return None


def _hostfile(path: str, source: str) -> Allocation:
    try:
        hosts = host_slots(read_hostfile(path))
    except SystemExit as e:  # read_hostfile's message says what is wrong with it
        raise ValueError(str(e).removeprefix("horovodliterun: ")) from None
    return Allocation(merged(hosts), source, mpirun_has_it=True)


def from_mpi_args(mpi_args: str) -> Allocation | None:
    path = _option_value(shlex.split(mpi_args or ""), HOSTFILE_OPTIONS)
    if path is None:
        return None
    return _hostfile(path, f"the hostfile in --mpi-args ({path})")


def from_mpi_settings(env) -> Allocation | None:
    for name in MPI_HOSTFILE_SETTINGS:
        if env.get(name):
            return _hostfile(env[name], f"{name}={env[name]}")
    return None


def find(env=os.environ, mpi_args: str = "") -> Allocation | None:
    """The allocation's hosts (see the top), or None; ValueError naming what could not be
    read."""
    for probe in (lambda: from_mpi_args(mpi_args), lambda: from_mpi_settings(env),
                  lambda: from_slurm(env), lambda: from_pbs(env), lambda: from_lsf(env)):
        found = probe()
        if found is not None:
            return found
    return None


def placing_option(mpi_args: str = "") -> str | None:
    """The first of mpirun's options in ``mpi_args`` that places ranks on hosts given otherwise
    (``--host``, a rankfile, ...: ``HOST_OPTIONS``), else None. horovodliterun then adds no -H
    of the allocation's: mpirun would merge the two host lists and fill the first given."""
    for word in shlex.split(mpi_args or ""):
        if word.partition("=")[0] in HOST_OPTIONS:
            return word.partition("=")[0]
    return None


def spans_unknown_hosts(env=os.environ, mpi_args: str = "") -> str:
    """Why mpirun may place ranks on hosts horovodliterun does not know ('' if not)."""
    option = placing_option(mpi_args)
    if option:
        return f"--mpi-args has {option}"
    for name in OTHER_SCHEDULERS:
        if env.get(name):
            return f"{name} is set (an allocation horovodliterun does not read)"
    return ""


def reachable_address(why: str) -> str:
    """An address of this machine that other hosts may reach, for a job whose hosts are not
    known (``why``: ``spans_unknown_hosts``'s reason): the source address of this machine's
    route to the outside, else its first address that is not loopback. SystemExit naming the
    fix when it has none."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: nothing is sent, a route is chosen
            found = probe.getsockname()[0]
        if not found.startswith("127."):
            return found
    except OSError:
        pass  # no default route (e.g. an isolated cluster network)
    others = [a for a in interface_addresses() if not a.startswith("127.")]
    if others:
        return others[0]
    raise SystemExit(f"horovodliterun: mpirun may start ranks on other hosts ({why}), but this "
                     "machine has no address they could reach its rank reports at; name the "
                     "hosts with -H or --hostfile, or the interface with --network-interface")


__all__ = ["Allocation", "expand_nodelist", "expand_counts", "find", "from_slurm", "from_pbs",
           "from_lsf", "from_mpi_args", "from_mpi_settings", "spans_unknown_hosts", "merged",
           "placing_option",
           "reachable_address"]
