"""Host discovery for growing elastic jobs (``horovodliterun --host-discovery-script S``).

Rank 0 runs the script (Horovod's format: one ``host:slots`` a line; a line without ``:slots``
counts as one slot) every ``HVDL_DISCOVERY_INTERVAL`` seconds on a background thread. At each
``state.commit()`` rank 0 says how many ranks the job should add - the slots found, capped at
``--max-np`` (default ``-np``) and at the slots of ``-H``, minus the current size - and every
rank learns it with one broadcast; if it is positive, ``commit`` raises
``HostsUpdatedInterrupt`` and the reset in ``hvd.elastic.run`` starts the new ranks
(MPI_Comm_spawn, placed by mpirun on the job's hosts) and merges them into the job; they receive
the state by the sync that follows.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

from horovodlite.common import basics

_poller = None
_requested = 0  # ranks to add, as agreed at the last check


def parse_slots(text: str) -> int:
    """Total slots of a discovery script's output."""
    total = 0
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        host, _, slots = line.partition(":")
        total += int(slots) if slots.strip() else 1
    return total


class _Poller:
    def __init__(self, script: str, interval: float) -> None:
        self.script = script
        self.interval = interval
        self.slots: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="hvdl-discovery")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                out = subprocess.run([self.script], capture_output=True, text=True, timeout=30,
                                     check=True).stdout
                self.slots = parse_slots(out)
            except (OSError, subprocess.SubprocessError, ValueError) as exc:
                sys.stderr.write(f"hvd.elastic: host discovery script {self.script} failed: "
                                 f"{exc}\n")
            self._stop.wait(self.interval)


def active() -> bool:
    return bool(os.environ.get("HVDL_DISCOVERY_SCRIPT")) and basics.is_initialized()


def growth_agreed() -> int:
    """Collective when discovery is active: how many ranks to add now (same on every rank)."""
    global _poller, _requested
    from horovodlite.torch.functions import broadcast_object

    add = 0
    if basics.rank() == 0:
        if _poller is None:
            _poller = _Poller(os.environ["HVDL_DISCOVERY_SCRIPT"],
                              float(os.environ.get("HVDL_DISCOVERY_INTERVAL", "1")))
        caps = [int(os.environ[v]) for v in ("HVDL_ELASTIC_MAX_NP", "HVDL_ELASTIC_SLOTS")
                if os.environ.get(v, "").isdigit()]
        if _poller.slots is not None:
            add = max(0, min([_poller.slots, *caps]) - basics.size())
    _requested = int(broadcast_object(add, 0, name="elastic.host_updates"))
    return _requested


def take_request() -> int:
    """The growth agreed at the last check, once (the reset that acts on it calls this)."""
    global _requested
    add, _requested = _requested, 0
    return add
