"""allgather, broadcast, alltoall and reducescatter on every rank: each dtype x variant against a
locally computed reference, uneven first dimensions, gradients, and call-time errors."""

import pytest
import torch
from helpers import DTYPES, assert_close, rank_data, reference_allreduce

import horovodlite.torch as hvd

ALL = DTYPES + [torch.bool]


def data(seed, rank, shape, dtype):
    if dtype == torch.bool:
        return rank_data(seed, rank, shape, torch.int32) > 0
    return rank_data(seed, rank, shape, dtype)


def gather_reference(seed, n, dtype, trailing=(2, 3)):
    return torch.cat([data(seed, k, (k + 1, *trailing), dtype) for k in range(n)])


# ---------------------------------------------------------------------------------- allgather


@pytest.mark.parametrize("variant", ["allgather", "allgather_async", "grouped_allgather",
                                     "grouped_allgather_async"])
@pytest.mark.parametrize("dtype", ALL, ids=str)
def test_allgather_uneven_first_dims(dtype, variant):
    n, r = hvd.size(), hvd.rank()
    seed = ALL.index(dtype)
    mine = data(seed, r, (r + 1, 2, 3), dtype)
    other = data(seed + 50, r, (r + 1, 4), dtype)
    name = f"ag.{variant}.{dtype}"
    if variant == "allgather":
        outs = [hvd.allgather(mine, name=name)]
    elif variant == "allgather_async":
        outs = [hvd.synchronize(hvd.allgather_async(mine, name=name))]
    elif variant == "grouped_allgather":
        outs = hvd.grouped_allgather([mine, other], name=name)
    else:
        outs = hvd.synchronize(hvd.grouped_allgather_async([mine, other], name=name))
    assert torch.equal(outs[0], gather_reference(seed, n, dtype))
    if len(outs) > 1:
        assert torch.equal(outs[1], gather_reference(seed + 50, n, dtype, trailing=(4,)))


def test_allgather_fuses_many_and_scalars():
    n, r = hvd.size(), hvd.rank()
    handles = [hvd.allgather_async(torch.full((r + 1, i + 1), float(i * 10 + r)), name=f"agf.{i}")
               for i in range(12)]
    for i, h in enumerate(handles):
        expect = torch.cat([torch.full((k + 1, i + 1), float(i * 10 + k)) for k in range(n)])
        assert torch.equal(hvd.synchronize(h), expect)
    scalar = hvd.allgather(torch.tensor(float(r)), name="ag.scalar")
    assert scalar.tolist() == [float(k) for k in range(n)]


def test_allgather_gradient_is_own_rows_of_the_averaged_gradient():
    r = hvd.rank()
    x = torch.full((r + 1, 3), float(r), requires_grad=True)
    y = hvd.allgather(x, name="ag.grad")
    weights = torch.arange(y.numel(), dtype=torch.float32).reshape(y.shape)  # same on all ranks
    (y * weights).sum().backward()
    start = sum(k + 1 for k in range(r))
    assert torch.equal(x.grad, weights[start:start + r + 1])


@pytest.mark.skipif("hvd.size() < 2", reason="needs ranks that disagree")
def test_allgather_trailing_dimension_mismatch_names_each_rank():
    r = hvd.rank()
    h = hvd.allgather_async(torch.zeros(2, 3 + (r > 0)), name="ag.bad")
    with pytest.raises(hvd.HorovodInternalError) as info:
        hvd.synchronize(h)
    msg = str(info.value)
    assert "allgather.ag.bad: trailing dimensions mismatch" in msg
    assert "rank 0 float32[2,3]" in msg and "rank 1 float32[2,4]" in msg
    assert hvd.allgather(torch.ones(1), name="ag.after").numel() == hvd.size()


# ---------------------------------------------------------------------------------- broadcast


@pytest.mark.parametrize("variant", ["broadcast", "broadcast_", "broadcast_async",
                                     "broadcast_async_"])
@pytest.mark.parametrize("dtype", ALL, ids=str)
def test_broadcast_from_every_root(dtype, variant):
    n, r = hvd.size(), hvd.rank()
    for root in range(n):
        seed = 200 + ALL.index(dtype)
        mine = data(seed, r, (3, 4), dtype)
        original = mine.clone()
        name = f"bc.{variant}.{dtype}.{root}"
        fn = getattr(hvd, variant)
        out = fn(mine, root, name=name)
        if variant.endswith("async") or variant.endswith("async_"):
            out = hvd.synchronize(out)
        assert torch.equal(out, data(seed, root, (3, 4), dtype))
        if variant.endswith("_"):
            assert out is mine
        else:
            assert torch.equal(mine, original), "out-of-place broadcast changed its input"


def test_broadcast_gradient_goes_to_the_root_only():
    n, r = hvd.size(), hvd.rank()
    root = n - 1
    x = torch.ones(4, requires_grad=True)
    y = hvd.broadcast(x, root, name="bc.grad")
    (y * (r + 1)).sum().backward()
    expected = sum(k + 1 for k in range(n)) / n if r == root else 0.0
    assert torch.allclose(x.grad, torch.full((4,), expected))


