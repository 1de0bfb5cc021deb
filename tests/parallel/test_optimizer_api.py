"""DistributedOptimizer's arguments and methods, one behaviour per test: the wrapped class and
shared state, names, errors (with their messages), ops, predivide, groups, accumulation, sparse
gradients, compression, skip_synchronize and its warning, zero_grad, load_state_dict, closures,
LR schedulers, add_param_group.

Every rank can rebuild every other rank's batch, so expected gradients (the average or sum of
each rank's local gradient) are computed locally on every rank.
"""

import copy
import re
import warnings

import pytest
import torch
import torch.nn.functional as F

import horovodlite.torch as hvd
from horovodlite.torch.distributed_optimizer import OutstandingAllreduceError

SYNC_WARNING = (r"optimizer\.step\(\) called without optimizer\.skip_synchronize\(\) context "
                r"after optimizer\.synchronize\(\)")


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(),
                               torch.nn.Linear(3, 2)).double()


def batch(rank, rows=3):
    g = torch.Generator().manual_seed(10 + rank)
    return (torch.randn(rows, 4, generator=g, dtype=torch.float64),
            torch.randn(rows, 2, generator=g, dtype=torch.float64))


def loss_of(model, rank):
    x, y = batch(rank)
    return F.mse_loss(model(x), y)


def local_grads(rank):
    model = make_model()
    loss_of(model, rank).backward()
    return [p.grad.clone() for p in model.parameters()]


def expected_grads(op=hvd.Average):
    per_rank = [local_grads(r) for r in range(hvd.size())]
    sums = [sum(gs) for gs in zip(*per_rank)]
    return [s / hvd.size() for s in sums] if op == hvd.Average else sums


def assert_grads(model, expected, tol=1e-12):
    for (name, p), e in zip(model.named_parameters(), expected):
        torch.testing.assert_close(p.grad, e, rtol=tol, atol=tol, msg=f"rank {hvd.rank()} {name}")


def backward_and_sync(opt, model):
    loss_of(model, hvd.rank()).backward()
    opt.synchronize()


# ------------------------------------------------------------------ the object and its names


def test_instance_of_wrapped_class_sharing_param_groups_and_state():
    model = make_model()
    base = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters())
    assert isinstance(opt, torch.optim.SGD) and type(opt).__name__ == "SGD"
    assert opt.param_groups is base.param_groups and opt.state is base.state
    assert opt._parameter_names == {p: n for n, p in model.named_parameters()}
    loss_of(model, hvd.rank()).backward()
    opt.step()
    assert len(base.state) == 4 and all("momentum_buffer" in s for s in base.state.values())
    base.param_groups[0]["lr"] = 0.5
    assert opt.param_groups[0]["lr"] == 0.5


def test_generated_names_unique_across_groups_and_identical_on_every_rank():
    model = make_model()
    params = list(model.parameters())
    opt = hvd.DistributedOptimizer(torch.optim.SGD(
        [{"params": params[:2]}, {"params": params[2:], "lr": 0.01}], lr=0.1))
    names = [opt._parameter_names[p] for p in params]
    assert len(set(names)) == len(params)
    assert all(other == names for other in hvd.allgather_object(names))
    second = hvd.DistributedOptimizer(torch.optim.SGD(make_model().parameters(), lr=0.1))
    assert second._hvd_prefix != opt._hvd_prefix
    assert all(o == [opt._hvd_prefix, second._hvd_prefix]
               for o in hvd.allgather_object([opt._hvd_prefix, second._hvd_prefix]))


def test_named_parameters_errors():
    model = make_model()
    sgd = lambda: torch.optim.SGD(model.parameters(), lr=0.1)
    named = list(model.named_parameters())
    dup = [("w", named[0][1]), ("w", named[1][1])] + named[2:]
    with pytest.raises(ValueError, match="must be unique; found duplicates: w"):
        hvd.DistributedOptimizer(sgd(), named_parameters=dup)
    with pytest.raises(ValueError, match=r"named_parameters was specified, but 2 parameter\(s\)"):
        hvd.DistributedOptimizer(sgd(), named_parameters=named[:2])
    with pytest.raises(ValueError, match="sequence of \\(name, parameter\\) tuples"):
        hvd.DistributedOptimizer(sgd(), named_parameters=[p for _, p in named])
    with pytest.raises(ValueError, match="two names: '0.weight' and 'again'"):
        hvd.DistributedOptimizer(sgd(), named_parameters=named + [("again", named[0][1])])


