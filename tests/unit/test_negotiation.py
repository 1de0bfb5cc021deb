"""The controller's negotiation protocol, with N ranks as threads over the in-process control
plane (no MPI): readiness, ordering, validation messages, response cache hits, invalidation,
eviction, process sets and join."""

import pytest
from cpp_testing import load_testing_module

T = load_testing_module()
ALLREDUCE, ALLGATHER, BROADCAST, BARRIER, JOIN = 0, 1, 2, 5, 6
FLOAT32, FLOAT64 = 7, 8


def req(name, **kw):
    return dict(name=name, **kw)


def names(responses):
    return [r["name"] for r in responses]


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_name_is_ready_only_when_every_rank_submitted(n):
    # cycle 0: only rank 0 submits; cycle 1: everyone else does.
    script = [[[req("x")] if r == 0 else [] for r in range(n)],
              [[] if r == 0 else [req("x")] for r in range(n)]]
    cycles, _ = T.negotiate(n, script)
    if n == 1:
        assert all(names(cycles[0][r]) == ["x"] for r in range(n))
    else:
        assert all(cycles[0][r] == [] for r in range(n))
        assert all(names(cycles[1][r]) == ["x"] for r in range(n))


def test_every_rank_gets_the_same_order_whatever_the_submission_order():
    n = 3
    order = ["a", "b", "c", "d"]
    script = [[[req(x) for x in (order if r % 2 == 0 else reversed(order))] for r in range(n)]]
    cycles, _ = T.negotiate(n, script)
    lists = [names(cycles[0][r]) for r in range(n)]
    assert lists[0] == lists[1] == lists[2] and sorted(lists[0]) == order


def test_shape_mismatch_error_names_each_rank():
    script = [[[req("w", shape=[4, 4])], [req("w", shape=[4, 4])], [req("w", shape=[4, 5])]]]
    cycles, _ = T.negotiate(3, script)
    for r in range(3):
        (resp,) = cycles[0][r]
        assert resp["error"] == ("allreduce 'w': shape mismatch: rank 0 float32[4,4], rank 1 "
                                 "float32[4,4], rank 2 float32[4,5]; every rank must submit the "
                                 "same shape under one name.")


@pytest.mark.parametrize("op,name,label", [
    (ALLREDUCE, "allreduce.w", "allreduce.w"),  # horovodlite.torch's names: shown as they are
    (ALLREDUCE, "grouped_allreduce.w.1", "grouped_allreduce.w.1"),
    (ALLGATHER, "allgather.w", "allgather.w"),
    (ALLREDUCE, "w", "allreduce 'w'"),  # any other name: with its op, quoted
    (ALLREDUCE, "myallreduce.w", "allreduce 'myallreduce.w'"),
    (ALLREDUCE, "broadcast.w", "allreduce 'broadcast.w'"),
    (ALLGATHER, "sparse_allreduce.w.values", "allgather 'sparse_allreduce.w.values'"),
])
def test_messages_show_op_prefixed_names_as_they_are(op, name, label):
    script = [[[req(name, op=op, shape=[2, 4 + r])] for r in range(2)]]
    cycles, _ = T.negotiate(2, script)
    error = cycles[0][0][0]["error"]
    assert error.startswith(f"{label}: ") and "mismatch: rank 0 float32[2,4]" in error, error


@pytest.mark.parametrize("field,values,fragment", [
    ("dtype", [FLOAT32, FLOAT64], "dtype mismatch: rank 0 float32[4], rank 1 float64[4]"),
    ("reduce_op", [1, 4], "reduce op mismatch: rank 0 Sum, rank 1 Max"),
    ("prescale", [1.0, 2.0], "prescale_factor mismatch: rank 0 1, rank 1 2"),
    ("postscale", [1.0, 0.5], "postscale_factor mismatch: rank 0 1, rank 1 0.5"),
    ("op", [ALLREDUCE, ALLGATHER], "operation mismatch: rank 0 allreduce, rank 1 allgather"),
])
def test_each_mismatch_kind(field, values, fragment):
    script = [[[req("t", **{field: values[r]})] for r in range(2)]]
    cycles, _ = T.negotiate(2, script)
    assert fragment in cycles[0][0][0]["error"]
    assert cycles[0][0][0]["error"] == cycles[0][1][0]["error"]


def test_broadcast_root_and_allgather_trailing_dims():
    script = [[[req("b", op=BROADCAST, root=r)] for r in range(2)],
              [[req("g", op=ALLGATHER, shape=[2 + r, 3 + r])] for r in range(2)],
              [[req("ok", op=ALLGATHER, shape=[1 + r, 3])] for r in range(2)]]
    cycles, _ = T.negotiate(2, script)
    assert "root rank mismatch: rank 0 0, rank 1 1" in cycles[0][0][0]["error"]
    assert "trailing dimensions mismatch: rank 0 float32[2,3], rank 1 float32[3,4]" in \
        cycles[1][0][0]["error"]
    assert cycles[2][0][0]["error"] == "" and cycles[2][0][0]["sizes"] == [1, 2]


