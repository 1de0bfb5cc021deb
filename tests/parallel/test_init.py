"""init(comm=...): an mpi4py communicator (MPI initialised by mpi4py is reused and never
finalised by horovodlite), a split communicator, a list of ranks; topology queries."""

import pytest
import torch

import horovodlite.torch as hvd

# Communicators and rank lists are the MPI controller's (the Gloo one refuses them:
# test_gloo_init.py); mpi4py is imported only under MPI (importing it initialises MPI).
pytestmark = pytest.mark.skipif(not hvd.mpi_enabled(),
                                reason="init(comm=...) needs the MPI controller")
if hvd.mpi_enabled():
    from mpi4py import MPI

    WORLD = MPI.COMM_WORLD


def restart(**kwargs):
    hvd.shutdown()
    hvd.init(**kwargs)


def test_topology_on_one_node():
    n, r = hvd.size(), hvd.rank()
    assert (n, r) == (WORLD.Get_size(), WORLD.Get_rank())
    assert hvd.local_size() == n and hvd.local_rank() == r
    assert hvd.cross_size() == 1 and hvd.cross_rank() == 0
    assert isinstance(hvd.mpi_threads_supported(), bool)


def test_init_with_the_mpi4py_world_communicator():
    restart(comm=WORLD)
    assert hvd.size() == WORLD.Get_size() and hvd.rank() == WORLD.Get_rank()
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum, name="w4py").item() == hvd.size()
    hvd.shutdown()
    assert MPI.Is_initialized() and not MPI.Is_finalized()  # shutdown stops horovodlite only
    hvd.init()


def test_init_with_a_split_communicator():
    r = WORLD.Get_rank()
    half = WORLD.Split(color=r % 2, key=r)
    restart(comm=half)
    members = [k for k in range(WORLD.Get_size()) if k % 2 == r % 2]
    assert hvd.size() == len(members) and hvd.rank() == members.index(r)
    out = hvd.allreduce(torch.tensor([float(r)]), op=hvd.Sum, name="half")
    assert out.item() == sum(members)
    restart()
    half.Free()


def test_init_with_a_list_of_ranks():
    n, r = WORLD.Get_size(), WORLD.Get_rank()
    ranks = list(range(max(n - 1, 1)))
    hvd.shutdown()
    if r in ranks:
        hvd.init(comm=ranks)
        assert hvd.size() == len(ranks) and hvd.rank() == ranks.index(r)
        assert hvd.allreduce(torch.ones(1), op=hvd.Sum, name="list").item() == len(ranks)
        hvd.shutdown()
    else:
        with pytest.raises(ValueError, match=r"is not in the requested ranks"):
            hvd.init(comm=ranks)
    WORLD.Barrier()
    hvd.init()
    assert hvd.size() == n


def test_bad_comm_argument():
    hvd.shutdown()
    with pytest.raises(ValueError, match="expected an mpi4py communicator or a list of ranks"):
        hvd.init(comm=3.5)
    with pytest.raises(ValueError, match="list of ranks is empty"):
        hvd.init(comm=[])
    hvd.init()
