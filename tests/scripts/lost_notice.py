"""A launcher notice of a lost host (what horovodliterun's rank wrapper writes into the pipe named
by HVDL_NOTICE_FD) fails this rank's pending and later collectives with HorovodInternalError
naming the host and its ranks; shutdown returns at once, and init refuses to start again.

Each rank makes its own pipe (standing in for the wrapper's) and sends itself the notice, so no
rank has really gone: the test is about what the runtime does with the notice. Rank 0 has a
collective pending that the others never submit (at np > 1). Each rank prints OK and writes
OUT_DIR/ok.<rank>; it waits for the others' files before exiting (exiting ends the job: MPI is
not finalized).
"""

import os
import sys
import threading
import time
from pathlib import Path

# A line is one write (the ranks share one pipe; unbuffered, print writes its parts apart).
sys.stdout.reconfigure(line_buffering=True, write_through=False)

read_end, write_end = os.pipe()
os.environ["HVDL_NOTICE_FD"] = str(read_end)

import torch  # noqa: E402

import horovodlite.torch as hvd  # noqa: E402

out_dir = Path(sys.argv[1])
hvd.init()
rank, size = hvd.rank(), hvd.size()
hvd.allreduce(torch.ones(3), name="before")  # the runtime works until the notice
NOTICE = "lost hvdl-hostX (ranks 7, 8): nothing heard from it for 15 s"
pending = hvd.allreduce_async(torch.ones(3), name="only.rank0") if rank == 0 < size - 1 else None
threading.Timer(0.5, lambda: os.write(write_end, (NOTICE + "\n").encode())).start()
start = time.monotonic()
if pending is not None:
    try:
        hvd.synchronize(pending)
        raise AssertionError("the pending collective completed")
    except hvd.HorovodInternalError as e:
        assert "only.rank0" in str(e) and NOTICE in str(e) and f"rank {rank}/{size}" in str(e), e
        assert time.monotonic() - start < 5, time.monotonic() - start
time.sleep(1.0)
try:
    hvd.allreduce(torch.ones(3), name="after")
    raise AssertionError("a collective after the notice completed")
except hvd.HorovodInternalError as e:
    assert NOTICE in str(e), e
t = time.monotonic()
hvd.shutdown()
assert time.monotonic() - t < 5
try:
    hvd.init()
    raise AssertionError("init after lost ranks succeeded")
except hvd.HorovodInternalError as e:
    assert "lost ranks" in str(e), e
print("OK", rank, flush=True)
(out_dir / f"ok.{rank}").write_text("ok")
deadline = time.monotonic() + 30
while len(list(out_dir.glob("ok.*"))) < size and time.monotonic() < deadline:
    time.sleep(0.1)
