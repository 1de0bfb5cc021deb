"""The ranks' output: prefixed lines on the launcher's console (``--gloo``), and one folder of
files per rank (``--output-filename DIR``, both modes).

Console (``horovodliterun --gloo``): every line a rank writes reaches the launcher's stdout or
stderr, whichever the rank wrote it to, as

    [3]<stdout>:epoch 1 loss 0.25
    [3]<stderr>:UserWarning: ...

(Horovod's Gloo format: the global rank, the stream, the line as written). A line is written
whole, so lines of different ranks never mix; a last line without a newline gets one. Output
that never ends a line (a progress bar redrawn with ``\\r``) shows when the rank ends it.
(Under mpirun the output is mpirun's own, unprefixed.)

Files (``--output-filename DIR``): the rank wrapper (``task.py``) of rank N copies what its
command writes into ``DIR/rank.N/stdout`` and ``DIR/rank.N/stderr`` as well, unprefixed, on
the rank's host (one folder for the whole job on a shared filesystem). The console still shows
it all.
"""

from __future__ import annotations

import os
import sys
import threading


def prefix(rank: int, stream: str) -> bytes:
    return f"[{rank}]<{stream}>:".encode()


class Forwarder:
    """Copies the ranks' pipes to the launcher's stdout and stderr, one prefixed line at a time
    (a thread per pipe; one lock for both streams, which may be one file)."""

    def __init__(self, stdout=None, stderr=None):
        self._dest = {"stdout": stdout or sys.stdout.buffer, "stderr": stderr or sys.stderr.buffer}
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def add(self, rank: int, stream: str, pipe) -> None:
        """Forwards ``pipe`` (a binary file object, read to its end and closed) as ``stream``
        ("stdout" or "stderr") of ``rank``."""
        t = threading.Thread(target=self._pump, args=(pipe, self._dest[stream],
                                                      prefix(rank, stream)), daemon=True)
        t.start()
        self._threads.append(t)

    def _pump(self, pipe, dest, tag: bytes) -> None:
        try:
            for line in iter(pipe.readline, b""):
                if not line.endswith(b"\n"):
                    line += b"\n"
                with self._lock:
                    try:
                        dest.write(tag + line)
                        dest.flush()
                    except (OSError, ValueError):
                        pass  # the console is gone; keep draining so that the rank never blocks
        finally:
            pipe.close()

    def join(self, timeout: float) -> None:
        """Waits up to ``timeout`` s in all for the pipes to end (a rank's children may hold
        them open after it exited)."""
        for t in self._threads:
            t.join(timeout=timeout)
            timeout = 0.1


def output_files(folder: str, rank) -> dict:
    """{"stdout": path, "stderr": path} of ``rank`` under ``--output-filename`` ``folder``."""
    base = os.path.join(folder, f"rank.{rank}")
    return {s: os.path.join(base, s) for s in ("stdout", "stderr")}


def tee(source_fd: int, console_fd: int, path: str) -> threading.Thread:
    """Copies ``source_fd`` (a rank command's stdout or stderr pipe) to ``console_fd`` and to
    the file ``path`` until the pipe ends; returns the copying thread."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    out = open(path, "wb", buffering=0)

    def copy():
        console_ok = True
        try:
            while True:
                chunk = os.read(source_fd, 65536)
                if not chunk:
                    return
                out.write(chunk)
                while console_ok and chunk:
                    try:
                        chunk = chunk[os.write(console_fd, chunk):]
                    except OSError:
                        console_ok = False
        finally:
            out.close()
            os.close(source_fd)

    t = threading.Thread(target=copy, daemon=True)
    t.start()
    return t
