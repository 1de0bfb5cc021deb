"""Which device a rank trains on: ``hvd.local_device()``, right in every placement a cluster gives.

``torch.cuda.set_device(hvd.local_rank())`` assumes every rank of a host sees all of the host's
GPUs. A scheduler that binds GPUs to tasks (Slurm's ``--gpus-per-task=1``, ``--gpu-bind``, a
``CUDA_VISIBLE_DEVICES`` of one device per rank, Kubernetes' one GPU per pod) shows each rank
only its own, as ``cuda:0``; local rank 1 then asks for a device it does not have and fails.
The rule, from what this process sees (``torch.cuda.device_count()``):

- no CUDA, or no GPU visible: ``cpu``;
- exactly one GPU: ``cuda:0`` - the scheduler gave this rank its GPU;
- at least as many GPUs as ranks on this host (``hvd.local_size()``): ``cuda:<local rank>`` -
  every rank sees the host's GPUs (or a set of its own as large) and takes its own;
- between the two (e.g. 4 ranks on a host, each seeing 2 GPUs): which GPU is this rank's own
  cannot be known from here (``local_rank % count`` gives two ranks one GPU when they see the
  same ones), so it raises, naming the rank, its local rank, and what it sees.
"""

from __future__ import annotations

import os

import torch

from horovodlite.common import basics


def local_device() -> torch.device:
    """This rank's device: ``cuda:0`` when it sees one GPU, ``cuda:<local rank>`` when it sees
    at least as many GPUs as there are ranks on its host, ``cpu`` without CUDA or a GPU.

    Call it after ``hvd.init()``, and pin the rank to the device before creating CUDA tensors::

        device = hvd.local_device()
        if device.type == "cuda":
            torch.cuda.set_device(device)
        model.to(device)

    Raises:
        RuntimeError: the rank sees several GPUs but fewer than the ranks of its host, so it
            cannot tell which is its own; the message names the rank, its local rank and local
            size, the GPUs it sees, and how to give each rank its GPU.
    """
    if not torch.cuda.is_available():
        return torch.device("cpu")
    count = torch.cuda.device_count()
    if count == 0:
        return torch.device("cpu")
    if count == 1:
        return torch.device("cuda", 0)
    local_rank, local_size = basics.local_rank(), basics.local_size()
    if count >= local_size:
        return torch.device("cuda", local_rank)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    seen = f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""
    raise RuntimeError(
        f"hvd.local_device(): rank {basics.rank()} (local rank {local_rank} of {local_size} "
        f"ranks on its host) sees {count} GPUs{seen}: more than one and fewer than the ranks of "
        "its host, so which one is its own cannot be known. Give each rank one GPU (srun "
        "--gpus-per-task=1, or a CUDA_VISIBLE_DEVICES of one device per rank), or run at most "
        f"{count} ranks on each host; a rank that uses several GPUs picks them itself "
        "(torch.device('cuda', i)).")


__all__ = ["local_device"]
