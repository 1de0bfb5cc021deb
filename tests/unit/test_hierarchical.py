"""Hierarchical allreduce (comm/hierarchical) over in-process rank threads laid out as hosts x
ranks per host: against NumPy for every dtype and op, identical bits on every rank, results that
depend only on each element's chunk (fusion-independent), integers equal to the flat ring."""

import numpy as np
import pytest
import torch
from cpp_testing import load_testing_module
from hypothesis import given, settings
from hypothesis import strategies as st
from test_kernels_and_ring import DT, OPS, from_bytes, make, reference, to_bytes, tolerance

T = load_testing_module()
GRIDS = [(1, 1), (1, 3), (3, 1), (2, 2), (2, 3), (3, 2)]  # hosts x ranks per host


@pytest.mark.parametrize("grid", GRIDS, ids=lambda g: f"{g[0]}x{g[1]}")
@pytest.mark.parametrize("count", [0, 1, 7, 64, 1001])
@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", list(DT), ids=str)
def test_matches_numpy_and_ranks_agree_bitwise(dtype, op, count, grid):
    hosts, per_host = grid
    n = hosts * per_host
    inputs = [make(r, count, dtype, op) for r in range(n)]
    outs = T.hierarchical_allreduce([to_bytes(t) for t in inputs], hosts, DT[dtype], OPS[op],
                                    segment=16)
    assert len(set(outs)) == 1, "ranks got different bits"
    got = from_bytes(outs[0], dtype, (count,)).double().numpy()
    np.testing.assert_allclose(got, reference(inputs, op), rtol=tolerance(dtype, n),
                               atol=tolerance(dtype, n))
    if not dtype.is_floating_point:  # exact: the same as the flat ring
        assert outs == T.ring_allreduce([to_bytes(t) for t in inputs], DT[dtype], OPS[op])


def test_average_is_scaled_once():
    inputs = [torch.arange(12, dtype=torch.float64) * (r + 1) for r in range(6)]  # 2 hosts x 3
    outs = T.hierarchical_allreduce([to_bytes(t) for t in inputs], 2, DT[torch.float64], 1,
                                    postscale=1 / 6)
    expected = torch.arange(12, dtype=torch.float64) * 3.5
    for b in outs:
        assert torch.allclose(from_bytes(b, torch.float64, (12,)), expected)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(grid=st.sampled_from(GRIDS[2:]), pads=st.lists(st.integers(0, 9), min_size=6,
                                                        max_size=6), seed=st.integers(0, 99))
def test_result_depends_only_on_chunk_index(grid, pads, seed):
    # Each chunk of a tensor reduced alone, and the same chunk with other data around it (as
    # when fused with other tensors): bit-identical elements.
    hosts, per_host = grid
    n = hosts * per_host
    rng = np.random.default_rng(seed)
    per_chunk = 5
    data = [rng.normal(size=n * per_chunk).astype(np.float32) for _ in range(n)]
    pads = (pads * n)[:n]
    fillers = [[rng.normal(size=p).astype(np.float32) for p in pads] for _ in range(n)]
    padded = [np.concatenate([np.concatenate([d[c * per_chunk:(c + 1) * per_chunk], f[c]])
                              for c in range(n)]) for d, f in zip(data, fillers)]
    alone = T.hierarchical_allreduce([d.tobytes() for d in data], hosts, 7, 1,
                                     chunks=[per_chunk] * n)
    fused = T.hierarchical_allreduce([d.tobytes() for d in padded], hosts, 7, 1,
                                     chunks=[per_chunk + p for p in pads])
    a = np.frombuffer(alone[0], np.float32)
    b = np.frombuffer(fused[0], np.float32)
    starts = np.cumsum([0] + [per_chunk + p for p in pads])
    picked = np.concatenate([b[s:s + per_chunk] for s in starts[:-1]])
    assert np.array_equal(a, picked)


def test_bad_grid_is_an_error():
    with pytest.raises(ValueError):
        T.hierarchical_allreduce([b"\0" * 4] * 3, 2, DT[torch.float32], 1)


@pytest.mark.parametrize("hosts", [[[0, 1], [2, 3]], [[0, 2], [1, 3]], [[0], [1], [2]],
                                   [[0, 1, 2]], [[0, 3], [5, 1], [2, 4]]],
                         ids=["2x2", "2x2-interleaved", "3x1", "1x3", "3x2-scattered"])
@pytest.mark.parametrize("sizes", ["even", "uneven"])
def test_hierarchical_allgather_matches_the_concatenation(hosts, sizes):
    """comm/hierarchical's allgather: across hosts by local rank, then inside each host, for
    any placement of ranks on hosts (columns in ascending rank order) and blocks of any size
    (empty ones too), in segments smaller than the blocks."""
    n = sum(len(h) for h in hosts)
    blocks = [bytes((r * 37 + i) % 251 for i in range(100 if sizes == "even" else r * 45))
              for r in range(n)]
    outs = T.hierarchical_allgather(blocks, hosts, segment=16)
    assert outs == [b"".join(blocks)] * n


@pytest.mark.parametrize("hosts", [[[0, 1], [2, 3]], [[0, 2], [1, 3]], [[0], [1], [2]],
                                   [[0, 1, 2]], [[0, 3], [5, 1], [2, 4]]],
                         ids=["2x2", "2x2-interleaved", "3x1", "1x3", "3x2-scattered"])
def test_hierarchical_reducescatter_sums_each_ranks_block(hosts):
    """comm/hierarchical's reduce-scatter: inside each host by column, then across hosts, for
    any placement; blocks of different sizes (one empty), small integers: exact sums."""
    n = sum(len(h) for h in hosts)
    counts = [r * 7 + (0 if r == 1 else 3) for r in range(n)]
    inputs = [np.arange(sum(counts), dtype=np.float32) % 5 + r for r in range(n)]
    outs = T.hierarchical_reducescatter([a.tobytes() for a in inputs], hosts, counts, segment=16)
    total = np.sum(inputs, axis=0)
    at = np.cumsum([0] + counts)
    for r in range(n):
        np.testing.assert_array_equal(np.frombuffer(outs[r], np.float32), total[at[r]:at[r + 1]])
