"""What the elastic driver (elastic_driver.py) keeps per worker and per host: a worker it
started, the hosts it blacklisted after failures, and each worker's start assignment."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field

from horovodlite.common import launch_env


@dataclass
class Worker:
    number: int
    host: str
    local: bool
    proc: subprocess.Popen
    status: int | None = None  # exit status, once known (negative: signal)
    left: str = ""  # why it is out of the job ("" while in it, or finished)
    retired: bool = False
    first_round: int = -1  # the first round it is a member of (-1: none yet)

    def running(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig) -> None:
        """``sig`` to the worker's process group (its own session: the rank, or the ssh or srun
        that runs it elsewhere and passes it on) while it runs. A pid below 1 is refused: to
        killpg it names the caller's own group (the driver, and whatever started it)."""
        if self.proc.pid is None or self.proc.pid < 1:
            raise ValueError(f"worker {self.number} on {self.host}: no process to signal "
                             f"(pid {self.proc.pid})")
        if self.running():
            try:
                os.killpg(self.proc.pid, sig)
            except OSError:
                pass  # it ended already


@dataclass
class Blacklist:
    cooldown: tuple | None  # (MIN, MAX) seconds, or None: for the rest of the job
    failures: dict = field(default_factory=dict)
    until: dict = field(default_factory=dict)

    def add(self, host: str, now: float) -> str:
        self.failures[host] = self.failures.get(host, 0) + 1
        if self.cooldown is None:
            self.until[host] = float("inf")
            return "for the rest of the job"
        seconds = min(self.cooldown[1], self.cooldown[0] * 2 ** (self.failures[host] - 1))
        self.until[host] = now + seconds
        return f"for {seconds:g} s (--blacklist-cooldown-range)"

    def blocked(self, host: str, now: float) -> bool:
        return self.until.get(host, 0.0) > now


PLACE = (launch_env.GLOO_RANK, launch_env.GLOO_SIZE, launch_env.GLOO_LOCAL_RANK,
         launch_env.GLOO_LOCAL_SIZE, launch_env.GLOO_CROSS_RANK, launch_env.GLOO_CROSS_SIZE)


def start_places(hosts: list) -> list:
    """Each worker's start assignment (HOROVOD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE,
    _CROSS_RANK, _CROSS_SIZE), as horovodrun gives them, from the hosts of a round's workers in
    rank order: what a worker reading them (Horovod's scripts do) learns of its start. The rank
    a round gives it later is ``hvd.rank()``; the variables are not updated."""
    return [{k: v for k, v in settings.items() if k in PLACE}
            for settings in launch_env.gloo_rank_settings(hosts, "", 0, "")]
