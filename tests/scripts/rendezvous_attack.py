"""A ``horovodliterun --gloo`` job that a stranger attacks through the network (issue 37;
tests/test_rendezvous_security.py). The stranger's moves are ``strangers.py``; rank 0 makes them,
as another process on the network would.

    python rendezvous_attack.py names      after the job met (and, across two host names, built
                                           its Gloo pairs): the names a stranger can form (the
                                           job's old key layout, the job id included) name
                                           nothing in the store, though the job's keys are there
                                           (the test finds them by the secret); prints "UNNAMED
                                           <names tried> <keys in the store>"
    python rendezvous_attack.py forge DIR  before the ranks meet, rank 0 writes a forged address
                                           for rank 1 where rank 1's belongs; its init must fail
                                           naming the key and the tampering ("REFUSED <message>"),
                                           then it re-raises; rank 1 waits (bounded) until rank 0
                                           is done, and exits 0 without meeting
    python rendezvous_attack.py garbage    before init, rank 0 sends garbage to the store and to
                                           the rank reports; then every rank checks a few
                                           allreduces ("OK <rank>")
"""

import json
import os
import sys
import time
from pathlib import Path

import strangers
import torch

import horovodlite.torch as hvd
from horovodlite.common import launchers

sys.stdout.reconfigure(line_buffering=True, write_through=False)


def reduce_check() -> None:
    for i in range(3):
        out = hvd.allreduce(torch.full((4,), float(hvd.rank() + i)), name=f"check{i}", op=hvd.Sum)
        n = hvd.size()
        want = float(n * (n - 1) // 2 + n * i)
        assert torch.equal(out, torch.full((4,), want)), (i, out)
    print(f"OK {hvd.rank()}", flush=True)


def names() -> None:
    hvd.init()
    reduce_check()
    if hvd.rank() == 0:
        job = launchers.detect().job
        tried = ["horovodlite/secret", "horovodlite/job-token", "horovodlite/elastic/round",
                 "horovodlite/elastic/round/0", "horovodlite/elastic/reset/0"]
        for r in range(hvd.size()):  # (c10d's PrefixStore puts a "/" after its prefix)
            for sep in ("/", "//"):
                tried += [f"horovodlite/{job}/0{sep}rank/{r}",
                          f"horovodlite/{job}/0{sep}gloo//0/{r}",
                          f"horovodlite/{job}/0{sep}gloo//hvdl-heartbeat/{r}"]
        stranger = strangers.client()
        found = [k for k in tried if stranger.check([k])]
        assert not found, f"a stranger can name {found}"
        # ... though they are there, under names only the secret gives
        real = [strangers.name_seen_on_the_wire(job, 0, f"rank/{r}") for r in range(hvd.size())]
        real += [strangers.name_seen_on_the_wire("job", "job")]
        if hvd.cross_size() > 1:
            real += [strangers.name_seen_on_the_wire(job, 0, f"gloo//0/{r}")
                     for r in range(hvd.size())]
        assert stranger.check(real), real
        stored = stranger.get(real[0])
        assert json.loads(stored[len(strangers.FAKE_TAG):])["pid"] > 0  # tag || value
        print(f"UNNAMED {len(tried)} {stranger.num_keys()}", flush=True)
    hvd.allreduce(torch.zeros(1), name="done")
    hvd.shutdown()


def forge(folder: Path) -> None:
    done = folder / "rank0-done"
    if os.environ["HOROVOD_RANK"] != "0":
        deadline = time.monotonic() + 60
        while not done.exists():
            assert time.monotonic() < deadline, "rank 0 did not finish its attempt in 60 s"
            time.sleep(0.1)
        print("WAITED 1", flush=True)
        return
    job = launchers.detect().job
    name = strangers.name_seen_on_the_wire(job, 0, "rank/1")
    strangers.forge(strangers.client(), name, json.dumps({"host": "evil", "pid": 1}))
    try:
        hvd.init()
        raise AssertionError("rank 0 met the job with a forged rank/1")
    except hvd.HorovodInternalError as e:
        message = str(e)
        assert "tampered" in message and "'rank/1'" in message, message
        print(f"REFUSED {message}", flush=True)
        raise
    finally:
        done.write_text("done")


def garbage() -> None:
    if os.environ["HOROVOD_RANK"] == "0":
        strangers.garbage_to_the_job()
        print("GARBAGE sent", flush=True)
    hvd.init()
    reduce_check()
    hvd.shutdown()


def main() -> None:
    mode = sys.argv[1]
    if mode == "names":
        names()
    elif mode == "forge":
        forge(Path(sys.argv[2]))
    elif mode == "garbage":
        garbage()
    else:
        sys.exit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
