"""Training through failures, side by side: horovodlite's elastic training (rollback ``step``,
the driver's heartbeats), torchft (its Manager and Lighthouse, DDP on Gloo) and torchrun
restarting every worker from a checkpoint taken every 50 steps - the same model, data, steps
and seeded failure schedule, one after the other in one run.

    python benchmarks/fault_tolerance.py [--steps 600] [--runs 3] [--seed S]
                                         [--systems hvdl torchft torchrun]

4 workers on this machine. The schedule: a worker SIGKILLed every ``--every`` s (20, with a
seeded jitter of +-15 %, the victim drawn from the live workers by the seed), brought back
``--back`` s later (10): horovodlite's driver starts one when the host's blacklist cooldown ends
(the discovery script lists 4 one-slot hosts: names of this machine), the harness restarts the
torchft replica, torchrun restarts every worker at once by itself. A step is
``--work`` s of other work (sleep) plus a small MLP's forward, backward and allreduce
(benchmarks/fault_tolerance_worker.py).

Reported per run and as ranges: the wall time to the last step (from the launch), the steps
redone (applied twice: torchrun goes back to its checkpoint, horovodlite at most the step in
flight), the steps torchft discarded, from each kill to training again (the first new step),
how long the others stopped for a worker joining (the gap between the last step without it and
the first with it), the steps per second while a worker was away and with all four, and whether
the weights are right (horovodlite, torchrun: equal to one process training the same steps on
the whole batch; torchft drops an absent replica's share of the batch, so its weights differ by
design).

Needs ``pip install torchft==0.2.0`` (a benchmark-only dependency; skipped without it). Not
measured here: a whole host lost and a cut link (one machine; see docs/elastic.md for those on
the test hosts), spares, and a newcomer that joins without stopping the others (horovodlite's
newcomers join at the next commit through a sync that every rank waits for).
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKER = ROOT / "benchmarks" / "fault_tolerance_worker.py"
LINE = re.compile(r"^(?:\[\d+\]<stdout>:)?(UP|STEP|DISCARD|FINAL) (.*)$")


def local_hosts() -> list:
    """Four names of this machine, each a one-slot host of the elastic job (names the
    launcher starts workers under without ssh: loopback, the host name, its addresses)."""
    from horovodlite.runner.report import interface_addresses

    names = list(dict.fromkeys(["127.0.0.1", "localhost", socket.gethostname(),
                                *interface_addresses()]))
    if len(names) < 4:
        raise SystemExit(f"fault_tolerance: 4 names of this machine needed, found {names}")
    return names[:4]


def ours(pid: int) -> bool:
    """Whether ``pid`` is still one of this benchmark's workers: pids are reused (quickly on
    some machines), and a pid that said UP minutes ago may now be anyone's - the test runner's."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return WORKER.name.encode() in f.read()
    except OSError:
        return False


