"""DistributedOptimizer(shard=...) (issue 47) reducing the gradients while backward runs, and
keeping the parameters in its buckets' storage: the allreduces are in flight when backward
returns, no gradient is copied with ``zero_grad(set_to_none=False)``, and the results stay the
unsharded optimizer's (same bits in float32). Every rank asserts."""

import io
import time

import pytest
import torch
import torch.nn.functional as F
from test_sharded_optimizer import (
    MODES,
    assert_same,
    make_data,
    make_model,
    shard,
    train_pair,
    wrap,
)

import horovodlite.torch as hvd
from horovodlite.torch.distributed_optimizer import OutstandingAllreduceError


def backward(model, x, y):
    F.mse_loss(model(shard(x)), shard(y)).backward()


def laid_out(opt) -> int:
    return sum(len(b.params) for b in opt._shard_buckets)


def inside(t, storage) -> bool:
    lo = storage.data_ptr()
    return lo <= t.data_ptr() < lo + storage.numel() * storage.element_size()


@pytest.mark.parametrize("mode", MODES)
def test_backward_starts_every_allreduce(mode):
    model = make_model()
    opt = wrap(torch.optim.Adam(model.parameters(), lr=0.01), model, mode)
    x, y = make_data()
    opt.zero_grad()
    backward(model, x[0], y[0])
    n = laid_out(opt)
    in_flight = sum(map(len, opt._overlap_handles.values()))
    assert len(opt._overlap_started) == n == in_flight, f"rank {hvd.rank()}"
    flats = opt._overlap_flats
    for bi, b in enumerate(opt._shard_buckets):
        for p in b.params:
            if mode == "gradients":  # the gradient tensors backward made are let go already
                assert p.grad is None, f"rank {hvd.rank()}"
            else:  # .grad is its place in the flat gradient being reduced
                assert inside(p.grad, flats[bi]), f"rank {hvd.rank()}"
    opt.step()
    assert not opt._overlap_handles and not opt._overlap_started, f"rank {hvd.rank()}"


def test_no_gradient_copy_after_zero_grad_keeping_tensors():
    """shard="optimizer_state" with zero_grad(set_to_none=False): backward accumulates into the
    flat gradient itself, step after step, and the results are the unsharded optimizer's."""
    x, y = make_data(steps=6, dtype=torch.float32)
    runs = []
    for mode in (None, "optimizer_state"):
        model = make_model(dtype=torch.float32)
        opt = wrap(torch.optim.Adam(model.parameters(), lr=0.01), model, mode)
        places = None
        for s in range(6):
            opt.zero_grad(set_to_none=False)
            backward(model, x[s], y[s])
            if mode is not None and s >= 1:
                now = [p.grad.data_ptr() for p in model.parameters()]
                assert places is None or now == places, f"rank {hvd.rank()} step {s}"
                assert all(inside(p.grad, opt._shard_buckets[0].flat)
                           for p in model.parameters()), f"rank {hvd.rank()}"
                places = now
            opt.step()
        runs.append(model)
    assert_same(runs[1], runs[0], rtol=0, atol=0, what="set_to_none=False")


@pytest.mark.parametrize("mode", MODES)
def test_parameters_live_in_the_buckets(mode):
    """Every parameter's .data is a view of its bucket's storage (the step writes there, no
    copy back); a parameter given new storage (p.data = t) between steps is trained from its
    new values and taken back into the bucket."""

    def replace(s, model, opt):
        if s == 2:
            model[2].weight.data = model[2].weight.detach() * 0.5

    (ref, _), (model, opt) = train_pair("adam", mode, each_step=replace)
    assert_same(model, ref, what="p.data replaced")
    storages = [b.params_flat for b in opt._shard_buckets]
    for name, p in model.named_parameters():
        assert any(inside(p, s) for s in storages), f"rank {hvd.rank()}: {name}"
    model[2].weight.requires_grad_(False)  # leaves the layout at the next step
    opt.zero_grad()
    backward(model, *[t[0] for t in make_data(steps=1)])
    opt.step()
    storages = [b.params_flat for b in opt._shard_buckets]
    assert not any(inside(model[2].weight, s) for s in storages), f"rank {hvd.rank()}"
    assert all(any(inside(p, s) for s in storages)
               for p in model.parameters() if p.requires_grad), f"rank {hvd.rank()}"


