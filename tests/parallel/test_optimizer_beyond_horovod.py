"""Cases where Horovod's DistributedOptimizer fails or needs workarounds, and ours must not:
several optimizers without name prefixes (GAN), requires_grad toggled between steps, parameters
unused on some ranks, an epoch ending mid-accumulation, GradScaler + gradient clipping, and an
optimizer over a subset of the ranks.

Each test trains both the distributed optimizer (rank r on its shard of a global batch of 12) and
a plain single-process reference on the whole batch, and compares parameters after every step.
"""

import os
import re

import pytest
import torch
import torch.nn.functional as F

import horovodlite.torch as hvd

# For the process-set test; read by hvd.init() in conftest, after this module is imported.
os.environ["HOROVOD_DYNAMIC_PROCESS_SETS"] = "1"

GLOBAL_BATCH = 12


def mlp(seed, sizes=(4, 6, 3)):
    torch.manual_seed(seed)
    layers = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers[:-1]).double()


def data(seed, steps, width=4, out=3):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(steps, GLOBAL_BATCH, width, generator=g, dtype=torch.float64),
            torch.randn(steps, GLOBAL_BATCH, out, generator=g, dtype=torch.float64))


def shard(t, n=None, r=None):
    n = hvd.size() if n is None else n
    r = hvd.rank() if r is None else r
    per = t.shape[0] // n
    return t[r * per:(r + 1) * per]


def assert_same(model, reference, tol=1e-10, what=""):
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=tol, atol=tol,
                                   msg=lambda m, name=name: f"rank {hvd.rank()} {what} {name}: {m}")


def sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=0.01)


# ------------------------------------------------------------------------------------- GAN


@pytest.mark.parametrize("named", [False, True])
def test_two_optimizers_without_name_prefixes(named):
    """Generator and discriminator have identical parameter names ("0.weight", ...) and both
    backward before either steps, so both optimizers have allreduces in flight at once."""
    z, real = data(5, 3, width=4, out=4)
    gen, disc = mlp(1, (4, 5, 4)), mlp(2, (4, 5, 1))
    ref_gen, ref_disc = mlp(1, (4, 5, 4)), mlp(2, (4, 5, 1))
    kw = lambda m: {"named_parameters": m.named_parameters()} if named else {}
    opt_g = hvd.DistributedOptimizer(torch.optim.Adam(gen.parameters(), lr=0.01), **kw(gen))
    opt_d = hvd.DistributedOptimizer(sgd(disc.parameters()), **kw(disc))
    ref_g = torch.optim.Adam(ref_gen.parameters(), lr=0.01)
    ref_d = sgd(ref_disc.parameters())

    def gan_loss(g, d, zs, xs):  # a mean over samples, so shard gradients average exactly
        return ((d(g(zs)) - d(xs)) ** 2).mean() + g(zs).pow(2).mean()

    for s in range(3):
        for o in (opt_g, opt_d, ref_g, ref_d):
            o.zero_grad()
        gan_loss(gen, disc, shard(z[s]), shard(real[s])).backward()
        gan_loss(ref_gen, ref_disc, z[s], real[s]).backward()
        for o in (opt_g, opt_d, ref_g, ref_d):
            o.step()
        assert_same(gen, ref_gen, what=f"generator step {s}")
        assert_same(disc, ref_disc, what=f"discriminator step {s}")
    names_g = {opt_g._hvd_wire_name(p) for p in gen.parameters()}
    names_d = {opt_d._hvd_wire_name(p) for p in disc.parameters()}
    assert not names_g & names_d


# -------------------------------------------------------------------- requires_grad toggles


def test_requires_grad_toggled_between_steps():
    """Layer 0 is frozen at step 1 and unfrozen at step 2; layer 2 starts frozen (no hook at
    construction) and is unfrozen at step 1. A frozen parameter must not move: with momentum and
    weight decay, a zero gradient (what Horovod feeds it) would move it."""
    x, y = data(7, 4)
    model, reference = mlp(3), mlp(3)
    for m in (model, reference):
        m[2].weight.requires_grad_(False)
    opt = hvd.DistributedOptimizer(sgd(model.parameters()),
                                   named_parameters=model.named_parameters())
    ref_opt = sgd(reference.parameters())
    plan = {1: [(0, False), (2, True)], 2: [(0, True)]}
    for s in range(4):
        opt.zero_grad()
        ref_opt.zero_grad()
        # Toggled after zero_grad(): layer 2 gets no hook before this step's backward, so
        # synchronize() must find and reduce it; it is hooked from the next step on.
        for layer, flag in plan.get(s, []):
            model[layer].weight.requires_grad_(flag)
            reference[layer].weight.requires_grad_(flag)
        before = model[0].weight.detach().clone()
        F.mse_loss(model(shard(x[s])), shard(y[s])).backward()
        F.mse_loss(reference(x[s]), y[s]).backward()
        opt.step()
        ref_opt.step()
        assert_same(model, reference, what=f"step {s}")
        if s == 1:
            assert torch.equal(model[0].weight, before), "a frozen parameter moved"
        assert (model[2].weight in opt._hvd_hooks) == (s >= 1)


