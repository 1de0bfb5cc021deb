"""A worker of the elastic chaos run (scripts/elastic_chaos.py): trains under hvd.elastic while
the plan's events kill it, its host or its host's link, at chosen points of a step.

    horovodliterun --elastic ... python tests/scripts/chaos_train.py PLAN_DIR

PLAN_DIR/plan.json holds the events, in order: ``{"kind": "kill-rank" | "kill-host" | "stop-rank"
| "cut-link", "after": STEPS, "phase": PHASE, "target": N}``. Event i is due once event i-1 has
fired and the job has committed ``after`` more steps; the rank ``target % size`` then acts at
``phase`` of its step (``forward``, ``backward``: before the backward pass, whose hooks start the
allreduces, ``step``: before the optimizer waits for them, ``commit``: before the commit). A kill
needs a survivor: it waits (steps go on) until the job has 2 workers, and a host's loss until the
job spans 2 hosts. An event fires once: its marker PLAN_DIR/fired.<i> (made with O_EXCL; it holds
the step) says so to every later try, after a rollback too. ``cut-link`` takes the host's eth0
down from inside the host (test hosts only); the chaos script brings it back. ``stop-rank``: the
rank SIGSTOPs itself, for the driver to take it for lost by its heartbeats.

Training is the same whatever the events, given the commits and the data order: step s trains on
global batch s (a fixed permutation of the data), each rank on its share of it, with a loss
scaled so that the averaged gradient is the full batch's mean gradient. So the final weights of
any run equal one process training the same number of steps (up to the order of floating-point
sums). Every rank checks: after every reset (the state rank 0 synced), that all ranks hold the
same weights (``AGREE``); at the end, its weights against that reference (``FINAL``).
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

# The chaos script's stack dump at a stall (SIGUSR1), an import that hangs included; START and
# READY (imports done) count as progress: a worker added on a loaded machine spends most of its
# start importing torch, while the others wait for it at the rendezvous.
faulthandler.register(signal.SIGUSR1, all_threads=True)
sys.stdout.write(f"START pid {os.getpid()}\n")
sys.stdout.flush()

import torch  # noqa: E402

import horovodlite.torch as hvd  # noqa: E402

sys.stdout.reconfigure(line_buffering=True, write_through=False)
sys.stdout.write(f"READY pid {os.getpid()}\n")

N, G, FEATURES, SEED, LR = 96, 12, 6, 11, 0.05
TAIL = 8  # steps trained after the last event fired
PHASES = ("forward", "backward", "step", "commit")


def make_data():
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(N, FEATURES, generator=g, dtype=torch.float64)
    y = torch.sin(x @ torch.linspace(0.5, 1.5, FEATURES, dtype=torch.float64)).unsqueeze(1)
    order = torch.randperm(N, generator=g)
    return x, y, order


def make_model():
    torch.manual_seed(SEED)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 8), torch.nn.Tanh(),
                                torch.nn.Linear(8, 1)).double()
    return model, torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)


def batch(order, step: int):
    start = (step * G) % N
    return order[start:start + G]


def reference(x, y, order, steps: int):
    model, opt = make_model()
    for s in range(steps):
        idx = batch(order, s)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[idx]), y[idx]).backward()
        opt.step()
    return model


def flat(model) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


class Plan:
    def __init__(self, folder: Path):
        self.folder = folder
        self.events = json.loads((folder / "plan.json").read_text())

    def fired_step(self, i: int) -> int | None:
        try:
            return int((self.folder / f"fired.{i}").read_text() or -1)
        except (OSError, ValueError):
            return None

    def due(self, step: int):
        """(index, event) of the next event if it is due at ``step``; None otherwise."""
        for i, e in enumerate(self.events):
            if (self.folder / f"fired.{i}").exists():
                continue
            before = self.fired_step(i - 1) if i else 0
            if before is None or step < before + e["after"]:
                return None
            return i, e
        return None

    def all_fired(self) -> bool:
        return all((self.folder / f"fired.{i}").exists() for i in range(len(self.events)))

    def claim(self, i: int, step: int) -> bool:
        try:
            fd = os.open(self.folder / f"fired.{i}.tmp{os.getpid()}", os.O_CREAT | os.O_WRONLY)
            os.write(fd, str(step).encode())
            os.close(fd)
            os.link(self.folder / f"fired.{i}.tmp{os.getpid()}", self.folder / f"fired.{i}")
            return True
        except FileExistsError:
            return False
        finally:
            Path(self.folder / f"fired.{i}.tmp{os.getpid()}").unlink(missing_ok=True)


def main():
    folder = Path(sys.argv[1])
    plan = Plan(folder)
    torch.set_num_threads(1)
    hvd.init()
    x, y, order = make_data()
    model, opt = make_model()
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, opt, step=0, end=-1)
    host = os.environ.get("HOROVOD_HOSTNAME") or socket.gethostname()
    peers: dict = {}  # this round's rank -> (host, pid)

    def on_reset():
        peers.clear()

    state.register_reset_callbacks([on_reset])
    print(f"UP pid {os.getpid()} host {host}", flush=True)

    def act(phase: str) -> None:
        found = plan.due(state.step)
        if found is None:
            return
        i, e = found
        hosts = {h for h, _ in peers.values()}
        if hvd.size() < 2 or (e["kind"] != "kill-rank" and len(hosts) < 2):
            # no survivor: wait for the job to grow back, slowly (every rank: the same
            # peers), so that the steps stay few enough for the final comparison: over
            # ~30,000 steps the float order of the sums alone moves the weights by ~1e-2
            if phase == "forward":
                time.sleep(0.2)
            return
        if e["phase"] != phase or e["target"] % hvd.size() != hvd.rank():
            return
        if not plan.claim(i, state.step):
            return
        print(f"EVENT {i} {e['kind']} rank {hvd.rank()} of {hvd.size()} host {host} step "
              f"{state.step} phase {phase} at {time.time():.3f}", flush=True)
        if e["kind"] == "kill-host":
            for h, pid in peers.values():
                if h == host and pid != os.getpid():
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
        elif e["kind"] == "cut-link":
            subprocess.run(["ip", "link", "set", "eth0", "down"], check=False)
            return  # the silence is the event: this worker goes on until it notices
        elif e["kind"] == "stop-rank":
            os.kill(os.getpid(), signal.SIGSTOP)  # the driver kills it
            return
        os.kill(os.getpid(), signal.SIGKILL)

    @hvd.elastic.run
    def train(state):
        # after every (re)start: the state rank 0 synced is every rank's
        rows = hvd.allgather(flat(model).unsqueeze(0), name="chaos.agree")
        assert all(torch.equal(r, rows[0]) for r in rows), f"ranks disagree at {state.step}"
        table = hvd.allgather_object((host, os.getpid()), name="chaos.peers")
        peers.update(enumerate(table))
        print(f"AGREE rank {hvd.rank()} size {hvd.size()} step {state.step}", flush=True)
        while state.end < 0 or state.step < state.end:
            idx = batch(order, state.step)[hvd.rank()::hvd.size()]
            opt.zero_grad()
            act("forward")
            loss = torch.nn.functional.mse_loss(model(x[idx]), y[idx], reduction="sum")
            act("backward")
            (loss * hvd.size() / G).backward()
            act("step")
            opt.step()
            state.step += 1
            if state.end < 0:  # rank 0's word, the same on every rank
                done = hvd.broadcast_object(plan.all_fired(), name="chaos.done")
                state.end = state.step + TAIL if done else -1
            act("commit")
            state.commit()
            if hvd.rank() == 0:
                print(f"STEP {state.step} size {hvd.size()}", flush=True)

    train(state)
    want = reference(x, y, order, state.step)
    torch.testing.assert_close(flat(model), flat(want), rtol=1e-7, atol=1e-10)
    print(f"FINAL rank {hvd.rank()} size {hvd.size()} steps {state.step} match", flush=True)


if __name__ == "__main__":
    main()
