"""Bucket views (docs/bucket_views.md) on every rank: a model trained with bucket views gives
bit-identical parameters to the same model trained on the per-gradient path, in the same job, for
each way users touch gradients, and under torch.compile; the layout is the same on every rank,
and ranks that optimize different parameters are told which one and which ranks.

tests/test_parallel.py runs this file at np 1, 2 and 3."""

from __future__ import annotations

import copy

import pytest
import torch

import horovodlite.torch as hvd

THRESHOLD = 1024  # bytes per bucket: several buckets for the small models here
STEPS = 50  # of training, compared bit for bit with the per-gradient path
OPTIMIZERS = [pytest.param(torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}, id="sgd"),
              pytest.param(torch.optim.Adam, {"lr": 0.01}, id="adam")]
multi_rank = pytest.mark.skipif("hvd.size() < 2", reason="needs at least 2 ranks to disagree")


class Net(torch.nn.Module):
    def __init__(self, sparse: bool = False):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 4, sparse=sparse)
        self.fc1 = torch.nn.Linear(4, 16)
        self.fc2 = torch.nn.Linear(16, 8)
        self.extra = torch.nn.Linear(8, 8)  # used on rank 0 only in the unused-parameter case

    def forward(self, idx, use_extra: bool = False):
        h = torch.relu(self.fc1(self.emb(idx).sum(1)))
        out = self.fc2(h)
        if use_extra:
            out = out + self.extra(out)
        return out


def data(step: int):
    g = torch.Generator().manual_seed(1000 * step + hvd.rank())
    return torch.randint(0, 10, (6, 3), generator=g), torch.randn(6, 8, generator=g)


def pair(opt_cls, sparse=False, passes=1, late=False, **kwargs):
    """Two identical models and their optimizers: bucket views on, then off. With ``late`` the
    model has a parameter ``late`` the optimizer is given later (add_param_group)."""
    out = []
    for bucket_view in (True, False):
        torch.manual_seed(7)
        model = Net(sparse)
        params = list(model.parameters())
        if late:
            model.late = torch.nn.Parameter(torch.ones(3))
        opt = hvd.DistributedOptimizer(opt_cls(params, **kwargs),
                                       named_parameters=model.named_parameters(),
                                       backward_passes_per_step=passes, bucket_view=bucket_view)
        opt._hvd_buckets.threshold = THRESHOLD
        out.append((model, opt))
    return out


def train(runs, steps, *, set_to_none=True, passes=1, before_backward=None, after_step=None,
          clip=False, use_extra=None):
    for step in range(steps):
        for model, opt in runs:
            opt.zero_grad(set_to_none=set_to_none if isinstance(set_to_none, bool)
                          else set_to_none(step))
            if before_backward is not None:
                before_backward(step, model)
            for k in range(passes):
                idx, y = data(step * passes + k)
                extra = use_extra(step) if use_extra else False
                torch.nn.functional.mse_loss(model(idx, extra), y).backward()
            if clip:
                opt.synchronize()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
                with opt.skip_synchronize():
                    opt.step()
            else:
                opt.step()
            if after_step is not None:
                after_step(step, model, opt)


def assert_same(runs):
    (a, opt_a), (b, _) = runs
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        # Bit-identical: with 3 ranks or more a bucket goes out as its members' spans, which
        # the ring reduces in the per-gradient path's order.
        assert torch.equal(p, q), f"rank {hvd.rank()}: parameter {name} differs"
    report = opt_a.bucket_report()
    assert report["state"] == "built", report
    # The same layout on every rank.
    layouts = hvd.allgather_object([(b["name"], b["bytes"], b["members"])
                                    for b in report["buckets"]], name="bucket_views_layout")
    assert all(layout == layouts[0] for layout in layouts), layouts
    return report


def bucketed(report) -> set:
    return {m for b in report["buckets"] for m in b["members"]}