class Job:
    """One system's run: its processes, and the lines its workers print, with their times."""

    def __init__(self, system: str, args, folder: Path):
        self.system, self.args, self.folder = system, args, folder
        self.log = open(folder / f"{system}.log", "w")
        self.ups: dict = {}  # pid -> wall time
        self.steps: list = []  # (step, wall, workers, generation, pid)
        self.discards: set = set()
        self.finals: list = []
        self.procs: list = []  # (Popen, replica or None)
        self.lock = threading.Lock()
        self.lighthouse = None
        self.start = time.time()

    def spawn(self, cmd: list, replica=None, env=None) -> None:
        p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, start_new_session=True,
                             env=dict(os.environ, OMP_NUM_THREADS="1", **(env or {})))
        self.procs.append((p, replica))
        threading.Thread(target=self._read, args=(p,), daemon=True).start()

    def _read(self, p) -> None:
        for line in p.stdout:
            self.log.write(line)
            m = LINE.match(line.strip())
            if not m:
                continue
            kind, words = m.group(1), m.group(2).split()
            with self.lock:
                if kind == "UP":
                    self.ups[int(words[0])] = float(words[1])
                elif kind == "STEP":
                    self.steps.append((int(words[0]), float(words[1]), int(words[2]),
                                       int(words[3]), int(words[4])))
                elif kind == "DISCARD":
                    self.discards.add(int(words[0]))
                else:
                    self.finals.append(words)

    def launch(self) -> None:
        a, worker = self.args, [sys.executable, str(WORKER), self.system, "--steps",
                                str(self.args.steps), "--work", str(self.args.work)]
        if self.system == "hvdl":
            script = self.folder / "hosts.sh"
            script.write_text("#!/bin/sh\n" + "".join(f"echo {h}:1\n" for h in local_hosts()))
            script.chmod(0o755)
            self.spawn([sys.executable, "-m", "horovodlite.runner.launch", "--elastic", "-np",
                        "4", "--min-np", "2", "--max-np", "4", "--host-discovery-script",
                        str(script), "--blacklist-cooldown-range", str(a.back), str(a.back),
                        *worker], env={"HOROVOD_GLOO_TIMEOUT_SECONDS": "10"})
        elif self.system == "torchft":
            from torchft.coordination import LighthouseServer

            self.lighthouse = LighthouseServer(bind="[::]:0", min_replicas=2,
                                               join_timeout_ms=1000)
            for i in range(4):
                self.start_replica(i)
        else:
            (self.folder / "torchrun.pt").unlink(missing_ok=True)  # a new job, from step 0
            self.spawn([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node", "4", "--max-restarts", "100", *worker[1:],
                        "--checkpoint", str(self.folder / "torchrun.pt")])

    def start_replica(self, i: int) -> None:
        self.spawn([sys.executable, str(WORKER), "torchft", "--steps", str(self.args.steps),
                    "--work", str(self.args.work), "--replica", str(i), "--lighthouse",
                    self.lighthouse.address()], replica=i)

    def live_workers(self) -> list:
        """The workers training now (they said UP and run), by pid."""
        with self.lock:
            pids = sorted(self.ups)
        alive = []
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().split(")")[1].split()[0] != "Z" and ours(pid):
                        alive.append(pid)
            except OSError:
                pass
        return alive

    def replica_of(self, pid: int):
        for p, replica in self.procs:
            if p.pid == pid:
                return replica
        return None

    def finished_steps(self) -> int:
        with self.lock:
            return max((s for s, *_ in self.steps), default=0)

    def stop(self) -> None:
        # the launchers' process groups, then every worker that said UP (torchrun starts its
        # workers in sessions of their own: killing torchrun alone leaves them running)
        for p, _ in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except OSError:
                    pass
        for pid in self.ups:
            if ours(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        if self.lighthouse is not None:
            self.lighthouse.shutdown()
        self.log.close()


def run_one(system: str, args, seed: int, folder: Path) -> dict:
    rng = random.Random(seed)
    job = Job(system, args, folder)
    job.launch()
    kills: list = []  # (wall, pid)
    back: list = []  # (when, replica): torchft replicas to restart
    next_kill = None
    deadline = time.time() + args.timeout
    while time.time() < deadline:
        now = time.time()
        if all(p.poll() is not None for p, _ in job.procs) and not back:
            break
        if next_kill is None and job.finished_steps() > 0:
            next_kill = now + args.every + rng.uniform(-0.15, 0.15) * args.every
        if next_kill is not None and now >= next_kill and job.finished_steps() < args.steps - 20:
            live = job.live_workers()
            if len(live) >= 3:
                victim = live[rng.randrange(len(live))]
                if not ours(victim):  # (it ended since)
                    continue
                os.kill(victim, signal.SIGKILL)
                kills.append((now, victim))
                replica = job.replica_of(victim)
                if replica is not None:
                    back.append((now + args.back, replica))
            next_kill = now + args.every + rng.uniform(-0.15, 0.15) * args.every
        for when, replica in list(back):
            if now >= when:
                back.remove((when, replica))
                if job.finished_steps() < args.steps - 10:  # (it would wait for a quorum)
                    job.start_replica(replica)
        time.sleep(0.05)
    timed_out = time.time() >= deadline
    job.stop()
    return measure(system, job, kills, args, timed_out)


def measure(system: str, job: Job, kills: list, args, timed_out: bool) -> dict:
    steps = sorted(job.steps, key=lambda r: r[1])
    kept: dict = {}  # step -> when it was applied for the last time (the time that counted)
    gens: dict = {}
    size: dict = {}  # step -> the workers that applied it (the last time)
    last_gen: dict = {}  # step -> the generation that applied it (the last time)
    for s, t, n, gen, _ in steps:
        kept[s], size[s], last_gen[s] = t, n, gen
        gens.setdefault(s, set()).add(gen)
    # a worker joining: the gap between the last step without it and the first with it (the
    # others wait for it: horovodlite's sync, torchft's quorum and healing)
    order = sorted(kept)
    joins = [kept[b] - kept[a] for a, b in zip(order, order[1:])
             if size[b] > size[a] and system != "torchrun"]
    end = kept.get(args.steps)
    recoveries, degraded = [], []
    for t_kill, _ in kills:
        # training again: the first step applied after the kill by the workers that go on
        # without the lost one (another generation or number of workers than at the kill: the
        # step in flight may still complete with the victim's part), and not applied again
        # later (torchrun's old generation may finish a step before it is stopped)
        at_kill = max((s for s in order if kept[s] <= t_kill), default=None)
        was = (size.get(at_kill), last_gen.get(at_kill))
        after = [kept[s] for s in order
                 if kept[s] > t_kill and (size[s], last_gen[s]) != was]
        if after:
            recoveries.append(min(after) - t_kill)
        if system == "torchrun":
            continue  # every worker restarts at once: no time with a worker away
        # steps per second while the worker was away (after training resumed, until it was
        # brought back)
        lo, hi = t_kill + (recoveries[-1] if after else 0), t_kill + args.back
        inside = [s for s, t in kept.items() if lo < t <= hi]
        if inside and hi > lo:
            degraded.append(len(inside) / (hi - lo))
    full = [t for s, t, n, *_ in steps if n == 4]
    full_rate = None
    if len(full) > 10:
        full_steps = len({s for s, t, n, *_ in steps if n == 4})
        full_rate = full_steps / (max(full) - min(full))
    finals = job.finals
    right = "-"
    if system in ("hvdl", "torchrun") and finals:
        diffs = [float(f[2]) for f in finals if f[2] != "nan"]
        agree = all(f[3] != "DISAGREE" for f in finals)
        right = (f"max diff {max(diffs):.2g}" if diffs else "?") + ("" if agree else " DISAGREE")
    elif finals:
        right = "replicas agree" if len({f[1] for f in finals}) == 1 else "replicas DIFFER"
    return {"system": system, "wall": (end - job.start) if end else None,
            "startup": (steps[0][1] - job.start) if steps else None,
            "kills": len(kills), "redone": sum(len(g) - 1 for g in gens.values()),
            "discarded": len(job.discards), "recoveries": recoveries, "degraded": degraded,
            "joins": joins,
            "full": full_rate, "right": right, "timed_out": timed_out,
            "log": str(job.folder / f"{system}.log")}


def fmt(values, unit="", digits=1) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    lo, hi = min(values), max(values)
    return (f"{lo:.{digits}f}" if lo == hi else f"{lo:.{digits}f}-{hi:.{digits}f}") + unit


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--work", type=float, default=0.05)
    p.add_argument("--every", type=float, default=20.0, help="seconds between kills")
    p.add_argument("--back", type=float, default=10.0, help="seconds a killed worker stays away")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seed", type=int)
    p.add_argument("--timeout", type=float, default=600.0, help="per run")
    p.add_argument("--systems", nargs="+", default=["hvdl", "torchft", "torchrun"],
                   choices=["hvdl", "torchft", "torchrun"])
    p.add_argument("--keep", help="keep the logs in this folder")
    args = p.parse_args()
    if "torchft" in args.systems:
        try:
            import torchft  # noqa: F401
        except ImportError:
            print("fault_tolerance: torchft is not installed (pip install torchft==0.2.0); "
                  "running without it")
            args.systems = [s for s in args.systems if s != "torchft"]
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2 ** 31)
    print(f"fault_tolerance: seed {seed}, {args.steps} steps, a kill every ~{args.every:g} s, "
          f"back after {args.back:g} s, {args.runs} runs, {time.strftime('%Y-%m-%d %H:%M')}, "
          f"{os.cpu_count()} CPUs")
    folder = Path(args.keep or tempfile.mkdtemp(prefix="hvdl-ft-"))
    folder.mkdir(parents=True, exist_ok=True)
    results: dict = {s: [] for s in args.systems}
    for run in range(args.runs):
        for system in args.systems:  # alternating: the machine's state changes slowly
            sub = folder / f"run{run}"
            sub.mkdir(exist_ok=True)
            r = run_one(system, args, seed + run, sub)
            results[system].append(r)
            print(f"run {run} {system:9} wall {fmt([r['wall']], ' s')}  kills {r['kills']}  "
                  f"redone {r['redone']}  discarded {r['discarded']}  to training again "
                  f"{fmt(r['recoveries'], ' s', 2)}  join pause {fmt(r['joins'], ' s', 2)}  "
                  f"steps/s away {fmt(r['degraded'])} "
                  f"all four {fmt([r['full']])}  {r['right']}"
                  + ("  TIMED OUT" if r["timed_out"] else ""), flush=True)
    print("\nsystem     wall (s)        redone/kill  to training again (s)  join pause (s)  "
          "steps/s away  steps/s all four  weights")
    for system, rs in results.items():
        per_kill = [r["redone"] / r["kills"] for r in rs if r["kills"]]
        print(f"{system:10} {fmt([r['wall'] for r in rs]):15} {fmt(per_kill):12} "
              f"{fmt([x for r in rs for x in r['recoveries']], '', 2):22} "
              f"{fmt([x for r in rs for x in r['joins']], '', 2):15} "
              f"{fmt([x for r in rs for x in r['degraded']]):13} "
              f"{fmt([r['full'] for r in rs]):17} {'; '.join(sorted({r['right'] for r in rs}))}")
    if "hvdl" in results:
        for other in results:
            if other != "hvdl":
                ratio = [o["wall"] / h["wall"] for h, o in zip(results["hvdl"], results[other])
                         if h["wall"] and o["wall"]]
                print(f"{other} wall / horovodlite wall: {fmt(ratio, 'x', 2)}")
    print(f"logs: {folder}")
    if not args.keep:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
