"""Names as Horovod namespaces them: a collective negotiates under ``<op>.<user name>``, so
different ops may share a user name while both are in flight, the same op and name twice in flight
is refused, unnamed ops are ``<op>.noname.<n>``, and timelines and errors show those names (stall
reports: tests/test_failures.py).

To hold a collective in flight, rank 0 submits before a barrier that the other ranks enter before
they submit: it cannot complete before rank 0 has left the barrier. At np=1 nothing waits for
another rank, so there only what was accepted is checked."""

import json
import os
import re
import tempfile

import pytest
import torch

import horovodlite.torch as hvd

multi = pytest.mark.skipif(hvd.size() < 2, reason="needs at least 2 ranks")


def rank0_first(submit):
    """Runs ``submit()`` on rank 0 before a barrier and on the other ranks after it, so rank 0's
    collectives are still in flight while it runs ``submit`` (np > 1). Returns its result."""
    if hvd.rank() == 0:
        out = submit()
        hvd.barrier()
    else:
        hvd.barrier()
        out = submit()
    return out


def test_different_ops_share_a_user_name_while_in_flight():
    n, r = hvd.size(), hvd.rank()
    rows = 2 * n

    def submit():
        return dict(
            allreduce=hvd.allreduce_async(torch.full((3,), float(r)), name="x", op=hvd.Sum),
            broadcast=hvd.broadcast_async(torch.full((2,), float(r + 10)), 0, name="x"),
            allgather=hvd.allgather_async(torch.full((1, 2), float(r)), name="x"),
            alltoall=hvd.alltoall_async(torch.full((rows,), float(r)), name="x"),
            reducescatter=hvd.reducescatter_async(torch.ones(rows), name="x", op=hvd.Sum),
            grouped=hvd.grouped_allreduce_async([torch.ones(1), torch.ones(2)], name="x",
                                                op=hvd.Sum),
            inplace_broadcast=hvd.broadcast_async_(torch.full((1,), float(r)), 0, name="y"),
            inplace_allreduce=hvd.allreduce_async_(torch.full((1,), 1.0), name="y", op=hvd.Sum),
        )

    handles = rank0_first(submit)
    out = {k: hvd.synchronize(h) for k, h in handles.items()}
    total = float(sum(range(n)))
    assert out["allreduce"].tolist() == [total] * 3
    assert out["broadcast"].tolist() == [10.0, 10.0]
    assert out["allgather"][:, 0].tolist() == [float(k) for k in range(n)]
    received, splits = out["alltoall"]
    assert received.tolist() == [float(k) for k in range(n) for _ in range(2)]
    assert splits.tolist() == [2] * n
    assert out["reducescatter"].tolist() == [float(n)] * 2
    assert [t.tolist() for t in out["grouped"]] == [[float(n)], [float(n)] * 2]
    assert out["inplace_broadcast"].tolist() == [0.0]
    assert out["inplace_allreduce"].tolist() == [float(n)]


def test_the_same_op_and_name_twice_in_flight_is_refused():
    """Rank 0 tries a second broadcast 'twice' while its first is in flight (np > 1: held by
    the barrier, so certainly refused). Alone (np=1) the first may have completed already; then
    the second is accepted, and must be."""

    def submit():
        h = hvd.broadcast_async_(torch.ones(2), 0, name="twice")
        if hvd.rank() != 0:
            return h, None
        try:
            again = hvd.broadcast_async(torch.ones(2), 0, name="twice")
        except ValueError as exc:
            assert re.fullmatch(
                r"broadcast\.twice: a collective with this name is still pending on this rank "
                rf"\(handle {h}, not completed yet\); synchronize\(\) it before reusing the "
                r"name, or pass a different name\.", str(exc)), str(exc)
            return h, None
        assert hvd.size() == 1 and hvd.poll(h), "accepted while the first one was in flight"
        return h, again

    h, again = rank0_first(submit)
    assert hvd.synchronize(h).tolist() == [1.0, 1.0]
    if again is not None:
        assert hvd.synchronize(again).tolist() == [1.0, 1.0]
    # the refused call enqueued nothing, and once completed the name is free again
    assert hvd.broadcast(torch.ones(1), 0, name="twice").tolist() == [1.0]


@multi
def test_a_mismatch_error_names_the_op_prefixed_tensor():
    r = hvd.rank()
    ok = hvd.allreduce_async(torch.ones(2), name="disagree", op=hvd.Sum)
    bad = hvd.broadcast_async(torch.ones(2), root_rank=0 if r == 0 else 1, name="disagree")
    with pytest.raises(hvd.HorovodInternalError) as info:
        hvd.synchronize(bad)
    assert str(info.value).startswith("broadcast.disagree: root rank mismatch: rank 0 0, rank 1 "
                                      "1"), str(info.value)
    assert hvd.synchronize(ok).tolist() == [float(hvd.size())] * 2


def test_call_time_errors_name_the_op_prefixed_tensor():
    with pytest.raises(ValueError, match=r"^allgather\.nc: the tensor is not contiguous"):
        hvd.allgather_async(torch.zeros(4, 6).t(), name="nc")
    with pytest.raises(ValueError, match=r"^alltoall\.cx: unsupported dtype"):
        hvd.alltoall_async(torch.zeros(hvd.size(), dtype=torch.complex64), name="cx")


def traced(body):
    """Runs body() on every rank while a timeline records; returns the tensor names of rank 0's
    tracks (None on the other ranks)."""
    path = hvd.broadcast_object(os.path.join(tempfile.mkdtemp(), "names.json")
                                if hvd.rank() == 0 else None, name="names timeline path")
    hvd.start_timeline(path)
    try:
        body()
    finally:
        hvd.stop_timeline()
    if hvd.rank() != 0:
        return None
    with open(path) as f:
        events = json.load(f)
    return {e["args"]["name"] for e in events if e.get("name") == "thread_name"}


def numbers(names, op):
    return sorted(int(m.group(1)) for m in map(re.compile(rf"{op}\.noname\.(\d+)").fullmatch,
                                               names) if m)


def test_timeline_tracks_carry_the_negotiated_names():
    model = torch.nn.Linear(2, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())

    def body():
        hvd.allreduce(torch.ones(2), name="test_allreduce")
        hvd.broadcast(torch.ones(2), 0, name="test_allreduce")  # the same user name
        for _ in range(3):
            hvd.allreduce(torch.ones(1))
        for _ in range(2):
            hvd.broadcast(torch.ones(1), 0)
        hvd.grouped_allreduce([torch.ones(1), torch.ones(2)], name="g")
        hvd.sparse_allreduce_async(torch.eye(2).to_sparse(), "emb", hvd.Sum)()
        model(torch.ones(3, 2)).sum().backward()
        opt.step()

    names = traced(body)
    if names is None:
        return
    assert {"allreduce.test_allreduce", "broadcast.test_allreduce", "grouped_allreduce.g.0",
            "grouped_allreduce.g.1", "sparse_allreduce.emb.indices",
            "sparse_allreduce.emb.values"} <= names, names
    allreduces, broadcasts = numbers(names, "allreduce"), numbers(names, "broadcast")
    assert len(allreduces) == 3 and allreduces == list(range(allreduces[0], allreduces[0] + 3))
    assert len(broadcasts) == 2 and broadcasts == list(range(broadcasts[0], broadcasts[0] + 2))
    grads = {n for n in names if re.fullmatch(r"allreduce\.grad\.opt\d+\.(weight|bias)", n)}
    assert len(grads) == 2, names
    assert not any(n.startswith(("allreduce.allreduce.", "broadcast.broadcast.")) for n in names)