@pytest.mark.parametrize("opt_cls, kwargs", OPTIMIZERS)
def test_same_results_and_copies(opt_cls, kwargs):
    runs = pair(opt_cls, **kwargs)
    steps = []

    def record(step, model, opt):
        if opt is runs[0][1]:
            steps.append([(b["copies"], b["own"], b["views"], tuple(b["members"]))
                          for b in opt.bucket_report()["buckets"]])

    # set_to_none=True (torch's default) for half the steps, then False.
    train(runs, STEPS, set_to_none=lambda s: s < STEPS // 2, after_step=record)
    report = assert_same(runs)
    assert bucketed(report) == {name for name, _ in runs[0][0].named_parameters()}
    assert len(report["buckets"]) > 1
    assert all(b["bytes"] <= THRESHOLD or len(b["members"]) == 1 for b in report["buckets"])
    # No gradient is ever copied. Step 0 observes. Step 1 (set_to_none=True): autograd puts each
    # gradient in a tensor of its own, reduced where it is; a bucket whose members all came so
    # gives up its flat tensor. `extra` is unused here: where its bucket's other members came in
    # their own tensors it goes out as zeros of its own, else its slices are zeroed in place.
    assert [c for step in steps[1:] for c, _, _, _ in step] == [0] * sum(map(len, steps[1:]))
    for _, own, views, members in steps[1]:
        if all(m.startswith("extra") for m in members):
            assert (own, views) == (0, True), steps[1]
        else:
            assert (own, views) == (len(members), False), steps[1]
    # From then on those gradients stay the user's tensors (set_to_none=False zeroes them in
    # place): still no copies, and no second home.
    assert steps[-1] == steps[1], steps
    for name, p in runs[0][0].named_parameters():
        view = [b for b in report["buckets"] if name in b["members"]]
        assert len(view) == 1 and p.grad is not None
    assert all(b["fallback_steps"] == 0 for b in report["buckets"])


@pytest.mark.parametrize("opt_cls, kwargs", OPTIMIZERS)
def test_ranks_that_clear_gradients_differently_agree(opt_cls, kwargs):
    """Odd ranks call zero_grad(set_to_none=True) (their gradients come in tensors of their own,
    reduced where they are), even ranks set_to_none=False (gradients in the views): each bucket
    is still one op every rank negotiates alike, and the results are the per-gradient path's."""
    runs = pair(opt_cls, **kwargs)
    odd = hvd.rank() % 2 == 1
    train(runs, STEPS, set_to_none=odd)
    report = assert_same(runs)
    used = [b for b in report["buckets"] if not all(m.startswith("extra") for m in b["members"])]
    assert used and all(b["copies"] == 0 for b in report["buckets"]), report
    assert all(b["views"] is not odd for b in used), report


@pytest.mark.parametrize("opt_cls, kwargs", OPTIMIZERS)
def test_accumulation_clipping_and_replaced_grads(opt_cls, kwargs):
    runs = pair(opt_cls, passes=2, **kwargs)

    def replace(step, model):
        for p in model.parameters():  # what some training loops do; the views stay views
            if p.grad is not None:
                p.grad.detach_()
        if step == 3:  # the user's own tensor: accumulated into, then copied into the bucket
            model.fc1.weight.grad = torch.zeros_like(model.fc1.weight)

    copies = []

    def record(step, model, opt):
        if opt is runs[0][1]:
            copies.append(sum(b["copies"] for b in opt.bucket_report()["buckets"]))

    train(runs, STEPS, set_to_none=False, passes=2, clip=True, before_backward=replace,
          after_step=record)
    report = assert_same(runs)
    assert len(bucketed(report)) == 7
    # The replaced gradient shares its bucket with gradients in their views: copied in once.
    assert copies[1:] == [0, 0, 1] + [0] * (STEPS - 4), copies
    assert all(b["views"] for b in report["buckets"]), report


def test_unused_sparse_frozen_and_added():
    runs = pair(torch.optim.SGD, sparse=True, lr=0.1, late=True)

    def change(step, model, opt):
        if step == 2:  # frozen on every rank: the layout is rebuilt without it
            model.fc2.bias.requires_grad_(False)
        if step == 4:  # a parameter added later (named in named_parameters from the start)
            opt.add_param_group({"params": [model.late]})

    def before(step, model):
        if step == 6:  # a sparse gradient in a bucket: the bucket falls back this step
            model.late.grad = (torch.ones(3) * (hvd.rank() + 1)).to_sparse()
        else:
            (model.late * (hvd.rank() + 1)).sum().backward()

    train(runs, STEPS, use_extra=lambda s: hvd.rank() == 0, before_backward=before,
          after_step=change)
    report = assert_same(runs)
    members = bucketed(report)
    assert "emb.weight" not in members and "emb.weight" in report["outside"]
    assert "fc2.bias" not in members and "late" in members and "extra.weight" in members
    sparse = [b for b in report["buckets"] if "late" in b["members"]]
    assert sparse[0]["fallback_steps"] == 1 and "sparse" in sparse[0]["fallback"], sparse
    assert torch.equal(runs[0][0].late, runs[1][0].late)


def test_ready_order_differs_between_ranks():
    torch.manual_seed(3)
    a, b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
    params = list(a.parameters()) + list(b.parameters())
    names = [("a.weight", params[0]), ("a.bias", params[1]), ("b.weight", params[2]),
             ("b.bias", params[3])]
    opt = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.1), named_parameters=names)
    opt._hvd_buckets.threshold = 1 << 20
    for _ in range(3):
        opt.zero_grad()
        x = torch.ones(2, 8)
        first, second = (a, b) if hvd.rank() % 2 == 0 else (b, a)
        first(x).sum().backward()  # this rank's ready order: `first`'s parameters first
        second(x).sum().backward()
        opt.step()
    report = opt.bucket_report()
    layouts = hvd.allgather_object([bk["members"] for bk in report["buckets"]],
                                   name="bucket_views_order")
    assert all(layout == layouts[0] for layout in layouts)
    assert len(layouts[0]) == 1 and layouts[0][0][0].startswith("a.")  # rank 0's order
    assert params[0].grad.data_ptr() != 0


