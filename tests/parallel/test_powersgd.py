"""``compression=hvd.Compression.powersgd(...)``: what every rank must hold, step by step.

Each rank trains on its own rows; the ranks' own gradients are allgathered and a plain-torch
PowerSGD (powersgd_reference.py, float64, QR instead of Gram-Schmidt) computes what the reduced
gradient must be. The first Q comes from the optimizer's seeded start, read back through
``state_dict()`` after the first compressed step (and checked to be the same on every rank).
"""

from __future__ import annotations

import copy
import re

import pytest
import torch
import torch.nn.functional as F
from powersgd_reference import Reference, compresses

import horovodlite.torch as hvd
from horovodlite.torch.powersgd import initial_q

RANK = 2


class Net(torch.nn.Module):
    """A convolution (a 4-D weight, seen as 8 x 27), two linear layers and their biases."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 8, 3)
        self.fc1 = torch.nn.Linear(8 * 4 * 4, 24)
        self.fc2 = torch.nn.Linear(24, 5)

    def forward(self, x):
        h = torch.tanh(self.conv(x)).flatten(1)
        return self.fc2(torch.tanh(self.fc1(h)))


def batch(step: int, rank: int):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(4, 3, 6, 6, generator=g), torch.randn(4, 5, generator=g)


def make(compression, op=hvd.Average, lr=0.05):
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.5)
    return model, hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                           compression=compression, op=op)


def loss_of(model, step, rank=None):
    x, y = batch(step, hvd.rank() if rank is None else rank)
    return F.mse_loss(model(x), y)


def gathered_weights(model) -> list:
    mine = torch.cat([p.detach().flatten() for p in model.parameters()])
    return hvd.allgather_object(mine, name="powersgd.weights")


def assert_ranks_bitwise_equal(model):
    every = gathered_weights(model)
    for r, w in enumerate(every):
        assert torch.equal(w, every[0]), \
            f"rank {hvd.rank()}: rank {r}'s weights differ from rank 0's"


def test_the_warm_up_steps_equal_the_uncompressed_run():
    plain, plain_opt = make(hvd.Compression.none)
    model, opt = make(hvd.Compression.powersgd(rank=RANK, warmup_steps=3))
    for step in range(3):
        for m, o in ((plain, plain_opt), (model, opt)):
            o.zero_grad()
            loss_of(m, step).backward()
            o.step()
    for (name, p), q in zip(model.named_parameters(), plain.parameters()):
        if hvd.size() <= 2:  # a + b = b + a: the same bits whatever the fusion
            assert torch.equal(p, q), f"rank {hvd.rank()}: {name} differs after the warm-up"
        else:  # three ranks: the ring's order of additions depends on the fusion buffer
            torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
    assert opt.state_dict()["powersgd"]["q"] == {}


@pytest.mark.parametrize("op", ["average", "sum"])
@pytest.mark.parametrize("error_feedback", [True, False])
def test_each_step_equals_the_plain_torch_reference(op, error_feedback):
    warmup, steps = 1, 6
    config = hvd.Compression.powersgd(rank=RANK, warmup_steps=warmup,
                                      error_feedback=error_feedback, seed=7)
    model, opt = make(config, op=hvd.Sum if op == "sum" else hvd.Average)
    names = [n for n, _ in model.named_parameters()]
    params = list(model.parameters())
    reference = Reference(RANK, warmup, hvd.size(), lambda name, m: initial_q(7, name, m, RANK),
                          error_feedback=error_feedback, op=op)
    compressed = [n for n, p in model.named_parameters() if compresses(p.shape, RANK)]
    assert compressed == ["conv.weight", "fc1.weight", "fc2.weight"]
    for step in range(steps):
        opt.zero_grad()
        loss = loss_of(model, step)
        local = torch.autograd.grad(loss, params, retain_graph=True)
        loss.backward()
        opt.synchronize()
        every = hvd.allgather_object([t.clone() for t in local], name="powersgd.local")
        expect = reference.reduce([dict(zip(names, g)) for g in every])
        for name, p in zip(names, params):
            torch.testing.assert_close(
                p.grad.double(), expect[name], rtol=2e-4, atol=2e-6,
                msg=lambda m, name=name, step=step: f"rank {hvd.rank()} step {step} {name}: {m}")
        with opt.skip_synchronize():
            opt.step()
    state = opt.state_dict()["powersgd"]
    assert state["step"] == steps and sorted(state["q"]) == sorted(compressed)
    assert sorted(state["error"]) == (sorted(compressed) if error_feedback else [])
    assert_ranks_bitwise_equal(model)


def test_the_weights_of_every_rank_are_bitwise_equal_after_50_steps():
    model, opt = make(hvd.Compression.powersgd(rank=1, warmup_steps=2))
    for step in range(50):
        opt.zero_grad()
        loss_of(model, step).backward()
        opt.step()
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert_ranks_bitwise_equal(model)
    qs = hvd.allgather_object(opt.state_dict()["powersgd"]["q"], name="powersgd.q")
    for name, q in qs[0].items():
        assert all(torch.equal(other[name], q) for other in qs), name


def test_a_checkpoint_round_trips():
    """Save after 4 steps, train 3 more; load the checkpoint into a new model and optimizer
    and train the same 3: the same bits (Q, the error feedback and the step count restored)."""
    config = hvd.Compression.powersgd(rank=RANK, warmup_steps=2)
    model, opt = make(config)

    def train(m, o, steps):
        for step in steps:
            o.zero_grad()
            loss_of(m, step).backward()
            o.step()

    train(model, opt, range(4))
    saved = copy.deepcopy((model.state_dict(), opt.state_dict()))
    assert saved[1]["powersgd"]["step"] == 4 and saved[1]["powersgd"]["error"]
    train(model, opt, range(4, 7))
    again, again_opt = make(config)
    again.load_state_dict(saved[0])
    again_opt.load_state_dict(saved[1])
    train(again, again_opt, range(4, 7))
    for (name, p), q in zip(model.named_parameters(), again.parameters()):
        assert torch.equal(p, q), f"rank {hvd.rank()}: {name} differs after the reload"
    mine, theirs = opt.state_dict()["powersgd"], again_opt.state_dict()["powersgd"]
    assert mine["step"] == theirs["step"] == 7
    assert all(torch.equal(mine["error"][k], theirs["error"][k]) for k in mine["error"])


def test_broadcast_optimizer_state_sends_the_roots_q_and_keeps_each_ranks_error():
    model, opt = make(hvd.Compression.powersgd(rank=RANK, warmup_steps=0))
    for step in range(2):
        opt.zero_grad()
        loss_of(model, step).backward()
        opt.step()
    state = opt._hvd_powersgd
    mine = {k: v.clone() for k, v in state.error.items()}
    state.q = {k: v + hvd.rank() for k, v in state.q.items()}  # ranks apart
    state.step = 10 + hvd.rank()
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    qs = hvd.allgather_object(state.q, name="powersgd.q.after")
    assert state.step == 10
    assert all(torch.equal(q[k], qs[0][k]) for q in qs for k in qs[0])
    assert all(torch.equal(state.error[k], mine[k]) for k in mine)
    # Another number of ranks than the error feedback was made with: it starts from zero.
    state.size = hvd.size() + 1
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert state.error == {} and state.size == hvd.size()


def test_an_overflow_on_one_rank_leaves_q_and_the_error_feedback_alone():
    """Horovod's recipe with a GradScaler: one rank's loss overflows at step 3; every rank's
    reduced gradient is not finite, the scaler skips the step on every rank, and Q and the error
    feedback stay as they were (a NaN in them would poison every later step)."""
    model, opt = make(hvd.Compression.powersgd(rank=RANK, warmup_steps=1))
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
    for step in range(6):
        opt.zero_grad()
        loss = loss_of(model, step)
        if step == 3 and hvd.rank() == hvd.size() - 1:
            loss = loss * float("inf")
        before = copy.deepcopy(opt.state_dict()["powersgd"])
        weights = [p.detach().clone() for p in model.parameters()]
        scaler.scale(loss).backward()
        opt.synchronize()
        scaler.unscale_(opt)
        with opt.skip_synchronize():
            scaler.step(opt)
        scaler.update()
        after = opt.state_dict()["powersgd"]
        if step == 3:
            assert scaler.get_scale() == 128.0, f"rank {hvd.rank()}: the step was not skipped"
            assert all(torch.equal(p, w) for p, w in zip(model.parameters(), weights))
            for key in ("q", "error"):
                assert all(torch.equal(after[key][k], before[key][k]) for k in before[key]), key
        for key in ("q", "error"):
            assert all(torch.isfinite(t).all() for t in after[key].values()), (step, key)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert_ranks_bitwise_equal(model)


def test_a_parameter_without_gradients_keeps_its_q():
    """fc2 gets no gradient on any rank at step 2 (reduced as zeros; no error feedback to add):
    its Q is not replaced by the zero Q that step reduces, so it compresses as before after."""
    model, opt = make(hvd.Compression.powersgd(rank=RANK, warmup_steps=0, error_feedback=False))
    for step in range(4):
        opt.zero_grad()
        if step == 2:
            model.fc2.weight.requires_grad_(False)
            loss_of(model, step).backward()
            model.fc2.weight.requires_grad_(True)
            q = opt.state_dict()["powersgd"]["q"]["fc2.weight"].clone()
            opt.step()
            assert torch.equal(opt.state_dict()["powersgd"]["q"]["fc2.weight"], q)
        else:
            loss_of(model, step).backward()
            opt.step()
        assert torch.count_nonzero(opt.state_dict()["powersgd"]["q"]["fc2.weight"]) > 0
    assert_ranks_bitwise_equal(model)


@pytest.mark.parametrize("kwargs,named", [
    (dict(rank=0), "rank must be an int >= 1, got 0"),
    (dict(rank=-2), "rank must be an int >= 1, got -2"),
    (dict(rank=2.5), "rank must be an int >= 1, got 2.5"),
    (dict(warmup_steps=-1), "warmup_steps must be an int >= 0, got -1"),
    (dict(error_feedback="yes"), "error_feedback must be a bool, got 'yes'"),
])
def test_bad_settings_are_refused_by_name(kwargs, named):
    with pytest.raises(hvd.HorovodArgumentError,
                       match=re.escape("hvd.Compression.powersgd: " + named)):
        hvd.Compression.powersgd(**kwargs)


@pytest.mark.parametrize("build,named", [
    (lambda opt, m: hvd.DistributedOptimizer(opt, compression="powersgd"),
     "compression must be hvd.Compression.none, .fp16, .bf16, .powersgd(...) or an object "
     "with compress()/decompress(), got 'powersgd'"),
    (lambda opt, m: hvd.DistributedOptimizer(opt, compression=hvd.Compression.powersgd),
     "compression=hvd.Compression.powersgd is the factory: call it"),
    (lambda opt, m: hvd.DistributedOptimizer(opt, op=hvd.Adasum,
                                             compression=hvd.Compression.powersgd()),
     "compression=hvd.Compression.powersgd(...) does not combine with op=hvd.Adasum"),
    (lambda opt, m: hvd.DistributedOptimizer(opt, shard="optimizer_state",
                                             compression=hvd.Compression.powersgd()),
     "shard='optimizer_state') does not compress gradients"),
])
def test_what_does_not_combine_is_refused_at_construction(build, named):
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(hvd.HorovodArgumentError, match=re.escape(named)):
        build(opt, model)
    # the plain optimizer is untouched: it can still be wrapped
    assert hvd.DistributedOptimizer(opt, compression=hvd.Compression.powersgd()) is not None


def test_collectives_refuse_powersgd_by_name():
    with pytest.raises(hvd.HorovodArgumentError, match="compresses the gradients of "
                       "horovodlite.torch's DistributedOptimizer only"):
        hvd.allreduce(torch.ones(4, 4), name="powersgd.refused",
                      compression=hvd.Compression.powersgd())
    assert hvd.allreduce(torch.ones(2), name="powersgd.after").tolist() == [1.0, 1.0]


def test_a_checkpoint_of_another_number_of_ranks_drops_the_error_feedback():
    model, opt = make(hvd.Compression.powersgd(rank=RANK, warmup_steps=0))
    opt.zero_grad()
    loss_of(model, 0).backward()
    opt.step()
    saved = copy.deepcopy(opt.state_dict())
    assert saved["powersgd"]["size"] == hvd.size() and saved["powersgd"]["error"]
    opt.load_state_dict(saved)
    assert sorted(opt.state_dict()["powersgd"]["error"]) == sorted(saved["powersgd"]["error"])
    saved["powersgd"]["size"] = hvd.size() + 2
    opt.load_state_dict(saved)
    state = opt.state_dict()["powersgd"]
    assert state["error"] == {} and state["size"] == hvd.size()
    assert all(torch.equal(state["q"][k], saved["powersgd"]["q"][k]) for k in state["q"])
