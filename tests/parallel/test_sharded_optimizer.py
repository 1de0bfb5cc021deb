"""DistributedOptimizer(shard=...) (issue 47) against the unsharded DistributedOptimizer, on every
rank, in the same process: the same model, data and steps through both, then the parameters and
the full optimizer state compared.

Every step has a global batch of 24 rows; rank r trains on its contiguous 24/size rows. Models
are float64 unless a case needs float32 (GradScaler). The sharded run's arithmetic per element is
the unsharded run's, so parameters agree to rounding of the reductions (checked to 1e-12
relative in float64). With the default collectives (an allreduce) the gradients are summed as
the unsharded optimizer sums them and every rank holds the whole reduced gradient, so float32
training, clipped or not, gives the very same bits; a reducescatter sums in another order, so
it agrees to 1e-9 in float64.
"""

import copy
import math

import pytest
import torch
import torch.nn.functional as F

import horovodlite.torch as hvd

GLOBAL_BATCH = 24
STEPS = 4
MODES = ["optimizer_state", "gradients"]
OPTIMIZERS = {
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=1e-3,
                                               nesterov=True),
    "adam": lambda ps: torch.optim.Adam(ps, lr=0.01, amsgrad=True),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1),
}


def make_model(seed=0, dtype=torch.float64):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 6),
                               torch.nn.Tanh(), torch.nn.Linear(6, 3)).to(dtype)


def make_data(seed=1, steps=STEPS, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(steps, GLOBAL_BATCH, 5, generator=g, dtype=dtype)
    y = torch.randn(steps, GLOBAL_BATCH, 3, generator=g, dtype=dtype)
    return x, y


def shard(t):
    per = GLOBAL_BATCH // hvd.size()
    return t[hvd.rank() * per:(hvd.rank() + 1) * per]


def wrap(opt, model, shard_mode, **kwargs):
    return hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                    shard=shard_mode, **kwargs)


def assert_same(model, reference, rtol=1e-12, atol=1e-14, what=""):
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(
            p, q, rtol=rtol, atol=atol,
            msg=lambda m, name=name: f"rank {hvd.rank()} {what} {name}: {m}")


def assert_same_state(a, b, rtol=1e-12, atol=1e-14):
    assert a["param_groups"] == b["param_groups"], f"rank {hvd.rank()}"
    assert sorted(a["state"]) == sorted(b["state"]), f"rank {hvd.rank()}"
    for i in a["state"]:
        assert sorted(a["state"][i]) == sorted(b["state"][i])
        for key, value in a["state"][i].items():
            torch.testing.assert_close(value, b["state"][i][key], rtol=rtol, atol=atol,
                                       msg=lambda m, i=i, key=key: f"rank {hvd.rank()} "
                                       f"state[{i}][{key}]: {m}")


def train_pair(opt_name, mode, steps=STEPS, clip=None, passes=1, each_step=None):
    """The same training through the unsharded and the sharded optimizer; returns both
    (model, optimizer) pairs."""
    x, y = make_data(steps=steps)
    runs = []
    for shard_mode in (None, mode):
        model = make_model()
        opt = wrap(OPTIMIZERS[opt_name](model.parameters()), model, shard_mode,
                   backward_passes_per_step=passes)
        for s in range(steps):
            if each_step is not None:
                each_step(s, model, opt)
            opt.zero_grad()
            for xm, ym in zip(shard(x[s]).chunk(passes), shard(y[s]).chunk(passes)):
                (F.mse_loss(model(xm), ym) / passes).backward()
            if clip is None:
                opt.step()
            elif shard_mode is None:
                opt.synchronize()
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
                with opt.skip_synchronize():
                    opt.step()
            else:
                opt.synchronize()
                opt.clip_grad_norm_(clip)
                opt.step()
        runs.append((model, opt))
    return runs


