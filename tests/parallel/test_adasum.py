"""op=hvd.Adasum: every allreduce variant against a NumPy reference of the pairwise tree, scale
factors, the zero-vector and parallel/orthogonal properties, argument errors, and the Adasum delta
optimizer against NumPy. Adasum needs a power-of-two number of ranks: at np=3 every test checks
the ValueError instead (on every rank, before anything is enqueued)."""

import numpy as np
import pytest
import torch

import horovodlite.torch as hvd

SIZE_ERROR = "power-of-two number of ranks, but the process set has 3"


def power_of_two() -> bool:
    n = hvd.size()
    return n & (n - 1) == 0


def np_adasum(vectors):
    """The reference: pairs (0, 1), (2, 3), ... then pairs of pairs, in float64."""
    level = [np.asarray(v, dtype=np.float64).ravel() for v in vectors]
    while len(level) > 1:
        nxt = []
        for a, b in zip(level[0::2], level[1::2]):
            dot = a @ b
            ca = 1 - dot / (2 * (a @ a)) if a @ a > 0 else 1.0
            cb = 1 - dot / (2 * (b @ b)) if b @ b > 0 else 1.0
            nxt.append(ca * a + cb * b)
        level = nxt
    return level[0]


def rank_vector(rank, shape=(3, 4), seed=0):
    rng = np.random.default_rng(seed * 100 + rank)
    return rng.normal(size=shape)


def run(variant, tensor, **kw):
    if variant == "allreduce":
        return hvd.allreduce(tensor, op=hvd.Adasum, **kw)
    if variant == "allreduce_":
        return hvd.allreduce_(tensor, op=hvd.Adasum, **kw)
    if variant == "allreduce_async":
        return hvd.synchronize(hvd.allreduce_async(tensor, op=hvd.Adasum, **kw))
    return hvd.synchronize(hvd.allreduce_async_(tensor, op=hvd.Adasum, **kw))


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-5),
                                       (torch.float16, 5e-3)])
@pytest.mark.parametrize("variant", ["allreduce", "allreduce_", "allreduce_async",
                                     "allreduce_async_"])
def test_adasum_matches_numpy(variant, dtype, tol):
    n, r = hvd.size(), hvd.rank()
    tensor = torch.from_numpy(rank_vector(r)).to(dtype)
    if not power_of_two():
        with pytest.raises(ValueError, match=SIZE_ERROR):
            run(variant, tensor, name=f"adasum.{variant}.{dtype}")
        return
    out = run(variant, tensor, name=f"adasum.{variant}.{dtype}")
    assert out.dtype == dtype and out.shape == (3, 4)
    if variant.endswith("_"):
        assert out is tensor
    inputs = [torch.from_numpy(rank_vector(k)).to(dtype).double().numpy() for k in range(n)]
    expected = np_adasum(inputs).reshape(3, 4)
    np.testing.assert_allclose(out.double().numpy(), expected, rtol=tol, atol=tol)


def test_adasum_scale_factors():
    n, r = hvd.size(), hvd.rank()
    tensor = torch.from_numpy(rank_vector(r, seed=1))
    if not power_of_two():
        with pytest.raises(ValueError, match=SIZE_ERROR):
            hvd.allreduce(tensor, op=hvd.Adasum, prescale_factor=0.5, postscale_factor=3.0)
        return
    out = hvd.allreduce(tensor, op=hvd.Adasum, prescale_factor=0.5, postscale_factor=3.0)
    expected = 3.0 * np_adasum([0.5 * rank_vector(k, seed=1) for k in range(n)]).reshape(3, 4)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-12)