def test_cache_hits_after_first_negotiation_and_invalidation_on_change():
    n = 3
    steps = 6
    script = [[[req("grad")] for _ in range(n)] for _ in range(steps)]
    script.append([[req("grad", shape=[8])] for _ in range(n)])  # shape changes everywhere
    script.append([[req("grad", shape=[8])] for _ in range(n)])
    cycles, stats = T.negotiate(n, script)
    for c in range(len(script)):
        assert all(names(cycles[c][r]) == ["grad"] for r in range(n)), c
    for s in stats:
        # first time + after the shape change; everything else through the bit vector
        assert s["negotiations"] == 2
        assert s["cache_hits"] == steps - 1 + 1
        assert s["invalidations"] == 1


def test_one_rank_changing_shape_invalidates_and_reports_mismatch():
    script = [[[req("p")] for _ in range(2)],
              [[req("p")], [req("p", shape=[5])]]]
    cycles, stats = T.negotiate(2, script)
    assert cycles[1][0][0]["error"] and "shape mismatch" in cycles[1][0][0]["error"]
    assert all(s["invalidations"] == 1 for s in stats)


def test_cache_disabled_always_negotiates():
    script = [[[req("g")] for _ in range(2)] for _ in range(4)]
    _, stats = T.negotiate(2, script, cache_capacity=0)
    assert all(s["negotiations"] == 4 and s["cache_hits"] == 0 for s in stats)


def test_eviction_keeps_ranks_consistent():
    # capacity 2, three names cycling: every rank must still get every response.
    script = [[[req(f"n{i % 3}")] for _ in range(3)] for i in range(9)]
    cycles, stats = T.negotiate(3, script, cache_capacity=2)
    for i in range(9):
        assert all(names(cycles[i][r]) == [f"n{i % 3}"] for r in range(3))


def test_cached_and_uncached_in_one_cycle_agree_on_order():
    script = [[[req("a"), req("b")] for _ in range(2)],
              [[req("b"), req("new"), req("a")] for _ in range(2)]]
    cycles, _ = T.negotiate(2, script)
    assert names(cycles[1][0]) == names(cycles[1][1])
    assert sorted(names(cycles[1][0])) == ["a", "b", "new"]


def test_process_set_names_are_ready_when_members_submitted():
    sets = [[0, 2]]
    script = [[[req("ps", process_set=1)] if r in (0, 2) else [] for r in range(3)],
              [[req("ps", process_set=1)] if r in (0, 2) else [] for r in range(3)]]
    cycles, stats = T.negotiate(3, script, process_sets=sets)
    for c in range(2):
        assert names(cycles[c][0]) == ["ps"] and names(cycles[c][2]) == ["ps"]
        assert names(cycles[c][1]) == ["ps"]  # everyone hears it; non-members skip execution
    assert stats[0]["cache_hits"] == 1 and stats[1]["cache_hits"] == 1


def test_join_completes_allreduce_without_the_joined_rank():
    script = [[[req("j", op=JOIN)], [], []],
              [[], [req("x")], [req("x")]],
              [[], [req("j", op=JOIN)], [req("j", op=JOIN)]]]
    cycles, _ = T.negotiate(3, script)
    assert all(names(cycles[1][r]) == ["x"] for r in range(3))
    joined = [r for r in cycles[2][0] if r["op"] == JOIN]
    assert joined and joined[0]["sizes"] in ([1], [2])
    assert all(cycles[2][r][-1]["sizes"] == joined[0]["sizes"] for r in range(3))


def test_allgather_while_a_rank_joined_is_an_error_naming_it():
    script = [[[req("j", op=JOIN)], []], [[], [req("g", op=ALLGATHER)]], [[], [req("j", op=JOIN)]]]
    cycles, _ = T.negotiate(2, script)
    err = cycles[1][1][0]["error"]
    assert "allgather 'g': rank 0 has already called hvd.join()" in err


def test_barrier_is_negotiation_only():
    script = [[[req("barrier.0.0", op=BARRIER)] for _ in range(3)]]
    cycles, _ = T.negotiate(3, script)
    assert all(names(cycles[0][r]) == ["barrier.0.0"] for r in range(3))


def test_request_serialization_round_trips():
    reqs = [req("a", shape=[1, 2, 3], site="train.py:12", splits=[1, 2]),
            req("b" * 300, op=BROADCAST, root=2, prescale=0.25)]
    assert T.serialize_roundtrip(reqs) == [True, True]


def test_cached_name_after_join_when_ranks_submit_in_different_cycles():
    # Regression: right after a join completes, one rank classified a cached name while the fast
    # path was still suspended (full request to rank 0) and the others a cycle later (cache bit);
    # neither path could complete. Such entries are now invalidated so every rank renegotiates.
    script = [[[req("c")] for _ in range(3)],
              [[req("j", op=JOIN)], [], []],
              [[], [req("x")], [req("x")]],
              [[], [req("j", op=JOIN)], [req("j", op=JOIN)]],
              [[req("c")], [], []],
              [[], [req("c")], [req("c")]]] + [[[], [], []]] * 4
    cycles, _ = T.negotiate(3, script)
    got = [[c for c, per_rank in enumerate(cycles) if "c" in names(per_rank[r])] for r in range(3)]
    assert got[0] == got[1] == got[2] and len(got[0]) == 2, got
