"""Single-process behaviour before init and the public surface (the C++ layering: test_layering)."""

import pytest
import torch

import horovodlite.torch as hvd

API_NAMES = """init shutdown is_initialized size rank local_size local_rank cross_size cross_rank
mpi_threads_supported mpi_enabled mpi_built gloo_enabled gloo_built nccl_built ddl_built ccl_built
cuda_built rocm_built start_timeline stop_timeline HorovodInternalError Average Sum Adasum Min Max
Product allreduce allreduce_ allreduce_async allreduce_async_ grouped_allreduce
grouped_allreduce_ grouped_allreduce_async grouped_allreduce_async_ sparse_allreduce_async
allgather allgather_async grouped_allgather grouped_allgather_async broadcast broadcast_
broadcast_async broadcast_async_ alltoall alltoall_async reducescatter reducescatter_async
grouped_reducescatter grouped_reducescatter_async barrier join poll synchronize
broadcast_parameters broadcast_optimizer_state broadcast_object allgather_object
DistributedOptimizer Compression SyncBatchNorm ProcessSet global_process_set add_process_set
remove_process_set elastic""".split()


@pytest.mark.parametrize("call", [
    lambda: hvd.rank(), lambda: hvd.size(), lambda: hvd.local_rank(), lambda: hvd.cross_size(),
    lambda: hvd.allreduce(torch.ones(1)), lambda: hvd.allreduce_async_(torch.ones(1)),
    lambda: hvd.allgather(torch.ones(1)), lambda: hvd.broadcast_(torch.ones(1), 0),
    lambda: hvd.barrier(), lambda: hvd.join(),
])
def test_everything_before_init_says_to_call_init(call):
    assert not hvd.is_initialized()
    with pytest.raises(ValueError, match=r"use hvd\.init\(\)"):
        call()


def test_reduce_op_constants():
    assert (hvd.Average, hvd.Sum, hvd.Adasum, hvd.Min, hvd.Max, hvd.Product) == (0, 1, 2, 3, 4, 5)


def test_feature_probes():
    # This build has both controllers; a process started without a launcher gets MPI.
    assert hvd.mpi_built() and hvd.gloo_built()
    assert hvd.mpi_enabled() and not hvd.gloo_enabled()
    assert not hvd.ddl_built() and not hvd.ccl_built() and not hvd.rocm_built()
    assert isinstance(hvd.nccl_built(), int)


def test_horovod_internal_error_is_a_runtime_error():
    assert issubclass(hvd.HorovodInternalError, RuntimeError)


def test_public_surface_is_declared():
    exported = set(hvd.__all__)
    implemented = [n for n in API_NAMES if hasattr(hvd, n)]
    assert set(implemented) <= exported
    for name in hvd.__all__:
        assert hasattr(hvd, name), name
