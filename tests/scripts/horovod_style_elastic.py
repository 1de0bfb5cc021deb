"""An elastic worker written as Horovod's users write them: it learns its start rank and its host
from HOROVOD_RANK and HOROVOD_HOSTNAME (set by the launcher, not by hvd), and can fail on purpose.

    horovodliterun --elastic -np 2 --min-np 2 --max-np 4 -H localhost:2,127.0.0.1:2 \\
        python tests/scripts/horovod_style_elastic.py --fail raise --fail-rank 0

Each epoch is a few allreduce steps with a commit after each. ``--fail raise|kill`` makes the
worker whose start rank is ``--fail-rank`` (every worker with ``--fail-rank all``) raise an
exception, or SIGKILL itself, at the start of epoch 1. Each worker that finishes prints one line

    DONE {"start_rank": 2, "hostname": "127.0.0.1", "rank": 0, "size": 2, "rendezvous": 2, ...}

where ``rendezvous`` counts the rendezvous it took part in (1 + its resets).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys

import torch

import horovodlite.torch as hvd

sys.stdout.reconfigure(line_buffering=True)

START = {k: os.environ.get(f"HOROVOD_{k.upper()}") for k in (
    "rank", "size", "local_rank", "local_size", "cross_rank", "cross_size", "hostname")}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--fail", choices=("raise", "kill"))
    p.add_argument("--fail-rank", default="0")
    p.add_argument("--epochs", type=int, default=3)
    args = p.parse_args()
    start_rank = int(START["rank"])
    failing = args.fail and args.fail_rank in ("all", str(start_rank))
    torch.set_num_threads(1)

    hvd.init()
    weights = torch.zeros(4)
    state = hvd.elastic.TorchState(epoch=0, weights=weights)
    rendezvous = [1]
    state.register_reset_callbacks([lambda: rendezvous.__setitem__(0, rendezvous[0] + 1)])
    print(f"UP rank {start_rank} {json.dumps(START)}", flush=True)

    @hvd.elastic.run
    def train(state):
        while state.epoch < args.epochs:
            if failing and state.epoch == 1:
                print(f"FAILING start rank {start_rank} ({args.fail})", flush=True)
                if args.fail == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                raise RuntimeError(f"start rank {start_rank} fails on purpose")
            for _ in range(3):
                state.weights += hvd.allreduce(torch.ones(4), name="step")
                state.commit()
            state.epoch += 1

    train(state)
    print("DONE " + json.dumps(dict(
        START, start_rank=start_rank, rank=hvd.rank(), size=hvd.size(),
        rendezvous=rendezvous[0], epochs=state.epoch)), flush=True)


if __name__ == "__main__":
    main()
