"""join: a rank out of data keeps serving the other ranks' allreduces with zeros; Average still
divides by the full size; every rank gets the same last-joined rank; allgather/broadcast while a
rank has joined fail naming it; Adasum (an allreduce) treats a joined rank as a zero vector."""

import pytest
import torch

import horovodlite.torch as hvd


@pytest.mark.parametrize("same_name", [True, False], ids=["cached-names", "new-names"])
def test_uneven_loops(same_name):
    n, r = hvd.size(), hvd.rank()
    steps = 2 * (r + 1)  # rank n-1 has the most data
    for i in range(steps):
        name = "join.grad" if same_name else f"join.grad.{i}"
        out = hvd.allreduce(torch.full((3,), float(r + 1)), name=name, op=hvd.Average)
        active = [k for k in range(n) if 2 * (k + 1) > i]
        assert torch.allclose(out, torch.full((3,), sum(k + 1 for k in active) / n)), (i, out)
    last = hvd.join()
    assert last == n - 1
    # and the runtime goes on normally afterwards, the cache included
    for _ in range(3):
        assert hvd.allreduce(torch.ones(2), name="join.after", op=hvd.Sum).tolist() == [n, n]


def test_join_with_grouped_and_async_allreduces():
    n, r = hvd.size(), hvd.rank()
    for i in range(r + 1):
        outs = hvd.grouped_allreduce([torch.ones(2), torch.ones(3)], name=f"join.group.{i}",
                                     op=hvd.Sum)
        active = sum(1 for k in range(n) if k + 1 > i)
        assert outs[0].tolist() == [active] * 2 and outs[1].tolist() == [active] * 3
    assert hvd.join() == n - 1


@pytest.mark.skipif("hvd.size() < 2", reason="needs a joined rank and an active one")
def test_allgather_while_a_rank_has_joined_names_it():
    n, r = hvd.size(), hvd.rank()
    if r != 0:
        with pytest.raises(hvd.HorovodInternalError, match=r"allgather\.join\.gather: rank 0 "
                                                           r"has already called hvd.join\(\)"):
            hvd.allgather(torch.ones(1), name="join.gather")
        with pytest.raises(hvd.HorovodInternalError, match="has already called hvd.join"):
            hvd.broadcast(torch.ones(1), 1, name="join.bcast")
    last = hvd.join()
    assert last in range(1, n)  # rank 0 joined first; ranks 1.. join in any order
    assert hvd.allgather_object(last) == [last] * n  # the same answer on every rank


@pytest.mark.skipif("hvd.size() & (hvd.size() - 1) != 0 or hvd.size() < 2",
                    reason="Adasum needs a power-of-two number of ranks, and a joined rank")
def test_adasum_while_a_rank_has_joined_treats_it_as_a_zero_vector():
    """Adasum is an allreduce: a joined rank's zeros drop out of the tree (adasum(a, 0) = a)."""
    n, r = hvd.size(), hvd.rank()
    if r != 0:
        mine = torch.arange(1.0, 5.0) * r
        out = hvd.allreduce(mine, op=hvd.Adasum, name="join.adasum")
        # the reference: the same tree with rank 0's vector zero, on every active rank
        vectors = [torch.zeros(4, dtype=torch.float64)] + [
            torch.arange(1.0, 5.0, dtype=torch.float64) * k for k in range(1, n)]
        from horovodlite.torch.adasum import adasum_tree
        expected = adasum_tree(torch.stack(vectors)).float()
        torch.testing.assert_close(out, expected)
        inplace = torch.arange(1.0, 5.0) * r
        hvd.allreduce_(inplace, op=hvd.Adasum, name="join.adasum_")
        torch.testing.assert_close(inplace, expected)
    assert hvd.join() in range(1, n)