# ------------------------------------------------------------------- unused on some ranks


def branchy(seed):
    torch.manual_seed(seed)
    return torch.nn.ModuleDict({"trunk": torch.nn.Linear(4, 3), "odd": torch.nn.Linear(3, 3),
                                "never": torch.nn.Linear(3, 3)}).double()


def branchy_loss(model, rank, x, y):
    h = model["trunk"](x)
    if rank % 2 == 1:  # only odd ranks use this branch
        h = model["odd"](torch.tanh(h))
    return F.mse_loss(h, y)


@pytest.mark.parametrize("groups", [None, "mixed"])
def test_parameters_unused_on_some_ranks_are_still_reduced(groups):
    n = hvd.size()
    x, y = data(9, 1)
    x, y = x[0], y[0]
    model = branchy(4)
    grouping = None
    if groups == "mixed":  # one group mixing a used, a sometimes-used and an unused parameter
        grouping = [[model["trunk"].weight, model["odd"].weight, model["never"].bias]]
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), groups=grouping)
    branchy_loss(model, hvd.rank(), shard(x), shard(y)).backward()
    opt.synchronize()
    expected = {name: torch.zeros_like(p) for name, p in model.named_parameters()}
    for r in range(n):
        ref = branchy(4)
        branchy_loss(ref, r, shard(x, n, r), shard(y, n, r)).backward()
        for name, p in ref.named_parameters():
            if p.grad is not None:
                expected[name] += p.grad / n
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], msg=f"rank {hvd.rank()} {name}")
    with opt.skip_synchronize():
        opt.step()


# ------------------------------------------------------------- epoch end mid-accumulation


def run_epochs(model, opt, x, y, passes, end_of_epoch, distributed):
    """Two epochs of 4 micro-batches with ``passes`` accumulated per step; the last step of an
    epoch is partial. ``end_of_epoch``: "step" (apply the partial sum) or "drop" (discard)."""
    for _epoch in range(2):
        for i in range(4):
            xs, ys = (shard(x[i]), shard(y[i])) if distributed else (x[i], y[i])
            (F.mse_loss(model(xs), ys) / passes).backward()
            if (i + 1) % passes == 0:
                opt.step()
                opt.zero_grad()
        if end_of_epoch == "step":
            opt.step()
        elif distributed:  # the documented way to drop a partial accumulation
            opt.synchronize()
        opt.zero_grad()


@pytest.mark.parametrize("end_of_epoch", ["step", "drop"])
def test_epoch_ending_mid_accumulation(end_of_epoch):
    x, y = data(11, 4)
    model, reference = mlp(6), mlp(6)
    opt = hvd.DistributedOptimizer(sgd(model.parameters()), backward_passes_per_step=3)
    run_epochs(model, opt, x, y, 3, end_of_epoch, True)
    run_epochs(reference, sgd(reference.parameters()), x, y, 3, end_of_epoch, False)
    assert_same(model, reference)


def test_zero_grad_without_step_drops_a_partial_accumulation():
    """With no allreduce launched yet (1 of 3 passes), zero_grad() simply restarts the count."""
    x, y = data(12, 4)
    model, reference = mlp(8), mlp(8)
    opt = hvd.DistributedOptimizer(sgd(model.parameters()), backward_passes_per_step=3)
    ref_opt = sgd(reference.parameters())
    F.mse_loss(model(shard(x[0])), shard(y[0])).backward()
    opt.zero_grad()
    ref_opt.zero_grad()
    for i in range(1, 4):
        F.mse_loss(model(shard(x[i])), shard(y[i])).backward()
        F.mse_loss(reference(x[i]), y[i]).backward()
    opt.step()
    ref_opt.step()
    assert_same(model, reference)


# ------------------------------------------------------------- GradScaler + gradient clip


def scaled_step(model, opt, scaler, x, y, distributed):
    """The documented pattern: reduce first, then unscale and clip the reduced gradients."""
    opt.zero_grad()
    scaler.scale(F.mse_loss(model(x), y)).backward()
    if distributed:
        opt.synchronize()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
    if distributed:
        with opt.skip_synchronize():
            scaler.step(opt)
    else:
        scaler.step(opt)
    scaler.update()


def test_grad_scaler_and_clip_grad_norm():
    x, y = data(13, 4)
    model, reference = mlp(9), mlp(9)
    opt = hvd.DistributedOptimizer(sgd(model.parameters()))
    ref_opt = sgd(reference.parameters())
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    ref_scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    for s in range(3):
        scaled_step(model, opt, scaler, shard(x[s]), shard(y[s]), True)
        scaled_step(reference, ref_opt, ref_scaler, x[s], y[s], False)
        assert_same(model, reference, what=f"step {s}")
    # An overflow on rank 0 alone reaches every rank through the allreduce: all skip the step
    # and halve their scale, so the replicas stay identical.
    before = [p.detach().clone() for p in model.parameters()]
    bad_y = shard(y[3]).clone()
    if hvd.rank() == 0:
        bad_y[0, 0] = float("inf")
    scaled_step(model, opt, scaler, shard(x[3]), bad_y, True)
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    scales = hvd.allgather_object(scaler.get_scale())
    assert scales == [2.0 ** 9] * hvd.size()


