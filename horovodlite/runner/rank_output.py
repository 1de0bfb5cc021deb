"""The ranks' output: prefixed lines on the launcher's console (``--gloo``), and one folder of
files per rank (``--output-filename DIR``, both modes).

Console (``horovodliterun --gloo``): every line a rank writes reaches the launcher's stdout or
stderr, whichever the rank wrote it to, as

    [3]<stdout>:epoch 1 loss 0.25
    [3]<stderr>:UserWarning: ...

(Horovod's Gloo format: the global rank, the stream, the line as written). A line is written
whole, so lines of different ranks never mix; a last line without a newline gets one. Output
that never ends a line (a progress bar redrawn with ``\\r``) shows when the rank ends it.

Under mpirun (``horovodliterun --mpi``) the lines carry the same prefix: the launcher sets
``HVDL_PREFIX_OUTPUT=1`` (``PREFIX_VAR``) and each rank's wrapper (``task.py``) prefixes its
command's whole lines before mpirun forwards them (``tee``). Without the wrapper
(``--no-rank-reports``) the output is mpirun's own.

Files (``--output-filename DIR``): the rank wrapper (``task.py``) of rank N copies what its
command writes into ``DIR/rank.N/stdout`` and ``DIR/rank.N/stderr`` as well, unprefixed, on
the rank's host (one folder for the whole job on a shared filesystem). The console still shows
it all.
"""

from __future__ import annotations

import os
import selectors
import sys
import threading

PREFIX_VAR = "HVDL_PREFIX_OUTPUT"  # "1": the rank wrapper prefixes its command's lines (--mpi)


def prefix(rank: int, stream: str) -> bytes:
    return f"[{rank}]<{stream}>:".encode()


class Forwarder:
    """Copies the ranks' pipes to the launcher's stdout and stderr, one prefixed line at a time.
    One thread serves every pipe (a selector; a launch of thousands of ranks through ssh has two
    pipes per rank, and a thread each made every start pay for two thread starts); one lock for
    both streams, which may be one file."""

    def __init__(self, stdout=None, stderr=None):
        self._dest = {"stdout": stdout or sys.stdout.buffer, "stderr": stderr or sys.stderr.buffer}
        self._lock = threading.Lock()  # the destinations
        self._state = threading.Condition()  # the pipes: added, open, the serving thread
        self._added: list = []  # (pipe, destination, tag) not yet served
        self._open = 0  # pipes added and not ended
        self._thread: threading.Thread | None = None
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_write, False)

    def add(self, rank: int, stream: str, pipe) -> None:
        """Forwards ``pipe`` (a binary file object, read to its end and closed) as ``stream``
        ("stdout" or "stderr") of ``rank``."""
        dest, tag = self._dest[stream], prefix(rank, stream)
        try:
            pipe.fileno()
        except (OSError, ValueError):  # no descriptor to wait on (io.BytesIO): read it now
            self._drain(pipe, dest, tag)
            return
        with self._state:
            self._added.append((pipe, dest, tag))
            self._open += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, daemon=True)
                self._thread.start()
        try:
            os.write(self._wake_write, b"x")
        except BlockingIOError:
            pass  # a wake-up is pending already

    def _drain(self, pipe, dest, tag: bytes) -> None:
        state = [pipe, dest, tag, b""]
        try:
            while self._write(state, pipe.read(65536)):
                pass
        finally:
            pipe.close()

    def _serve(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self._wake_read, selectors.EVENT_READ, None)
        served = 0
        try:
            while True:
                with self._state:
                    added, self._added = self._added, []
                    if not added and not served:
                        self._thread = None  # the next add starts another
                        return
                for pipe, dest, tag in added:
                    sel.register(pipe.fileno(), selectors.EVENT_READ, [pipe, dest, tag, b""])
                    served += 1
                for key, _ in sel.select():
                    if key.data is None:
                        os.read(self._wake_read, 4096)
                    elif not self._read(key.fd, key.data):
                        sel.unregister(key.fd)
                        key.data[0].close()
                        served -= 1
                        with self._state:
                            self._open -= 1
                            self._state.notify_all()
        finally:
            sel.close()

    def _read(self, fd: int, state: list) -> bool:
        """Writes the whole lines ``fd`` has now; False once it ended (its last line written)."""
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return True
        except OSError:
            chunk = b""
        return self._write(state, chunk)

    def _write(self, state: list, chunk: bytes) -> bool:
        """Writes the whole lines of what came before and ``chunk``; at the end (an empty
        chunk) the rest too; False then."""
        _, dest, tag, pending = state
        data = pending + chunk
        if chunk:
            cut = data.rfind(b"\n") + 1
            data, state[3] = data[:cut], data[cut:]
        elif data and not data.endswith(b"\n"):
            data += b"\n"  # a last line without a newline gets one
        if data:
            out = b"".join(tag + line + b"\n" for line in data.split(b"\n")[:-1])
            with self._lock:
                try:
                    dest.write(out)
                    dest.flush()
                except (OSError, ValueError):
                    pass  # the console is gone; keep draining so that the rank never blocks
        return bool(chunk)

    def join(self, timeout: float) -> None:
        """Waits up to ``timeout`` s in all for the pipes to end (a rank's children may hold
        them open after it exited)."""
        with self._state:
            self._state.wait_for(lambda: self._open == 0, timeout)


def output_files(folder: str, rank) -> dict:
    """{"stdout": path, "stderr": path} of ``rank`` under ``--output-filename`` ``folder``."""
    base = os.path.join(folder, f"rank.{rank}")
    return {s: os.path.join(base, s) for s in ("stdout", "stderr")}


def tee(source_fd: int, console_fd: int, path: str | None, tag: bytes | None = None
        ) -> threading.Thread:
    """Copies ``source_fd`` (a rank command's stdout or stderr pipe) to ``console_fd`` - each
    whole line behind ``tag`` when one is given (``prefix``) - and, as written, to the file
    ``path`` (None: no file) until the pipe ends; returns the copying thread."""
    out = None
    if path is not None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        out = open(path, "wb", buffering=0)
    pending = [b""]  # with a tag: the line begun and not yet ended

    def lines(chunk: bytes) -> bytes:
        if tag is None:
            return chunk
        data = pending[0] + chunk
        if chunk:
            cut = data.rfind(b"\n") + 1
            data, pending[0] = data[:cut], data[cut:]
        elif data:
            data += b"\n"  # the pipe ended inside a line: it gets its newline
        return b"".join(tag + line + b"\n" for line in data.split(b"\n")[:-1])

    def copy():
        console_ok = True
        try:
            while True:
                chunk = os.read(source_fd, 65536)
                if out is not None and chunk:
                    out.write(chunk)
                shown = lines(chunk)
                while console_ok and shown:
                    try:
                        shown = shown[os.write(console_fd, shown):]
                    except OSError:
                        console_ok = False
                if not chunk:
                    return
        finally:
            if out is not None:
                out.close()
            os.close(source_fd)

    t = threading.Thread(target=copy, daemon=True)
    t.start()
    return t