def test_misuse_raises_on_every_rank_and_training_goes_on():
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   shard="optimizer_state")
    x, y = make_data()
    opt.zero_grad()
    backward(model, x[0], y[0])
    with pytest.raises(OutstandingAllreduceError, match="zero_grad.*still in flight"):
        opt.zero_grad()
    with pytest.raises(RuntimeError, match=r"parameter '4\.(weight|bias)' received more than "
                                           r"backward_passes_per_step=1"):
        backward(model, x[0], y[0])
    opt.step()  # waits for what the first backward started
    opt.zero_grad()
    backward(model, x[1], y[1])
    opt.step()
    assert not opt._overlap_handles, f"rank {hvd.rank()}"


def test_an_optimizer_built_again_takes_the_hooks_over():
    """A second sharded optimizer over the same model: only it starts allreduces from backward,
    and the first one, stepped no more, leaves nothing in flight."""
    x, y = make_data(dtype=torch.float32)
    ref = make_model(dtype=torch.float32)
    ref_opt = wrap(torch.optim.Adam(ref.parameters(), lr=0.01), ref, None)
    model = make_model(dtype=torch.float32)
    old = wrap(torch.optim.Adam(model.parameters(), lr=0.01), model, "gradients")
    opt = wrap(torch.optim.Adam(model.parameters(), lr=0.01), model, "gradients")
    for s in range(3):
        for m, o in ((ref, ref_opt), (model, opt)):
            o.zero_grad()
            backward(m, x[s], y[s])
            o.step()
        assert not old._overlap_handles, f"rank {hvd.rank()}"
    assert_same(model, ref, rtol=0, atol=0, what="rebuilt")


def slow_first_layer(model, opt):
    """Backward waits before the first layer's gradient until the allreduces of the first
    bucket started have ended, so the first layer's hook finds them ended when it polls."""

    def wait(grad):
        deadline = time.monotonic() + 60
        while (opt._overlap_queue and time.monotonic() < deadline
               and not all(hvd.poll(h) for h in opt._overlap_handles[opt._overlap_queue[0]])):
            time.sleep(0.001)
        return grad

    return model[0].weight.register_hook(wait)


def backward_letting_buckets_end(model, opt, x, y):
    """backward; for a sharded optimizer with slow_first_layer's wait."""
    if not hasattr(opt, "_shard_buckets"):
        return backward(model, x, y)
    wait = slow_first_layer(model, opt)
    try:
        backward(model, x, y)
    finally:
        wait.remove()


@pytest.mark.parametrize("mode", MODES)
def test_small_buckets_same_bits(mode, monkeypatch):
    """Buckets of at most 200 bytes (several per model): float32 Adam gives the unsharded
    optimizer's bits; with shard="gradients" and step() alone, buckets are retired during
    backward from the second step on."""
    monkeypatch.setenv("HOROVOD_SHARDED_BUCKET_BYTES", "200")
    x, y = make_data(steps=6, dtype=torch.float32)
    runs = []
    for shard_mode in (None, mode):
        model = make_model(dtype=torch.float32)
        opt = wrap(torch.optim.Adam(model.parameters(), lr=0.01), model, shard_mode)
        for s in range(6):
            opt.zero_grad()
            backward_letting_buckets_end(model, opt, x[s], y[s])
            if shard_mode is not None:
                assert len(opt._shard_buckets) >= 3, f"rank {hvd.rank()}"
                whole = len(opt._overlap_flats)
                if mode == "gradients" and s >= 1:
                    assert whole < len(opt._shard_buckets), f"rank {hvd.rank()} step {s}"
                else:
                    assert whole == len(opt._shard_buckets), f"rank {hvd.rank()} step {s}"
            opt.step()
        runs.append(model)
    assert_same(runs[1], runs[0], rtol=0, atol=0, what="small buckets")


