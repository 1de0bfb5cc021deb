"""Gradient compression for allreduce.

``Compression.fp16`` and ``Compression.bf16`` cast floating tensors to a 16-bit type for the wire;
they work on CPU and CUDA tensors alike (the reduction of 16-bit types runs in float32 inside
horovodlite). Non-floating tensors pass through unchanged. ``Compression.powersgd(rank=4)``
sends a low-rank approximation of each gradient matrix, with error feedback (its settings
here, the algorithm in powersgd.py).
"""

from __future__ import annotations

import torch

from horovodlite.common.exceptions import HorovodArgumentError


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


class PowerSGD:
    """The compressor's settings (``hvd.Compression.powersgd(...)``). The state lives in each
    DistributedOptimizer built with it (``new_state``), so one object can serve several."""

    powersgd = True  # DistributedOptimizer takes this path, not compress()/decompress()

    def __init__(self, rank: int = 4, warmup_steps: int = 10, error_feedback: bool = True,
                 seed: int = 0):
        for name, value, low in (("rank", rank, 1), ("warmup_steps", warmup_steps, 0),
                                 ("seed", seed, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise HorovodArgumentError(
                    f"hvd.Compression.powersgd: {name} must be an int >= {low}, got {value!r}")
        if not isinstance(error_feedback, bool):
            raise HorovodArgumentError(
                "hvd.Compression.powersgd: error_feedback must be a bool, got "
                f"{error_feedback!r}")
        self.rank, self.warmup_steps = rank, warmup_steps
        self.error_feedback, self.seed = error_feedback, seed

    def __repr__(self) -> str:
        return (f"hvd.Compression.powersgd(rank={self.rank}, warmup_steps={self.warmup_steps}, "
                f"error_feedback={self.error_feedback}, seed={self.seed})")

    # Not a compressor of single tensors: it needs the gradients' state across steps.
    def compress(self, tensor):
        raise HorovodArgumentError(
            f"{self!r} compresses the gradients of horovodlite.torch's DistributedOptimizer "
            "only; collectives (allreduce, reducescatter, ...) take hvd.Compression.none, "
            ".fp16 or .bf16")

    decompress = compress

    def compresses(self, shape) -> bool:
        """Whether a gradient of ``shape`` is compressed (after the warm-up)."""
        if len(shape) < 2:
            return False
        n = shape[0]
        m = 1
        for d in shape[1:]:
            m *= d
        return self.rank * (n + m) < n * m

def powersgd(rank: int = 4, warmup_steps: int = 10, error_feedback: bool = True,
             seed: int = 0) -> PowerSGD:
    """PowerSGD: each gradient matrix travels as a rank-``rank`` approximation P Q^T, warm-started
    from the last step's Q; what it leaves out is added to the next step's gradient
    (``error_feedback``). The first ``warmup_steps`` steps travel uncompressed, as do vectors
    and matrices that rank ``rank`` would not make smaller. ``seed`` picks Q's random start (the
    same on every rank). See docs/performance.md."""
    return PowerSGD(rank=rank, warmup_steps=warmup_steps, error_feedback=error_feedback,
                    seed=seed)


class Compression:
    """The available compressors: ``none``, ``fp16``, ``bf16``, ``powersgd(rank=...)``."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
    powersgd = staticmethod(powersgd)
