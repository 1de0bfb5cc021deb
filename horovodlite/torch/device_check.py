"""GPU placement checks for collectives on CUDA tensors.

horovodlite runs one GPU per process (``torch.cuda.set_device(hvd.local_rank())`` right after
``hvd.init()``). Two checks back that up:

* one device per process: a collective on a second CUDA device of this process raises
  ValueError at call time (NCCL communicators are bound to one device);
* pinning: at this process's first CUDA collective, every rank contributes (host hash, GPU id)
  through an asynchronous allgather named ``horovodlite.gpu_pinning_check``; when it completes
  (checked at later collectives and in ``synchronize``), each rank that shares its GPU with
  another rank of its node warns once. Several ranks on one GPU work through the host-staging
  path (``HOROVOD_GPU_OPERATIONS=mpi``) but are slow, and NCCL refuses them.

Every rank must eventually run a CUDA collective for the check to complete (otherwise the stall
inspector names the check's tensor); jobs mixing CPU-only and GPU ranks are not supported anyway.
"""

from __future__ import annotations

import hashlib
import os
import socket
import warnings

import torch

from horovodlite.common.exceptions import HorovodArgumentError

CHECK_NAME = "horovodlite.gpu_pinning_check"
_RECORD_BYTES = 32

_device: int | None = None  # the CUDA device this process runs collectives on
_pending: int | None = None  # handle of the pinning-check allgather
_done = False


def _reset() -> None:
    """After shutdown: a new init may pin another device."""
    global _device, _pending, _done
    _device, _pending, _done = None, None, False


def gpu_identity(device: torch.device) -> str:
    """A string naming the physical GPU (its UUID where torch exposes it)."""
    props = torch.cuda.get_device_properties(device)
    uuid = getattr(props, "uuid", None)
    if uuid:
        return f"uuid:{uuid}"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    return f"visible:{visible}/index:{device.index}"


def make_record(host: str, gpu: str) -> torch.Tensor:
    """The [1, 32] uint8 row a rank contributes: hashes of its host and of its GPU."""
    digest = hashlib.sha256(host.encode()).digest()[:16]
    digest += hashlib.sha256(gpu.encode()).digest()[:16]
    return torch.tensor(list(digest), dtype=torch.uint8).reshape(1, _RECORD_BYTES)


def ranks_sharing_gpu(rows: torch.Tensor, rank: int) -> list:
    """The ranks (including ``rank``) whose row shows the same host and GPU as ``rank``'s, or []
    when ``rank`` has its GPU to itself."""
    keys = [bytes(r.tolist()) for r in rows]
    same = [k for k, key in enumerate(keys) if key == keys[rank]]
    return same if len(same) > 1 else []


def note(first, op: str, submit_check) -> None:
    """Called before every enqueue with the op's input (a tensor or a list of them).

    ``submit_check(record)`` enqueues the pinning-check allgather and returns its handle.
    Cheap for CPU tensors: one attribute test.
    """
    global _device, _pending
    t = first[0] if isinstance(first, (list, tuple)) and first else first
    if not isinstance(t, torch.Tensor) or not t.is_cuda:
        return
    index = t.device.index if t.device.index is not None else torch.cuda.current_device()
    if _device is None:
        _device = index
        if _pending is None and not _done:
            record = make_record(socket.gethostname(), gpu_identity(t.device))
            _pending = submit_check(record)
    elif index != _device:
        raise HorovodArgumentError(
            f"{op}: horovodlite runs collectives on one GPU per process; this process already "
            f"used cuda:{_device} and now got a tensor on cuda:{index}. Call "
            "torch.cuda.set_device(hvd.local_rank()) once after hvd.init() and keep the tensors "
            "there."
        )


def poll(poll_fn, synchronize_fn, rank: int) -> None:
    """Finishes the pinning check once its allgather has completed (never blocks)."""
    global _pending, _done
    if _pending is None or not poll_fn(_pending):
        return
    handle, _pending = _pending, None
    _done = True
    try:
        rows = synchronize_fn(handle)
    except Exception:  # noqa: BLE001 - a failed check must not fail the user's collective
        return
    shared = ranks_sharing_gpu(rows, rank)
    if shared:
        warnings.warn(
            f"horovodlite: ranks {shared} share one GPU (cuda:{_device} on "
            f"{socket.gethostname()}). Pin one GPU per process with "
            "torch.cuda.set_device(hvd.local_rank()) before creating CUDA tensors; NCCL cannot "
            "run two ranks on one GPU, and the host-staging path (HOROVOD_GPU_OPERATIONS=mpi) "
            "works but is slow.",
            RuntimeWarning,
            stacklevel=3,
        )
