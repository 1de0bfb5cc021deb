"""horovodlite.torch: a drop-in for ``horovod.torch``.

    import horovodlite.torch as hvd
    hvd.init()
    torch.manual_seed(0)
    ...
"""

from horovodlite.common.basics import (
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    rocm_built,
    size,
    start_timeline,
    stop_timeline,
)
from horovodlite.common.exceptions import (
    HorovodArgumentError,
    HorovodInternalError,
    HostsUpdatedInterrupt,
)
from horovodlite.common.process_sets import (
    ProcessSet,
    add_process_set,
    global_process_set,
    remove_process_set,
)
from horovodlite.torch import elastic
from horovodlite.torch.collectives import (
    allgather,
    allgather_async,
    alltoall,
    alltoall_async,
    barrier,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    grouped_allgather,
    grouped_allgather_async,
    grouped_reducescatter,
    grouped_reducescatter_async,
    join,
    reducescatter,
    reducescatter_async,
    sparse_allreduce_async,
)
from horovodlite.torch.compression import Compression
from horovodlite.torch.device import local_device
from horovodlite.torch.functions import (
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)
from horovodlite.torch.mpi_ops import (
    Adasum,
    Average,
    Max,
    Min,
    Product,
    Sum,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    poll,
    shutdown,
    synchronize,
)
from horovodlite.torch.optimizer import DistributedOptimizer
from horovodlite.torch.summary import summary
from horovodlite.torch.sync_batch_norm import SyncBatchNorm

__all__ = [
    # basics
    "init", "shutdown", "is_initialized", "size", "rank", "local_size", "local_rank",
    "cross_size", "cross_rank", "local_device", "is_homogeneous", "mpi_threads_supported",
    "mpi_enabled",
    "mpi_built",
    "gloo_enabled", "gloo_built", "nccl_built", "ddl_built", "ccl_built", "cuda_built",
    "rocm_built", "HorovodArgumentError", "HorovodInternalError", "HostsUpdatedInterrupt",
    "start_timeline", "stop_timeline", "summary",
    # reduce ops
    "Average", "Sum", "Adasum", "Min", "Max", "Product",
    # process sets
    "ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
    # collectives
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
    "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
    "grouped_allreduce_async_", "sparse_allreduce_async",
    "allgather", "allgather_async", "grouped_allgather", "grouped_allgather_async",
    "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
    "alltoall", "alltoall_async",
    "reducescatter", "reducescatter_async", "grouped_reducescatter",
    "grouped_reducescatter_async",
    "barrier", "join", "poll", "synchronize",
    # helpers
    "broadcast_parameters", "broadcast_optimizer_state", "broadcast_object", "allgather_object",
    "Compression",
    # training
    "DistributedOptimizer", "SyncBatchNorm",
    # elastic training
    "elastic",
]
