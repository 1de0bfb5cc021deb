"""horovodlite's own algorithms with nothing but a Transport under them, and the allreduce planner.

``horovodlite._testing`` runs N ranks as threads over in-process transports (LocalTransport, and
the single-copy layer on top when the ranks are given pretend hosts): the real Executor and its
per-op code on host memory, the host collectives with no native collective at all (the ring, the
transport allgather/reducescatter/broadcast/alltoall), the single-copy probe and protocol - what
a new transport family gets without writing any collective. The planner's decisions are checked
against its documented rules (csrc/comm/allreduce_planner.h).
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
FLOAT32, FLOAT64 = DTYPE_CODE[torch.float32], DTYPE_CODE[torch.float64]
# No single copy; single copy between all ranks (one host); two hosts, single copy inside each.
LAYOUTS = [pytest.param("plain", id="plain"), pytest.param("one-host", id="single-copy"),
           pytest.param("two-hosts", id="two-hosts")]


def hosts_for(layout, n):
    if layout == "one-host":
        return ["h0"] * n
    if layout == "two-hosts":
        return [f"h{r % 2}" for r in range(n)]
    return []


def run(nranks, ops, layout="plain", threshold=64 << 20, joined=(), algorithm="auto"):
    out = T.run_device_ops(nranks, ops, mode="transports", hosts=hosts_for(layout, nranks),
                           fusion_threshold=threshold, joined=list(joined), algorithm=algorithm)
    for rank, (results, _) in enumerate(out):
        if rank in joined:
            continue
        for op, res in zip(ops, results):
            assert res["done"] and res["error"] == "", (rank, op["name"], res["error"])
    return out


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("nranks", [1, 2, 3, 4])
@pytest.mark.parametrize("dtype,op", [(torch.float32, AVERAGE), (torch.float64, SUM),
                                      (torch.bfloat16, SUM), (torch.int32, MAX),
                                      (torch.int64, PRODUCT), (torch.int16, MIN)])
def test_fused_allreduce_over_transports(layout, nranks, dtype, op):
    # 300 KiB in all: fused batches of this size run as the in-place ring over spans.
    shapes = [(3, 4), (40000,), (1,), (0,), (2, 2, 2), (37000,)]
    pre, post = (0.5, 3.0) if dtype in FLOATS else (1.0, 1.0)
    ops = [dict(op=ALLREDUCE, name=f"t{i}", dtype=DTYPE_CODE[dtype], reduce_op=op, prescale=pre,
                postscale=post, shapes=[s] * nranks,
                inputs=[to_bytes(data(i, r, s, dtype, op)) for r in range(nranks)])
           for i, s in enumerate(shapes)]
    out = run(nranks, ops, layout)
    for r, (results, stats) in enumerate(out):
        for i, s in enumerate(shapes):
            want = reduce_ref([data(i, q, s, dtype, op) for q in range(nranks)], op, dtype,
                              pre, post)
            close(from_bytes(results[i]["output"], dtype, s), want, dtype, f"rank {r} t{i}")
        expected_peers = {"one-host": nranks - 1,
                          "two-hosts": len(range(r % 2, nranks, 2)) - 1}.get(layout, 0)
        assert stats["single_copy_peers"] == (expected_peers if nranks > 1 else 0)


@pytest.mark.parametrize("algorithm", ["auto", "ring", "mpi"])
@pytest.mark.parametrize("in_place", [False, True])
def test_lone_allreduce_over_transports(algorithm, in_place):
    # With no native collective a "native" plan falls back to the ring: same result.
    n, s = 3, (1000, 3)
    ops = [dict(op=ALLREDUCE, name="g", dtype=FLOAT64, reduce_op=AVERAGE, prescale=2.0,
                postscale=0.5, in_place=in_place, shapes=[s] * n,
                inputs=[to_bytes(data(1, r, s, torch.float64)) for r in range(n)])]
    out = run(n, ops, "one-host", algorithm=algorithm)
    want = reduce_ref([data(1, r, s, torch.float64) for r in range(n)], AVERAGE, torch.float64,
                      2.0, 0.5)
    for results, _ in out:
        close(from_bytes(results[0]["output"], torch.float64, s), want, torch.float64)


def test_fused_ring_results_do_not_depend_on_fusion():
    # The ring's chunk-major layout: a tensor reduced alone or inside any batch, identical bits.
    n, shapes = 3, [(70001,), (5,), (123457,)]
    ops = [dict(op=ALLREDUCE, name=f"t{i}", dtype=FLOAT32, reduce_op=SUM, shapes=[s] * n,
                inputs=[to_bytes(data(i, r, s, torch.float32)) for r in range(n)])
           for i, s in enumerate(shapes)]
    fused = run(n, ops, "one-host")
    alone = run(n, ops, "one-host", threshold=1)
    for r in range(n):
        for i in range(len(shapes)):
            assert fused[r][0][i]["output"] == alone[r][0][i]["output"], (r, i)


def test_joined_rank_contributes_zeros_over_transports():
    n, s = 3, (70000,)
    ops = [dict(op=ALLREDUCE, name=f"j{i}", dtype=FLOAT32, reduce_op=AVERAGE, shapes=[s] * n,
                inputs=[to_bytes(data(i, r, s, torch.float32)) for r in range(n)])
           for i in range(3)]
    out = run(n, ops, "one-host", joined=[1])
    for i in range(3):
        want = sum(data(i, r, s, torch.float32).double() for r in (0, 2)) / n
        for r in (0, 2):
            close(from_bytes(out[r][0][i]["output"], torch.float32, s), want, torch.float32)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("nranks", [1, 2, 3, 5])
def test_gather_type_collectives_over_transports(layout, nranks):
    dtype = torch.float64
    code = DTYPE_CODE[dtype]
    gather_shapes = [(r + 1, 3) for r in range(nranks)]
    scatter_shape = (2 * nranks + 1, 2)
    splits = [[(r + q) % 3 for q in range(nranks)] for r in range(nranks)]
    a2a_shapes = [(sum(splits[r]), 4) for r in range(nranks)]
    ops = [
        dict(op=ALLGATHER, name="ag", dtype=code, shapes=gather_shapes,
             inputs=[to_bytes(data(1, r, gather_shapes[r], dtype)) for r in range(nranks)]),
        dict(op=REDUCESCATTER, name="rs", dtype=code, reduce_op=SUM,
             shapes=[scatter_shape] * nranks,
             inputs=[to_bytes(data(2, r, scatter_shape, dtype)) for r in range(nranks)]),
        dict(op=BROADCAST, name="bc", dtype=code, root=nranks - 1, shapes=[(6,)] * nranks,
             inputs=[to_bytes(data(3, r, (6,), dtype)) for r in range(nranks)]),
        dict(op=ALLTOALL, name="a2a", dtype=code, shapes=a2a_shapes, splits=splits,
             inputs=[to_bytes(data(4, r, a2a_shapes[r], dtype)) for r in range(nranks)]),
    ]
    out = run(nranks, ops, layout)
    gathered = torch.cat([data(1, q, gather_shapes[q], dtype) for q in range(nranks)])
    summed = sum(data(2, q, scatter_shape, dtype) for q in range(nranks))
    rows = [scatter_shape[0] // nranks + (1 if r < scatter_shape[0] % nranks else 0)
            for r in range(nranks)]
    for r, (results, _) in enumerate(out):
        assert torch.equal(from_bytes(results[0]["output"], dtype, gathered.shape), gathered)
        lo = sum(rows[:r])
        mine = summed[lo:lo + rows[r]]
        close(from_bytes(results[1]["output"], dtype, mine.shape), mine, dtype)
        assert torch.equal(from_bytes(results[2]["output"], dtype, (6,)),
                           data(3, nranks - 1, (6,), dtype))
        parts = []
        for q in range(nranks):
            start = sum(splits[q][:r])
            parts.append(data(4, q, a2a_shapes[q], dtype)[start:start + splits[q][r]])
        want = torch.cat(parts)
        assert torch.equal(from_bytes(results[3]["output"], dtype, want.shape), want)
        assert results[3]["extra"] == [splits[q][r] for q in range(nranks)]


# ----------------------------------------------------------------- the transport collectives


def blocks(nranks, counts, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(c) for c in counts]


@pytest.mark.parametrize("hosts", ["plain", "one-host", "two-hosts"])
@pytest.mark.parametrize("nranks", [1, 2, 3, 4, 7])
def test_transport_allgatherv_and_reducescatter(hosts, nranks):
    counts = [(r * 37) % 11 for r in range(nranks)]  # uneven, some empty
    parts = blocks(nranks, counts)
    out = T.transport_collective("allgather", [p.tobytes() for p in parts], [counts],
                                 FLOAT64, hosts=hosts_for(hosts, nranks), segment=48)
    want = np.concatenate(parts).tobytes()
    assert all(got == want for got, _ in out)
    inputs = [np.random.default_rng(r).standard_normal(sum(counts)) for r in range(nranks)]
    out = T.transport_collective("reducescatter", [x.tobytes() for x in inputs], [counts],
                                 FLOAT64, hosts=hosts_for(hosts, nranks), segment=48)
    total = np.sum(inputs, axis=0)
    for r, (got, _) in enumerate(out):
        lo = sum(counts[:r])
        np.testing.assert_allclose(np.frombuffer(got), total[lo:lo + counts[r]], rtol=1e-12)
    # Every rank adds in the order its ring fixes: the same bits on every run.
    again = T.transport_collective("reducescatter", [x.tobytes() for x in inputs], [counts],
                                   FLOAT64, hosts=hosts_for(hosts, nranks), segment=48)
    assert [g for g, _ in again] == [g for g, _ in out]
    # In place on scratch (a fusion buffer the caller gives up): the same bits, no copy.
    inplace = T.transport_collective("reducescatter_inplace", [x.tobytes() for x in inputs],
                                     [counts], FLOAT64, hosts=hosts_for(hosts, nranks), segment=48)
    assert [g for g, _ in inplace] == [g for g, _ in out]


@pytest.mark.parametrize("nranks", [1, 2, 3, 5, 8])
def test_transport_broadcast_from_every_root(nranks):
    for root in range(nranks):
        inputs = [np.full(9, float(r)) for r in range(nranks)]
        out = T.transport_collective("broadcast", [x.tobytes() for x in inputs], root=root,
                                     dtype=FLOAT64)
        assert all(np.array_equal(np.frombuffer(g), inputs[root]) for g, _ in out), root


@pytest.mark.parametrize("nranks", [1, 2, 3, 4])
def test_transport_alltoallv(nranks):
    sends = [[(r * 3 + q) % 4 for q in range(nranks)] for r in range(nranks)]
    inputs = [np.arange(sum(sends[r]), dtype=np.float32) + 100 * r for r in range(nranks)]
    out = T.transport_collective("alltoall", [x.tobytes() for x in inputs], sends, FLOAT32,
                                 hosts=hosts_for("one-host", nranks))
    for r, (got, _) in enumerate(out):
        want = np.concatenate([inputs[q][sum(sends[q][:r]):sum(sends[q][:r]) + sends[q][r]]
                               for q in range(nranks)])
        assert np.array_equal(np.frombuffer(got, dtype=np.float32), want)


def test_single_copy_pairs_only_ranks_of_one_host():
    out = T.transport_collective("broadcast", [b"\0" * 8] * 5, dtype=FLOAT64,
                                 hosts=["a", "b", "a", "a", "c"])
    assert [peers for _, peers in out] == [2, 0, 2, 2, 0]


# ------------------------------------------------------------------------------ the planner


def plan(env=None, fabric=None, nccl=False, **query):
    return T.plan_allreduce(env or {}, fabric or {}, query, nccl=nccl)


def test_planner_single_tensor_native_fused_batch_ring():
    assert plan(bytes=4)["algorithm"] == "native"
    assert plan(bytes=1 << 20)["algorithm"] == "native"
    p = plan(bytes=256 * 1024, tensors=10)
    assert p["algorithm"] == "ring" and p["spans"] and p["activity"] == "RING_ALLREDUCE"
    assert plan(bytes=256 * 1024 - 1, tensors=10)["algorithm"] == "native"
    assert not plan(bytes=1 << 20, tensors=1, env={"HOROVOD_ALLREDUCE_ALGO": "ring"})["spans"]


def test_planner_floating_sums_on_three_ranks_ring_for_determinism():
    assert plan(bytes=4, set_size=3, op=SUM)["algorithm"] == "ring"
    assert plan(bytes=4, set_size=3, op=AVERAGE)["algorithm"] == "ring"
    assert plan(bytes=4, set_size=3, op=MAX)["algorithm"] == "native"
    assert plan(bytes=4, set_size=3, op=SUM, dtype=DTYPE_CODE[torch.int32])["algorithm"] == "native"
    assert plan(bytes=4, set_size=1, op=SUM)["algorithm"] == "native"


def test_planner_forced_algorithms_and_threshold():
    assert plan(env={"HOROVOD_ALLREDUCE_ALGO": "mpi"}, bytes=1 << 20, tensors=9,
                set_size=3)["algorithm"] == "native"
    assert plan(env={"HOROVOD_ALLREDUCE_ALGO": "ring"}, bytes=4)["algorithm"] == "ring"
    env = {"HOROVOD_RING_THRESHOLD": "1000"}
    assert plan(env=env, bytes=999)["algorithm"] == "native"
    assert plan(env=env, bytes=1000)["algorithm"] == "ring"
    # auto: single tensors from 8 MiB ring on one host with single-copy rings, never across
    # hosts, without single copy, or with -1
    big = 8 << 20
    assert plan(bytes=big - 1)["algorithm"] == "native"
    assert plan(bytes=big)["algorithm"] == "ring"
    assert plan(fabric={"spans_hosts": True}, bytes=big)["algorithm"] == "native"
    assert plan(env={"HOROVOD_RING_CMA": "0"}, bytes=big)["algorithm"] == "native"
    assert plan(env={"HOROVOD_RING_THRESHOLD": "-1"}, bytes=big)["algorithm"] == "native"
    assert plan(env={"HOROVOD_RING_THRESHOLD": "auto"}, bytes=big)["algorithm"] == "ring"


def test_planner_average_is_a_sum_with_postscale():
    p = plan(op=AVERAGE, set_size=4, prescale=2.0, postscale=3.0)
    assert (p["op"], p["prescale"], p["postscale"]) == (SUM, 2.0, 0.75)
    p = plan(op=MIN, set_size=4, postscale=3.0)
    assert (p["op"], p["postscale"]) == (MIN, 3.0)


def test_planner_segments_depend_on_the_job_not_the_member():
    assert plan(bytes=1 << 20, tensors=3)["segment_bytes"] == 256 * 1024
    across = plan(fabric={"spans_hosts": True}, bytes=1 << 20, tensors=3)
    assert across["segment_bytes"] == 64 * 1024
    env = {"HOROVOD_RING_SEGMENT_BYTES": "4096"}
    assert plan(env=env, fabric={"spans_hosts": True}, bytes=1 << 20,
                tensors=3)["segment_bytes"] == 4096


def test_planner_hierarchical_where_the_layout_allows():
    layout = {"hierarchical": True, "spans_hosts": True}
    p = plan(fabric=layout, bytes=1 << 20, tensors=3)
    assert p["algorithm"] == "hierarchical" and p["spans"]
    assert (p["segment_bytes"], p["cross_segment_bytes"]) == (256 * 1024, 64 * 1024)
    assert plan(fabric=layout, bytes=4)["algorithm"] == "native"  # auto: where auto rings
    assert plan(fabric=layout, bytes=1 << 20, tensors=3, ps=1)["algorithm"] == "ring"
    on = {"HOROVOD_HIERARCHICAL_ALLREDUCE": "1"}
    assert plan(env=on, fabric=layout, bytes=4)["algorithm"] == "hierarchical"
    off = {"HOROVOD_HIERARCHICAL_ALLREDUCE": "0"}
    assert plan(env=off, fabric=layout, bytes=1 << 20, tensors=3)["algorithm"] == "ring"
    assert plan(env=on, fabric={"spans_hosts": True}, bytes=4)["algorithm"] == "native"


def test_planner_device_tensors():
    p = plan(device=0, bytes=1 << 20, tensors=5, nccl=True)
    assert (p["algorithm"], p["backend"], p["activity"], p["spans"]) == \
        ("native", "nccl", "NCCL_ALLREDUCE", False)
    on = {"HOROVOD_HIERARCHICAL_ALLREDUCE": "1"}
    assert plan(env=on, device=0, nccl=True)["algorithm"] == "hierarchical"
    assert plan(env=on, device=0, nccl=True, ps=1)["algorithm"] == "native"
    assert plan(env=on, fabric={"homogeneous": False}, device=0, nccl=True)["algorithm"] == "native"
    staged = plan(device=0, nccl=False)
    assert (staged["backend"], staged["activity"]) == ("host-staged", "MPI_ALLREDUCE")


def test_planner_without_transports_only_native():
    assert plan(fabric={"none": True}, bytes=1 << 20, tensors=9, set_size=3)["algorithm"] == \
        "native"


@pytest.mark.parametrize("algorithm", ["auto", "ring", "mpi"])
@pytest.mark.parametrize("nranks", [1, 2, 3, 4])
def test_a_tensor_in_pieces_is_reduced_where_its_pieces_are(algorithm, nranks):
    """A gradient bucket whose gradients are tensors of their own goes out as one tensor in
    pieces (TensorEntry::pieces) under the bucket's name, while a rank whose gradients are the
    bucket's views sends the flat tensor: the same op. Odd ranks here hold each tensor in runs
    laid apart and in reverse order, even ranks in one piece; alone and fused with other
    tensors, every rank gets the reference result, and the bits of a run where no rank uses
    pieces."""
    dtype = torch.float32
    shapes = [(70001,), (5,), (9000,)]  # t0 in pieces, fused with t1 and t2; then "alone"
    runs_of = {0: [30000, 0, 17, 39984], 2: [4000, 5000]}

    def ops(pieces: bool):
        out = []
        for i, s in enumerate(shapes):
            op = dict(op=ALLREDUCE, name=f"p{i}", dtype=DTYPE_CODE[dtype], reduce_op=AVERAGE,
                      prescale=0.5, postscale=3.0, in_place=True, shapes=[s] * nranks,
                      inputs=[to_bytes(data(i, r, s, dtype)) for r in range(nranks)])
            if pieces and i in runs_of:
                op["pieces"] = [runs_of[i] if r % 2 else [] for r in range(nranks)]
            out.append(op)
        return out

    for threshold in (64 << 20, 1):  # fused, then each tensor alone
        plain = run(nranks, ops(False), "one-host", threshold=threshold, algorithm=algorithm)
        got = run(nranks, ops(True), "one-host", threshold=threshold, algorithm=algorithm)
        for r in range(nranks):
            for i, s in enumerate(shapes):
                want = reduce_ref([data(i, q, s, dtype) for q in range(nranks)], AVERAGE, dtype,
                                  0.5, 3.0)
                close(from_bytes(got[r][0][i]["output"], dtype, s), want, dtype,
                      f"rank {r} p{i} threshold {threshold}")
                assert got[r][0][i]["output"] == plain[r][0][i]["output"], (r, i, threshold)