def test_argument_errors():
    model = make_model()
    sgd = lambda: torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="op must be hvd.Average, hvd.Sum or hvd.Adasum"):
        hvd.DistributedOptimizer(sgd(), op=hvd.Max)
    with pytest.raises(ValueError, match="gradient_predivide_factor is only supported with"):
        hvd.DistributedOptimizer(sgd(), op=hvd.Sum, gradient_predivide_factor=2.0)
    with pytest.raises(ValueError, match="gradient_predivide_factor must be > 0"):
        hvd.DistributedOptimizer(sgd(), gradient_predivide_factor=0.0)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="backward_passes_per_step must be a positive int"):
            hvd.DistributedOptimizer(sgd(), backward_passes_per_step=bad)
    with pytest.raises(ValueError, match="does not support LBFGS"):
        hvd.DistributedOptimizer(torch.optim.LBFGS(model.parameters()))
    with pytest.raises(ValueError, match="wraps a torch.optim.Optimizer"):
        hvd.DistributedOptimizer(model)
    with pytest.raises(ValueError, match="already a DistributedOptimizer"):
        hvd.DistributedOptimizer(hvd.DistributedOptimizer(sgd()))
    with pytest.raises(ValueError, match="process_set must be a hvd.ProcessSet"):
        hvd.DistributedOptimizer(sgd(), process_set=[0])
    with pytest.raises(ValueError, match="compression must be"):
        hvd.DistributedOptimizer(sgd(), compression="fp16")


# ------------------------------------------------------------------------- ops and scaling


@pytest.mark.parametrize("op", [hvd.Average, hvd.Sum])
def test_op_average_and_sum(op):
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), op=op)
    backward_and_sync(opt, model)
    assert_grads(model, expected_grads(op))


def test_gradient_predivide_factor_gives_the_average():
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   gradient_predivide_factor=4.0)
    backward_and_sync(opt, model)
    assert_grads(model, expected_grads())


# ---------------------------------------------------------------- hooks and accumulation


def test_allreduce_starts_during_backward():
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    loss_of(model, hvd.rank()).backward()
    assert set(opt._hvd_pending) == set(model.parameters()), "hooks did not launch allreduces"
    opt.synchronize()
    assert not opt._hvd_pending
    assert_grads(model, expected_grads())


def test_backward_passes_per_step_accumulates_then_reduces():
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   backward_passes_per_step=3)
    for i in range(3):
        assert not opt._hvd_pending, f"an allreduce fired after {i} of 3 passes"
        loss_of(model, hvd.rank()).backward()
    assert set(opt._hvd_pending) == set(model.parameters())
    opt.synchronize()
    assert_grads(model, [3 * g for g in expected_grads()])


def test_set_backward_passes_per_step():
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    opt.set_backward_passes_per_step(2)
    assert opt.backward_passes_per_step == 2
    loss_of(model, hvd.rank()).backward()
    assert not opt._hvd_pending
    loss_of(model, hvd.rank()).backward()
    opt.step()
    assert_grads(model, [2 * g for g in expected_grads()])
    with pytest.raises(ValueError, match="positive int"):
        opt.set_backward_passes_per_step(0)


def test_more_backward_passes_than_configured_is_an_error():
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    loss_of(model, hvd.rank()).backward()
    with pytest.raises(RuntimeError, match="more than backward_passes_per_step=1 gradients"):
        loss_of(model, hvd.rank()).backward()
    opt.synchronize()  # the first pass's allreduces complete; the optimizer stays usable
    opt.zero_grad()
    backward_and_sync(opt, model)
    assert_grads(model, expected_grads())


# -------------------------------------------------------------------------------- groups


def test_groups_int_and_lists():
    model = make_model()
    params = list(model.parameters())
    opt = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.1), groups=3)
    assert [len(g) for g in opt._hvd_groups] == [2, 1, 1]
    loss_of(model, hvd.rank()).backward()
    assert opt._hvd_pending[params[0]] is opt._hvd_pending[params[1]], "group not fused"
    opt.synchronize()
    assert_grads(model, expected_grads())

    model = make_model()
    params = list(model.parameters())
    opt = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.1),
                                   groups=[[params[0], params[3]]])
    loss_of(model, hvd.rank()).backward()
    pending = opt._hvd_pending
    assert pending[params[0]] is pending[params[3]] and pending[params[1]] is not pending[params[2]]
    opt.synchronize()
    assert_grads(model, expected_grads())


