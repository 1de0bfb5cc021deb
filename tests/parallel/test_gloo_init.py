"""The controller without MPI, as a training script sees it (every rank asserting): the launcher
decides the controller, the topology comes from where the ranks run, init/shutdown/init meets in
a fresh rendezvous round, and what only MPI offers is refused with a message that says so."""

import os

import pytest
import torch

import horovodlite.torch as hvd

pytestmark = pytest.mark.skipif(not hvd.gloo_enabled(),
                                reason="the Gloo controller's own behaviour")


def test_probes_name_the_controller():
    assert hvd.gloo_enabled() and hvd.gloo_built()
    assert not hvd.mpi_enabled()
    assert isinstance(hvd.mpi_built(), bool)


def test_topology_matches_the_launcher():
    assert hvd.size() == int(os.environ.get("WORLD_SIZE", os.environ.get("HOROVOD_SIZE", "1")))
    assert hvd.rank() == int(os.environ.get("RANK", os.environ.get("HOROVOD_RANK", "0")))
    # One host here: every rank is local, one cross rank.
    assert hvd.local_size() == hvd.size() and hvd.local_rank() == hvd.rank()
    assert hvd.cross_size() == 1 and hvd.cross_rank() == 0
    assert hvd.is_homogeneous()


def test_init_again_meets_in_a_fresh_round():
    for k in range(3):
        hvd.shutdown()
        hvd.init()
        out = hvd.allreduce(torch.tensor([float(hvd.rank() + k)]), op=hvd.Sum, name=f"round{k}")
        assert out.item() == sum(range(hvd.size())) + k * hvd.size()


def test_communicators_need_mpi():
    hvd.shutdown()
    with pytest.raises(ValueError, match="needs the MPI controller"):
        hvd.init(comm=[0])
    hvd.init()
    assert hvd.is_initialized()


@pytest.mark.skipif("HVDL_RENDEZVOUS_SECRET" not in os.environ,
                    reason="started by horovodliterun --gloo")
def test_no_mpi_launcher_variables_reach_a_gloo_rank():
    leaked = [k for k in os.environ if k.startswith(("OMPI_COMM_WORLD_", "PMIX_", "PMI_"))]
    assert leaked == []
