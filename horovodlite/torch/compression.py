"""Gradient compression for allreduce: casts floating tensors to a 16-bit type for the wire.

``Compression.fp16`` and ``Compression.bf16`` work on CPU and CUDA tensors alike (the reduction of
16-bit types runs in float32 inside horovodlite). Non-floating tensors pass through unchanged.
"""

from __future__ import annotations

import torch


class Compressor:
    """Interface: ``compress(t) -> (t', ctx)`` and ``decompress(t', ctx) -> t``."""

    @staticmethod
    def compress(tensor):
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    """No compression."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class _CastCompressor(Compressor):
    wire_dtype: torch.dtype = torch.float16

    @classmethod
    def compress(cls, tensor):
        if tensor.dtype.is_floating_point and tensor.dtype != cls.wire_dtype:
            return tensor.to(cls.wire_dtype), tensor.dtype
        return tensor, None

    @classmethod
    def decompress(cls, tensor, ctx):
        return tensor if ctx is None else tensor.to(ctx)


class FP16Compressor(_CastCompressor):
    """Floating tensors travel as float16."""

    wire_dtype = torch.float16


class BF16Compressor(_CastCompressor):
    """Floating tensors travel as bfloat16 (same range as float32, less precision)."""

    wire_dtype = torch.bfloat16


class Compression:
    """The available compressors: ``none``, ``fp16``, ``bf16``."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