# ------------------------------------------------------------------------- process sets


def test_optimizer_over_a_process_set():
    n, r = hvd.size(), hvd.rank()
    members = list(range(0, n, 2))  # 0 / 0 / 0,2 at np 1 / 2 / 3
    hvd.shutdown()
    hvd.init(process_sets="dynamic")
    ps = hvd.add_process_set(members) if n > 1 else hvd.global_process_set
    x, y = data(14, 2)
    model = mlp(10)
    if r not in members:
        # as in Horovod: this rank trains on its own gradients, without communication
        opt = hvd.DistributedOptimizer(sgd(model.parameters()), process_set=ps)
        assert isinstance(opt, torch.optim.SGD)
        reference = mlp(10)
        ref_opt = sgd(reference.parameters())
        for s in range(2):
            for o in (opt, ref_opt):
                o.zero_grad()
            for m in (model, reference):
                F.mse_loss(m(x[s]), y[s]).backward()
            opt.synchronize()  # a no-op here
            with opt.skip_synchronize():
                opt.step()
            ref_opt.step()
        assert_same(model, reference)
    else:
        opt = hvd.DistributedOptimizer(sgd(model.parameters()), process_set=ps)
        k, me = len(members), members.index(r)
        reference = mlp(10)
        ref_opt = sgd(reference.parameters())
        for s in range(2):
            for o in (opt, ref_opt):
                o.zero_grad()
            F.mse_loss(model(shard(x[s], k, me)), shard(y[s], k, me)).backward()
            F.mse_loss(reference(x[s]), y[s]).backward()
            opt.step()
            ref_opt.step()
        assert_same(model, reference)
    if n > 1:
        hvd.remove_process_set(ps)
    hvd.shutdown()
    hvd.init()


# --------------------------------------------------------------- a parameter no rank uses


class WithSpare(torch.nn.Module):
    """An MLP and a layer that no rank uses in forward (in the optimizer all the same)."""

    def __init__(self, seed):
        super().__init__()
        self.net = mlp(seed)
        torch.manual_seed(seed + 100)
        self.spare = torch.nn.Linear(3, 3).double()

    def forward(self, x):
        return self.net(x)


@pytest.mark.parametrize("bucket_view", [True, False], ids=["buckets", "per-gradient"])
@pytest.mark.parametrize("set_to_none", [True, False], ids=["to-none", "to-zero"])
@pytest.mark.parametrize("passes", [1, 2])
def test_find_unused_parameters_leaves_a_parameter_no_rank_used_alone(bucket_view, set_to_none,
                                                                      passes):
    """find_unused_parameters=True (DDP's option): the ranks agree which parameters no rank
    gave a gradient; those keep .grad None and AdamW's weight decay does not move them, as in
    one process. Without it (Horovod's behaviour) they get zeros and decay."""
    x, y = data(11, 4)
    model, plain, reference = WithSpare(4), WithSpare(4), WithSpare(4)
    make = lambda m: torch.optim.AdamW(m.parameters(), lr=0.05, weight_decay=0.5)  # noqa: E731
    opt = hvd.DistributedOptimizer(make(model), named_parameters=model.named_parameters(),
                                   backward_passes_per_step=passes, bucket_view=bucket_view,
                                   find_unused_parameters=True)
    horovod = hvd.DistributedOptimizer(make(plain), named_parameters=plain.named_parameters(),
                                       backward_passes_per_step=passes, bucket_view=bucket_view)
    ref_opt = make(reference)
    for s in range(4):
        for o in (opt, horovod, ref_opt):
            o.zero_grad(set_to_none=set_to_none)
        for m in (model, plain):
            for half in range(passes):  # each pass a half of this rank's shard, summed
                xs, ys = shard(x[s]), shard(y[s])
                rows = slice(half * len(xs) // passes, (half + 1) * len(xs) // passes)
                (F.mse_loss(m(xs[rows]), ys[rows], reduction="sum") / GLOBAL_BATCH).backward()
        (F.mse_loss(reference(x[s]), y[s], reduction="sum") / GLOBAL_BATCH / hvd.size()).backward()
        for o in (opt, horovod, ref_opt):
            o.step()
        assert model.spare.weight.grad is None, hvd.rank()
        assert_same(model, reference, what=f"step {s}")
    # Horovod's way: the spare layer got zeros and decayed (that is why the option exists)
    assert not torch.equal(plain.spare.weight, reference.spare.weight)


def test_find_unused_parameters_is_refused_where_it_does_not_apply():
    model = torch.nn.Linear(2, 2)
    for kw, named in [({"shard": "optimizer_state"}, "shard='optimizer_state'"),
                      ({"op": hvd.Adasum}, "op=hvd.Adasum")]:
        with pytest.raises(hvd.HorovodArgumentError, match=f"find_unused_parameters=True does "
                                                            f"not combine with {re.escape(named)}"):
            hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     find_unused_parameters=True, **kw)
    with pytest.raises(hvd.HorovodArgumentError, match="must be a bool"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 find_unused_parameters="yes")
