"""The stand-ins of ``scale_launch.py``: a fake ssh agent, and one process that plays every
"remote" rank's wrapper (``horovodlite/runner/task.py``) without starting the user's command.

The agent (a bash script written to a temporary folder, handed to ``horovodliterun
--ssh-agent``): called like ssh (``AGENT HOST 'cd CWD && exec env VAR=... python -m
horovodlite.runner.task --env-on-stdin -- CMD'``), it waits ``delay`` seconds (the cost of
an ssh connection), then connects to the pool on 127.0.0.1, hands it the host, the command line
and the environment block the launcher wrote on its stdin, and stays until the pool answers with the
rank's exit status, which it exits with. It is one small bash process per rank, as ssh would be
one process per rank on the launcher's machine.

The pool (``Pool``): for each agent connection, a thread of a bounded pool reads the command
line with ``shlex`` and the environment block (``env_travel.read_block``), then does what the
wrapper and ``hvd.init()`` would do before training, with the package's own code and no torch
import per rank (the pool imports torch once, for the TCPStore client):

- the rank's report to the launcher: ``task.connect`` with the same signed "started" hello
  (the launcher registers the rank when it answers "ok"), then a heartbeat every 2 s from one
  thread for all ranks (the launcher takes a rank that is silent for 15 s for lost);
- the rendezvous: a TCPStore client to the launcher's store, the job secret's check
  (``rendezvous.check_secret``); an elastic worker then waits for the driver's round that lists
  it (``elastic_rounds.wait_listing``, as ``elastic_worker.join``) and takes its rank from it;
  then the rank's host and pid under the round's signed prefix (``gather_ranks``' first half).

A rank is *registered* once both are done; the pool notes when. ``finish()`` then ends every
rank as a finished one would: "exited" with status 0, its report connection closed, status 0 to
its agent.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import socket
import stat
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from horovodlite.common import (
    elastic_rounds,
    env_travel,
    launch_env,
    launchers,
    rendezvous,
    signed_store,
)
from horovodlite.runner import task

AGENT = r"""#!/bin/bash
# fake ssh (benchmarks/scale_standins.py): [-p PORT] [-i FILE] HOST LINE
while [ $# -gt 2 ]; do shift; done
sleep {delay}
exec 3<>/dev/tcp/127.0.0.1/{port} || exit 255
printf '%s\n%s\n' "$1" "$2" >&3
IFS= read -r l && printf '%s\n' "$l" >&3  # the environment block: one line
read -r status <&3
exit "${{status:-255}}"
"""


def write_agent(folder: str, port: int, delay: float) -> str:
    path = os.path.join(folder, "fake_ssh")
    with open(path, "w") as f:
        f.write(AGENT.format(delay=f"{delay:g}", port=port))
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    return path


def parse_line(line: str) -> tuple:
    """(the variables, the command after ``env``'s assignments) of a remote command line."""
    words = shlex.split(line)
    env: dict = {}
    i = words.index("env") + 1
    while i < len(words) and "=" in words[i] and words[i].split("=", 1)[0].isidentifier():
        name, _, value = words[i].partition("=")
        env[name] = value
        i += 1
    return env, words[i:]


@dataclasses.dataclass
class Registered:
    rank: int  # its rank in the job (an elastic worker's: in the round it met)
    worker: str  # an elastic worker's number ("" under --gloo)
    host: str
    round: int
    at: float  # time.monotonic() when both its report and its rendezvous key were done


class Pool:
    """Plays every remote rank (see the top). ``expected``: how many ranks make the job."""

    def __init__(self, expected: int, threads: int = 64, timeout: float = 120.0):
        self.expected = expected
        self.timeout = timeout
        self.registered: list[Registered] = []
        self.errors: list[str] = []
        self.all_in = threading.Event()
        self._lock = threading.Lock()
        self._send = threading.Lock()
        self._ranks: list = []  # [agent connection, report link, store]
        self._stop = threading.Event()
        self._srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._srv.bind(("127.0.0.1", 0))
        self._srv.listen(4096)
        self._srv.settimeout(0.5)
        self.port = self._srv.getsockname()[1]
        self._work = ThreadPoolExecutor(max_workers=threads)
        self._threads = [threading.Thread(target=self._accept, daemon=True),
                         threading.Thread(target=self._heartbeat, daemon=True)]
        for t in self._threads:
            t.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._srv.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            self._work.submit(self._rank, conn)

    def _heartbeat(self) -> None:
        while not self._stop.wait(task.HEARTBEAT):
            with self._lock:
                links = [link for _, link, _ in self._ranks if link is not None]
            with self._send:
                for link in links:
                    try:
                        link.send({"event": "alive"})
                    except OSError:
                        pass

    def _rank(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(self.timeout)
            reader = conn.makefile("rb")
            host = reader.readline().decode().rstrip("\n")
            env, _command = parse_line(reader.readline().decode().rstrip("\n"))
            env.update(env_travel.read_block(reader))  # the job's environment, on stdin
            self._play(conn, host, env)
        except Exception as e:  # noqa: BLE001 - said in the results, the rank fails
            with self._lock:
                self.errors.append(f"{type(e).__name__}: {e}")
            try:
                conn.sendall(b"1\n")
                conn.close()
            except OSError:
                pass

    def _play(self, conn, host: str, env: dict) -> None:
        rank = task.rank_from_env(env)
        hello = {"event": "started", "rank": rank, "host": task.host_from_env(env),
                 "pid": os.getpid(), "added": False}
        link = task.connect(launch_env.parse_report_to(env[launch_env.REPORT_TO]),
                            env[launch_env.REPORT_TOKEN], hello)
        if link is None:
            raise RuntimeError(f"rank {rank} on {host}: the launcher did not register it")
        launch = launchers.detect(env, mpi_built=False, default_group=False)
        store = rendezvous._tcp_store(launch, self.timeout, host=False)
        rendezvous.check_secret(store, launch, self.timeout)
        round_ = 0
        if launch.worker:
            control = signed_store.SignedStore(store, launch.secret, ("elastic",), "rounds")
            r = elastic_rounds.wait_listing(control, launch.worker, self.timeout, poll=0.05)
            mine = r.rank_of(launch.worker)
            launch = dataclasses.replace(launch, rank=mine, size=r.size, host=r.hosts[mine])
            round_ = r.number
        ns = rendezvous.namespace(store, launch, round_)
        ns.set(f"rank/{launch.rank}", json.dumps({"host": launch.host, "pid": os.getpid()}))
        with self._lock:
            self._ranks.append([conn, link, store])
            self.registered.append(Registered(launch.rank, launch.worker, launch.host, round_,
                                              time.monotonic()))
            if len(self.registered) >= self.expected:
                self.all_in.set()

    def finish(self) -> None:
        """Every rank exits 0 (see the top)."""
        with self._lock:
            ranks, self._ranks = self._ranks, []
        with self._send:
            for conn, link, _store in ranks:
                try:
                    link.send({"event": "exited", "status": 0})
                except OSError:
                    pass
                link.close()
                try:
                    conn.sendall(b"0\n")
                except OSError:
                    pass
                conn.close()

    def close(self) -> None:
        self._stop.set()
        self.finish()
        self._srv.close()
        self._work.shutdown(wait=False, cancel_futures=True)


def store_clients(ranks: list, envs: list, timeout: float, ready, go, out) -> None:
    """Clients of ``store_rendezvous`` (``scale_launch.py``): ranks ``ranks`` (their variables
    ``envs``), a thread each in this process; once ``go`` is set, each meets the others with
    ``rendezvous.py``'s own code. Puts [(rank, time.time() at the end, layout or None, error or
    None, time.time() once connected and its secret checked)] and this process's CPU seconds on
    ``out``."""
    import resource

    import torch.distributed  # noqa: F401 - loaded before the start, as in a rank

    def client(r: int, env: dict, found: list) -> None:
        try:
            launch = launchers.detect(env, mpi_built=False, default_group=False)
            store = rendezvous._tcp_store(launch, timeout, host=False)
            rendezvous.check_secret(store, launch, timeout)
            ns = rendezvous.namespace(store, launch, 0)
            connected = time.time()
            met = rendezvous.gather_ranks(ns, launch, timeout)
            found.append((r, time.time(), rendezvous.layout([m["host"] for m in met], r), None,
                          connected))
        except Exception as e:  # noqa: BLE001
            found.append((r, time.time(), None, f"rank {r}: {type(e).__name__}: {e}", 0.0))

    found: list = []
    threading.stack_size(512 * 1024)
    threads = [threading.Thread(target=client, args=(r, env, found), daemon=True)
               for r, env in zip(ranks, envs)]
    ready.put(len(threads))
    if not go.wait(timeout):
        return
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 10)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    out.put((found, usage.ru_utime + usage.ru_stime))
