"""An hvd.elastic training job that loses ranks on purpose, and checks the survivors' result.

    horovodliterun --elastic -np 3 python tests/scripts/elastic_train.py --kill 2:1:2

``--kill RANK:EPOCH:BATCH`` (repeatable): that rank SIGKILLs itself in the middle of that step
(after its forward pass, before its backward), as a crashed process would. ``--kill-in-reset
RANK``: that rank SIGKILLs itself inside its first reset callback, i.e. during the recovery
from the first loss. Ranks may also be lost from outside (a host killed or cut off). Every
survivor then checks that its final weights equal a reference computed here in one process: the
same model, data, sampler partition and optimizer, with the ranks that were alive at each
commit (all of them up to the commit the job continued from after a loss, the survivors after
it), and prints ``FINAL rank R size S epochs E steps T`` for the test to read.

``--stop RANK:EPOCH:BATCH``: that rank SIGSTOPs itself at that point instead (alive, holding its
connections, silent: a frozen process or host); the driver must take it for lost by its
heartbeats and kill it.

``--shard MODE``: ``DistributedOptimizer(shard=MODE)``, each rank keeping 1/N of the momentum;
a survivor then prints ``SHARD rank R holds H of T momentum values``.

``--forge-round EPOCH:BATCH``: at that step rank 0 plays a stranger on the network who saw the
driver's key names (tests/scripts/strangers.py): it overwrites the driver's latest-round pointer
and the next round with forged values (a round that ends the job), then trains on; every worker
must refuse them, naming the key, and go on with the driver's own rounds. ``--garbage``: after
init, rank 0 sends garbage to the driver's store and rank reports.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

import torch

import horovodlite.torch as hvd
from horovodlite._extension import load
from horovodlite.common import elastic_worker
from horovodlite.torch.elastic.sampler import partition

# A line is one write (the ranks share one pipe; unbuffered, print writes its parts apart).
sys.stdout.reconfigure(line_buffering=True, write_through=False)

_C = load()  # recoveries() and last_recovery_map(): which ranks each recovery lost

N, B, FEATURES, SEED, LR = 72, 4, 6, 7, 0.05


def make_data():
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(N, FEATURES, generator=g, dtype=torch.float64)
    y = (x @ torch.arange(1.0, FEATURES + 1, dtype=torch.float64)).unsqueeze(1) / FEATURES
    return x, y


def make_model():
    torch.manual_seed(SEED)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 8), torch.nn.Tanh(),
                                torch.nn.Linear(8, 1)).double()
    return model, torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)


def loss_of(model, x, y):
    return torch.nn.functional.mse_loss(model(x), y)


def reference(epochs: int, losses: list, size: int):
    """One process playing every rank: per step the average of each live rank's gradient.
    ``losses``: (epoch, batch, lost original ranks) for every recovery, as the survivors saw
    them after the sync (the point the job continued from). The lost ranks take no part from
    that step on; what every rank trained on up to that step is processed (a rank's
    ``record_batch`` records every rank's batch of the step) and the rest is re-partitioned -
    whether the ranks were lost or retired (their host left the discovery output)."""
    x, y = make_data()
    model, opt = make_model()
    live = list(range(size))
    pending = list(losses)
    steps = 0
    for epoch in range(epochs):
        processed: set = set()   # merged at the last sync
        local = {r: set() for r in live}
        while True:
            n = len(live)
            parts = {r: partition(N, processed, True, SEED, epoch, n, i)
                     for i, r in enumerate(live)}
            batches = len(parts[live[0]]) // B
            lost = None
            # up to b == batches: the job may continue from the commit after the partition's
            # last batch (before the epoch's own commit), with nothing left of the epoch
            for b in range(batches + 1):
                if pending and pending[0][:2] == (epoch, b):
                    lost = pending.pop(0)
                    break
                if b == batches:
                    break
                grads = [torch.zeros_like(p) for p in model.parameters()]
                for r in live:
                    idx = parts[r][b * B:(b + 1) * B]
                    model.zero_grad()
                    loss_of(model, x[idx], y[idx]).backward()
                    for g, p in zip(grads, model.parameters()):
                        g += p.grad
                    local[r].update(idx)
                for g, p in zip(grads, model.parameters()):
                    p.grad = g / n
                opt.step()
                steps += 1
            if lost is None:
                break
            for r in live:
                processed |= local[r]
            live = [r for r in live if r not in lost[2]]
            local = {r: set() for r in live}
    return model, steps


def forge_round(k: int) -> None:
    """Round k (and the pointer to it), forged: see --forge-round at the top."""
    import strangers

    from horovodlite.common import elastic_rounds

    stranger = strangers.client()
    forged = elastic_rounds.Round(k, [], [], "forged", end="forged by a stranger")
    strangers.forge(stranger, strangers.name_seen_on_the_wire(
        "elastic", elastic_rounds.round_key(k)), forged.to_json())
    strangers.forge(stranger, strangers.name_seen_on_the_wire(
        "elastic", elastic_rounds.ROUND_KEY), str(k))
    print(f"FORGED round {k}", flush=True)


def secrets_seen() -> str:
    """Where this rank's secrets (the report token) show: "absent" (none in its environment),
    "env only", or "ON THE COMMAND LINE" of this process or its parent (the rank's wrapper),
    which ps shows (a rank an MPI job added on a new host once had the token there)."""
    from horovodlite.common import launch_env

    values = [os.environ[k] for k in launch_env.SECRETS if os.environ.get(k)]
    if not values:
        return "absent"
    for pid in (os.getpid(), os.getppid()):
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            line = f.read().decode(errors="replace")
        if any(v in line for v in values):
            return "ON THE COMMAND LINE"
    return "env only"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--kill", action="append", default=[], help="RANK:EPOCH:BATCH")
    p.add_argument("--stop", action="append", default=[], help="RANK:EPOCH:BATCH")
    p.add_argument("--linger", type=float, default=0.0,
                   help="after training: hvd.shutdown(), then this long before exiting (the "
                        "driver must not take a worker that shut down in order for lost)")
    p.add_argument("--kill-in-reset", type=int)
    p.add_argument("--compare", choices=["reference", "ranks"], default="reference",
                   help="check the final weights against the reference, or only that every "
                        "rank has the same (for jobs that grow)")
    p.add_argument("--forge-round", help="EPOCH:BATCH (see the top)")
    p.add_argument("--garbage", action="store_true", help="see the top")
    p.add_argument("--step-seconds", type=float, default=0.0,
                   help="sleep this long in every step (to lose a host mid-training)")
    p.add_argument("--shard", choices=["optimizer_state", "gradients"],
                   help="DistributedOptimizer(shard=...): each rank keeps 1/N of the momentum")
    args = p.parse_args()
    kills = [tuple(int(v) for v in k.split(":")) for k in args.kill]
    stops = [tuple(int(v) for v in k.split(":")) for k in args.stop]
    forge_at = tuple(int(v) for v in args.forge_round.split(":")) if args.forge_round else None
    torch.set_num_threads(1)

    if elastic_worker.active():  # (before init: a worker added for growth says when it began)
        print(f"STARTED worker {os.environ['HVDL_WORKER_ID']}", flush=True)
    hvd.init()
    first_size, first_rank = hvd.size(), hvd.rank()
    x, y = make_data()
    model, opt = make_model()
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   shard=args.shard)
    sampler = hvd.elastic.ElasticSampler(torch.arange(N), shuffle=True, seed=SEED)
    state = hvd.elastic.TorchState(model, opt, sampler=sampler, epoch=0, batch=0, steps=0)
    live = list(range(first_size))  # the original ranks still in the job
    losses = []                     # (epoch, batch, lost original ranks) per continuation
    gone_since = []                 # lost in the recoveries since the last continuation
    seen = [_C.recoveries()]

    def on_reset():
        if elastic_worker.active():  # horovodliterun --elastic: the round lists who is in
            now = [int(w) for w in elastic_worker.current().workers]
            gone_since.extend(r for r in live if r not in now)
            live[:] = [r for r in live if r in now]
        elif _C.recoveries() > seen[0]:  # this reset followed a recovery: who did it lose?
            seen[0] = _C.recoveries()
            new_rank = _C.last_recovery_map()
            gone_since.extend(r for i, r in enumerate(live) if new_rank[i] < 0)
            live[:] = [r for i, r in enumerate(live) if new_rank[i] >= 0]
        if args.kill_in_reset == first_rank:
            os.kill(os.getpid(), signal.SIGKILL)

    state.register_reset_callbacks([on_reset])
    print(f"UP rank {first_rank}", flush=True)
    if args.garbage and first_rank == 0:
        import strangers

        strangers.garbage_to_the_job()
        print("GARBAGE sent", flush=True)

    @hvd.elastic.run
    def train(state):
        if gone_since:  # continuing after losses, from the state rank 0 synced
            print(f"RESUMED rank {hvd.rank()} at {time.time():.3f}", flush=True)
            losses.append((state.epoch, state.batch, sorted(gone_since)))
            gone_since.clear()
        state.batch = 0  # the sync re-partitioned what is left of the epoch: count from 0
        while state.epoch < args.epochs:
            batches = len(sampler.indices) // B
            for b in range(batches):
                idx = sampler.get_indices(b, B)
                opt.zero_grad()
                loss = loss_of(model, x[idx], y[idx])
                if first_rank == 0 and forge_at == (state.epoch, b):
                    forge_round(elastic_worker.current().number + 1)
                if (first_rank, state.epoch, b) in kills:
                    print(f"KILLED rank {first_rank} at {time.time():.3f}", flush=True)
                    os.kill(os.getpid(), signal.SIGKILL)
                if (first_rank, state.epoch, b) in stops:
                    print(f"STOPPED rank {first_rank} at {time.time():.3f}", flush=True)
                    os.kill(os.getpid(), signal.SIGSTOP)
                if args.step_seconds:
                    time.sleep(args.step_seconds)
                loss.backward()
                opt.step()
                sampler.record_batch(b, B)
                state.steps += 1
                state.batch = b + 1
                state.commit()
            state.epoch += 1
            state.batch = 0
            sampler.set_epoch(state.epoch)
            state.commit()

    train(state)
    if args.linger:
        rank = hvd.rank()
        hvd.shutdown()
        time.sleep(args.linger)
        print(f"LINGERED rank {rank} {args.linger:g} s", flush=True)
        return
    print(f"LOSSES rank {hvd.rank()} {losses}", flush=True)
    print(f"SECRETS rank {hvd.rank()} {secrets_seen()}", flush=True)
    if "MY_ODD_SETTING" in os.environ:  # a caller's value, as this rank got it (ASCII escaped)
        print(f"ODD rank {hvd.rank()} {os.environ['MY_ODD_SETTING']!a}", flush=True)
    if args.shard:  # this rank's part of the momentum, laid out over the ranks left
        held = sum(t.numel() for st in opt.state.values() for t in st.values())
        total = sum(p.numel() for p in model.parameters())
        print(f"SHARD rank {hvd.rank()} holds {held} of {total} momentum values", flush=True)
    if args.compare == "ranks":
        flat = torch.cat([p.detach().flatten() for p in model.parameters()]).unsqueeze(0)
        rows = hvd.allgather(flat, name="final.weights")
        assert all(torch.equal(row, rows[0]) for row in rows), "ranks disagree"
        print(f"FINAL rank {hvd.rank()} size {hvd.size()} epochs {state.epoch} agree",
              flush=True)
        return
    expected, steps = reference(args.epochs, losses, first_size)
    for name, (got, want) in zip([n for n, _ in model.named_parameters()],
                                 zip(model.parameters(), expected.parameters())):
        torch.testing.assert_close(got.detach(), want.detach(), rtol=1e-9, atol=1e-12,
                                   msg=lambda m, name=name: f"{name}: {m}")
    assert state.steps == steps, (state.steps, steps)
    print(f"FINAL rank {hvd.rank()} size {hvd.size()} epochs {state.epoch} steps {steps}",
          flush=True)


if __name__ == "__main__":
    main()
