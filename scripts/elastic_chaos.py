"""Elastic training under chaos: a seeded run of random events against a Gloo elastic job
(``horovodliterun --elastic``, 4 workers), each at a random point of a step.

    python scripts/elastic_chaos.py [--events 100] [--seed S] [--hosts] [--bound 60]

Events: kill a rank (SIGKILL), kill a host (every worker on it), stop a rank (SIGSTOP: alive
and silent, for the driver's heartbeat watch to find and kill), and with ``--hosts`` (the test
hosts, tests/hosts/hostctl.sh, as root) cut a host's link; a host comes back by itself: the host
discovery script always lists every host, so once its blacklist cooldown (1-2 s) is over the
driver starts workers there again, and they join at the next commit. The plan comes from the
seed alone (printed first; ``--seed S`` replays it): each event's kind, its distance in steps
from the last one, the phase of the step and its target (tests/scripts/chaos_train.py).

Checked, else the run fails naming the seed:
- after every reset, every rank holds the same weights (the workers' ``AGREE``);
- no deadlock: the job makes progress at least every ``--bound`` seconds, or ends with an
  error; progress is each effect an event waits for: a worker started, done importing,
  initialised (after a rendezvous), a step, a reset - so a slow start on a loaded machine is
  not taken for a deadlock, and a hang anywhere is;
- the final weights equal a one-process reference given the commits and the data order
  (``FINAL ... match`` from every last worker);
- every planned event fired.
Output: one line per event and a summary (events by kind, resets, steps, wall time).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKER = ROOT / "tests" / "scripts" / "chaos_train.py"
HOSTCTL = ROOT / "tests" / "hosts" / "hostctl.sh"
PHASES = ("forward", "backward", "step", "commit")
LOCAL_HOSTS = {"127.0.0.1": 2, "localhost": 2}  # two hosts of the job on this machine
TEST_HOSTS = {"hvdl-host1": 2, "hvdl-host2": 1, "hvdl-host3": 1}  # the driver on hvdl-host0
CUT_FOR = 20.0  # seconds a cut link stays down (past the launcher's 15 s of silence)


def make_plan(seed: int, events: int, hosts: bool) -> list:
    rng = random.Random(seed)
    kinds = ["kill-rank", "kill-host", "stop-rank"] + (["cut-link"] if hosts else [])
    weights = [5, 3, 2] + ([2] if hosts else [])
    return [{"kind": rng.choices(kinds, weights)[0], "after": rng.randint(1, 4),
             "phase": rng.choice(PHASES), "target": rng.randrange(4)} for _ in range(events)]


def command(folder: Path, hosts: bool) -> list:
    listing = TEST_HOSTS if hosts else LOCAL_HOSTS
    script = folder / "discover.sh"
    script.write_text("#!/bin/sh\n" + "".join(f"echo {h}:{n}\n" for h, n in listing.items()))
    script.chmod(0o755)
    cmd = [sys.executable, "-m", "horovodlite.runner.launch", "--elastic", "-np", "4",
           "--min-np", "1", "--max-np", "4", "--host-discovery-script", str(script),
           "--blacklist-cooldown-range", "1", "2"]
    if hosts:
        cmd = [str(HOSTCTL), "run", "hvdl-host0", *cmd, "--ssh-agent", str(HOSTCTL),
               "--network-interface", "eth0"]
    return [*cmd, sys.executable, str(WORKER), str(folder)]


class Watch:
    """Reads the job's output as it comes: progress times, events, cut links to restore."""

    def __init__(self, proc, log, hosts: bool):
        self.proc, self.log, self.hosts = proc, log, hosts
        self.last_progress = time.monotonic()
        self.lines: list = []
        self.restores: list = []  # (when, host)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        for line in self.proc.stdout:
            self.log.write(line)
            self.lines.append(line.rstrip("\n"))
            # progress: a worker started, done importing, initialised; a step; a reset
            if re.search(r"<stdout>:(START|READY|UP|STEP|AGREE) ", line):
                self.last_progress = time.monotonic()
            m = re.search(r"<stdout>:EVENT (\d+) (\S+) .* host (\S+) step", line)
            if m:
                print(f"  event {m.group(1)}: {m.group(2)} on {m.group(3)}", flush=True)
                if m.group(2) == "cut-link":
                    self.restores.append((time.monotonic() + CUT_FOR, m.group(3)))


def restore_links(watch: Watch, force: bool = False) -> None:
    now = time.monotonic()
    for when, host in list(watch.restores):
        if force or now >= when:
            subprocess.run(["ip", "netns", "exec", host, "ip", "link", "set", "eth0", "up"],
                           check=False)
            watch.restores.remove((when, host))


