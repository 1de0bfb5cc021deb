"""broadcast_parameters, broadcast_optimizer_state (every torch.optim optimizer: a checkpoint
restored on rank 0 reaches every rank), broadcast_object, allgather_object."""

import pytest
import torch

import horovodlite.torch as hvd

OPTIMIZERS = {
    "SGD": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True)),
    "Adam": (torch.optim.Adam, dict(lr=0.01, betas=(0.8, 0.9), amsgrad=True)),
    "AdamW": (torch.optim.AdamW, dict(lr=0.01, weight_decay=0.1)),
    "Adamax": (torch.optim.Adamax, dict(lr=0.01)),
    "NAdam": (torch.optim.NAdam, dict(lr=0.01)),
    "RAdam": (torch.optim.RAdam, dict(lr=0.01)),
    "Adagrad": (torch.optim.Adagrad, dict(lr=0.1, lr_decay=0.01)),
    "Adadelta": (torch.optim.Adadelta, dict(lr=0.5, rho=0.8)),
    "Adafactor": (torch.optim.Adafactor, dict(lr=0.01)),
    "ASGD": (torch.optim.ASGD, dict(lr=0.01)),
    "RMSprop": (torch.optim.RMSprop, dict(lr=0.01, centered=True, momentum=0.5)),
    "Rprop": (torch.optim.Rprop, dict(lr=0.01, etas=(0.4, 1.3))),
    "Muon": (torch.optim.Muon, dict(lr=0.01)),
}


def make_model(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 2))
    frozen = torch.nn.Linear(2, 2)
    for p in frozen.parameters():
        p.requires_grad_(False)  # parameters without gradients (and so without state)
    return torch.nn.Sequential(model, frozen)


def train(model, opt, steps, seed):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        opt.zero_grad()
        x = torch.randn(5, 4, generator=g)
        model(x).pow(2).mean().backward()
        opt.step()


def flat_state(opt):
    sd = opt.state_dict()
    tensors = [v.detach().float().flatten() for s in sd["state"].values() for v in s.values()
               if torch.is_tensor(v)]
    return sd, (torch.cat(tensors) if tensors else torch.zeros(0))


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_restore_from_checkpoint_reaches_every_rank(name):
    cls, kwargs = OPTIMIZERS[name]
    r = hvd.rank()
    model = make_model(seed=r)  # every rank starts different
    params = [p for p in model.parameters() if p.requires_grad]
    if name == "Muon":
        params = [p for p in params if p.dim() == 2]
    opt = cls(params, **kwargs)
    if r == 0:  # rank 0 restores a checkpoint: trained model and optimizer state
        train(model, opt, steps=3, seed=1)
        checkpoint = {"model": model.state_dict(), "opt": opt.state_dict()}
        model.load_state_dict(checkpoint["model"])
        opt.load_state_dict(checkpoint["opt"])
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    sd, state = flat_state(opt)
    options = [{k: v for k, v in g.items() if k != "params"} for g in sd["param_groups"]]
    everyone = hvd.allgather_object((options, state, [p.detach() for p in model.parameters()]),
                                    name=f"ckpt.{name}")
    for other_options, other_state, other_params in everyone:
        assert other_options == options  # same values and the same Python types
        assert torch.equal(other_state, state)
        for a, b in zip(other_params, model.parameters()):
            assert torch.equal(a, b.detach())
    for group in sd["param_groups"]:
        for key in ("betas", "etas"):
            if key in group:
                assert isinstance(group[key], tuple), f"{key} lost its tuple type"
        for key in ("nesterov", "amsgrad", "centered"):
            if key in group:
                assert isinstance(group[key], bool)
    # Training on from the restored state keeps every rank identical.
    train(model, opt, steps=2, seed=7)
    final = hvd.allgather_object([p.detach() for p in model.parameters()], name=f"after.{name}")
    for params_k in final:
        for a, b in zip(params_k, model.parameters()):
            assert torch.equal(a, b.detach())


def test_broadcast_optimizer_state_with_no_state_anywhere():
    model = make_model(seed=hvd.rank())
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad],
                           lr=0.001 * (hvd.rank() + 1))
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert opt.param_groups[0]["lr"] == 0.001 and not opt.state


