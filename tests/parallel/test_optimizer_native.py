"""DistributedOptimizer's C++ gradient path (``_C.GradReducer``): which parameters take it, that
it reduces exactly what the Python hooks reduce (``HOROVOD_NATIVE_GRADIENT_HOOKS=0``, horovodlite
restarted), what it leaves to Python (sparse and non-contiguous gradients), and its errors - the
Python path's, with the same messages and types - after each of which the next step works.
"""

import contextlib
import os
import re

import pytest
import torch
import torch.nn.functional as F

import horovodlite.torch as hvd
from horovodlite.torch.distributed_optimizer import OutstandingAllreduceError

multi_rank = pytest.mark.skipif("hvd.size() < 2", reason="needs at least 2 ranks to disagree")
KNOB = "HOROVOD_NATIVE_GRADIENT_HOOKS"


@contextlib.contextmanager
def python_hooks():
    """horovodlite restarted with a Python hook per gradient, then restarted as it was."""
    hvd.shutdown()
    os.environ[KNOB] = "0"
    hvd.init()
    try:
        yield
    finally:
        hvd.shutdown()
        del os.environ[KNOB]
        hvd.init()


class Net(torch.nn.Module):
    """Dense layers, an embedding with sparse gradients, a parameter used on even ranks only,
    and a leaf whose gradient is not contiguous (it is a transposed view's layout)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(4, 6)
        self.b = torch.nn.Linear(6, 2)
        self.emb = torch.nn.Embedding(10, 2, sparse=True)
        self.unused_on_odd = torch.nn.Parameter(torch.randn(2))
        self.t = torch.nn.Parameter(torch.randn(4, 2).t())  # strides (1, 2): not contiguous

    def forward(self, x, ids, rank):
        out = self.b(torch.tanh(self.a(x))) + self.emb(ids).sum(1) + x[:, :2] @ self.t[:, :2]
        if rank % 2 == 0:
            out = out + self.unused_on_odd
        return out


def data(step, rank):
    g = torch.Generator().manual_seed(100 * step + rank)
    return (torch.randn(3, 4, generator=g), torch.randint(0, 10, (3, 2), generator=g),
            torch.randn(3, 2, generator=g))


def train(steps=3, passes=1):
    """Trains a Net for `steps` steps; returns its parameters and the optimizer."""
    net = Net()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1),
                                   named_parameters=net.named_parameters(),
                                   backward_passes_per_step=passes)
    for s in range(steps):
        opt.zero_grad()
        for k in range(passes):
            x, ids, y = data(s * passes + k, hvd.rank())
            F.mse_loss(net(x, ids, hvd.rank()), y).backward()
        opt.step()
    return [p.detach().clone() for p in net.parameters()], opt


def test_the_common_case_takes_the_cpp_path():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 1))
    params = list(model.parameters())
    opt = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.1))
    assert opt._hvd_native == params and opt._hvd_python == []
    grouped = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.1), groups=[params[:2]])
    assert grouped._hvd_native == params[2:] and grouped._hvd_python == params[:2]
    fp16 = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.1),
                                    compression=hvd.Compression.fp16)
    assert fp16._hvd_reducer is None and fp16._hvd_python == params
    with python_hooks():
        plain = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.1))
        assert plain._hvd_reducer is None and plain._hvd_python == params


@pytest.mark.parametrize("passes", [1, 2])
def test_cpp_and_python_hooks_train_identically(passes):
    native, opt = train(passes=passes)
    # the sparse and the non-contiguous gradients went out through Python's path
    assert opt._hvd_sparse_seen and not opt._hvd_pending
    with python_hooks():
        python, _ = train(passes=passes)
    for a, b in zip(native, python):
        assert torch.equal(a, b), f"rank {hvd.rank()}: the two paths differ"


def test_allreduces_start_during_backward_and_unused_parameters_go_out_at_step():
    model = torch.nn.ModuleDict({"used": torch.nn.Linear(2, 2), "idle": torch.nn.Linear(2, 2)})
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    model["used"](torch.ones(1, 2) * (hvd.rank() + 1)).sum().backward()
    assert set(opt._hvd_pending) == set(model["used"].parameters())
    with pytest.raises(OutstandingAllreduceError, match="still in flight"):
        opt.zero_grad()
    opt.step()
    assert not opt._hvd_pending
    mean = (hvd.size() + 1) / 2
    torch.testing.assert_close(model["used"].weight.grad, torch.full((2, 2), mean))
    assert torch.equal(model["idle"].weight.grad, torch.zeros(2, 2))


def test_a_user_hook_on_the_parameter_still_runs():
    lin = torch.nn.Linear(2, 1)
    seen = []
    lin.weight.register_post_accumulate_grad_hook(lambda p: seen.append(p.grad.clone()))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(lin.parameters(), lr=0.1))
    lin(torch.ones(1, 2)).sum().backward()
    opt.step()
    assert len(seen) == 1 and torch.equal(seen[0], torch.ones(1, 2))


def test_a_compiled_model_trains_as_the_eager_one():
    def run(compile_it):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
        forward = torch.compile(model, backend="aot_eager") if compile_it else model
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters())
        for s in range(3):
            opt.zero_grad()
            x, _, y = data(s, hvd.rank())
            F.mse_loss(forward(x), y).backward()
            opt.step()
        assert opt._hvd_native == list(model.parameters())
        return [p.detach() for p in model.parameters()]

    for a, b in zip(run(False), run(True)):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


# -------------------------------------------------------------------------------- errors


@multi_rank
def test_a_shape_that_differs_between_ranks_names_every_rank_then_the_next_step_works():
    rows = 3 if hvd.rank() == 0 else 2
    model = torch.nn.Linear(4, rows, bias=False)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    model(torch.ones(1, 4)).sum().backward()
    with pytest.raises(hvd.HorovodInternalError) as info:
        opt.step()
    msg = str(info.value)
    assert "shape mismatch" in msg and "weight" in msg, msg
    for r in range(hvd.size()):
        assert f"rank {r} float32[{3 if r == 0 else 2},4]" in msg, msg
    assert not opt._hvd_pending
    good = torch.nn.Linear(4, 2)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(good.parameters(), lr=0.1),
                                   named_parameters=good.named_parameters())
    good(torch.ones(1, 4)).sum().backward()
    opt.step()
    torch.testing.assert_close(good.bias.grad, torch.ones(2))


def test_an_unsupported_dtype_raises_the_python_paths_error_from_backward():
    def error():
        lin = torch.nn.Linear(2, 1, bias=False, dtype=torch.complex64)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(lin.parameters(), lr=0.1),
                                       named_parameters=lin.named_parameters())
        with pytest.raises(hvd.HorovodArgumentError) as info:
            lin(torch.ones(1, 2, dtype=torch.complex64)).abs().sum().backward()
        del opt  # its hooks end with it
        return re.sub(r"grad\.opt\d+", "grad.opt<k>", str(info.value))  # optimizers are counted

    native = error()
    assert "unsupported dtype torch.complex64" in native, native
    with python_hooks():
        assert error() == native


def test_a_hook_refused_before_init_raises_from_backward_and_the_step_after_init_works():
    """Between shutdown and init the hook's enqueue is refused: backward() raises the
    HorovodArgumentError (a ValueError) the Python path raised; after init, step() sends the
    gradient and training goes on."""
    lin = torch.nn.Linear(2, 1, bias=False)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(lin.parameters(), lr=0.1),
                                   named_parameters=lin.named_parameters())
    hvd.shutdown()
    try:
        with pytest.raises(ValueError, match="init") as info:
            lin(torch.ones(1, 2)).sum().backward()
        assert isinstance(info.value, hvd.HorovodArgumentError)
    finally:
        hvd.init()
    opt.step()
    torch.testing.assert_close(lin.weight.grad, torch.ones(1, 2))
    opt.zero_grad()
    lin(torch.ones(1, 2) * (hvd.rank() + 1)).sum().backward()
    opt.step()
    torch.testing.assert_close(lin.weight.grad, torch.full((1, 2), (hvd.size() + 1) / 2))


def test_more_backward_passes_than_configured_raises_the_python_paths_error():
    lin = torch.nn.Linear(2, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(lin.parameters(), lr=0.1),
                                   named_parameters=lin.named_parameters())
    lin(torch.ones(1, 2)).sum().backward()
    with pytest.raises(RuntimeError, match="parameter '(weight|bias)' received more than "
                                           "backward_passes_per_step=1 gradients"):
        lin(torch.ones(1, 2)).sum().backward()
    opt.step()
    opt.zero_grad()
    lin(torch.ones(1, 2)).sum().backward()
    opt.step()
    torch.testing.assert_close(lin.bias.grad, torch.ones(1))


def test_a_parameter_missing_from_named_parameters_is_refused():
    lin, extra = torch.nn.Linear(2, 1), torch.nn.Linear(2, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(lin.parameters(), lr=0.1),
                                   named_parameters=lin.named_parameters())
    with pytest.raises(ValueError, match="not in named_parameters"):
        opt.add_param_group({"params": list(extra.parameters())})
    lin(torch.ones(1, 2)).sum().backward()
    opt.step()
    torch.testing.assert_close(lin.bias.grad, torch.ones(1))


# ------------------------------------------------------- parameters replaced after wrapping


@pytest.mark.parametrize("compression", ["none", "fp16"])  # C++ hooks / Python hooks
def test_a_parameter_swapped_into_a_param_group_is_reduced_and_the_old_one_is_not(compression):
    """``param_groups[g]["params"][i] = c`` keeps the group's length: ``c`` must still be hooked,
    named and reduced (averaged on every rank), and the parameter it replaced no longer is."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(2, 2)
    c, c2 = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))
    named = [*lin.named_parameters(), ("c", c), ("c2", c2)]
    opt = hvd.DistributedOptimizer(torch.optim.SGD(lin.parameters(), lr=0.1),
                                   named_parameters=named,
                                   compression=getattr(hvd.Compression, compression))
    old = lin.bias
    mean = (hvd.size() + 1) / 2

    def backward(extra):
        scale = hvd.rank() + 1
        (lin.weight.sum() + (extra * torch.full((2,), float(scale))).sum()).backward()

    # swapped before zero_grad: hooked there, so it goes out during backward
    opt.param_groups[0]["params"][1] = c
    opt.zero_grad()
    backward(c + old)
    assert c in opt._hvd_pending and old not in opt._hvd_pending
    opt.step()
    torch.testing.assert_close(c.grad, torch.full((2,), mean))
    torch.testing.assert_close(old.grad, torch.full((2,), float(hvd.rank() + 1)))  # its own
    # swapped between zero_grad and backward: no hook ran for it, step() still reduces it
    opt.zero_grad()
    opt.param_groups[0]["params"][1] = c2
    backward(c2)
    opt.step()
    torch.testing.assert_close(c2.grad, torch.full((2,), mean))


