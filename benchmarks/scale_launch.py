"""The launchers past one machine's worth of ranks (issue 38), simulated on one machine.

    python benchmarks/scale_launch.py --ranks 8,64,256,1024,2048 [--json] [--cases launch,...]

Three cases, one row (a dict; a JSON line with ``--json``) per case and rank count:

- ``launch`` (``launcher`` "gloo" and "elastic"): a real ``horovodliterun --gloo`` (or
  ``--elastic``) process starts N ranks on N/8 hosts of 8 slots (``host000`` ... named in -H;
  256 hosts at 2,048 ranks) through ``--ssh-agent``, a fake ssh that adds ``--ssh-delay``
  (50 ms) to each connection and hands the rank to one stand-in process
  (``scale_standins.py``, which says what its stand-ins do and do not do). The launcher's own
  code runs for real and unchanged: placement, the job's TCPStore and its secret, one agent
  process per rank with its output forwarded, the rank reports (signed hello, heartbeats,
  exits), the elastic driver's round 0 and its watching. ``seconds``: from just before the
  launcher process starts until the last rank is registered: the launcher answered its report
  hello and its host and pid are under the round's signed prefix in the store (an elastic
  worker first read round 0 for its rank). ``teardown``: from then until the launcher exited
  (status 0 required: every rank exited 0). The hosts' names never resolve: the job's address
  is ``--network-interface lo``'s (127.0.0.1).
- ``elastic_round`` (``launcher`` "elastic"): the driver's cost for one round, in process: a
  real ``ElasticJob`` with its store and report server, N workers on N/8 hosts (N hosts of one
  slot below 16) registered with
  the reports (their processes are stand-ins that never exit); ``idle`` is one look at the job
  when nothing changed (the driver looks every 0.2 s), ``seconds`` the look that finds a host
  lost and publishes the next round without its 8 workers (checked: read back, in order).
- ``store_rendezvous`` (``launcher`` "tcpstore"): N clients meet on the job's TCPStore (a real
  ``RendezvousServer`` in this process) with ``rendezvous.py``'s own code: a store connection,
  the secret's check, ``gather_ranks`` (each rank's host and pid under the signed prefix; rank
  0 lists them all, the others read the list), ``layout``. No Gloo pairs. The clients are
  threads of up to 16 processes (128 a process; they load torch before the start), which share
  this machine's two cores: ``client_cpu`` is what they spent in all. At 2,048 the clients'
  own end dominates: ``rank0`` (every rank connected, checked, its key set, all read by rank 0)
  is 2-4 s, then thousands of threads woken at once with Python work to do (the list's JSON,
  a signature, the layout) take 30-70 s of mostly system CPU here, while the same store wakes
  2,048 plain waiting threads that only read the list in 0.5 s: measure ``rank0`` for the
  store. ``seconds``: from the start signal to the end of the last client; ``connected``: to
  the last client connected with its secret checked; ``rank0``: to rank 0's end (it has
  listed the ranks); ``median``: to the median client's end.

What is a stand-in: the ssh (a bash script per rank, no network hop), the remote machines (all
on 127.0.0.1), the ranks' wrappers and their commands (threads of one process; no torch import
per rank, no training, no Gloo pairs between ranks).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# This machine's resolver drops about one query in 25, and c10d's store client looks its
# socket's name up once per connection: a 5 s stall each time, which is the sandbox's, not the
# launcher's. One try of 1 s (the least glibc takes) before torch loads; c10d's warning off.
os.environ.setdefault("RES_OPTIONS", "timeout:1 attempts:1")
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
sys.path.insert(0, str(Path(__file__).resolve().parent))
import scale_standins  # noqa: E402

SLOTS = 8  # ranks per simulated host
LAUNCH_RANKS = 2048  # the launcher rows' rank count whatever --ranks says (issue 38)
SSH_DELAY = 0.05
CASES = ("launch", "elastic_round", "store_rendezvous")


def hosts_arg(n: int, slots: int = SLOTS) -> str:
    hosts = (n + slots - 1) // slots
    return ",".join(f"host{h:03d}:{min(slots, n - h * slots)}" for h in range(hosts))


def launch(n: int, launcher: str, delay: float = SSH_DELAY, timeout: float = 170.0) -> dict:
    """One ``launch`` row (see the top)."""
    pool = scale_standins.Pool(n, timeout=timeout)
    with tempfile.TemporaryDirectory(prefix="scale_launch.") as folder:
        agent = scale_standins.write_agent(folder, pool.port, delay)
        # SCALE_LAUNCH_PROFILE=FILE: the launcher's main thread under cProfile, written to FILE
        profile = os.environ.get("SCALE_LAUNCH_PROFILE")
        argv = [sys.executable, *(["-m", "cProfile", "-o", profile] if profile else []),
                "-m", "horovodlite.runner.launch",
                "--elastic" if launcher == "elastic" else "--gloo", "-np", str(n),
                "-H", hosts_arg(n), "--ssh-agent", agent, "--network-interface", "lo",
                "--start-timeout", str(int(timeout)), "true"]
        env = dict(os.environ, HOROVOD_GLOO_TIMEOUT_SECONDS=str(int(timeout)))
        began = time.monotonic()
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        err: list = []
        reader = threading.Thread(target=lambda: err.append(proc.stderr.read()), daemon=True)
        reader.start()
        try:
            ok = pool.all_in.wait(timeout)
            done = time.monotonic()
            pool.finish()
            try:
                status = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                status = proc.wait()
            ended = time.monotonic()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            pool.close()
        reader.join(5)
    regs = pool.registered
    ranks = sorted(r.rank for r in regs)
    row = {"case": "launch", "launcher": launcher, "ranks": n,
           "hosts": len(set(r.host for r in regs)),
           "seconds": round(max((r.at for r in regs), default=done) - began, 3) if ok else None,
           "first": round(min((r.at for r in regs), default=began) - began, 3),
           "teardown": round(ended - done, 3), "status": status, "registered": len(regs),
           "complete": ranks == list(range(n)), "ssh_delay": delay}
    if launcher == "elastic":
        row["rounds"] = sorted(set(r.round for r in regs))
        row["workers_unique"] = len(set(r.worker for r in regs)) == len(regs)
    if pool.errors or not ok or status != 0:
        row["errors"] = (pool.errors[:3] + [line for line in "".join(err).splitlines()
                                            if "horovodliterun" in line][-5:])
    return row


class _Proc:
    """A worker's process that runs on (the driver's view of a remote agent)."""

    pid = None

    def poll(self):
        return None


def _stand_in(number: int, host: str, signals: dict):
    """A worker of the driver whose signals are recorded in ``signals[number]``, not sent:
    there is no process behind it."""
    from horovodlite.runner import elastic_driver

    worker = elastic_driver.Worker(number, host, False, _Proc())
    worker.signal = signals.setdefault(number, []).append
    return worker


def elastic_round(n: int) -> dict:
    """One ``elastic_round`` row (see the top)."""
    from horovodlite.common import elastic_rounds
    from horovodlite.runner import elastic_driver
    from horovodlite.runner import launch as launch_cli
    from horovodlite.runner.rendezvous_server import RendezvousServer
    from horovodlite.runner.report import Rank, ReportServer

    per_host = SLOTS if n >= 2 * SLOTS else 1  # a host lost leaves workers to go on with
    args = launch_cli._parser().parse_args(
        ["--elastic", "-np", str(n), "-H", hosts_arg(n, per_host), "--network-interface", "lo",
         "true"])
    slots = [(h.split(":")[0], int(h.split(":")[1])) for h in args.hosts.split(",")]
    job = elastic_driver.ElasticJob(args, slots, {})
    job.reports = ReportServer(bind=job.addr, on_lost=lambda *_: None)
    signals: dict = {}
    quiet = elastic_driver.say
    elastic_driver.say = lambda text: None  # a round's layout line names every host
    try:
        with RendezvousServer(job.addr) as server:
            job.server = server
            for host, count in job.slots.items():
                for _ in range(count):
                    number = len(job.workers)
                    job.workers[number] = _stand_in(number, host, signals)
                    job.reports.ranks.append(Rank(number, host, 0))
            job.members = list(job.workers)
            began = time.perf_counter()
            job.publish("the job starts")
            first = time.perf_counter() - began
            began = time.perf_counter()
            job.step(time.monotonic())
            idle = time.perf_counter() - began
            lost = "host001"
            for r in job.reports.ranks:
                if r.host == lost:
                    r.lost = "stand-in: its connection closed"
            began = time.perf_counter()
            job.step(time.monotonic())
            seconds = time.perf_counter() - began
            published = elastic_rounds.read(server.control, 1)
            expected = [str(w) for w in job.workers if job.workers[w].host != lost]
    finally:
        elastic_driver.say = quiet
        job.reports.close()
    return {"case": "elastic_round", "launcher": "elastic", "ranks": n,
            "seconds": round(seconds, 4), "idle": round(idle, 4), "publish_first": round(first, 4),
            "round": published.number, "members": published.size,
            "membership_ok": published.workers == expected and not published.end,
            # the lost host's workers, and only they, are told to stop (SIGTERM)
            "stopped_ok": {w for w, sigs in signals.items() if sigs} == {
                w for w in job.workers if job.workers[w].host == lost}
            and all(sigs in ([], [signal.SIGTERM]) for sigs in signals.values())}


def store_rendezvous(n: int, timeout: float = 120.0, per_process: int = 128) -> dict:
    """One ``store_rendezvous`` row (see the top)."""
    import multiprocessing

    from horovodlite.runner.rendezvous_server import RendezvousServer

    hosts = [f"host{r // SLOTS:03d}" for r in range(n)]
    procs = max(1, min(16, n // per_process))
    ctx = multiprocessing.get_context("spawn")
    ready, out, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    found: list = []
    cpu = 0.0
    with RendezvousServer("127.0.0.1", timeout_seconds=timeout) as server:
        envs = server.rank_environment(hosts)
        parts = [list(range(p, n, procs)) for p in range(procs)]
        children = [ctx.Process(target=scale_standins.store_clients, daemon=True,
                                args=(part, [envs[r] for r in part], timeout, ready, go, out))
                    for part in parts]
        for c in children:
            c.start()
        try:
            for _ in children:
                ready.get(timeout=timeout)
            began = time.time()
            go.set()
            for _ in children:
                try:
                    part, seconds = out.get(timeout=timeout + 30)
                except queue.Empty:
                    found.append((-1, 0.0, None, f"no answer within {timeout + 30:g} s", 0.0))
                    break
                found += part
                cpu += seconds
        finally:
            for c in children:
                c.join(5)
                if c.is_alive():
                    c.kill()
    errors = [f[3] for f in found if f[3]]
    done = {f[0]: f for f in found if not f[3]}
    layouts_ok = n % SLOTS == 0 and all(
        f[2] == {"local_rank": r % SLOTS, "local_size": SLOTS, "cross_rank": r // SLOTS,
                 "cross_size": n // SLOTS} for r, f in done.items())
    return {"case": "store_rendezvous", "launcher": "tcpstore", "ranks": n,
            "seconds": round(max(f[1] for f in done.values()) - began, 3)
            if len(done) == n else None,
            "connected": round(max(f[4] for f in done.values()) - began, 3) if done else None,
            "rank0": round(done[0][1] - began, 3) if 0 in done else None,
            "median": round(sorted(f[1] for f in done.values())[len(done) // 2] - began, 3)
            if done else None,
            "client_processes": procs, "client_cpu": round(cpu, 3), "met": len(done),
            "layout_ok": layouts_ok, **({"errors": errors[:3]} if errors else {})}


def launch_rows(ranks: list, *, json_lines: bool, cases=CASES, launchers=("gloo", "elastic"),
                launch_ranks: int | None = LAUNCH_RANKS) -> list:
    """Every row of the cases asked for at each of ``ranks`` (and the ``launch`` rows at
    ``launch_ranks`` too, unless None); prints each as it comes (a JSON line with
    ``json_lines``, else a line of text)."""
    rows = []
    counts = list(dict.fromkeys(list(ranks) + ([launch_ranks] if launch_ranks else [])))

    def emit(row: dict) -> None:
        rows.append(row)
        print(json.dumps(row) if json_lines else
              "  ".join(f"{k}={v}" for k, v in row.items()), flush=True)

    for n in counts:
        if "launch" in cases:
            for name in launchers:
                emit(launch(n, name))
        if "elastic_round" in cases:
            emit(elastic_round(n))
        if "store_rendezvous" in cases:
            emit(store_rendezvous(n))
    return rows


def main(argv: list | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", default="8,64,256,1024", help="rank counts, comma-separated")
    p.add_argument("--json", action="store_true", help="one JSON line per row")
    p.add_argument("--cases", default=",".join(CASES), help="of " + ", ".join(CASES))
    p.add_argument("--launchers", default="gloo,elastic")
    p.add_argument("--no-launch", action="store_true",
                   help=f"no extra rows at {LAUNCH_RANKS} ranks beyond --ranks")
    args = p.parse_args(argv)
    launch_rows([int(x) for x in args.ranks.split(",") if x], json_lines=args.json,
                cases=args.cases.split(","), launchers=args.launchers.split(","),
                launch_ranks=None if args.no_launch else LAUNCH_RANKS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