def test_off_switch_and_fallback_reason():
    torch.manual_seed(1)
    model = torch.nn.Linear(4, 4)
    off = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), bucket_view=False)
    model(torch.ones(1, 4)).sum().backward()
    off.step()
    report = off.bucket_report()
    assert report["state"] == "off" and report["buckets"] == []
    assert "bucket_view" in report["reason"]

    model = torch.nn.Linear(4, 4)  # `off` still hooks the first one
    on = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                  named_parameters=model.named_parameters())
    for _ in range(2):
        on.zero_grad()
        model(torch.ones(1, 4)).sum().backward()
        on.step()
    report = on.bucket_report()
    assert report["state"] == "built" and report["reason"] == ""
    assert [b["members"] for b in report["buckets"]] == [["bias", "weight"]]
    # Frozen after zero_grad, before backward: this step goes out gradient by gradient (the
    # reason says why), then the layout is rebuilt without it.
    on.zero_grad()
    model.bias.requires_grad_(False)
    model(torch.ones(1, 4)).sum().backward()
    on.synchronize()
    after = on.bucket_report()
    assert [b["members"] for b in after["buckets"]] == [["weight"]], after
    assert after["outside"] == []
    assert "does not require grad" in after["last_rebuild"], after
    assert "'bias'" in after["last_rebuild"]
    # The name it negotiates under (timeline, stall reports, errors) names its parameters.
    assert after["buckets"][0]["name"].endswith("[weight]"), after
    # Elastic rollback: the step is dropped and the layout observed and agreed again.
    on._hvd_abandon_step()
    assert on.bucket_report()["state"] == "observing"
    for _ in range(2):
        on.zero_grad()
        model(torch.ones(1, 4) * (hvd.rank() + 1)).sum().backward()
        on.step()
    again = on.bucket_report()
    assert again["state"] == "built" and again["last_rebuild"] == "elastic reset"
    assert [b["members"] for b in again["buckets"]] == [["weight"]]
    torch.testing.assert_close(model.weight.grad,
                               torch.full((4, 4), (hvd.size() + 1) / 2))


