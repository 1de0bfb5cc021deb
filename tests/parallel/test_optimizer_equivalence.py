"""The proof: data-parallel training with DistributedOptimizer equals one process training on the
whole batch.

Every step has a global batch of 24 samples (divisible by 1, 2, 3 and 4, and each shard by 2).
Rank r trains on its contiguous shard of 24 / size rows with a mean loss; averaging those shard
gradients gives the full-batch mean gradient, so after each step every rank's parameters must
equal those of a plain optimizer trained on all 24 rows - which every rank computes locally as
the reference. Models are float64 so that a wrong algorithm cannot hide behind rounding; the
compressed variants use a tolerance that fits 16-bit gradients on the wire.
"""

import pytest
import torch
import torch.nn.functional as F

import horovodlite.torch as hvd

GLOBAL_BATCH = 24
STEPS = 4


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 6),
                               torch.nn.Tanh(), torch.nn.Linear(6, 3)).double()


def make_data(seed=1, steps=STEPS):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(steps, GLOBAL_BATCH, 5, generator=g, dtype=torch.float64)
    y = torch.randn(steps, GLOBAL_BATCH, 3, generator=g, dtype=torch.float64)
    return x, y


OPTIMIZERS = {
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=1e-3),
    "adam": lambda ps: torch.optim.Adam(ps, lr=0.01),
}


def shard(t):
    n, r = hvd.size(), hvd.rank()
    per = GLOBAL_BATCH // n
    return t[r * per:(r + 1) * per]


def train_reference(opt_name, x, y, steps=STEPS):
    """One process, whole batch, plain optimizer."""
    model = make_model()
    opt = OPTIMIZERS[opt_name](model.parameters())
    for s in range(steps):
        opt.zero_grad()
        F.mse_loss(model(x[s]), y[s]).backward()
        opt.step()
    return model


def train_distributed(opt_name, x, y, passes=1, steps=STEPS, groups="none", **kwargs):
    """This rank's shard, split into ``passes`` micro-batches accumulated locally."""
    model = make_model()
    opt = hvd.DistributedOptimizer(OPTIMIZERS[opt_name](model.parameters()),
                                   named_parameters=model.named_parameters(),
                                   backward_passes_per_step=passes,
                                   groups=groups_arg(groups, model), **kwargs)
    for s in range(steps):
        opt.zero_grad()
        xs, ys = shard(x[s]), shard(y[s])
        for xm, ym in zip(xs.chunk(passes), ys.chunk(passes)):
            (F.mse_loss(model(xm), ym) / passes).backward()
        opt.step()
    return model, opt


def assert_same_params(model, reference, rtol=1e-9, atol=1e-11):
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=rtol, atol=atol,
                                   msg=lambda m, name=name: f"rank {hvd.rank()} {name}: {m}")


def groups_arg(kind, model):
    if kind == "none":
        return None
    if kind == "int":
        return 2
    params = list(model.parameters())
    return [params[0:2], params[4:6]]  # the rest of the parameters go individually


@pytest.mark.parametrize("groups", ["none", "int", "lists"])
@pytest.mark.parametrize("passes", [1, 2])
@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
def test_distributed_equals_full_batch(opt_name, passes, groups):
    x, y = make_data()
    reference = train_reference(opt_name, x, y)
    model, opt = train_distributed(opt_name, x, y, passes, groups=groups)
    assert_same_params(model, reference)
    assert opt.backward_passes_per_step == passes


@pytest.mark.parametrize("compression,tol", [("fp16", 2e-3), ("bf16", 2e-2)])
@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
def test_compressed_training_stays_close(opt_name, compression, tol):
    x, y = make_data()
    reference = train_reference(opt_name, x, y)
    model, _ = train_distributed(opt_name, x, y,
                                 compression=getattr(hvd.Compression, compression))
    assert_same_params(model, reference, rtol=tol, atol=tol)
    # The gradients really travelled in 16 bits: the result is not bit-identical.
    diffs = [float((p - q).detach().abs().max()) for p, q in zip(model.parameters(),
                                                         reference.parameters())]
    assert max(diffs) > 0


def test_sum_with_scaled_learning_rate_equals_average():
    """op=Sum adds the shard gradients: SGD with lr / size then equals the reference."""
    n = hvd.size()
    x, y = make_data()
    reference = train_reference("sgd_momentum", x, y)
    model = make_model()
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1 / n, momentum=0.9, weight_decay=1e-3 * n),
        op=hvd.Sum)
    for s in range(STEPS):
        opt.zero_grad()
        F.mse_loss(model(shard(x[s])), shard(y[s])).backward()
        opt.step()
    assert_same_params(model, reference)


@pytest.mark.parametrize("factor", [0.5, 2.0, 3.0])
def test_gradient_predivide_factor_keeps_the_average(factor):
    x, y = make_data()
    reference = train_reference("adam", x, y)
    model, _ = train_distributed("adam", x, y, gradient_predivide_factor=factor)
    assert_same_params(model, reference)


def test_broadcast_then_train_from_different_initialisations():
    """Ranks start from different weights; broadcast_parameters + broadcast_optimizer_state make
    them start from rank 0's, and then training matches the reference started there."""
    x, y = make_data()
    model = make_model(seed=100 + hvd.rank())
    opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    reference = make_model(seed=100)
    ref_opt = torch.optim.Adam(reference.parameters(), lr=0.01)
    for s in range(STEPS):
        opt.zero_grad()
        ref_opt.zero_grad()
        F.mse_loss(model(shard(x[s])), shard(y[s])).backward()
        F.mse_loss(reference(x[s]), y[s]).backward()
        opt.step()
        ref_opt.step()
    assert_same_params(model, reference)
