"""One rank of tests/test_bucket_send.py: whether a ready bucket goes out while nobody waits.

The job batches new work for 60 s (HOROVOD_CYCLE_TIME=60000) unless a thread waits on it, and
HOROVOD_HOLD_UNTIL_WAIT is what the test sets. Two optimizers over two copies of one model: one
built with HOROVOD_BUCKET_SEND_NOW=1 (the default), one with 0. After backward, with no thread
waiting, the first one's bucket is negotiated and reduced (the core's response count grows
within 30 s, where the batching would keep it 60 s), also on a host that holds new work until a
thread waits (HOROVOD_HOLD_UNTIL_WAIT=1); the second one's stays held until synchronize()
waits. Every case ends with the averaged gradients. Every rank asserts.
"""

from __future__ import annotations

import os
import time

import torch

import horovodlite.torch as hvd
from horovodlite._extension import load

_C = load()


def build(send_now: str):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    os.environ["HOROVOD_BUCKET_SEND_NOW"] = send_now
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), bucket_view=True)
    return model, opt


def backward(model, opt, step: int):
    opt.zero_grad(set_to_none=False)
    x = torch.full((4, 8), float(hvd.rank() + 1 + step))
    model(x).square().sum().backward()


def expected(model, step: int) -> list:
    """The gradients averaged over the ranks, computed here from each rank's input."""
    grads = []
    for r in range(hvd.size()):
        twin = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        twin.load_state_dict(model.state_dict())
        twin(torch.full((4, 8), float(r + 1 + step))).square().sum().backward()
        grads.append([p.grad for p in twin.parameters()])
    return [sum(g[i] for g in grads) / hvd.size() for i in range(len(grads[0]))]


def main() -> None:
    hvd.init()
    rank = hvd.rank()
    for send_now in ("1", "0"):
        model, opt = build(send_now)
        backward(model, opt, 0)  # the first step observes the ready order, then lays out
        opt.synchronize()
        report = opt.bucket_report()
        assert report["state"] == "built" and len(report["buckets"]) == 1, (rank, report)
        want = expected(model, 1)
        before = _C.stats()["responses"]
        backward(model, opt, 1)
        if send_now == "1":
            deadline = time.monotonic() + 30.0
            while _C.stats()["responses"] == before and time.monotonic() < deadline:
                time.sleep(0.01)
            assert _C.stats()["responses"] > before, \
                f"rank {rank}: the ready bucket did not go out while nobody waited"
        else:
            time.sleep(1.0)
            assert _C.stats()["responses"] == before, \
                f"rank {rank}: the bucket went out before a wait (send_now={send_now})"
        opt.synchronize()
        for p, g in zip(model.parameters(), want):
            torch.testing.assert_close(p.grad, g)
        with opt.skip_synchronize():
            opt.step()
        print(f"BUCKET SEND rank {rank} send_now={send_now} ok", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