def test_dtype_change_rebuilds_the_layout():
    """module.double() keeps the parameters and changes their data: the layout's key (read from
    the reducer) changes, the layout is dropped at the next zero_grad() and rebuilt in float64,
    and the reduced gradients stay right."""
    torch.manual_seed(2)
    model = torch.nn.Linear(3, 2)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    layout = opt._hvd_buckets
    for _ in range(2):
        opt.zero_grad()
        model(torch.ones(1, 3)).sum().backward()
        opt.step()
    assert opt.bucket_report()["state"] == "built"
    key = opt._hvd_reducer.layout_key()
    assert key == layout.signature and len(key) == 4 * 2  # four entries per parameter
    model.double()
    assert opt._hvd_reducer.layout_key() != key
    for _ in range(2):
        opt.zero_grad()
        model(torch.ones(1, 3, dtype=torch.float64) * (hvd.rank() + 1)).sum().backward()
        opt.step()
    report = opt.bucket_report()
    assert report["state"] == "built", report
    assert "parameters changed" in report["last_rebuild"], report
    assert [b["bytes"] for b in report["buckets"]] == [8 * (3 * 2 + 2)], report
    assert model.weight.grad.dtype == torch.float64
    torch.testing.assert_close(model.weight.grad,
                               torch.full((2, 3), (hvd.size() + 1) / 2, dtype=torch.float64))


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 16)
        self.fc3 = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.tanh(self.fc1(x)))))


@pytest.mark.parametrize("opt_cls, kwargs", OPTIMIZERS)
def test_torch_compile_trains_as_eager(opt_cls, kwargs):
    """torch.compile(backend="aot_eager": AOTAutograd's forward and backward graphs, run by the
    eager kernels) with bucket views: the compiled backward's gradients accumulate into the
    views (no copies with set_to_none=False), and the parameters are bit-identical to eager
    training with bucket views, and to compiled training without them."""
    import torch._dynamo.testing

    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    runs = {}
    for mode in ("eager", "compiled", "compiled-off"):
        torch.manual_seed(7)
        model = Mlp()
        opt = hvd.DistributedOptimizer(opt_cls(model.parameters(), **kwargs),
                                       named_parameters=model.named_parameters(),
                                       bucket_view=mode != "compiled-off")
        opt._hvd_buckets.threshold = 512
        forward = (model if mode == "eager"
                   else torch.compile(model, backend=counter, fullgraph=True))
        copies = []
        for step in range(5):
            opt.zero_grad(set_to_none=step < 2)
            g = torch.Generator().manual_seed(1000 * step + hvd.rank())
            x, y = torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)
            torch.nn.functional.mse_loss(forward(x), y).backward()
            opt.step()
            copies.append(sum(b["copies"] for b in opt.bucket_report()["buckets"]))
        runs[mode] = (model, opt, copies)
    assert counter.frame_count >= 1  # the forward did run compiled
    eager = dict(runs["eager"][0].named_parameters())
    for mode in ("compiled", "compiled-off"):
        for name, p in runs[mode][0].named_parameters():
            assert torch.equal(p, eager[name]), f"rank {hvd.rank()}: {mode} {name} differs"
    _, opt, copies = runs["compiled"]
    report = opt.bucket_report()
    assert report["state"] == "built" and report["outside"] == [], report
    assert bucketed(report) == set(eager) and len(report["buckets"]) > 1, report
    # Step 0 observes; steps 1-4 copy nothing: with set_to_none=True the gradients are reduced
    # in their own tensors, and set_to_none=False zeroes those in place.
    assert copies == [0, 0, 0, 0, 0], copies
    assert all(b["fallback_steps"] == 0 for b in report["buckets"]), report
    assert runs["compiled-off"][1].bucket_report()["state"] == "off"
    layouts = hvd.allgather_object([b["members"] for b in report["buckets"]],
                                   name=f"bucket_views_compile_{opt_cls.__name__}")
    assert all(layout == layouts[0] for layout in layouts), layouts


