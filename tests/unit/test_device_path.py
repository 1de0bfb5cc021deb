"""The executor's device (CUDA) path, checked on the CPU.

No GPU is needed: ``horovodlite._testing`` runs the real Executor (its device path) with
HostDeviceOps (host memory standing in for device memory; its ScaleCopy walks the CUDA kernel's
tiles, see csrc/comm/batch_copy.h) and N ranks as threads over ThreadBackend, directly
("NCCL-like" device backend) or through HostStagingBackend (the MPI fallback). The CUDA kernels
themselves are compared with this reference on a GPU by tests/unit/test_cuda_kernels.py and by
``hvdl_cuda_check`` (tests/unit/test_cuda_build.py builds it).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from collective_reference import (
    ALLGATHER,
    ALLREDUCE,
    ALLTOALL,
    AVERAGE,
    BROADCAST,
    DTYPE_CODE,
    FLOATS,
    MAX,
    MIN,
    PRODUCT,
    REDUCESCATTER,
    SUM,
    close,
    data,
    from_bytes,
    reduce_ref,
    to_bytes,
)
from cpp_testing import load_testing_module

T = load_testing_module()
TILE = T.batch_tile_elements

def run(nranks, ops, staging, threshold=64 << 20, joined=(), chunk=0, stream=False):
    out = T.run_device_ops(nranks, ops, staging=staging, fusion_threshold=threshold,
                           joined=list(joined), staging_chunk_bytes=chunk,
                           stream_completion=stream)
    for rank, (results, _) in enumerate(out):
        if rank in joined:
            continue
        for op, res in zip(ops, results):
            assert res["done"] and res["error"] == "", (rank, op["name"], res["error"])
            assert res["device_done"], (rank, op["name"])
            assert res["ready_waits"] >= 1, (rank, op["name"])
    return out


# ---------------------------------------------------------------------- the kernel's tiling


@pytest.mark.parametrize("counts", [[1], [0], [TILE], [TILE + 1, 0, 3], [0, 0, 5, 0],
                                    [TILE - 1, TILE, TILE + 1, 1, 0, 3 * TILE + 7]])
def test_tiles_cover_every_element_exactly_once(counts):
    seen = [np.zeros(c, dtype=np.int64) for c in counts]
    tiles = T.batch_plan(counts)
    assert [t for t, *_ in tiles] == list(range(len(tiles)))
    for _, region, first, last in tiles:
        assert counts[region] > 0 and 0 <= first < last <= counts[region]
        assert last - first <= TILE
        seen[region][first:last] += 1
    for s in seen:
        assert (s == 1).all()


@pytest.mark.parametrize("dtype", list(DTYPE_CODE))
@pytest.mark.parametrize("factor", [1.0, 0.5, 3.0, -0.25])
@pytest.mark.parametrize("in_place", [False, True])
def test_batched_scale_copy_is_the_cpu_kernel_in_one_launch(dtype, factor, in_place):
    if factor < 0 and dtype == torch.uint8:
        pytest.skip("negative factors have no uint8 result")
    sizes = [5, 0, TILE - 1, TILE + 3, 2 * TILE, 17]
    tensors = [data(3, i, (n,), dtype) for i, n in enumerate(sizes)]
    blobs = [to_bytes(t) for t in tensors]
    out, launches = T.device_scale_copy(blobs, DTYPE_CODE[dtype], factor, in_place)
    assert launches == 1
    for blob, got in zip(blobs, out):
        assert got == T.scale(blob, DTYPE_CODE[dtype], factor)  # bit for bit


# ------------------------------------------------------------------- collectives, both paths

PATHS = [pytest.param(False, id="device-backend"), pytest.param(True, id="host-staging")]


COMPLETION = [pytest.param(False, id="host-completion"), pytest.param(True, id="stream-completion")]


@pytest.mark.parametrize("stream", COMPLETION)
@pytest.mark.parametrize("staging", PATHS)
@pytest.mark.parametrize("nranks", [1, 2, 3])
@pytest.mark.parametrize("dtype,op", [(torch.float32, AVERAGE), (torch.float64, SUM),
                                      (torch.float16, SUM), (torch.bfloat16, AVERAGE),
                                      (torch.int32, MAX), (torch.int64, PRODUCT),
                                      (torch.int16, MIN), (torch.uint8, SUM)])
def test_fused_allreduce_packs_in_one_launch(stream, staging, nranks, dtype, op):
    shapes = [(3, 4), (TILE + 5,), (1,), (2, 2, 2), (0,)]
    pre, post = (0.5, 3.0) if dtype in FLOATS else (1.0, 1.0)
    ops = [dict(op=ALLREDUCE, name=f"t{i}", dtype=DTYPE_CODE[dtype], reduce_op=op, prescale=pre,
                postscale=post, shapes=[s] * nranks,
                inputs=[to_bytes(data(i, r, s, dtype, op)) for r in range(nranks)])
           for i, s in enumerate(shapes)]
    out = run(nranks, ops, staging, stream=stream)  # stream: handles done once queued
    for r, (results, stats) in enumerate(out):
        for i, s in enumerate(shapes):
            want = reduce_ref([data(i, q, s, dtype, op) for q in range(nranks)], op, dtype,
                              pre, post)
            close(from_bytes(results[i]["output"], dtype, s), want, dtype, f"rank {r} t{i}")
        assert stats["launches"] == 2  # one pack, one unpack for the five tensors
        assert stats["records"] == 1
        assert (stats["host_copies"] > 0) == staging


@pytest.mark.parametrize("staging", PATHS)
@pytest.mark.parametrize("in_place", [False, True])
def test_lone_allreduce_runs_on_its_output(staging, in_place):
    n, s = 3, (7, 3)
    ops = [dict(op=ALLREDUCE, name="g", dtype=DTYPE_CODE[torch.float64], reduce_op=AVERAGE,
                prescale=2.0, in_place=in_place, shapes=[s] * n,
                inputs=[to_bytes(data(1, r, s, torch.float64)) for r in range(n)])]
    out = run(n, ops, staging)
    want = reduce_ref([data(1, r, s, torch.float64) for r in range(n)], AVERAGE, torch.float64, 2.0)
    for results, stats in out:
        close(from_bytes(results[0]["output"], torch.float64, s), want, torch.float64)
        assert stats["launches"] == 1  # the prescale, written into the output


@pytest.mark.parametrize("staging", PATHS)
def test_joined_rank_contributes_zeros(staging):
    n, s = 3, (5,)
    ops = [dict(op=ALLREDUCE, name=f"j{i}", dtype=DTYPE_CODE[torch.float32], reduce_op=AVERAGE,
                shapes=[s] * n, inputs=[to_bytes(data(i, r, s, torch.float32)) for r in range(n)])
           for i in range(2)]
    out = run(n, ops, staging, joined=[1])
    for i in range(2):
        want = sum(data(i, r, s, torch.float32).double() for r in (0, 2)) / n
        for r in (0, 2):
            close(from_bytes(out[r][0][i]["output"], torch.float32, s), want, torch.float32)


@pytest.mark.parametrize("stream", COMPLETION)
@pytest.mark.parametrize("staging", PATHS)
@pytest.mark.parametrize("nranks", [1, 2, 3])
def test_fused_allgather_with_uneven_first_dims(stream, staging, nranks):
    dtype = torch.bfloat16
    trailing = [(3,), (), (2, 2)]
    ops = []
    for i, tr in enumerate(trailing):
        shapes = [(r + i + (1 if tr == () else 0), *tr) for r in range(nranks)]
        ops.append(dict(op=ALLGATHER, name=f"a{i}", dtype=DTYPE_CODE[dtype], shapes=shapes,
                        inputs=[to_bytes(data(i, r, shapes[r], dtype)) for r in range(nranks)]))
    out = run(nranks, ops, staging, stream=stream)
    for r, (results, stats) in enumerate(out):
        for i, op in enumerate(ops):
            want = torch.cat([data(i, q, op["shapes"][q], dtype) for q in range(nranks)])
            got = from_bytes(results[i]["output"], dtype, want.shape)
            assert torch.equal(got, want), (r, i)
        assert stats["launches"] == 2


@pytest.mark.parametrize("staging", PATHS)
@pytest.mark.parametrize("nranks", [1, 2, 3])
@pytest.mark.parametrize("op", [AVERAGE, SUM])
def test_fused_reducescatter_gives_low_ranks_the_extra_rows(staging, nranks, op):
    dtype = torch.float64
    shapes = [(7, 2), (nranks * 2,), (1, 3)]
    ops = [dict(op=REDUCESCATTER, name=f"r{i}", dtype=DTYPE_CODE[dtype], reduce_op=op,
                prescale=0.5, postscale=4.0, shapes=[s] * nranks,
                inputs=[to_bytes(data(i, r, s, dtype)) for r in range(nranks)])
           for i, s in enumerate(shapes)]
    out = run(nranks, ops, staging)
    for i, s in enumerate(shapes):
        full = reduce_ref([data(i, q, s, dtype) for q in range(nranks)], op, dtype, 0.5, 4.0)
        rows = [s[0] // nranks + (1 if q < s[0] % nranks else 0) for q in range(nranks)]
        for r in range(nranks):
            lo = sum(rows[:r])
            want = full[lo:lo + rows[r]]
            close(from_bytes(out[r][0][i]["output"], dtype, want.shape), want, dtype, f"r{i}@{r}")


@pytest.mark.parametrize("staging", PATHS)
@pytest.mark.parametrize("in_place", [False, True])
def test_broadcast_from_a_non_zero_root(staging, in_place):
    n, s, dtype = 3, (4, 5), torch.int16
    ops = [dict(op=BROADCAST, name="b", dtype=DTYPE_CODE[dtype], root=1, in_place=in_place,
                shapes=[s] * n, inputs=[to_bytes(data(2, r, s, dtype)) for r in range(n)])]
    out = run(n, ops, staging)
    for results, _ in out:
        assert torch.equal(from_bytes(results[0]["output"], dtype, s), data(2, 1, s, dtype))


@pytest.mark.parametrize("staging", PATHS)
def test_alltoall_with_splits(staging):
    n, dtype = 3, torch.float16
    splits = [[1, 0, 2], [2, 2, 0], [0, 1, 3]]
    shapes = [(sum(sp) + 1, 2) for sp in splits]  # one row more than sent: never read
    ops = [dict(op=ALLTOALL, name="x", dtype=DTYPE_CODE[dtype], shapes=shapes, splits=splits,
                inputs=[to_bytes(data(4, r, shapes[r], dtype)) for r in range(n)])]
    out = run(n, ops, staging)
    for r, (results, _) in enumerate(out):
        pieces = []
        for q in range(n):
            start = sum(splits[q][:r])
            pieces.append(data(4, q, shapes[q], dtype)[start:start + splits[q][r]])
        want = torch.cat(pieces)
        assert torch.equal(from_bytes(results[0]["output"], dtype, want.shape), want)
        assert results[0]["extra"] == [splits[q][r] for q in range(n)]


def test_a_small_fusion_threshold_splits_the_batch():
    n, s, dtype = 2, (100,), torch.float32
    ops = [dict(op=ALLREDUCE, name=f"s{i}", dtype=DTYPE_CODE[dtype], reduce_op=SUM,
                shapes=[s] * n, inputs=[to_bytes(data(i, r, s, dtype)) for r in range(n)])
           for i in range(4)]
    out = run(n, ops, staging=False, threshold=2 * 400)  # two tensors per batch
    for results, stats in out:
        for i in range(4):
            want = reduce_ref([data(i, r, s, dtype) for r in range(n)], SUM, dtype)
            close(from_bytes(results[i]["output"], dtype, s), want, dtype)
        assert stats["records"] == 2 and stats["launches"] == 4


# ------------------------------------------------------- host staging's pipeline (in chunks)


def _chunks(nbytes, chunk, elem):
    step = max(elem, chunk // elem * elem)
    return 1 if chunk == 0 or nbytes <= step else -(-nbytes // step)


# Chunks that divide the message, that leave a short last chunk, that are not a whole number of
# elements (cut down to one), smaller than one element (one element each), and as large as it.
@pytest.mark.parametrize("chunk", [0, 64, 100, 6, 1, 4 * 1000])
@pytest.mark.parametrize("nranks", [1, 2, 3])
@pytest.mark.parametrize("dtype,op", [(torch.float32, AVERAGE), (torch.float64, MIN),
                                      (torch.float16, SUM), (torch.int64, PRODUCT)])
def test_staged_allreduce_in_chunks_is_the_whole_allreduce(chunk, nranks, dtype, op):
    n = 1000 if dtype != torch.float64 else 301
    shapes = [(n,), (3, 5)]  # over the fusion threshold: each on its own, one in chunks
    pre, post = (0.5, 3.0) if dtype in FLOATS else (1.0, 1.0)
    ops = [dict(op=ALLREDUCE, name=f"c{i}", dtype=DTYPE_CODE[dtype], reduce_op=op, prescale=pre,
                postscale=post, shapes=[s] * nranks,
                inputs=[to_bytes(data(i, r, s, dtype, op)) for r in range(nranks)])
           for i, s in enumerate(shapes)]
    out = run(nranks, ops, staging=True, threshold=1024, chunk=chunk)
    elem = torch.empty(0, dtype=dtype).element_size()
    pieces = [_chunks(n * elem, chunk, elem), _chunks(15 * elem, chunk, elem)]
    for r, (results, stats) in enumerate(out):
        for i, s in enumerate(shapes):
            want = reduce_ref([data(i, q, s, dtype, op) for q in range(nranks)], op, dtype,
                              pre, post)
            close(from_bytes(results[i]["output"], dtype, s), want, dtype, f"rank {r} c{i}")
        # each chunk copied in and back; an event per chunk when there are several
        assert stats["host_copies"] == 2 * sum(pieces), (r, stats)
        events = sum(p for p in pieces if p > 1)
        assert stats["records"] == len(shapes) + events, (r, stats)


@pytest.mark.parametrize("chunk", [0, 8, 40])
@pytest.mark.parametrize("in_place", [False, True])
def test_staged_broadcast_in_chunks_copies_only_the_roots_data_in(chunk, in_place):
    n, s, dtype = 3, (7, 11), torch.int16  # 154 bytes: 20 chunks of 8, 4 of 40
    ops = [dict(op=BROADCAST, name="b", dtype=DTYPE_CODE[dtype], root=2, in_place=in_place,
                shapes=[s] * n, inputs=[to_bytes(data(5, r, s, dtype)) for r in range(n)])]
    out = run(n, ops, staging=True, chunk=chunk)
    pieces = _chunks(154, chunk, 2)
    for r, (results, stats) in enumerate(out):
        assert torch.equal(from_bytes(results[0]["output"], dtype, s), data(5, 2, s, dtype)), r
        copies_in = pieces if r == 2 else 0
        assert stats["host_copies"] == copies_in + pieces, (r, stats)