@pytest.mark.parametrize("wire", ["allreduce", "reducescatter"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
def test_equals_unsharded(opt_name, mode, wire, monkeypatch):
    monkeypatch.setenv("HOROVOD_SHARDED_COLLECTIVES", wire)
    (ref, ref_opt), (model, opt) = train_pair(opt_name, mode)
    assert_same(model, ref, what=f"{opt_name}/{mode}")
    # The full state is torch's format, equal to the unsharded optimizer's.
    assert_same_state(opt.state_dict(), ref_opt.state_dict())


@pytest.mark.parametrize("mode", MODES)
def test_float32_adam_is_bit_identical(mode):
    """With the default collective the gradients are summed in the unsharded optimizer's order
    at every rank count (from 3 ranks on, each parameter's range goes out as a tensor of its
    own), and each rank's slice of Adam runs torch's arithmetic: 20 float32 steps give the very
    same bits."""
    x, y = make_data(steps=20, dtype=torch.float32)
    runs = []
    for shard_mode in (None, mode):
        model = make_model(dtype=torch.float32)
        opt = wrap(torch.optim.Adam(model.parameters(), lr=0.01), model, shard_mode)
        for s in range(20):
            opt.zero_grad()
            F.mse_loss(model(shard(x[s])), shard(y[s])).backward()
            opt.step()
        runs.append(model)
    for (name, p), q in zip(runs[1].named_parameters(), runs[0].parameters()):
        assert torch.equal(p, q), (name, (p - q).abs().max().item())


@pytest.mark.parametrize("wire", ["allreduce", "reducescatter"])
@pytest.mark.parametrize("mode", MODES)
def test_clipping_and_accumulation(mode, wire, monkeypatch):
    monkeypatch.setenv("HOROVOD_SHARDED_COLLECTIVES", wire)
    (ref, _), (model, _) = train_pair("adam", mode, clip=0.05, passes=2)
    if wire == "allreduce":
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            assert torch.equal(p, q), (hvd.rank(), name, (p - q).abs().max().item())
    else:  # another order of addition
        assert_same(model, ref, rtol=1e-9, atol=1e-11, what="clip+passes")


def train_clipped(shard_mode, opt_name, norm_type, steps=20, torch_clip=False):
    """float32 training clipped at 0.05 after ``synchronize()``: the unsharded optimizer with
    torch.nn.utils.clip_grad_norm_, the sharded one with ``opt.clip_grad_norm_`` (or, with
    ``torch_clip``, torch's on the parameters too). Returns the model and the norms returned."""
    x, y = make_data(steps=steps, dtype=torch.float32)
    model = make_model(dtype=torch.float32)
    opt = wrap(OPTIMIZERS[opt_name](model.parameters()), model, shard_mode)
    norms = []
    for s in range(steps):
        opt.zero_grad()
        F.mse_loss(model(shard(x[s])), shard(y[s])).backward()
        opt.synchronize()
        if shard_mode is None or torch_clip:
            norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05, norm_type))
        else:
            norms.append(opt.clip_grad_norm_(0.05, norm_type=norm_type))
        with opt.skip_synchronize():
            opt.step()
    return model, torch.stack(norms)


@pytest.mark.parametrize("norm_type", [2.0, math.inf, 1.0])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("opt_name", ["adam", "sgd_momentum"])
def test_clipping_is_bit_identical(opt_name, mode, norm_type):
    """Default collectives: opt.clip_grad_norm_ returns torch's norm on every rank and clips as
    torch does, so 20 float32 steps give the very same bits: after synchronize() every rank
    holds the whole reduced gradient, whatever the shard mode."""
    ref, ref_norms = train_clipped(None, opt_name, norm_type)
    model, norms = train_clipped(mode, opt_name, norm_type)
    assert (ref_norms > 0.05).any(), f"nothing was clipped: {ref_norms}"
    assert norms.dtype == ref_norms.dtype == torch.float32
    every = hvd.allgather(norms.unsqueeze(0), name="shard.clip.norms")
    assert (every == every[0]).all(), f"rank {hvd.rank()}: norms differ across ranks {every}"
    assert torch.equal(norms, ref_norms), (hvd.rank(), (norms - ref_norms).abs().max().item())
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert torch.equal(p, q), (hvd.rank(), name, (p - q).abs().max().item())