@multi_rank
@pytest.mark.parametrize("case", ["extra", "order"])
def test_a_parameter_set_that_differs_between_ranks_is_named_on_every_rank(case):
    """Ranks 1 and up hand the optimizer a different parameter set than rank 0, one the
    per-gradient path cannot tell apart (it negotiates gradients by name, shape and dtype), so
    the first step completes everywhere and the layout agreement is what finds it:

    - extra: one parameter more, in the middle, frozen before the first backward (hooked, so
      it is the optimizer's, but it sends no gradient);
    - order: the same parameters in another order (a layout built from them would put
      different parameters in the same bucket on different ranks).

    Every rank raises the same error naming the parameter and the ranks; the layout is off for
    that optimizer, and a correct model and optimizer train afterwards."""
    torch.manual_seed(4)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    extra = torch.nn.Parameter(torch.ones(3))
    named = [*model.named_parameters(), ("extra", extra)]
    params = list(model.parameters())
    if hvd.rank() >= 1:
        params = params[:2] + [extra] + params[2:] if case == "extra" else params[::-1]
    opt = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.1), named_parameters=named)
    extra.requires_grad_(False)
    model(torch.ones(2, 4)).sum().backward()
    with pytest.raises(hvd.HorovodArgumentError) as info:
        opt.step()
    msg = str(info.value)
    others = list(range(1, hvd.size()))
    if case == "extra":
        want = ("parameter #2 is '1.weight' [2, 4] torch.float32 on rank 0 but 'extra' [3] "
                "torch.float32 on rank 1")
    else:
        want = ("parameter #0 is '0.weight' [4, 4] torch.float32 on rank 0 but '1.bias' [2] "
                "torch.float32 on rank 1")
    assert want in msg and f"(ranks differing from rank 0: {others})" in msg, msg
    assert all(m == msg for m in hvd.allgather_object(msg, name=f"bucket_views_mismatch_{case}"))
    report = opt.bucket_report()
    assert report["state"] == "off" and report["reason"] == msg, report

    torch.manual_seed(4)
    good = torch.nn.Linear(4, 2)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(good.parameters(), lr=0.1),
                                   named_parameters=good.named_parameters())
    for _ in range(2):
        opt.zero_grad()
        good(torch.ones(1, 4) * (hvd.rank() + 1)).sum().backward()
        opt.step()
    assert opt.bucket_report()["state"] == "built"
    torch.testing.assert_close(good.weight.grad, torch.full((2, 4), (hvd.size() + 1) / 2))


