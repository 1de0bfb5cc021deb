"""Exceptions users catch."""

from horovodlite._extension import load

_C = load()

# Both types are made by the C++ module (its errors raise them); their docstrings are set here,
# where the API reference (docs/api.md, generated) reads them.
HorovodInternalError = _C.HorovodInternalError
HorovodInternalError.__doc__ = (
    "Raised by ``synchronize`` (and the synchronous ops) when a collective fails: ranks "
    "disagreed on a tensor (the message names each rank's value), the job was shut down, or the "
    "transport failed. A subclass of RuntimeError. The runtime stays usable after a mismatch.")

HorovodArgumentError = _C.HorovodArgumentError
HorovodArgumentError.__doc__ = (
    "Raised at call time for a bad argument (wrong type, shape, rank, process set, name still in "
    "flight...), before anything is enqueued: every rank that made the bad call raises it, and "
    "the runtime keeps working. It derives from both ValueError and RuntimeError, because "
    "Horovod raises ValueError for some such errors and RuntimeError for others (those of its "
    "C++ layer), and code written for Horovod catches either.")
HorovodInternalError.__module__ = HorovodArgumentError.__module__ = __name__


class HostsUpdatedInterrupt(RuntimeError):
    """Raised in elastic jobs when the set of hosts changed (kept for API compatibility)."""

    def __init__(self, skip_sync: bool = False) -> None:
        super().__init__("hosts updated")
        self.skip_sync = skip_sync


__all__ = ["HorovodArgumentError", "HorovodInternalError", "HostsUpdatedInterrupt"]
