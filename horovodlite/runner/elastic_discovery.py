"""The elastic driver's host list (runner/elastic_driver.py): from ``--host-discovery-script``
or, in a Slurm job without one, the job's nodes Slurm still offers (``slurm_steps.usable``);
which workers retire when a host leaves it, and where the job grows when one comes."""

from __future__ import annotations

import subprocess

from horovodlite.common import elastic_rounds, launch_env
from horovodlite.runner import horovod_flags, slurm_steps
from horovodlite.runner.elastic_places import start_places
from horovodlite.runner.gloo_launch import say

PENDING_WAIT = 30.0  # s after growth started workers: join with those ready by then


class Discovery:
    """The part of ``ElasticJob`` that reads the host list; it sets ``args``, ``allocated``
    (host -> slots of the Slurm job, or empty), ``base_env``, ``next_discovery``, ``workers``,
    ``members``, ``pending``, ``server``, ``slots``, ``max_np``, ``blacklist`` and ``spawn``."""

    def discovering(self) -> bool:
        return bool(self.args.host_discovery_script or self.allocated)

    def discover(self) -> dict | None:
        """host -> slots the script lists now (or, in a Slurm job without a script, the job's
        nodes Slurm still offers); None when it fails (the last answer stands)."""
        if not self.args.host_discovery_script:
            nodes = slurm_steps.usable(list(self.allocated))
            if nodes is None:
                say("sinfo could not say which of the job's nodes Slurm still offers; keeping "
                    "the last host list")
                return None
            return {h: self.allocated[h] for h in nodes}
        try:
            out = subprocess.run([self.args.host_discovery_script], capture_output=True,
                                 text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as e:
            say(f"--host-discovery-script: {e}; keeping the last host list")
            return None
        if out.returncode != 0:
            say(f"--host-discovery-script exited with status {out.returncode}; keeping the "
                "last host list")
            return None
        found: dict = {}
        listing = horovod_flags.discovery_with_slots(
            out.stdout, getattr(self.args, "slots_per_host", None))
        for host, slots in elastic_rounds.parse_hosts(listing).items():
            name = self.name(host)
            found[name] = found.get(name, 0) + slots
        return found

    def _discovery(self, now: float) -> tuple:
        """(workers to retire, hosts grown onto) from the discovery script, when it is time."""
        if not self.discovering() or now < self.next_discovery:
            return [], []
        # sinfo asks slurmctld, which every job on the cluster shares: every 5 s by default
        self.next_discovery = now + launch_env.discovery_interval(
            self.base_env, 1.0 if self.args.host_discovery_script else 5.0)
        found = self.discover()
        if found is None:
            return [], []
        listed = {h for h in found}
        job_hosts = {self.workers[w].host for w in self.members}
        if job_hosts and not job_hosts & listed:
            return [], []  # lists none of the job's hosts: taken for a broken script
        retire = [w for w in self.members if self.workers[w].host not in listed]
        if retire:
            return retire, []
        self.slots = found
        room = self.max_np - len(self.members) - len(self.pending)
        grown = []
        for host, slots in found.items():
            free = slots - self.running_on(host)
            while free > 0 and room > 0 and not self.blacklist.blocked(host, now):
                grown.append(host)
                free -= 1
                room -= 1
        # the new workers' start assignment: their places in the round that lists them next;
        # they join the job once they say they are ready (newcomers() below)
        known = self.members + self.pending
        hosts = [self.workers[w].host for w in known] + grown
        places = start_places(hosts)[len(known):]
        if grown:
            if not self.pending:
                self.pending_since = now
            self.pending += [self.spawn(h, p) for h, p in zip(grown, places)]
            listed = ", ".join(f"{h}:{grown.count(h)}" for h in dict.fromkeys(grown))
            say(f"started {len(grown)} worker{'s' if len(grown) > 1 else ''} on {listed} "
                f"({self.growth_source()}); listed in a round once ready")
        return [], grown

    def growth_source(self) -> str:
        return "host discovery" if self.args.host_discovery_script else "Slurm offers it again"

    def newcomers(self, now: float) -> list:
        """The workers started for growth that wait for a round now (``elastic_rounds``'s
        ready keys), all together: they leave ``pending`` for ``members`` once every pending
        worker is ready (one round, one stop of the others for all of them), or PENDING_WAIT s
        after the first was started (a newcomer that never gets ready holds up no others). One
        that ended before is dropped, named. Returns the hosts of those that joined."""
        for number in list(self.pending):
            w = self.workers[number]
            if w.status is not None:
                self.pending.remove(number)
                w.left = f"exited with status {w.status} before it joined"
                say(f"worker {number} on {w.host}, started for growth, exited with status "
                    f"{w.status} before it joined")
        ready = [n for n in self.pending
                 if elastic_rounds.is_ready(self.server.control, str(n))]
        if not ready or (len(ready) < len(self.pending)
                         and now - self.pending_since < PENDING_WAIT):
            return []
        self.pending = [n for n in self.pending if n not in ready]
        self.pending_since = now
        self.members += ready
        return [self.workers[w].host for w in ready]


__all__ = ["Discovery"]
