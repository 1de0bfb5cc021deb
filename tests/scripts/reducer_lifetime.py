"""DistributedOptimizer's C++ gradient hooks (csrc/torch/grad_reducer) against the ends of their
reducer's life, for tests/unit/test_grad_reducer_lifetime.py. Run in a child process because the
defect it guards against was a crash: ``python reducer_lifetime.py MODE...`` runs each mode in
turn and prints ``ok MODE`` after each.

drop-in-hook  the last reference to the optimizer goes away inside its own hook (the call site
              lookup drops it, as a garbage collection there would), with a user's hook on the
              same AccumulateGrad node after ours: backward completes and the user's hook runs.
drop-in-user-hook  a user's hook on the node drops an optimizer and wraps another while torch
              runs that node's hooks.
threads       one thread runs backward in a loop while the main thread wraps new optimizers over
              the same parameters and drops or detaches old ones; a bounded number of rounds.
"""

import gc
import sys
import threading
import weakref

import torch

import horovodlite.torch as hvd
import horovodlite.torch.optimizer as optimizer_module
from horovodlite._extension import load

subscribers_on = load().GradReducer.subscribers_on  # reducers served by our hook on p's node


def drop_in_hook() -> None:
    lin = torch.nn.Linear(3, 2)
    holder = []

    def site_that_drops_the_optimizer() -> str:
        holder.clear()
        gc.collect()
        return ""

    real_site = optimizer_module.hook_site
    optimizer_module.hook_site = site_that_drops_the_optimizer
    try:
        holder.append(hvd.DistributedOptimizer(torch.optim.SGD(lin.parameters(), lr=0.1)))
    finally:
        optimizer_module.hook_site = real_site
    alive = weakref.ref(holder[0])
    ran = []
    accumulators = [p.view_as(p).grad_fn.next_functions[0][0] for p in lin.parameters()]
    for acc in accumulators:  # a user's post hook on the node, after ours
        acc.register_hook(lambda grad_inputs, grad_outputs: ran.append(1))
    lin(torch.ones(1, 3)).sum().backward()
    assert alive() is None, "the optimizer outlived its last reference"
    assert [subscribers_on(p) for p in lin.parameters()] == [0, 0]
    assert len(ran) == 2, f"the user's hooks ran {len(ran)} times, expected 2"
    assert torch.equal(lin.bias.grad, torch.ones(2))
    # The parameters train on with a new optimizer.
    opt = hvd.DistributedOptimizer(torch.optim.SGD(lin.parameters(), lr=0.1))
    opt.zero_grad()
    lin(torch.ones(1, 3)).sum().backward()
    assert set(opt._hvd_pending) == set(lin.parameters())
    opt.step()
    assert torch.equal(lin.bias.grad, torch.ones(2)) and len(ran) == 4


def drop_in_user_hook() -> None:
    """A user's hook on the node, between two optimizers' hooks, drops the first optimizer and
    wraps a third while torch is running the node's hooks: every hook still runs once."""
    lin = torch.nn.Linear(3, 2)
    params = list(lin.parameters())
    holder = [hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.1))]
    ran, more = [], []

    def user_hook(grad_inputs, grad_outputs):
        ran.append(1)
        holder.clear()
        gc.collect()
        more.append(hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.1)))

    accumulators = [p.view_as(p).grad_fn.next_functions[0][0] for p in params]
    for acc in accumulators:
        acc.register_hook(user_hook)
    second = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.1))
    lin(torch.ones(1, 3)).sum().backward()
    assert len(ran) == 2 and not holder
    assert set(second._hvd_pending) == set(params)  # the second optimizer's hooks ran
    second.step()
    assert torch.equal(lin.bias.grad, torch.ones(2))
    assert [subscribers_on(p) for p in params] == [3, 3]  # second and the two wrapped in hooks


def threads(rounds: int = 150) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(16)])
    params = list(model.parameters())

    def wrap():  # counts passes only: its hooks never launch, whatever the thread does
        return hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.1),
                                        backward_passes_per_step=1 << 30)

    live = [wrap() for _ in range(3)]
    # A user's Python hook on every node, after the first reducers' hooks: torch takes the GIL
    # for it in the middle of running the node's hooks, which is when the main thread (holding
    # the GIL between bytecodes) wraps or drops reducers.
    accumulators = [p.view_as(p).grad_fn.next_functions[0][0] for p in params]
    user_calls = []
    for acc in accumulators:
        acc.register_hook(lambda grad_inputs, grad_outputs: user_calls.append(1))
    stop, errors, passes = threading.Event(), [], [0]

    def backward_loop():
        x = torch.ones(2, 4)
        try:
            while not stop.is_set():
                model(x).sum().backward()
                passes[0] += 1
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    thread = threading.Thread(target=backward_loop)
    thread.start()
    try:
        for i in range(rounds):
            live.append(wrap())
            old = live.pop(0)
            if i % 3 == 0:
                old._hvd_remove_hooks()  # detached while alive, then dropped
            del old
    finally:
        stop.set()
        thread.join()
    assert not errors, errors
    assert passes[0] > 0 and len(user_calls) == passes[0] * len(params), (passes, user_calls)
    # Dropped and detached reducers left nothing behind on the nodes.
    assert {subscribers_on(p) for p in params} == {len(live)}
    # What is left still reduces.
    del live
    opt = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.1))
    opt.zero_grad()
    model(torch.ones(2, 4)).sum().backward()
    assert set(opt._hvd_pending) == set(params)
    opt.step()
    assert torch.equal(params[-1].grad, torch.full((4,), 2.0))


MODES = {"drop-in-hook": drop_in_hook, "drop-in-user-hook": drop_in_user_hook,
         "threads": threads}

if __name__ == "__main__":
    hvd.init()
    for mode in sys.argv[1:]:
        print(f"start {mode}", flush=True)
        MODES[mode]()
        print(f"ok {mode}", flush=True)
    hvd.shutdown()