@pytest.mark.parametrize("mode", MODES)
def test_torch_clip_on_the_parameters_is_exact(mode):
    """After synchronize() the .grad of the parameters hold the whole reduced gradient, with
    either shard mode, so torch's own clip_grad_norm_ on model.parameters() (Horovod's recipe)
    works unchanged. shard="gradients" used to keep only the parameters crossing this rank's
    range: torch's clip took a rank-local norm and each rank clipped by another factor."""
    ref, ref_norms = train_clipped(None, "adam", 2.0)
    model, norms = train_clipped(mode, "adam", 2.0, torch_clip=True)
    assert torch.equal(norms, ref_norms)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert torch.equal(p, q), (hvd.rank(), name, (p - q).abs().max().item())


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("wire", ["allreduce", "reducescatter"])
def test_where_the_reduced_gradient_lives(wire, mode, monkeypatch):
    """After synchronize(), .grad holds the unsharded optimizer's whole reduced gradient on
    every rank, the same bits on every rank, whatever the shard mode and collectives: over the
    allreduce the unsharded optimizer's bits; over the reducescatter (another order of
    addition) close to them. A second synchronize() reduces nothing again (op=Sum would show
    it), and step() frees it with shard="gradients"."""
    monkeypatch.setenv("HOROVOD_SHARDED_COLLECTIVES", wire)
    x, y = make_data(steps=1, dtype=torch.float32)
    grads = []
    for shard_mode in (None, mode):
        model = make_model(dtype=torch.float32)
        opt = wrap(torch.optim.Adam(model.parameters()), model, shard_mode, op=hvd.Sum)
        opt.zero_grad()
        F.mse_loss(model(shard(x[0])), shard(y[0])).backward()
        opt.synchronize()
        if shard_mode is not None:
            opt.synchronize()
        grads.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
        if shard_mode is not None:
            with opt.skip_synchronize():
                opt.step()
            if mode == "gradients":
                assert all(p.grad is None for p in model.parameters()), hvd.rank()
    ref, got = grads
    if wire == "allreduce":
        assert torch.equal(got, ref), (hvd.rank(), (got - ref).abs().max().item())
    else:
        torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-7)
    every = hvd.allgather(got.unsqueeze(0), name=f"shard.whole.{wire}.{mode}")
    assert (every == every[0]).all(), f"rank {hvd.rank()}: the ranks' gradients differ"


CLIP = 0.05


def inf_at_origin(grad):
    grad = grad.clone()
    grad[0, 0] = float("inf")
    return grad


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("mode", MODES)
def test_grad_scaler_skips_on_every_rank(mode, fused):
    """An inf in one element of one rank's gradient: after synchronize() every rank's .grad
    holds the whole reduced gradient, so every rank's scaler sees the inf, skips the step and
    backs off the scale alike, as with the unsharded optimizer - bit-identical to it. A fused
    Adam takes GradScaler's other path (the optimizer skips, told by ``found_inf``): the inner
    optimizer that steps the shards must be told too, or the step writes NaN into every
    weight."""
    x, y = make_data(dtype=torch.float32)
    results = []
    for shard_mode in (None, mode):
        model = make_model(dtype=torch.float32)
        opt = wrap(torch.optim.Adam(model.parameters(), lr=0.01, fused=fused), model,
                   shard_mode)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=1)
        scales = []
        for s in range(STEPS):
            opt.zero_grad()
            poison = None
            if s == 1 and hvd.rank() == hvd.size() - 1:
                # as backward produces it: the sharded optimizer takes each gradient then
                poison = model[0].weight.register_hook(inf_at_origin)
            scaler.scale(F.mse_loss(model(shard(x[s])), shard(y[s]))).backward()
            if poison is not None:
                poison.remove()
            opt.synchronize()
            assert all(p.grad is not None for p in model.parameters()), hvd.rank()
            scaler.unscale_(opt)
            # clipped after unscale_, as torch's AMP recipe does: the norm is of the unscaled
            # gradient
            if shard_mode is None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            else:
                opt.clip_grad_norm_(CLIP)
            with opt.skip_synchronize():
                scaler.step(opt)
            scaler.update()
            scales.append(scaler.get_scale())
        results.append((model, scales))
    (ref, ref_scales), (model, scales) = results
    assert scales == ref_scales, f"rank {hvd.rank()}: {scales} != {ref_scales}"
    assert scales[1] < scales[0], f"rank {hvd.rank()}: step 1 was not skipped: {scales}"
    gathered = hvd.allgather(torch.tensor([scales], dtype=torch.float64), name="shard.scales")
    assert (gathered == gathered[0]).all(), f"rank {hvd.rank()}: scales differ {gathered}"
    assert_same(model, ref, rtol=0, atol=0, what="GradScaler")  # bit-identical