@pytest.mark.skipif("hvd.size() < 2", reason="needs ranks that disagree")
def test_broadcast_root_mismatch_names_each_rank():
    r = hvd.rank()
    h = hvd.broadcast_async(torch.zeros(2), root_rank=0 if r == 0 else 1, name="bc.bad")
    with pytest.raises(hvd.HorovodInternalError, match=r"root rank mismatch: rank 0 0, rank 1 1"):
        hvd.synchronize(h)


def test_broadcast_root_outside_the_job_is_a_value_error():
    with pytest.raises(ValueError, match="root_rank 99 is not a member"):
        hvd.broadcast(torch.zeros(1), 99, name="bc.root99")


# ----------------------------------------------------------------------------------- alltoall


def sends(r, n):
    """Rows rank r sends to each rank (uneven, some zero)."""
    return [(r + j) % 3 for j in range(n)]


@pytest.mark.parametrize("form", ["list", "tensor", "async"])
@pytest.mark.parametrize("dtype", ALL, ids=str)
def test_alltoall_with_splits(dtype, form):
    n, r = hvd.size(), hvd.rank()
    seed = 400 + ALL.index(dtype)

    def tensor_of(k):
        return data(seed, k, (sum(sends(k, n)) + 1, 2), dtype)  # one row never sent

    mine = tensor_of(r)
    splits = sends(r, n)
    name = f"a2a.{form}.{dtype}"
    if form == "list":
        out, received = hvd.alltoall(mine, splits=splits, name=name)
    elif form == "tensor":
        out, received = hvd.alltoall(mine, splits=torch.tensor(splits, dtype=torch.int32),
                                     name=name)
    else:
        out, received = hvd.synchronize(hvd.alltoall_async(mine, splits=splits, name=name))
    expected_rows = []
    for k in range(n):
        start = sum(sends(k, n)[:r])
        expected_rows.append(tensor_of(k)[start:start + sends(k, n)[r]])
    assert torch.equal(out, torch.cat(expected_rows))
    assert received.dtype == torch.int32
    assert received.tolist() == [sends(k, n)[r] for k in range(n)]


def test_alltoall_even_split_returns_only_the_output():
    n, r = hvd.size(), hvd.rank()
    mine = torch.arange(2 * n, dtype=torch.float32) + 100 * r
    out = hvd.alltoall(mine, name="a2a.even")
    assert isinstance(out, torch.Tensor)
    assert out.tolist() == [float(100 * k + 2 * r + i) for k in range(n) for i in range(2)]


def test_alltoall_gradient_routes_back():
    n, r = hvd.size(), hvd.rank()
    x = torch.ones(2 * n, 2, requires_grad=True)
    y = hvd.alltoall(x, name="a2a.grad")
    (y * (r + 1)).sum().backward()
    # my rows went to rank j, whose loss weighs them by (j + 1)
    expected = torch.cat([torch.full((2, 2), float(j + 1)) for j in range(n)])
    assert torch.equal(x.grad, expected)


@pytest.mark.parametrize("splits,pattern", [
    (lambda n: [1] * (n + 1), "must have one entry per rank"),
    (lambda n: [100] * n, "sum to at most dimension 0"),
    (lambda n: torch.ones(n, dtype=torch.int64), "splits must be an int32 tensor"),
])
def test_alltoall_bad_splits_fail_at_call_time(splits, pattern):
    with pytest.raises(ValueError, match=pattern):
        hvd.alltoall(torch.zeros(4, 2), splits=splits(hvd.size()), name="a2a.bad")


@pytest.mark.skipif("hvd.size() < 2", reason="every dim 0 divides by 1 rank")
def test_alltoall_indivisible_without_splits():
    with pytest.raises(ValueError, match="is not divisible by"):
        hvd.alltoall(torch.zeros(hvd.size() + 1), name="a2a.indivisible")


@pytest.mark.skipif("hvd.size() < 2", reason="needs ranks that disagree")
def test_alltoall_trailing_mismatch():
    n, r = hvd.size(), hvd.rank()
    h = hvd.alltoall_async(torch.zeros(n, 2 + r), name="a2a.trailing")
    with pytest.raises(hvd.HorovodInternalError, match="trailing dimensions mismatch"):
        hvd.synchronize(h)


# ------------------------------------------------------------------------------ reducescatter


@pytest.mark.parametrize("variant", ["reducescatter", "reducescatter_async",
                                     "grouped_reducescatter", "grouped_reducescatter_async"])
