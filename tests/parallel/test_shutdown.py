"""shutdown with work pending fails those handles cleanly; init works again afterwards.
(Its own file: it stops and restarts the runtime.)"""

import time

import pytest
import torch

import horovodlite.torch as hvd


def test_shutdown_fails_pending_handles_then_init_again():
    r, n = hvd.rank(), hvd.size()
    # Rank 0 submits a name nobody else submits, so it can only end by shutdown (at np=1 it
    # completes); every rank also submits a batch of large ops that may or may not finish.
    lonely = hvd.allreduce_async(torch.ones(4), name="only.rank0") if r == 0 else None
    big = [hvd.allreduce_async_(torch.ones(1 << 20), name=f"big.{i}") for i in range(8)]
    if n > 1:
        time.sleep(0.2)
    started = time.monotonic()
    hvd.shutdown()
    assert time.monotonic() - started < 30, "shutdown must not hang"
    assert not hvd.is_initialized()
    handles = ([lonely] if lonely is not None else []) + big
    failures = 0
    for h in handles:
        try:
            hvd.synchronize(h)
        except hvd.HorovodInternalError as exc:
            failures += 1
            assert "shut down" in str(exc), str(exc)
    if n > 1 and r == 0:
        assert failures >= 1, "the op only rank 0 submitted must fail at shutdown"
    with pytest.raises(ValueError, match=r"hvd.init\(\)"):
        hvd.allreduce(torch.ones(1))
    hvd.init()
    assert hvd.is_initialized() and hvd.size() == n and hvd.rank() == r
    out = hvd.allreduce(torch.ones(2), op=hvd.Sum, name="after.restart")
    assert torch.all(out == n)


def test_second_init_is_a_noop():
    hvd.init()
    hvd.init()
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum, name="noop.init").item() == hvd.size()