@pytest.mark.parametrize("wrap", [False, True])
def test_broadcast_optimizer_state_leaves_a_gradient_on_every_trainable_parameter(wrap):
    # Horovod's behaviour, which code relies on (it reads p.grad right after); no state invented
    model = make_model(seed=hvd.rank())
    model[0][0].bias.grad = torch.full_like(model[0][0].bias, 7.0)  # an existing gradient stays
    frozen = [p for p in model.parameters() if not p.requires_grad]
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=0.01)
    if wrap:
        opt = hvd.DistributedOptimizer(opt, named_parameters=[
            (n, p) for n, p in model.named_parameters() if p.requires_grad])
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    for group in opt.param_groups:
        for p in group["params"]:
            assert p.grad is not None and p.grad.shape == p.shape
            if p is not model[0][0].bias:
                assert torch.count_nonzero(p.grad) == 0
    assert torch.equal(model[0][0].bias.grad, torch.full_like(model[0][0].bias, 7.0))
    assert all(p.grad is None for p in frozen)
    assert not opt.state


def test_sparse_state_tensors_reach_every_rank():
    """SGD's momentum of a sparse gradient (an Embedding(sparse=True)) is a sparse tensor: it
    travels dense and arrives sparse. It used to fail on the root after the structure went
    out, leaving every other rank waiting for the tensors."""
    torch.manual_seed(hvd.rank())
    emb = torch.nn.Embedding(6, 3, sparse=True)
    opt = torch.optim.SGD(emb.parameters(), lr=0.1, momentum=0.9)
    emb(torch.tensor([1, 4, hvd.rank() % 6])).sum().backward()
    opt.step()
    assert opt.state[emb.weight]["momentum_buffer"].is_sparse
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    mine = opt.state[emb.weight]["momentum_buffer"]
    assert mine.is_sparse and mine.sparse_dim() == 1
    every = hvd.allgather_object(mine.to_dense(), name="sparse_state")
    assert all(torch.equal(t, every[0]) for t in every)


def test_lbfgs_and_sparse_adam_are_rejected():
    p = [torch.nn.Parameter(torch.zeros(2))]
    with pytest.raises(ValueError, match="LBFGS is not supported"):
        hvd.broadcast_optimizer_state(torch.optim.LBFGS(p), root_rank=0)
    with pytest.raises(ValueError, match="SparseAdam is not supported"):
        hvd.broadcast_optimizer_state(torch.optim.SparseAdam(p), root_rank=0)


def test_broadcast_parameters_accepts_dicts_and_lists():
    r = hvd.rank()
    model = make_model(seed=r)
    hvd.broadcast_parameters(list(model.named_parameters()), root_rank=0)
    tensors = [torch.full((3,), float(r)), torch.full((2, 2), float(r))]
    hvd.broadcast_parameters(tensors, root_rank=hvd.size() - 1)
    assert all(torch.all(t == hvd.size() - 1) for t in tensors)
    ref = make_model(seed=0)
    for a, b in zip(model.parameters(), ref.parameters()):
        assert torch.equal(a, b)


@pytest.mark.parametrize("bad", [42, "weights", torch.ones(2), {1, 2}])
def test_broadcast_parameters_rejects_other_containers(bad):
    with pytest.raises(ValueError, match="broadcast_parameters"):
        hvd.broadcast_parameters(bad, root_rank=0)


def test_broadcast_and_allgather_objects():
    r, n = hvd.rank(), hvd.size()
    obj = {"rank": r, "fn": (lambda x: x + r), "t": torch.arange(3) * r}
    got = hvd.broadcast_object(obj, root_rank=n - 1)
    assert got["rank"] == n - 1 and got["fn"](1) == n
    assert torch.equal(got["t"], torch.arange(3) * (n - 1))
    everyone = hvd.allgather_object({"rank": r, "payload": "x" * (r * 100)})
    assert [o["rank"] for o in everyone] == list(range(n))
    assert [len(o["payload"]) for o in everyone] == [k * 100 for k in range(n)]


def test_object_helpers_without_a_name_agree_whatever_each_rank_passes():
    r, n = hvd.rank(), hvd.size()
    path = hvd.broadcast_object("/chosen/by/root" if r == 0 else None)
    assert path == "/chosen/by/root"
    mixed = hvd.allgather_object(r if r % 2 else None)
    assert mixed == [k if k % 2 else None for k in range(n)]