def test_groups_errors_and_deprecated_num_groups():
    model = make_model()
    params = list(model.parameters())
    sgd = lambda: torch.optim.SGD(params, lr=0.1)
    with pytest.raises(ValueError, match="not a parameter of the optimizer"):
        hvd.DistributedOptimizer(sgd(), groups=[[params[0], torch.zeros(2)]])
    with pytest.raises(ValueError, match="already in a group"):
        hvd.DistributedOptimizer(sgd(), groups=[[params[0]], [params[0], params[1]]])
    with pytest.raises(ValueError, match="groups must be an int"):
        hvd.DistributedOptimizer(sgd(), groups="two")
    with pytest.raises(ValueError, match="groups must be a positive int"):
        hvd.DistributedOptimizer(sgd(), groups=-1)
    with pytest.warns(DeprecationWarning, match="num_groups=.*deprecated"):
        opt = hvd.DistributedOptimizer(sgd(), num_groups=2)
    assert [len(g) for g in opt._hvd_groups] == [2, 2]
    with pytest.raises(ValueError, match="either groups= or the deprecated num_groups="):
        with pytest.warns(DeprecationWarning):
            hvd.DistributedOptimizer(sgd(), num_groups=2, groups=2)


# ------------------------------------------------------------------------ sparse gradients


def embedding_setup(sparse_as_dense, passes=1):
    torch.manual_seed(3)
    emb = torch.nn.Embedding(10, 3, sparse=True).double()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.1),
                                   sparse_as_dense=sparse_as_dense,
                                   backward_passes_per_step=passes)
    return emb, opt


def embedding_grad(rank, emb):
    idx = torch.tensor([rank % 10, (rank + 1) % 10, 5])
    weights = torch.arange(1.0, 4.0, dtype=torch.float64) * (rank + 1)
    return (emb(idx).sum(1) * weights).sum()


@pytest.mark.parametrize("sparse_as_dense", [False, True])
@pytest.mark.parametrize("passes", [1, 2])
def test_sparse_gradients(sparse_as_dense, passes):
    n = hvd.size()
    expected = torch.zeros(10, 3, dtype=torch.float64)
    for r in range(n):
        emb, _ = embedding_setup(False)
        embedding_grad(r, emb).backward()
        expected += emb.weight.grad.to_dense() * passes / n
    emb, opt = embedding_setup(sparse_as_dense, passes)
    for _ in range(passes):
        embedding_grad(hvd.rank(), emb).backward()
    opt.synchronize()
    assert emb.weight.grad.is_sparse != sparse_as_dense
    torch.testing.assert_close(emb.weight.grad.to_dense(), expected)
    with opt.skip_synchronize():
        opt.step()


# ---------------------------------------------------------------------------- compression


@pytest.mark.parametrize("name,tol", [("none", 1e-12), ("fp16", 2e-3), ("bf16", 2e-2)])
def test_compression_through_the_optimizer(name, tol):
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   compression=getattr(hvd.Compression, name))
    backward_and_sync(opt, model)
    assert all(p.grad.dtype == torch.float64 for p in model.parameters())
    assert_grads(model, expected_grads(), tol=tol)


@pytest.mark.parametrize("name", ["none", "fp16", "bf16"])
def test_allreduce_with_compression_restores_dtype(name):
    comp = getattr(hvd.Compression, name)
    values = torch.arange(6, dtype=torch.float32) / 8 + hvd.rank()
    out = hvd.allreduce(values, compression=comp, name=f"compressed.{name}")
    assert out.dtype == torch.float32
    mean_rank = (hvd.size() - 1) / 2
    torch.testing.assert_close(out, torch.arange(6, dtype=torch.float32) / 8 + mean_rank)


# ---------------------------------------------------- synchronize, skip, zero_grad, state


def test_step_after_synchronize_warns_and_does_not_reduce_twice():
    model = make_model()
    # lr=0 keeps the parameters, so every step's expected gradients are the same.
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0), op=hvd.Sum)
    for _ in range(2):  # one warning per offending step() call
        opt.zero_grad()
        backward_and_sync(opt, model)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            opt.step()
        assert len(caught) == 1 and re.match(SYNC_WARNING, str(caught[0].message))
        assert caught[0].filename == __file__, "the warning must point at the caller"
        assert_grads(model, expected_grads(hvd.Sum))  # summed once, not twice
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the correct patterns do not warn at all
        opt.zero_grad()
        loss_of(model, hvd.rank()).backward()
        opt.step()
        opt.zero_grad()
        backward_and_sync(opt, model)
        with opt.skip_synchronize():
            opt.step()
    with pytest.warns(UserWarning, match=SYNC_WARNING):
        opt.zero_grad()
        backward_and_sync(opt, model)
        opt.step()