@multi_rank
@pytest.mark.parametrize("case", ["frozen", "sparse"])
def test_a_bucket_member_that_cannot_join_on_one_rank_is_named_on_every_rank(case):
    """After the layout is built, rank 1 alone freezes a bucket member (before zero_grad, so
    its layout check sees it first) or hands one a sparse gradient (before backward, as a
    user's own gradient). The other ranks send the bucket whole; rank 1 cannot. Whether a
    bucket goes out whole or member by member is one decision of all ranks: every rank raises,
    naming the parameter and the ranks, instead of waiting for names the others never send.
    Then the ranks agree again and train on."""
    torch.manual_seed(5)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    model.given = torch.nn.Parameter(torch.zeros(3))  # its gradient is set by hand
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    x = torch.ones(2, 4) * (hvd.rank() + 1)

    def backward(sparse=False):
        given = torch.ones(3) * (hvd.rank() + 1)
        model.given.grad = given.to_sparse() if sparse else given
        model(x).sum().backward()

    for _ in range(2):
        opt.zero_grad()
        backward()
        opt.step()
    assert opt.bucket_report()["state"] == "built"
    member = model[1].bias if case == "frozen" else model.given
    name = "1.bias" if case == "frozen" else "given"
    if case == "frozen" and hvd.rank() == 1:
        member.requires_grad_(False)
    opt.zero_grad()
    backward(sparse=case == "sparse" and hvd.rank() == 1)
    with pytest.raises(hvd.HorovodInternalError) as info:
        opt.step()
    msg = str(info.value)
    assert f"rank 1: parameter '{name}'" in msg, msg
    why = "does not require grad" if case == "frozen" else "has a sparse gradient"
    assert (f"'{name}' {why}" in msg) == (hvd.rank() == 1), msg  # only rank 1 knows why
    # The process keeps working: the ranks agree again, and the layout follows.
    member.requires_grad_(True)
    for step in range(3):
        reference = copy.deepcopy(model)
        opt.zero_grad()
        backward()
        reference.given.grad = model.given.grad.clone()
        opt.synchronize()
        reference(x).sum().backward()  # this rank's gradients, averaged by hand
        for k, (p, q) in enumerate(zip(model.parameters(), reference.parameters())):
            want = hvd.allreduce(q.grad, name=f"bucket_member_{case}_{step}_{k}")
            torch.testing.assert_close(p.grad, want)
        with opt.skip_synchronize():
            opt.step()
    assert opt.bucket_report()["state"] == "built"
    weights = hvd.allgather_object([p.detach().clone() for p in model.parameters()],
                                   name=f"bucket_member_after_{case}")
    assert all(torch.equal(a, b) for w in weights for a, b in zip(w, weights[0]))


@pytest.mark.parametrize("bucket_view", [True, False], ids=["buckets", "per-gradient"])
def test_a_gradient_replaced_or_changed_while_in_flight_is_named(bucket_view):
    """``p.grad = t`` (or ``p.grad.data = t``) after backward sent the gradient: the average
    goes into the tensor that was sent, p.grad keeps the user's value; changed in place
    meanwhile (scaler.unscale_ before synchronize()): a race with the average. Misuses, as in
    Horovod, but they used to pass silently; now every step that does one warns, naming the
    parameter and the rank. Steps that change gradients after synchronize() do not warn."""
    import warnings

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   bucket_view=bucket_view, backward_passes_per_step=1)

    def backward():
        opt.zero_grad()
        model(torch.ones(3, 4) * (hvd.rank() + 1)).sum().backward()

    for _ in range(2):  # the first step builds the bucket layout
        backward()
        opt.step()
    backward()
    replaced = model[1].weight.grad.clone()
    model[1].weight.grad = replaced
    with pytest.warns(RuntimeWarning, match=rf"rank {hvd.rank()}: the gradient of 1 "
                                            r"parameter\(s\) \('1.weight'\) was replaced"):
        opt.synchronize()
    assert model[1].weight.grad is replaced
    with opt.skip_synchronize():
        opt.step()
    backward()
    model[1].weight.grad.data = model[1].weight.grad.data.clone()
    with pytest.warns(RuntimeWarning, match=r"'1.weight'"):
        opt.step()
    backward()
    model[0].bias.grad.mul_(0.5)  # scaler.unscale_ before synchronize() does this
    with pytest.warns(RuntimeWarning, match=rf"rank {hvd.rank()}: the gradient of 1 "
                                            r"parameter\(s\) \('0.bias'\) was changed in place"):
        opt.step()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        backward()
        opt.synchronize()
        model[0].bias.grad.mul_(0.5)  # in place after synchronize: fine
        model[0].bias.grad = model[0].bias.grad * 2  # after synchronize: fine
        with opt.skip_synchronize():
            opt.step()
