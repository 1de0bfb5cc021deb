"""What horovodliterun starts on every rank: the user's command, plus a line back to the launcher.

    python -m horovodlite.runner.task -- python train.py ...
    python -m horovodlite.runner.task --added-as N -- python train.py ...
    python -m horovodlite.runner.task --env-on-stdin -- python train.py ...

(The second form starts the ranks an elastic job adds while training, which become ranks N,
N+1, ... of the grown job: MPI_Comm_spawn runs it, not mpirun, and the launcher lists them as
"added while training". The third is how ``horovodliterun --gloo`` starts a rank on another
host through ssh: the rank's environment, the job's secrets among it, comes on stdin as one line
(``common/env_travel.py``), laid over the host's login environment, not on the command line
that ``ps`` shows (``remote.py``); the command then gets an empty stdin.)

mpirun's own exit status does not prove that a job completed: measured with Open MPI 5, a job
whose second host died ("lost communication with a remote daemon") ended with status 0. So each
rank reports to horovodliterun over TCP (addresses and token in HVDL_REPORT_TO /
HVDL_REPORT_TOKEN, see ``horovodlite/common/launch_env.py``): "started" with its rank, host and
pid, a heartbeat every HEARTBEAT seconds, and "exited" with the command's status. Every line is
signed with the token, which itself never crosses the network (``report_channel.py``); a line
from the launcher that is not signed is ignored and said once. The launcher
then knows which ranks finished, which failed and which vanished with their host (see
``report.py``).

The command runs as a child with this process's stdin/stdout/stderr (with ``--output-filename``,
HVDL_OUTPUT_FILENAME, its stdout and stderr are also copied to files: ``rank_output.py``); signals
the launcher's daemon sends (TERM, INT, HUP, USR1, USR2) are passed on to it. The child is ended
(TERM, then KILL after KILL_GRACE s) when this process's parent - the MPI daemon, horovodliterun
or the ssh session that started it - dies, or when the launcher
has been unreachable for LAUNCHER_LOST seconds after having been reached: a rank must never run
on after its job ended (a cut network link leaves no one else to stop it). If the launcher
cannot be reached at the start, the command runs anyway and the launcher says it could not
confirm that rank.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from horovodlite.common import env_travel, launch_env
from horovodlite.common.launch_env import RETIRED_STATUS, parse_report_to
from horovodlite.runner import rank_output, report_channel

HEARTBEAT = 2.0
LAUNCHER_LOST = 30.0
KILL_GRACE = 5.0
CONNECT_TIMEOUT = 3.0


def rank_from_env(env=os.environ) -> int | None:
    names = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", launch_env.GLOO_RANK)
    if env.get(launch_env.CONTROLLER) == "gloo":  # horovodliterun --gloo's rank
        names = (launch_env.GLOO_RANK,)
    if launch_env.worker_id(env):  # horovodliterun --elastic: the worker's number
        names = (launch_env.WORKER_ID,)
    for name in names:
        if env.get(name, "").isdigit():
            return int(env[name])
    return None


def host_from_env(env=os.environ) -> str:
    """The rank's host as the launcher names it (-H under --gloo), else this machine's name."""
    return env.get(launch_env.GLOO_HOSTNAME) or socket.gethostname()


class Link:
    """A connection to the launcher that answered our signed hello with its own signed "ok"."""

    def __init__(self, sock: socket.socket, channel: report_channel.Channel, pending: bytes):
        self.sock = sock
        self.channel = channel
        self.pending = pending  # bytes the launcher sent after its "ok"
        self.env: dict = {}  # an added rank's: the job's environment (report_channel.env_parts)
        self.env_left: list = []  # ... and the names the launcher could not send

    def send(self, message: dict) -> None:
        """Raises OSError; the caller serialises its sends."""
        self.sock.sendall(self.channel.seal(message))

    def close(self) -> None:
        self.sock.close()


def _line(sock: socket.socket, buffer: bytes) -> tuple:
    """(the next line, what came after it); ValueError when the connection ends first."""
    while b"\n" not in buffer:
        if len(buffer) > report_channel.MAX_LINE:
            raise ValueError("no line end")
        data = sock.recv(4096)
        if not data:
            raise ValueError("the connection closed")
        buffer += data
    line, _, rest = buffer.partition(b"\n")
    return line, rest


def _read_env(link: Link) -> list:
    """An added rank's: the job's environment, which the launcher sends after its "ok"
    (``report_channel.env_parts``), into ``link.env``; the names it left behind."""
    while True:
        line, link.pending = _line(link.sock, link.pending)
        if line.strip():  # (heartbeats are empty lines)
            left = report_channel.read_env_part(json.loads(link.channel.open(line)), link.env)
            if left is not None:
                return left


def connect(addresses: list, token: str, hello: dict) -> Link | None:
    """The first launcher address that answers our signed hello with its signed "ok"; None if
    none does (see ``report_channel.py``)."""
    for addr in addresses:
        s = None
        try:
            s = socket.create_connection(addr, timeout=CONNECT_TIMEOUT)
            line, rest = _line(s, b"")
            channel = report_channel.Channel(token, report_channel.read_challenge(line),
                                             report_channel.RANK)
            s.sendall(channel.seal(hello))
            while True:
                line, rest = _line(s, rest)
                if line.strip():  # (heartbeats are empty lines)
                    break
            if json.loads(channel.open(line)).get("event") == "ok":
                s.settimeout(CONNECT_TIMEOUT)
                link = Link(s, channel, rest)
                if hello.get("added"):
                    link.env_left = _read_env(link)
                return link
        except (OSError, ValueError):
            pass
        if s is not None:
            s.close()
    return None


class Reporter:
    """The connection to the launcher. send() never raises; `last_heard` is when the launcher
    last sent anything (it sends a heartbeat every HEARTBEAT s): a cut link loses no send (the
    bytes wait in the socket buffer), so silence from the launcher is what tells."""

    def __init__(self, link: Link | None, rank=None, notices: int | None = None):
        self.link = link
        self.sock = link.sock if link is not None else None
        self.rank = rank
        self.notices = notices  # write end of the rank's HVDL_NOTICE_FD pipe
        self.lock = threading.Lock()
        self.last_heard = time.monotonic()
        if self.sock is not None:
            threading.Thread(target=self._listen, daemon=True).start()

    def _listen(self) -> None:
        buffer = self.link.pending
        refused = False
        while True:
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                if not line.strip():
                    continue  # a heartbeat
                try:
                    self._event(self.link.channel.open(line))
                except ValueError as e:
                    if not refused:
                        refused = True
                        say(f"horovodlite: rank {self.rank}: ignored {e} on the connection "
                            "to horovodliterun")
            if len(buffer) > report_channel.MAX_LINE:
                buffer = b""
            try:
                data = self.sock.recv(4096)
            except socket.timeout:
                continue
            except OSError:
                return
            if not data:
                return
            self.last_heard = time.monotonic()
            buffer += data

    def _event(self, line: bytes) -> None:
        try:
            msg = json.loads(line)
        except ValueError:
            return
        if msg.get("event") == "lost":  # a host lost: its ranks' connections ended, or silence
            ranks = msg.get("ranks") or []
            what = (f"lost {msg.get('host')} (rank{'s' if len(ranks) > 1 else ''} "
                    f"{', '.join(map(str, ranks))}): {msg.get('why')}")
        elif msg.get("event") == "failed":  # under --gloo: a rank exited with an error
            what = f"lost rank {msg.get('rank')} (host {msg.get('host')}): {msg.get('why')}"
        else:
            return
        # say it here too: every survivor names the lost ranks
        goes_on = ("the job goes on without it" if launch_env.worker_id() else "the job ends")
        who = f"worker {self.rank}" if launch_env.worker_id() else f"rank {self.rank}"
        say(f"horovodlite: {who} on {socket.gethostname()}: {what}; {goes_on}")
        if self.notices is not None:  # the rank's runtime raises HorovodInternalError(what)
            try:
                tag = f"@{msg['round']} " if isinstance(msg.get("round"), int) else ""
                os.write(self.notices, (tag + what.replace("\n", " ") + "\n").encode())
            except OSError:
                pass

    def send(self, message: dict) -> bool:
        if self.link is None:
            return False
        with self.lock:
            try:
                self.link.send(message)
                return True
            except OSError:
                return False


def say(line: str) -> None:
    """One line to stderr - which may be a pipe to a launcher that is gone: never raises (the
    watch must still end the rank then)."""
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def end(child: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, KILL_GRACE), (signal.SIGKILL, 0.0)):
        if child.poll() is not None:
            return
        try:
            child.send_signal(sig)
        except OSError:
            return
        try:
            child.wait(timeout=wait or None)
        except subprocess.TimeoutExpired:
            pass


def watch(child: subprocess.Popen, reporter: Reporter, rank, parent: int, done: threading.Event):
    """Heartbeats; ends the child when the daemon (our parent) or the launcher is gone."""
    while not done.wait(HEARTBEAT):
        if os.getppid() != parent:
            say(f"horovodlite: rank {rank}: its launcher (MPI daemon, horovodliterun or ssh "
                "session) is gone; ending it")
            end(child)
            return
        if reporter.sock is not None:
            reporter.send({"event": "alive"})
            if time.monotonic() - reporter.last_heard > LAUNCHER_LOST:
                say(f"horovodlite: rank {rank} on {socket.gethostname()}: horovodliterun "
                    f"unreachable for {LAUNCHER_LOST:.0f} s (its host or the network to it is "
                    "down); ending the rank")
                end(child)
                return


USAGE = ("usage: python -m horovodlite.runner.task [--added-as N] [--env-on-stdin] -- "
         "COMMAND...\n")


def _options(argv: list) -> tuple:
    """(added_as, secrets_on_stdin, command) from the wrapper's arguments; command None if
    they are not understood."""
    added_as, secrets_on_stdin = None, False
    while argv and argv[0] != "--":
        if len(argv) >= 2 and argv[0] == "--added-as" and argv[1].isdigit():
            added_as, argv = int(argv[1]), argv[2:]
        elif argv[0] == "--env-on-stdin":
            secrets_on_stdin, argv = True, argv[1:]
        else:
            break
    if argv and argv[0] == "--":
        argv = argv[1:]
    return added_as, secrets_on_stdin, (argv or None)


def _start(argv: list, env: dict, rank, stdin) -> tuple:
    """Starts the command; returns (child, the threads copying its output to files, if any).
    Raises OSError when it cannot be started."""
    folder = env.get(launch_env.OUTPUT_FILENAME)
    # --mpi: the command's lines get the rank prefix the launcher's own output has (--gloo)
    prefixed = env.get(rank_output.PREFIX_VAR) == "1" and rank is not None
    pipes = subprocess.PIPE if folder or prefixed else None
    # close_fds=False: the command gets every inheritable descriptor this process got, as
    # with exec - MPICH's launcher hands each rank its PMI connection as one (PMI_FD). Our
    # own socket is not inheritable (PEP 446).
    child = subprocess.Popen(argv, close_fds=False, env=env, stdin=stdin, stdout=pipes,
                             stderr=pipes)
    copies = []
    if pipes is not None:
        paths = rank_output.output_files(folder, rank) if folder else {}
        for stream, console in (("stdout", 1), ("stderr", 2)):
            pipe = getattr(child, stream)
            tag = rank_output.prefix(rank, stream) if prefixed else None
            copies.append(rank_output.tee(os.dup(pipe.fileno()), console, paths.get(stream), tag))
            pipe.close()
    return child, copies


def main(argv: list | None = None) -> int:
    added_as, secrets_on_stdin, argv = _options(list(sys.argv[1:] if argv is None else argv))
    if not argv:
        sys.stderr.write(USAGE)
        return 2
    stdin = None
    if secrets_on_stdin:  # before anything reads the token or the secret
        os.environ.update(env_travel.read_block(sys.stdin.buffer))
        stdin = subprocess.DEVNULL
    rank = rank_from_env()  # an added rank's is its rank among the ranks spawned with it
    if added_as is not None and rank is not None:
        rank += added_as
    link = None
    report_to = launch_env.reports_to()
    host = host_from_env()
    if report_to:
        hello = {"event": "started", "rank": rank, "host": host,
                 "pid": os.getpid(), "added": added_as is not None}
        link = connect(parse_report_to(report_to), os.environ.get(launch_env.REPORT_TOKEN, ""),
                       hello)
        if link is None:
            sys.stderr.write(f"horovodlite: rank {rank} on {host} cannot reach "
                             f"horovodliterun at {report_to}; running without exit reports\n")
        else:  # an added rank: the job's environment over its host's
            os.environ.update(link.env)
            if link.env_left:
                sys.stderr.write(f"horovodlite: rank {rank} on {host}: too long to send to a "
                                 f"rank added later, not set: {', '.join(link.env_left)}\n")
    # The runtime in the rank reads the launcher's notices (a lost host) from this pipe.
    notice_read, notices = os.pipe() if link is not None else (None, None)
    env = {k: v for k, v in os.environ.items() if k != launch_env.NOTICE_FD}
    if notice_read is not None:
        os.set_inheritable(notice_read, True)
        os.set_blocking(notices, False)
        env[launch_env.NOTICE_FD] = str(notice_read)
    reporter = Reporter(link, rank, notices)
    parent = os.getppid()
    try:
        child, copies = _start(argv, env, rank, stdin)
    except OSError as e:
        sys.stderr.write(f"horovodlite: rank {rank}: cannot run {argv[0]!r}: {e.strerror}\n")
        reporter.send({"event": "exited", "status": 127})
        return 127
    finally:
        if notice_read is not None:
            os.close(notice_read)

    def forward(signum, _frame):
        try:
            child.send_signal(signum)
        except OSError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, forward)
    done = threading.Event()
    threading.Thread(target=watch, args=(child, reporter, rank, parent, done),
                     daemon=True).start()
    while True:
        try:
            status = child.wait()
            break
        except InterruptedError:
            continue
    done.set()
    for t in copies:  # the rest of its output into the files (its own children may hold on)
        t.join(timeout=KILL_GRACE)
    if status == RETIRED_STATUS and launch_env.is_elastic():
        reporter.send({"event": "exited", "status": 0, "retired": True})
        if link is not None:
            link.close()
        return 0
    reporter.send({"event": "exited", "status": status})
    if link is not None:
        link.close()
    # A child killed by a signal: end the same way, so mpirun reports it as such.
    if status < 0:
        if -status not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
        return 128 - status
    return status


if __name__ == "__main__":
    sys.exit(main())
