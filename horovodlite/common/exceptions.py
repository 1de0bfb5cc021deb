"""Exceptions users catch."""

from horovodlite._extension import load

_C = load()

#: Raised by ``synchronize`` (and the synchronous ops) when a collective fails: ranks disagreed
#: on a tensor (the message names each rank's value), the job was shut down, or the transport
#: failed. A subclass of RuntimeError. The runtime stays usable after a mismatch.
HorovodInternalError = _C.HorovodInternalError


class HostsUpdatedInterrupt(RuntimeError):
    """Raised in elastic jobs when the set of hosts changed (kept for API compatibility)."""

    def __init__(self, skip_sync: bool = False) -> None:
        super().__init__("hosts updated")
        self.skip_sync = skip_sync


__all__ = ["HorovodInternalError", "HostsUpdatedInterrupt"]