def test_skip_synchronize_with_allreduces_in_flight_is_an_error():
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    loss_of(model, hvd.rank()).backward()
    with pytest.raises(RuntimeError, match="call optimizer.synchronize\\(\\) before"):
        with opt.skip_synchronize():
            opt.step()
    opt.step()
    assert_grads(model, expected_grads())


def test_zero_grad_with_allreduces_in_flight_raises():
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    loss_of(model, hvd.rank()).backward()
    with pytest.raises(OutstandingAllreduceError, match=r"zero_grad\(\) was called after "
                       r"loss.backward\(\) but before optimizer.step\(\).*'0.bias'"):
        opt.zero_grad()
    with pytest.raises(AssertionError):  # what Horovod raised; existing handlers still work
        opt.zero_grad()
    opt.step()
    opt.zero_grad()
    assert all(p.grad is None for p in model.parameters())


def test_load_state_dict_resumes_training():
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01))
    for _ in range(2):
        opt.zero_grad()
        loss_of(model, hvd.rank()).backward()
        opt.step()
    saved = copy.deepcopy(opt.state_dict())  # state_dict() shares the state tensors
    clone = make_model()
    clone.load_state_dict(model.state_dict())
    resumed = hvd.DistributedOptimizer(torch.optim.Adam(clone.parameters(), lr=0.01))
    resumed.load_state_dict(saved)
    for m, o in ((model, opt), (clone, resumed)):
        o.zero_grad()
        loss_of(m, hvd.rank()).backward()
        o.step()
    for p, q in zip(model.parameters(), clone.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    loss_of(clone, hvd.rank()).backward()
    with pytest.raises(RuntimeError, match="load_state_dict\\(\\) while the allreduces"):
        resumed.load_state_dict(saved)
    resumed.synchronize()


def test_step_with_closure_returns_the_loss():
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))

    def closure():
        opt.zero_grad()
        loss = loss_of(model, hvd.rank())
        loss.backward()
        return loss

    loss = opt.step(closure)
    assert torch.is_tensor(loss) and loss.dim() == 0
    assert_grads(model, expected_grads())


def test_lr_scheduler_created_before_wrapping_still_synchronizes():
    model = make_model()
    base = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(base, step_size=1, gamma=0.5)
    opt = hvd.DistributedOptimizer(base)
    loss_of(model, hvd.rank()).backward()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opt.step()
        scheduler.step()
    assert_grads(model, expected_grads())
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05)


def test_add_param_group_names_and_reduces_new_parameters():
    model = make_model()
    params = list(model.parameters())
    opt = hvd.DistributedOptimizer(torch.optim.SGD(params[:2], lr=0.1))
    opt.add_param_group({"params": params[2:], "lr": 0.01})
    assert len(set(opt._parameter_names.values())) == 4
    backward_and_sync(opt, model)
    assert_grads(model, expected_grads())


def test_sparse_parameter_unused_on_some_ranks_after_first_use():
    """A sparse-gradient parameter seen before but unused on odd ranks this step: those ranks
    contribute an empty sparse gradient to the same allgather."""
    n, r = hvd.size(), hvd.rank()
    emb, opt = embedding_setup(False)
    embedding_grad(r, emb).backward()
    opt.synchronize()
    opt.zero_grad()
    if r % 2 == 0:
        embedding_grad(r, emb).backward()
    opt.synchronize()
    expected = torch.zeros(10, 3, dtype=torch.float64)
    for k in range(0, n, 2):
        ref, _ = embedding_setup(False)
        embedding_grad(k, ref).backward()
        expected += ref.weight.grad.to_dense() / n
    assert emb.weight.grad.is_sparse
    torch.testing.assert_close(emb.weight.grad.to_dense(), expected)


def test_wrapping_the_same_plain_optimizer_again_retires_the_first_wrapper():
    model = make_model()
    base = torch.optim.SGD(model.parameters(), lr=0.1)
    first = hvd.DistributedOptimizer(base)
    with pytest.raises(ValueError, match="duplicates"):  # a failed wrap leaves `first` intact
        hvd.DistributedOptimizer(base, named_parameters=[("a", p) for p in model.parameters()])
    assert len(first._hvd_hooks) == 4
    second = hvd.DistributedOptimizer(base)
    loss_of(model, hvd.rank()).backward()  # only the second wrapper's hooks launch
    second.synchronize()
    assert_grads(model, expected_grads())