def test_clipping_after_buckets_were_retired(monkeypatch):
    """shard="gradients": steps with step() alone, then one with synchronize() and clipping
    (its buckets were retired during backward, so the norm comes from the ranks' ranges, in
    float64), then step() alone again: the unsharded optimizer's parameters to 1e-12."""
    monkeypatch.setenv("HOROVOD_SHARDED_BUCKET_BYTES", "200")

    x, y = make_data(steps=4)
    runs = []
    for shard_mode in (None, "gradients"):
        model = make_model()
        opt = wrap(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), model,
                   shard_mode)
        for s in range(4):
            opt.zero_grad()
            backward_letting_buckets_end(model, opt, x[s], y[s])
            if shard_mode is not None and s == 2:
                assert len(opt._overlap_flats) < len(opt._shard_buckets), f"rank {hvd.rank()}"
            if s != 2:
                opt.step()
                continue
            opt.synchronize()
            if shard_mode is None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
                with opt.skip_synchronize():
                    opt.step()
            else:
                opt.clip_grad_norm_(0.05)
                opt.step()
        runs.append(model)
    assert_same(runs[1], runs[0], what="clipped after retiring")


def short_waits(monkeypatch, bucket_bytes: int) -> None:
    """Small buckets, and backward's wait for a bucket given up after 0.5 s instead of 2."""
    from horovodlite.torch import sharded_overlap
    monkeypatch.setattr(sharded_overlap, "WAIT_SECONDS", 0.5)
    monkeypatch.setenv("HOROVOD_SHARDED_BUCKET_BYTES", str(bucket_bytes))


def test_a_layer_used_on_one_rank_with_buckets_retired(monkeypatch):
    """shard="gradients", small buckets, step() alone: a layer used on rank 0 only is started
    by rank 0's hook and by the other ranks' synchronize(); rank 0 waits for it in backward
    and the others for the next bucket, which rank 0 has not reached, until one gives up
    (sharded_overlap.WAIT_SECONDS); the parameters are the unsharded optimizer's."""
    short_waits(monkeypatch, bucket_bytes=80)
    x, y = make_data(steps=4)
    runs = []
    for shard_mode in (None, "gradients"):
        torch.manual_seed(3)
        layers = torch.nn.ModuleList([torch.nn.Linear(5, 5).double() for _ in range(4)])
        side = torch.nn.Linear(5, 5).double()
        params = [*layers.parameters(), *side.parameters()]
        opt = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.1, momentum=0.9),
                                       shard=shard_mode)
        for s in range(4):
            opt.zero_grad()
            h = shard(x[s])
            for layer in layers:
                h = torch.tanh(layer(h))
            if hvd.rank() == 0:
                h = h + side(h)
            F.mse_loss(h[:, :3], shard(y[s])).backward()
            opt.step()
        runs.append(params)
    for p, q in zip(*runs[::-1]):
        torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-14, msg=f"rank {hvd.rank()}")


@pytest.mark.parametrize("limit", ["0", "1", "all"])
def test_backward_waits_while_more_buckets_than_the_limit_are_in_flight(limit, monkeypatch):
    """shard="gradients", step() alone, small buckets: once the previous step taught the
    optimizer to retire buckets during backward, at most HOROVOD_SHARDED_OVERLAP_BUCKETS
    buckets wholly started on this rank are left unretired when each hook returns (0: every
    bucket is retired before backward goes on); the parameters stay the unsharded
    optimizer's."""
    monkeypatch.setenv("HOROVOD_SHARDED_BUCKET_BYTES", "200")
    monkeypatch.setenv("HOROVOD_SHARDED_OVERLAP_BUCKETS", limit)
    x, y = make_data(steps=3)
    runs = []
    for shard_mode in (None, "gradients"):
        model = make_model()
        opt = wrap(torch.optim.Adam(model.parameters(), lr=0.01), model, shard_mode)
        most = []
        if shard_mode:
            def count(p, opt=opt, most=most):
                most.append(len(opt._overlap_queue))
            hooks = [p.register_post_accumulate_grad_hook(count) for p in model.parameters()]
        for s in range(3):
            opt.zero_grad()
            backward(model, x[s], y[s])
            opt.step()
        if shard_mode:
            for h in hooks:
                h.remove()
            assert len(opt._shard_buckets) >= 3, f"rank {hvd.rank()}"
            # the counting hooks run after the optimizer's (registered first), last step only
            last = most[-len(list(model.parameters())):]
            if limit != "all":
                assert max(last) <= int(limit), f"rank {hvd.rank()}: {last}"
        runs.append(model)
    assert_same(runs[1], runs[0], what=f"HOROVOD_SHARDED_OVERLAP_BUCKETS={limit}")