@pytest.mark.parametrize("op_name", ["Average", "Sum"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_reducescatter_uneven(dtype, op_name, variant):
    n, r = hvd.size(), hvd.rank()
    rows = 2 * n + 1  # low ranks get the extra row
    seed = 600 + DTYPES.index(dtype)
    inputs = [rank_data(seed, k, (rows, 3), dtype) for k in range(n)]
    op = hvd.Average if op_name == "Average" else hvd.Sum
    name = f"rs.{variant}.{op_name}.{dtype}"
    fn = getattr(hvd, variant)
    if variant.startswith("grouped"):
        out = fn([inputs[r], inputs[r] * 1], name=name, op=op)
    else:
        out = fn(inputs[r], name=name, op=op)
    if variant.endswith("async"):
        out = hvd.synchronize(out)
    outs = out if isinstance(out, list) else [out]
    full = reference_allreduce(inputs, op_name, dtype)
    start = sum(rows // n + (k < rows % n) for k in range(r))
    count = rows // n + (r < rows % n)
    for o in outs:
        assert tuple(o.shape) == (count, 3)
        assert_close(o, full[start:start + count], dtype, variant)


@pytest.mark.parametrize("op_name", ["Average", "Sum"])
def test_reducescatter_large_enough_for_the_ring(op_name):
    """From 256 KiB a reduce-scatter runs over horovodlite's ring even where MPI's natives exist
    (in place on the fusion buffer): uneven blocks, one tensor and a group, exact values."""
    n, r = hvd.size(), hvd.rank()
    rows = 70000 * n + 1  # float32: over 256 KiB in all; low ranks get the extra row
    op = hvd.Average if op_name == "Average" else hvd.Sum
    base = torch.arange(rows, dtype=torch.float32).remainder_(97)
    mine = [base + r, base * 2 + r]
    outs = hvd.grouped_reducescatter(mine, op=op, name=f"rs.ring.{op_name}")
    outs.append(hvd.reducescatter(mine[0], op=op, name=f"rs.ring.one.{op_name}"))
    start = sum(rows // n + (k < rows % n) for k in range(r))
    count = rows // n + (r < rows % n)
    ranks = float(sum(range(n)))
    for out, want in zip(outs, [base * n + ranks, base * 2 * n + ranks, base * n + ranks]):
        exact = op_name == "Sum"  # integer sums below 2**24; Average scales by 1/n
        if not exact:
            want = want / n
        assert tuple(out.shape) == (count,), (r, tuple(out.shape))
        torch.testing.assert_close(out, want[start:start + count], rtol=0 if exact else 1e-6,
                                   atol=0 if exact else 1e-6)


def test_reducescatter_scale_factors():
    n, r = hvd.size(), hvd.rank()
    inputs = [torch.full((n * 2, 2), float(k + 1)) for k in range(n)]
    out = hvd.reducescatter(inputs[r], op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5,
                            name="rs.scaled")
    assert torch.allclose(out, torch.full((2, 2), float(sum(k + 1 for k in range(n)))))


def test_reducescatter_gradient():
    n = hvd.size()
    x = torch.ones(2 * n, 2, requires_grad=True)
    y = hvd.reducescatter(x, op=hvd.Sum, name="rs.grad")
    y.sum().backward()
    assert torch.equal(x.grad, torch.full((2 * n, 2), float(n)))


def test_reducescatter_rejects_scalars_and_other_ops():
    with pytest.raises(ValueError, match="0-d tensor cannot be scattered"):
        hvd.reducescatter(torch.tensor(1.0), name="rs.scalar")
    for op in (hvd.Max, hvd.Min, hvd.Product, hvd.Adasum):
        with pytest.raises(ValueError, match="only hvd.Average and hvd.Sum"):
            hvd.reducescatter(torch.ones(4), op=op, name="rs.op")


# ------------------------------------------------------------------ sparse, grouped gradients


@pytest.mark.parametrize("op", [hvd.Average, hvd.Sum])
def test_sparse_allreduce_async_returns_a_waiting_callable(op):
    n, r = hvd.size(), hvd.rank()
    dense = torch.zeros(6, 3)
    dense[r % 6] = float(r + 1)  # each rank touches its own row
    dense[5] += 1.0              # and everyone touches row 5
    wait = hvd.sparse_allreduce_async(dense.to_sparse(), name=f"sparse.{op}", op=op)
    assert callable(wait)
    out = wait()
    assert out.is_sparse
    expected = torch.zeros(6, 3)
    for k in range(n):
        expected[k % 6] += float(k + 1)
        expected[5] += 1.0
    if op == hvd.Average:
        expected /= n
    assert torch.allclose(out.to_dense(), expected)


def test_grouped_allgather_and_reducescatter_gradients():
    n, r = hvd.size(), hvd.rank()
    a = torch.full((r + 1, 2), 1.0, requires_grad=True)
    b = torch.full((2, 3), 2.0, requires_grad=True)
    ga, gb = hvd.grouped_allgather([a, b], name="gag.grad")
    (ga.sum() * 2 + gb.sum() * 3).backward()
    assert torch.equal(a.grad, torch.full((r + 1, 2), 2.0))
    assert torch.equal(b.grad, torch.full((2, 3), 3.0))
    x = torch.ones(2 * n, 2, requires_grad=True)
    y = torch.ones(3 * n, requires_grad=True)
    ox, oy = hvd.grouped_reducescatter([x, y], op=hvd.Sum, name="grs.grad")
    (ox.sum() + 2 * oy.sum()).backward()
    assert torch.equal(x.grad, torch.full((2 * n, 2), float(n)))
    assert torch.equal(y.grad, torch.full((3 * n,), 2.0 * n))