@pytest.mark.parametrize("mode", [None, *MODES])
def test_a_fused_scaler_step_without_synchronize_is_refused(mode):
    """With a fused optimizer GradScaler checks .grad for inf/nan itself before step(): without
    synchronize() that is this rank's own gradient, so a rank overflowing alone would skip the
    step the others take. Refused on every rank, naming the recipe; the recipe then works."""
    x, y = make_data(steps=2, dtype=torch.float32)
    model = make_model(dtype=torch.float32)
    opt = wrap(torch.optim.Adam(model.parameters(), lr=0.01, fused=True), model, mode)
    scaler = torch.amp.GradScaler("cpu")
    opt.zero_grad()
    scaler.scale(F.mse_loss(model(shard(x[0])), shard(y[0]))).backward()
    with pytest.raises(ValueError, match=r"without optimizer.synchronize\(\) first"):
        scaler.step(opt)
    opt.synchronize()  # what was in flight ends; then the recipe
    scaler = torch.amp.GradScaler("cpu")
    opt.zero_grad()
    scaler.scale(F.mse_loss(model(shard(x[1])), shard(y[1]))).backward()
    opt.synchronize()
    scaler.unscale_(opt)
    with opt.skip_synchronize():
        scaler.step(opt)
    scaler.update()


def train_with_changes(shard_mode, steps=5):
    """Per-group hyperparameters, an LR scheduler, a layer frozen and unfrozen, a parameter
    used on rank 0 only, one used nowhere, and a param group added at step 2."""
    x, y = make_data(steps=steps)
    model = make_model()
    torch.manual_seed(5)
    extra = torch.nn.Parameter(torch.randn(3, dtype=torch.float64))
    unused = torch.nn.Parameter(torch.randn(4, dtype=torch.float64))
    named = [*model.named_parameters(), ("extra", extra), ("unused", unused)]
    base = torch.optim.Adam([{"params": [*model[0].parameters(), unused], "lr": 0.02},
                             {"params": [*model[2].parameters(), extra], "lr": 0.005,
                              "betas": (0.8, 0.99)}], lr=0.01, weight_decay=1e-2)
    opt = hvd.DistributedOptimizer(base, named_parameters=named, shard=shard_mode)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)
    for s in range(steps):
        if s == 1:
            model[2].weight.requires_grad_(False)
        if s == 3:
            model[2].weight.requires_grad_(True)
        if s == 2:
            opt.add_param_group({"params": list(model[4].parameters()), "lr": 0.03})
        opt.zero_grad()
        out = model(shard(x[s]))
        loss = F.mse_loss(out, shard(y[s]))
        if hvd.rank() == 0:
            loss = loss + (extra * out.mean()).sum()
        loss.backward()
        opt.step()
        sched.step()
    return [*model.parameters(), extra, unused], opt


@pytest.mark.parametrize("mode", MODES)
def test_training_changes(mode):
    ref_params, ref_opt = train_with_changes(None)
    params, opt = train_with_changes(mode)
    for i, (p, q) in enumerate(zip(params, ref_params)):
        torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-14,
                                   msg=lambda m, i=i: f"rank {hvd.rank()} param {i}: {m}")
    assert_same_state(opt.state_dict(), ref_opt.state_dict())


def state_bytes(opt):
    return sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values()
               if isinstance(v, torch.Tensor) and v.dim() > 0)


