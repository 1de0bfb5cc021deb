"""Process sets: static (init(process_sets=[...])) and dynamic (add/remove) sets, set-relative
ranks, broadcast's global root, errors for non-members and unknown or removed sets, and barriers
of disjoint sets progressing independently."""

import time

import pytest
import torch

import horovodlite.torch as hvd

N = hvd.size()
multi = pytest.mark.skipif(N < 2, reason="a proper subset needs at least 2 ranks")


def restart(**kwargs):
    hvd.shutdown()
    hvd.init(**kwargs)


@multi
def test_static_even_and_odd_sets():
    evens, odds = hvd.ProcessSet(range(0, N, 2)), hvd.ProcessSet(range(1, N, 2))
    restart(process_sets=[evens, odds])
    r = hvd.rank()
    mine, other = (evens, odds) if r % 2 == 0 else (odds, evens)
    assert mine.included() and not other.included()
    assert mine.rank() == mine.ranks.index(r) and mine.size() == len(mine.ranks)
    out = hvd.allreduce(torch.tensor([float(r)]), op=hvd.Sum, process_set=mine, name="ps.sum")
    assert out.item() == sum(mine.ranks)
    gathered = hvd.allgather(torch.tensor([r]), process_set=mine, name="ps.gather")
    assert gathered.tolist() == mine.ranks
    # broadcast's root is a global rank, even inside a set
    root = mine.ranks[-1]
    got = hvd.broadcast(torch.tensor([float(r)]), root, process_set=mine, name="ps.bcast")
    assert got.item() == root
    rs = hvd.reducescatter(torch.ones(len(mine.ranks) * 2), op=hvd.Sum, process_set=mine,
                           name="ps.rs")
    assert rs.tolist() == [float(len(mine.ranks))] * 2
    a2a = hvd.alltoall(torch.full((len(mine.ranks),), float(r)), process_set=mine, name="ps.a2a")
    assert a2a.tolist() == [float(k) for k in mine.ranks]
    with pytest.raises(ValueError, match=rf"rank {r} is not in process set {other.process_set_id}"):
        hvd.allreduce(torch.ones(1), process_set=other, name="ps.not.member")
    hvd.barrier(process_set=mine)
    hvd.barrier()
    restart()


def test_dynamic_add_and_remove():
    restart(process_sets="dynamic")
    r = hvd.rank()
    if N > 1:
        members = [0] if N == 2 else [0, 1]  # a proper subset
        low = hvd.add_process_set(members)
        assert low.process_set_id is not None and low.ranks == members
        if r in members:
            assert hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=low,
                                 name="dyn.low").item() == len(members)
        with pytest.raises(ValueError, match="already exists"):
            hvd.add_process_set(hvd.ProcessSet(members))
        with pytest.raises(ValueError, match="already exists"):
            hvd.add_process_set(list(range(N)))
        assert hvd.remove_process_set(low)
        with pytest.raises(ValueError, match="not registered|was removed"):
            hvd.allreduce(torch.ones(1), process_set=low, name="dyn.removed")
        assert not hvd.remove_process_set(low)
    never = hvd.ProcessSet([0])
    with pytest.raises(ValueError, match="is not registered"):
        hvd.allreduce(torch.ones(1), process_set=never, name="dyn.unknown")
    with pytest.raises(ValueError, match="subset of 0"):
        hvd.add_process_set([N + 5])
    restart()


def test_dynamic_sets_require_opt_in():
    with pytest.raises(ValueError, match="needs dynamic process sets"):
        hvd.add_process_set([0])


@pytest.mark.skipif(N < 3, reason="needs two disjoint sets with a busy rank outside")
def test_barriers_of_disjoint_sets_progress_independently():
    restart(process_sets="dynamic")
    r = hvd.rank()
    first, second = hvd.add_process_set([0, 1]), hvd.add_process_set(list(range(2, N)))
    if r >= 2:
        time.sleep(2.0)  # busy: its set's barrier comes late
        hvd.barrier(process_set=second)
    else:
        start = time.monotonic()
        hvd.barrier(process_set=first)
        out = hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=first, name="indep.ar")
        elapsed = time.monotonic() - start
        assert out.item() == 2
        assert elapsed < 1.5, f"set {first.ranks} waited {elapsed:.2f}s for a rank outside it"
    hvd.barrier()
    restart()


def test_barrier_completes_while_other_collectives_are_pending():
    r = hvd.rank()
    # Every rank leaves an allreduce pending that only completes after the barrier.
    h = hvd.allreduce_async(torch.ones(2), name=f"pending.after.barrier.{0}", op=hvd.Sum)
    hvd.barrier()
    assert torch.all(hvd.synchronize(h) == N)
    if N > 1:
        late = hvd.allreduce_async(torch.ones(1), name="late", op=hvd.Sum) if r == 0 else None
        hvd.barrier()
        if r != 0:
            late = hvd.allreduce_async(torch.ones(1), name="late", op=hvd.Sum)
        assert hvd.synchronize(late).item() == N
