"""hvd.local_device() in the placements a cluster gives, on the CPU: the GPUs a rank sees are
replaced (torch.cuda.is_available / device_count), and so are its local rank and local size."""

from __future__ import annotations

import pytest
import torch

import horovodlite.torch as hvd
from horovodlite.common import basics


def place(monkeypatch, gpus: int, local_rank: int, local_size: int, rank: int | None = None):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(basics, "local_rank", lambda: local_rank)
    monkeypatch.setattr(basics, "local_size", lambda: local_size)
    monkeypatch.setattr(basics, "rank", lambda: local_rank if rank is None else rank)


@pytest.mark.parametrize("local_rank", range(4))
def test_a_rank_that_sees_one_gpu_takes_it(monkeypatch, local_rank):
    """srun --gpus-per-task=1 (or CUDA_VISIBLE_DEVICES of one device): every rank's GPU is its
    cuda:0, whatever its local rank."""
    place(monkeypatch, gpus=1, local_rank=local_rank, local_size=4)
    assert hvd.local_device() == torch.device("cuda", 0)


@pytest.mark.parametrize("gpus", [4, 8])
def test_a_rank_that_sees_the_host_s_gpus_takes_its_local_rank(monkeypatch, gpus):
    for local_rank in range(4):
        place(monkeypatch, gpus=gpus, local_rank=local_rank, local_size=4)
        assert hvd.local_device() == torch.device("cuda", local_rank)


def test_no_cuda_or_no_gpu_is_the_cpu(monkeypatch):
    place(monkeypatch, gpus=0, local_rank=1, local_size=2)
    assert hvd.local_device() == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # CUDA, but nothing visible
    assert hvd.local_device() == torch.device("cpu")


def test_several_gpus_but_fewer_than_the_ranks_is_an_error_naming_them(monkeypatch):
    place(monkeypatch, gpus=2, local_rank=3, local_size=4, rank=7)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with pytest.raises(RuntimeError) as e:
        hvd.local_device()
    text = str(e.value)
    assert "rank 7 (local rank 3 of 4 ranks on its host) sees 2 GPUs" in text, text
    assert "CUDA_VISIBLE_DEVICES=0,1" in text and "--gpus-per-task=1" in text, text


def test_it_is_exported():
    assert "local_device" in hvd.__all__ and hvd.local_device.__doc__