def dump_stacks(folder: Path, log) -> None:
    """At a stall: every worker's Python stacks (SIGUSR1: faulthandler) and the processes."""
    log.write(subprocess.run(["ps", "-eo", "pid,ppid,stat,etime,args"], capture_output=True,
                             text=True).stdout)
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            line = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            # the workers themselves, not their wrappers (which have no handler: they would end)
            if str(WORKER) in line and str(folder) in line and "runner.task" not in line:
                os.kill(int(pid), signal.SIGUSR1)
        except OSError:
            pass
    time.sleep(5)  # the dumps reach the log through the driver


def run(seed: int, events: int, hosts: bool, bound: float, timeout: float, log_path) -> dict:
    """Runs one chaos job; returns its summary, with "failure" set when a check failed."""
    plan = make_plan(seed, events, hosts)
    start = time.monotonic()
    # the log line by line: it is read at a stall
    with tempfile.TemporaryDirectory(prefix="hvdl-chaos-") as tmp, \
            open(log_path, "w", buffering=1) as log:
        folder = Path(tmp)
        folder.chmod(0o755)
        (folder / "plan.json").write_text(json.dumps(plan))
        env = dict(os.environ, OMP_NUM_THREADS="1", HVDL_DISCOVERY_INTERVAL="0.3",
                   HOROVOD_GLOO_TIMEOUT_SECONDS="10", PYTHONUNBUFFERED="1")
        proc = subprocess.Popen(command(folder, hosts), cwd=ROOT, env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True, errors="replace")
        watch = Watch(proc, log, hosts)
        failure = ""
        try:
            while proc.poll() is None:
                time.sleep(0.2)
                restore_links(watch)
                now = time.monotonic()
                if now - watch.last_progress > bound:
                    failure = (f"no progress (a worker starting or initialising, a step, a "
                               f"reset) for {bound:g} s: a deadlock")
                elif now - start > timeout:
                    failure = f"the run took more than {timeout:g} s"
                if failure:
                    if "deadlock" in failure:
                        dump_stacks(folder, log)
                    os.killpg(proc.pid, 9)
                    break
            proc.wait()
            watch.thread.join(timeout=10)
        finally:
            restore_links(watch, force=True)
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()
    out = "\n".join(watch.lines)
    fired = re.findall(r"<stdout>:EVENT \d+ (\S+) ", out)
    finals = re.findall(r"<stdout>:FINAL rank (\d+) size (\d+) steps (\d+) match", out)
    if not failure and proc.returncode != 0:
        failure = f"horovodliterun exited with {proc.returncode}"
    if not failure and "ranks disagree" in out:
        failure = "ranks disagreed after a reset"
    if not failure and len(fired) != events:
        failure = f"{len(fired)} of {events} events fired"
    if not failure and (not finals or len(finals) != int(finals[0][1])):
        failure = f"the final weights were not checked by every last worker ({finals})"
    if not failure and "Tensor-likes are not close" in out:
        failure = "a worker's final weights differ from the reference"
    event_steps = [int(s) for s in re.findall(r"<stdout>:EVENT \d+ \S+ rank .* step (\d+) ",
                                              out)]
    if not failure and event_steps and int(finals[0][2]) < max(event_steps):
        failure = (f"the last workers ended at step {finals[0][2]}, before the last event's "
                   f"(step {max(event_steps)}): they trained from scratch")
    return {"seed": seed, "events": events, "fired": {k: fired.count(k) for k in set(fired)},
            "resets": len(re.findall(r"<stdout>:AGREE rank 0 ", out)) - 1,
            "steps": int(finals[0][2]) if finals else None,
            "final size": int(finals[0][1]) if finals else None,
            "seconds": round(time.monotonic() - start, 1), "failure": failure,
            "log": str(log_path)}


def main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the job's group ends with us
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=100)
    p.add_argument("--seed", type=int, help="replay this seed (default: a new one, printed)")
    p.add_argument("--hosts", action="store_true",
                   help="on the test hosts (tests/hosts/hostctl.sh up 4 first), with cut links")
    p.add_argument("--bound", type=float, default=60.0,
                   help="seconds without progress that count as a deadlock")
    p.add_argument("--timeout", type=float, default=3600.0)
    p.add_argument("--log", default=None, help="the job's output (default: a temporary file)")
    args = p.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2 ** 31)
    print(f"elastic chaos: seed {seed} ({args.events} events; replay with --seed {seed})",
          flush=True)
    log = args.log or tempfile.mkstemp(prefix="hvdl-chaos-", suffix=".log")[1]
    summary = run(seed, args.events, args.hosts, args.bound, args.timeout, log)
    print(json.dumps(summary), flush=True)
    if summary["failure"]:
        print(f"elastic chaos FAILED (seed {seed}): {summary['failure']}; the job's output: "
              f"{log}", flush=True)
        return 1
    print(f"elastic chaos passed (seed {seed})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
