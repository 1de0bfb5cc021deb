"""How horovodliterun reaches other machines: which hosts are this one, the ssh (or agent)
command line that starts a rank elsewhere, and the same agent handed to mpirun.

A remote rank is started as

    ssh [-p PORT] [-i IDENTITY] -o BatchMode=yes HOST \
        'cd CWD && exec env [PYTHONPATH=... LD_LIBRARY_PATH=...] PYTHON -m horovodlite.runner.task
         --env-on-stdin -- COMMAND'

or, with ``--ssh-agent CMD``, as ``CMD [-p PORT] [-i IDENTITY] HOST 'cd CWD && ...'`` (CMD split
as shell words; an agent is called the way Open MPI calls its ``plm_ssh_agent``: like ssh, the
host, then the command line). The rank's environment - what ``common/env_travel.py`` sends to
other hosts, the job's secrets among it - goes on the command's stdin as one JSON line, which
the rank wrapper reads first and lays over the host's login environment (``task.py``): a
command line can be read by anyone on both machines (``ps``), is parsed by the remote user's
shell (whose quoting rules differ: a newline inside quotes ends a csh command), and has a
length limit. Only what Python itself needs to start the wrapper is on the command line.
BatchMode: a host that would ask for a password fails at once instead of waiting on a prompt
nobody sees.
"""

from __future__ import annotations

import shlex
import socket

from horovodlite.common import env_travel, launch_env

LOCAL_NAMES = ("localhost", "127.0.0.1", "::1", "localhost.localdomain")
SECRET_NAMES = launch_env.SECRETS
# What the remote Python needs before it can read its stdin (also sent there, as all else).
STARTUP = ("PYTHONPATH", "PYTHONHOME", "LD_LIBRARY_PATH")


def local_names(addresses: list = ()) -> set:
    """The names and addresses by which ranks are started here, without ssh."""
    names = set(LOCAL_NAMES) | set(addresses)
    for name in (socket.gethostname(), socket.getfqdn()):
        names.add(name)
        names.add(name.split(".")[0])
    return names


def is_local(host: str, names: set) -> bool:
    if host in names:
        return True
    try:
        socket.inet_pton(socket.AF_INET6 if ":" in host else socket.AF_INET, host)
        return False  # an address: only the exact ones above are this machine's
    except OSError:
        return host.split(".")[0] in names  # node1.cluster is node1


def agent_words(ssh_agent: str | None, port: int | None, identity: str | None,
                batch: bool = True) -> list:
    """The command that reaches a host, without the host: the agent's words or ssh, then the
    ssh options given (-p, -i)."""
    if ssh_agent:
        words = shlex.split(ssh_agent)
    else:
        words = ["ssh", "-o", "BatchMode=yes"] if batch else ["ssh"]
    if port is not None:
        words += ["-p", str(port)]
    if identity:
        words += ["-i", identity]
    return words


def shell_line(argv: list, env: dict, cwd: str) -> str:
    """``cd CWD && exec env VAR=value ... ARGV`` for a remote shell; ``env`` in its order."""
    assigns = [f"{k}={shlex.quote(v)}" for k, v in env.items()]
    return " ".join(["cd", shlex.quote(cwd), "&&", "exec", "env", *assigns,
                     *(shlex.quote(a) for a in argv)])


def remote_env(env: dict, policy: env_travel.Policy | None = None) -> dict:
    """What a remote rank gets over its login environment (``env_travel``): the secrets
    among it."""
    return (policy or env_travel.Policy()).remote(env)


def startup_env(env: dict) -> dict:
    """What the remote command line carries: Python's own start-up variables, no secret."""
    return {k: env[k] for k in STARTUP if k in env and "\n" not in env[k]}


def stdin_block(env: dict, policy: env_travel.Policy | None = None) -> bytes:
    """The remote rank's stdin: its environment as one line (``env_travel.encode_block``)."""
    return env_travel.encode_block(remote_env(env, policy))


def remote_command(host: str, argv: list, env: dict, cwd: str, ssh_agent: str | None = None,
                   port: int | None = None, identity: str | None = None) -> list:
    """The local argv that runs ``argv`` on ``host`` in ``cwd``, with Python's start-up
    variables of ``env`` (the rest goes on stdin: ``stdin_block``; see the top)."""
    return [*agent_words(ssh_agent, port, identity), host,
            shell_line(argv, startup_env(env), cwd)]


def mpirun_agent_args(flavor: str, openmpi_major: int, ssh_agent: str | None,
                      port: int | None, identity: str | None) -> list:
    """mpirun's arguments that make it reach hosts with the agent (or ssh with -p/-i): Open
    MPI's ``plm_ssh_agent`` (PRRTE's, Open MPI 5; ``plm_rsh_agent`` before), MPICH's
    ``-launcher-exec``. Nothing when neither an agent nor an ssh option was given."""
    if not ssh_agent and port is None and not identity:
        return []
    # Open MPI splits the agent at white space (no shell quoting): words cannot contain spaces
    agent = " ".join(agent_words(ssh_agent, port, identity, batch=False))
    if flavor == "openmpi":
        if openmpi_major >= 5:
            return ["--prtemca", "plm_ssh_agent", agent]
        return ["--mca", "plm_rsh_agent", agent]
    if flavor == "mpich":
        return ["-launcher", "ssh", "-launcher-exec", agent]
    return []