def test_ranks_waiting_for_each_others_unused_layers_stop_waiting(monkeypatch):
    """A layer used on rank 0 only and another on rank 1 only, each its own bucket: a rank's
    backward would wait for a bucket another rank starts only in synchronize(), or only after
    its own wait. A rank stops waiting after sharded_overlap.WAIT_SECONDS with a warning naming
    the bucket, which ends the others' waits, and the step gives the unsharded optimizer's
    parameters."""
    import warnings

    short_waits(monkeypatch, bucket_bytes=120)
    x, y = make_data(steps=3)
    runs = []
    for shard_mode in (None, "gradients"):
        torch.manual_seed(3)
        base = torch.nn.Linear(5, 5).double()
        sides = torch.nn.ModuleList([torch.nn.Linear(5, 5).double() for _ in range(2)])
        params = [*base.parameters(), *sides.parameters()]
        opt = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.1, momentum=0.9),
                                       named_parameters=[("base." + n, p) for n, p in
                                                         base.named_parameters()] +
                                       [("sides." + n, p) for n, p in sides.named_parameters()],
                                       shard=shard_mode)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for s in range(3):  # the second step retires buckets during backward
                opt.zero_grad()
                h = torch.tanh(base(shard(x[s])))
                if hvd.size() > 1 and hvd.rank() < 2:
                    h = h + sides[hvd.rank()](h)
                F.mse_loss(h[:, :3], shard(y[s])).backward()
                opt.step()
        if shard_mode and hvd.size() > 1:
            said = [str(w.message) for w in caught if "backward waited" in str(w.message)]
            assert len(said) <= 1, f"rank {hvd.rank()}: {said}"
            for text in said:
                assert f"rank {hvd.rank()}:" in text, text
                assert "(base." in text or "(sides." in text, text
            # whichever rank gives up first lets the others' waits end
            warned = hvd.allreduce(torch.tensor([float(len(said))]), op=hvd.Sum,
                                   name="overlap.warned")
            assert warned.item() >= 1, f"rank {hvd.rank()}"
        runs.append(params)
    for p, q in zip(*runs[::-1]):
        torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-14, msg=f"rank {hvd.rank()}")


def test_a_bad_overlap_limit_is_named(monkeypatch):
    monkeypatch.setenv("HOROVOD_SHARDED_OVERLAP_BUCKETS", "some")
    model = make_model()
    with pytest.raises(hvd.HorovodArgumentError, match="HOROVOD_SHARDED_OVERLAP_BUCKETS"):
        wrap(torch.optim.SGD(model.parameters(), lr=0.1), model, "gradients")


@pytest.mark.parametrize("mode", MODES)
def test_a_layout_change_after_backward_raises_on_every_rank(mode):
    """Freezing a layer between backward and step() (the buckets must be laid out again while
    the allreduces are in flight) raises on every rank, leaves nothing in flight, and the
    next step trains."""
    model = make_model()
    opt = wrap(torch.optim.Adam(model.parameters(), lr=0.01), model, mode)
    x, y = make_data()
    opt.zero_grad()
    backward(model, x[0], y[0])
    model[2].weight.requires_grad_(False)
    with pytest.raises(OutstandingAllreduceError, match="laid out again.*dropped"):
        opt.step()
    assert not any(opt._overlap_handles.values()), f"rank {hvd.rank()}"
    before = model[0].weight.detach().clone()
    opt.zero_grad()
    backward(model, x[1], y[1])
    opt.step()
    assert not torch.equal(model[0].weight, before), f"rank {hvd.rank()}"


def test_parameters_pickle_and_autograd_sees_the_step():
    """The optimizer leaves nothing unpicklable on the parameters, and a graph kept across
    step() is refused by autograd as with the unsharded optimizer (the step changed the
    parameters through their buckets' storage)."""
    model = make_model()
    opt = wrap(torch.optim.SGD(model.parameters(), lr=0.1), model, "optimizer_state")
    x, y = make_data()
    torch.save(model, io.BytesIO())
    opt.zero_grad()
    loss = F.mse_loss(model(shard(x[0])), shard(y[0]))
    loss.backward(retain_graph=True)
    opt.step()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