def test_state_bytes_divided_by_ranks():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 33))
    x = torch.randn(4, 64)
    opts = []
    for shard_mode in (None, "optimizer_state"):
        opt = wrap(torch.optim.Adam(model.parameters()), model, shard_mode)
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
        opts.append(opt)
    full, mine = state_bytes(opts[0]), state_bytes(opts[1])
    n = hvd.size()
    assert mine <= 1.05 * full / n, f"rank {hvd.rank()}: {mine} bytes of {full} at np {n}"
    total = hvd.allreduce(torch.tensor([mine], dtype=torch.int64), op=hvd.Sum, name="shard.b")
    # All ranks together hold the state once, plus the padding of one bucket (< n elements).
    assert full <= total.item() < full + 2 * 4 * n, f"rank {hvd.rank()}: {total} vs {full}"


def fresh_sharded(mode="optimizer_state"):
    model = make_model()
    return model, wrap(torch.optim.Adam(model.parameters(), lr=0.01), model, mode)


def continue_training(model, opt, steps=2):
    x, y = make_data(seed=7, steps=steps)
    for s in range(steps):
        opt.zero_grad()
        F.mse_loss(model(shard(x[s])), shard(y[s])).backward()
        opt.step()


def test_checkpoints_round_trip():
    (ref, ref_opt), (model, opt) = train_pair("adam", "gradients")
    full, mine = opt.state_dict(), opt.shard_state_dict()
    # torch's own format: the plain optimizer loads it.
    plain = torch.optim.Adam(make_model().parameters(), lr=0.01)
    plain.load_state_dict(full)
    assert_same_state(plain.state_dict(), ref_opt.state_dict())
    # Each form (ours, this rank's shard, the unsharded optimizer's) loads into a fresh sharded
    # optimizer, which then trains on as the reference does.
    forms = (full, mine, copy.deepcopy(ref_opt.state_dict()))  # torch's does not copy
    continue_training(ref, ref_opt)
    for form in forms:
        m2, o2 = fresh_sharded()
        m2.load_state_dict(model.state_dict())
        o2.load_state_dict(form)
        continue_training(m2, o2)
        assert_same(m2, ref, what="after loading")
    # Horovod's start-of-training pattern: broadcast_optimizer_state, once every rank loaded.
    # Every rank holds its shard of the same state: only rank 0's options travel.
    m4, o4 = fresh_sharded()
    o4.load_state_dict(full)
    if hvd.rank() != 0:
        o4.param_groups[0]["lr"] = 123.0
    hvd.broadcast_optimizer_state(o4, root_rank=0)
    assert o4.param_groups[0]["lr"] == full["param_groups"][0]["lr"], f"rank {hvd.rank()}"
    assert_same_state(o4.state_dict(), full)
    if hvd.size() > 1:  # loaded on one rank only: each rank holds a shard, so refused by all
        m5, o5 = fresh_sharded()
        if hvd.rank() == 0:
            o5.load_state_dict(full)
        with pytest.raises(ValueError, match=r"state differs across ranks \(ranks \[1"):
            hvd.broadcast_optimizer_state(o5, root_rank=0)
    # The shards of all ranks, as a list, load too (the same forms at any number of ranks:
    # test_shard_checkpoints_across_rank_counts).
    shards = hvd.allgather_object(mine, name="shard.ckpt")
    m3, o3 = fresh_sharded()
    m3.load_state_dict(model.state_dict())
    o3.load_state_dict(shards)
    continue_training(m3, o3)
    assert_same(m3, ref, what="after loading all shards")