def test_a_parameter_swapped_in_that_named_parameters_does_not_name_is_refused_each_time():
    lin = torch.nn.Linear(2, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(lin.parameters(), lr=0.1),
                                   named_parameters=lin.named_parameters())
    stranger = torch.nn.Parameter(torch.zeros(1))
    opt.param_groups[0]["params"][1] = stranger
    for _ in range(2):  # refused again, not once and then silently left unreduced
        with pytest.raises(ValueError, match=r"shape \[1\].* not in named_parameters"):
            opt.zero_grad()
    lin(torch.ones(1, 2)).sum().backward()
    with pytest.raises(ValueError, match="not in named_parameters"):
        opt.step()  # raised on every rank once what did go out was waited for
    assert not opt._hvd_pending
    opt.param_groups[0]["params"][1] = lin.bias
    opt.zero_grad()
    lin(torch.ones(1, 2) * (hvd.rank() + 1)).sum().backward()
    opt.step()
    torch.testing.assert_close(lin.weight.grad, torch.full((1, 2), (hvd.size() + 1) / 2))


@pytest.mark.parametrize("convert", ["double", "module"])
def test_a_parameter_whose_data_changes_dtype_still_goes_out_during_backward(convert):
    """``p.data = p.data.double()`` (what ``module.double()`` does) makes torch drop the
    parameter's AccumulateGrad node: the reducer hooks the new one at the next zero_grad."""
    lin = torch.nn.Linear(2, 2)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(lin.parameters(), lr=0.1),
                                   named_parameters=lin.named_parameters())
    lin(torch.ones(1, 2)).sum().backward()  # a step before the change, hooks on the old nodes
    opt.step()
    if convert == "double":
        for p in lin.parameters():
            p.data = p.data.double()
    else:
        lin.double()
    for step in range(2):
        opt.zero_grad()
        x = torch.full((1, 2), float(hvd.rank() + 1), dtype=torch.float64)
        lin(x).sum().backward()
        assert opt._hvd_reducer.fired(), "the hooks on the new nodes did not fire"
        # The first step keeps the float32 bucket layout, which the float64 gradients cannot
        # join: they go out at synchronize, agreed by every rank; the layout built then has
        # them launched during backward.
        if step > 0:
            assert set(opt._hvd_pending) == set(lin.parameters()), "not launched in backward"
        opt.step()
        torch.testing.assert_close(lin.weight.grad,
                                   torch.full((2, 2), (hvd.size() + 1) / 2, dtype=torch.float64))


def test_hooks_removed_then_hooked_again_still_reduce():
    """``_hvd_remove_hooks`` (Lightning's teardown; rewrapping) says the next refresh hooks every
    parameter again: the optimizer used afterwards must still average the gradients (the C++
    reducer, once detached, took the parameters again and never launched them: every rank
    stepped on its own gradient)."""
    lin = torch.nn.Linear(2, 2)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(lin.parameters(), lr=0.1),
                                   named_parameters=lin.named_parameters())
    opt._hvd_remove_hooks()
    for _ in range(2):
        opt.zero_grad()
        lin(torch.full((1, 2), float(hvd.rank() + 1))).sum().backward()
        opt.step()
        torch.testing.assert_close(lin.weight.grad, torch.full((2, 2), (hvd.size() + 1) / 2))
        torch.testing.assert_close(lin.bias.grad, torch.ones(2))