def test_adasum_properties():
    """Identical inputs -> that input; orthogonal inputs -> their sum; a zero input drops out."""
    n, r = hvd.size(), hvd.rank()
    if not power_of_two():
        with pytest.raises(ValueError, match=SIZE_ERROR):
            hvd.allreduce(torch.ones(4), op=hvd.Adasum)
        return
    same = hvd.allreduce(torch.tensor([1.0, -2.0, 3.0]), op=hvd.Adasum, name="adasum.same")
    torch.testing.assert_close(same, torch.tensor([1.0, -2.0, 3.0]))
    basis = torch.zeros(n)
    basis[r] = r + 1.0
    ortho = hvd.allreduce(basis, op=hvd.Adasum, name="adasum.ortho")
    torch.testing.assert_close(ortho, torch.arange(1.0, n + 1.0))
    mine = np.zeros(3) if r == 0 else rank_vector(r, (3,))
    out = hvd.allreduce(torch.from_numpy(mine), op=hvd.Adasum, name="adasum.zero")
    inputs = [np.zeros(3)] + [rank_vector(k, (3,)) for k in range(1, n)]
    np.testing.assert_allclose(out.numpy(), np_adasum(inputs), rtol=1e-12)
    assert torch.isfinite(out).all()


def test_adasum_argument_errors():
    with pytest.raises(ValueError, match="needs a floating-point tensor, got torch.int32"):
        hvd.allreduce(torch.ones(3, dtype=torch.int32), op=hvd.Adasum, name="adasum.int")
    with pytest.raises(ValueError, match="not contiguous"):
        hvd.allreduce_async_(torch.ones(4, 4).t(), op=hvd.Adasum, name="adasum.strided")
    with pytest.raises(ValueError, match="Adasum"):
        hvd.grouped_allreduce([torch.ones(2)], op=hvd.Adasum)


# ----------------------------------------------------------------- Adasum delta optimizer


def tiny_model():
    torch.manual_seed(0)
    return torch.nn.Linear(3, 2).double()


def rank_loss(model, rank):
    g = torch.Generator().manual_seed(40 + rank)
    x = torch.randn(4, 3, generator=g, dtype=torch.float64)
    y = torch.randn(4, 2, generator=g, dtype=torch.float64)
    return torch.nn.functional.mse_loss(model(x), y)


def local_delta(rank, make_opt, start):
    """The update rank ``rank`` would apply alone, from parameters ``start``."""
    model = tiny_model()
    with torch.no_grad():
        for p, s in zip(model.parameters(), start):
            p.copy_(s)
    opt = make_opt(model.parameters())
    rank_loss(model, rank).backward()
    opt.step()
    return [(p - s).detach().numpy() for p, s in zip(model.parameters(), start)]


@pytest.mark.parametrize("name", ["sgd", "adam"])
def test_adasum_delta_optimizer_matches_numpy(name):
    make_opt = {"sgd": lambda ps: torch.optim.SGD(ps, lr=0.1),
                "adam": lambda ps: torch.optim.Adam(ps, lr=0.01)}[name]
    n = hvd.size()
    model = tiny_model()
    if not power_of_two():
        with pytest.raises(ValueError, match=SIZE_ERROR):
            hvd.DistributedOptimizer(make_opt(model.parameters()), op=hvd.Adasum)
        return
    opt = hvd.DistributedOptimizer(make_opt(model.parameters()), op=hvd.Adasum)
    steps = 2 if name == "sgd" else 1  # SGD keeps no state, so every step is fresh per rank
    for _ in range(steps):
        start = [p.detach().clone() for p in model.parameters()]
        deltas = [local_delta(r, make_opt, start) for r in range(n)]
        opt.zero_grad()
        rank_loss(model, hvd.rank()).backward()
        opt.synchronize()  # a no-op for Adasum: gradients stay local
        opt.step()
        for i, p in enumerate(model.parameters()):
            expected = start[i].numpy() + np_adasum([d[i] for d in deltas]).reshape(p.shape)
            np.testing.assert_allclose(p.detach().numpy(), expected, rtol=1e-10, atol=1e-12)


def test_adasum_optimizer_argument_errors():
    model = tiny_model()
    if power_of_two():
        with pytest.raises(ValueError, match="gradient_predivide_factor is only supported"):
            hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     op=hvd.Adasum, gradient_predivide_factor=2.0)
    else:
        with pytest.raises(ValueError, match=SIZE_ERROR):
            hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     op=hvd.Adasum)