def test_rank_zero_saves_after_consolidating(monkeypatch):
    """Horovod's checkpoint idiom, ``if hvd.rank() == 0: torch.save(opt.state_dict())``: after
    ``consolidate_state_dict(to=0)`` on every rank, rank 0's state_dict() is the full state
    without communication; another rank's raises, naming the rank that holds it; a step makes
    state_dict() collective again. Called by one rank alone while the others are elsewhere, it
    warns naming the idiom (here the others join after the warning, so nothing hangs)."""
    from horovodlite.torch import sharded_checkpoints

    x, y = make_data(steps=2)
    model = make_model()
    opt = wrap(torch.optim.Adam(model.parameters(), lr=0.01), model, "optimizer_state")

    def train(s):
        opt.zero_grad()
        F.mse_loss(model(shard(x[s])), shard(y[s])).backward()
        opt.step()

    train(0)
    full = opt.state_dict()
    opt.consolidate_state_dict(to=0)
    if hvd.rank() == 0:
        assert_same_state(opt.state_dict(), full)
    else:
        with pytest.raises(ValueError, match="on rank 0, not on this rank"):
            opt.state_dict()
    train(1)
    after = opt.state_dict()  # collective again (a stale consolidation would return `full`)
    assert not torch.equal(after["state"][0]["exp_avg"], full["state"][0]["exp_avg"])
    if hvd.size() == 1:
        return
    monkeypatch.setattr(sharded_checkpoints, "CONSOLIDATE_HINT_SECONDS", 0.5)
    if hvd.rank() == 0:
        with pytest.warns(RuntimeWarning, match=r"rank 0: .*consolidate_state_dict\(to=0\)"):
            opt.state_dict()
    else:
        import time
        time.sleep(2.0)
        opt.state_dict()


def test_bad_input_named_on_every_rank(monkeypatch):
    model = make_model()

    class MyAdam(torch.optim.Adam):
        pass

    for bad in (torch.optim.Adafactor(model.parameters()), MyAdam(model.parameters()),
                torch.optim.LBFGS(model.parameters())):
        with pytest.raises(ValueError, match=type(bad).__qualname__):
            wrap(bad, model, "optimizer_state")
    with pytest.raises(ValueError, match="shard must be None"):
        wrap(torch.optim.SGD(model.parameters(), lr=0.1), model, "zero3")
    with monkeypatch.context() as m:
        m.setenv("HOROVOD_SHARDED_COLLECTIVES", "ring")
        with pytest.raises(ValueError, match="HOROVOD_SHARDED_COLLECTIVES must be one of"):
            wrap(torch.optim.SGD(model.parameters(), lr=0.1), model, "gradients")
    with pytest.raises(ValueError, match="already a sharded DistributedOptimizer"):
        wrap(wrap(torch.optim.SGD(model.parameters(), lr=0.1), model, "gradients"), model,
             "gradients")
    (_, _), (model, opt) = train_pair("adam", "optimizer_state", steps=1)
    state = opt.state_dict()
    state["state"][2]["exp_avg"] = torch.zeros(7, 8, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"exp_avg' of parameter 2\.weight has shape \[7, 8\]"):
        opt.load_state_dict(state)
    if hvd.size() > 1:
        m2, o2 = fresh_sharded()
        alien = dict(opt.shard_state_dict())
        alien["horovodlite_shard"] = {**alien["horovodlite_shard"], "size": hvd.size() + 1}
        with pytest.raises(ValueError, match=f"of {hvd.size() + 1} ranks and this job has"):
            o2.load_state_dict(alien)


@pytest.mark.skipif(hvd.size() < 2, reason="needs a smaller set of ranks to load into")
def test_shard_checkpoints_across_rank_counts():
    """Saved at N ranks, loaded at N - 1 (a process set of the first N - 1 ranks), and back.
    Last in this file: it restarts horovodlite with dynamic process sets."""
    hvd.shutdown()
    hvd.init(process_sets="dynamic")
    n = hvd.size()
    fewer = hvd.add_process_set(list(range(n - 1)))
    (_, ref_opt), (_, opt) = train_pair("adam", "optimizer_state")
    expected = copy.deepcopy(ref_opt.state_dict())
    shards = hvd.allgather_object(opt.shard_state_dict(), name="shard.ckpt.n")
    small = None
    if fewer.included():
        model = make_model()
        o = wrap(torch.optim.Adam(model.parameters()), model, "gradients", process_set=fewer)
        o.load_state_dict(shards)  # n shards into n - 1 ranks
        assert_same_state(o.state_dict(), expected)
        small = o.shard_state_dict()
    small = [s for s in hvd.allgather_object(small, name="shard.ckpt.n1") if s is not None]
    assert [s["horovodlite_shard"]["size"] for s in small] == [n - 1] * (n - 1)
    model, o = fresh_sharded()
    o.load_state_dict(small)  # n - 1 shards into n ranks
    assert_same_state(o.state_dict(), expected)
    hvd.remove_process_set(fewer)
