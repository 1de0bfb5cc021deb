"""Reduce kernels (float16/bfloat16 via float32), scaling rules, the fusion planner, and the ring
allreduce over the in-process transport against NumPy, for every dtype, op and odd sizes."""

import numpy as np
import pytest
import torch
from cpp_testing import load_testing_module
from hypothesis import given, settings
from hypothesis import strategies as st

T = load_testing_module()
DT = {torch.uint8: 0, torch.int8: 1, torch.int16: 2, torch.int32: 3, torch.int64: 4,
      torch.float16: 5, torch.bfloat16: 6, torch.float32: 7, torch.float64: 8}
OPS = {"Sum": 1, "Min": 3, "Max": 4, "Product": 5}


def to_bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def from_bytes(b: bytes, dtype, shape) -> torch.Tensor:
    if not b:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(b), dtype=torch.uint8).view(dtype).reshape(shape)


def make(rank, n, dtype, op):
    g = torch.Generator().manual_seed(rank * 97 + n)
    if dtype.is_floating_point:
        lo, hi = (0.5, 1.5) if op == "Product" else (-3.0, 3.0)
        return (torch.rand(n, generator=g, dtype=torch.float64) * (hi - lo) + lo).to(dtype)
    lo, hi = (1, 3) if op == "Product" else (0 if dtype == torch.uint8 else -5, 6)
    return torch.randint(lo, hi, (n,), generator=g).to(dtype)


def reference(inputs, op):
    xs = np.stack([t.double().numpy() for t in inputs])
    return {"Sum": xs.sum(0), "Min": xs.min(0), "Max": xs.max(0), "Product": xs.prod(0)}[op]


def tolerance(dtype, nranks):
    if dtype == torch.float16:
        return 2e-3 * nranks
    if dtype == torch.bfloat16:
        return 1.6e-2 * nranks
    if dtype == torch.float32:
        return 1e-6
    return 0 if not dtype.is_floating_point else 1e-12


@pytest.mark.parametrize("nranks", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("count", [0, 1, 2, 3, 7, 64, 1001])
@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", list(DT), ids=str)
def test_ring_matches_numpy(dtype, op, count, nranks):
    inputs = [make(r, count, dtype, op) for r in range(nranks)]
    outs = T.ring_allreduce([to_bytes(t) for t in inputs], DT[dtype], OPS[op], segment_bytes=16)
    expected = reference(inputs, op)
    for r, b in enumerate(outs):
        got = from_bytes(b, dtype, (count,)).double().numpy()
        np.testing.assert_allclose(got, expected, rtol=tolerance(dtype, nranks),
                                   atol=tolerance(dtype, nranks), err_msg=f"rank {r}")


def test_ring_postscale_and_explicit_chunks():
    inputs = [torch.arange(10, dtype=torch.float32) * (r + 1) for r in range(3)]
    outs = T.ring_allreduce([to_bytes(t) for t in inputs], DT[torch.float32], 1,
                            chunks=[0, 7, 3], postscale=0.5)
    for b in outs:
        assert torch.equal(from_bytes(b, torch.float32, (10,)), torch.arange(10.) * 3)


def test_ring_result_depends_only_on_chunk_index():
    # The same element reduced inside differently sized buffers gets bit-identical results when
    # it sits in the same chunk: that is what makes fusion deterministic.
    rng = np.random.default_rng(0)
    data = [rng.normal(size=30).astype(np.float32) for _ in range(3)]
    padded = [np.concatenate([d[:10], rng.normal(size=5).astype(np.float32), d[10:20],
                              rng.normal(size=5).astype(np.float32), d[20:]]) for d in data]
    plain = T.ring_allreduce([d.tobytes() for d in data], 7, 1, chunks=[10, 10, 10])
    mixed = T.ring_allreduce([d.tobytes() for d in padded], 7, 1, chunks=[15, 15, 10])
    a = np.frombuffer(plain[0], np.float32)
    b = np.frombuffer(mixed[0], np.float32)
    assert np.array_equal(a, np.concatenate([b[:10], b[15:25], b[30:]]))


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.floats(allow_nan=False, width=32))
def test_float16_conversion_matches_torch(x):
    expected = torch.tensor([x], dtype=torch.float16).view(torch.int16).item() & 0xFFFF
    assert T.float_to_half(x) == expected
    h = T.float_to_half(x)
    back = torch.tensor([h], dtype=torch.int32).to(torch.int16).view(torch.float16).float().item()
    assert T.half_to_float(h) == back or (np.isnan(back) and np.isnan(T.half_to_float(h)))


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.floats(allow_nan=False, width=32))
def test_bfloat16_conversion_matches_torch(x):
    expected = torch.tensor([x], dtype=torch.bfloat16).view(torch.int16).item() & 0xFFFF
    assert T.float_to_bfloat16(x) == expected


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_reduction_happens_in_float32(dtype):
    a = torch.tensor([1000.0, 0.1, -2.5, 60000.0], dtype=dtype)
    b = torch.tensor([0.5, 0.2, 2.5, 10000.0], dtype=dtype)
    got = from_bytes(T.reduce(to_bytes(a), to_bytes(b), DT[dtype], 1), dtype, (4,))
    assert torch.equal(got, (a.float() + b.float()).to(dtype))


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.sampled_from(list(DT)), st.sampled_from(list(OPS)), st.integers(0, 300),
       st.sampled_from([1.0, 0.5, 1 / 3, 0.1, 7.0]), st.integers(0, 2**31 - 1))
def test_reduce_scale_is_bit_identical_to_reduce_then_scale(dtype, op, n, factor, seed):
    # the ring's last reduce-scatter step folds and averages in one pass (float32/float64 Sum):
    # it must give exactly the bits of folding, then scaling
    a, b = make(seed % 1000, n, dtype, op), make(seed % 1000 + 1, n, dtype, op)
    if dtype.is_floating_point:  # values whose sums round, and an inf and a nan
        a = a * 1e7 + 0.3
        if n > 2:
            a[0], a[1] = float("inf"), float("nan")
    fused = T.reduce_scale(to_bytes(a), to_bytes(b), DT[dtype], OPS[op], factor)
    two = T.scale(T.reduce(to_bytes(a), to_bytes(b), DT[dtype], OPS[op]), DT[dtype], factor)
    assert fused == two


@pytest.mark.parametrize("dtype,factor,values,expected", [
    (torch.int32, 0.5, [3, -3, 7], [1, -1, 3]),          # float64 then truncation toward zero
    (torch.uint8, 1.5, [3, 5, 200], [4, 7, 44]),          # 300 wraps like a uint8 cast
    (torch.float32, 0.25, [1.0, -2.0, 3.0], [0.25, -0.5, 0.75]),
])
def test_scaling_rules(dtype, factor, values, expected):
    t = torch.tensor(values, dtype=dtype)
    got = from_bytes(T.scale(to_bytes(t), DT[dtype], factor), dtype, (3,))
    if dtype == torch.uint8:
        expected = [int(np.trunc(v * factor)) % 256 for v in values]
    assert got.tolist() == pytest.approx(expected)


def test_fusion_plan_groups_compatible_responses_up_to_threshold():
    items = [dict(op=0, bytes=40), dict(op=0, bytes=40), dict(op=0, bytes=40, dtype=8),
             dict(op=2, bytes=8), dict(op=0, bytes=40), dict(op=0, bytes=500),
             dict(op=0, bytes=10, reduce_op=4)]
    plan = T.plan_batches(items, 100)
    assert plan == [[0, 1], [2], [3], [4], [5], [6]]
    assert T.plan_batches(items, 0) == [[i] for i in range(7)]
    assert T.plan_batches([dict(op=0, bytes=1)] * 5, 1 << 20) == [[0, 1, 2, 3, 4]]
