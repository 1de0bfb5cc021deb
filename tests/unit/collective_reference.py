"""Reference arithmetic and byte conversions for the tests that run collectives through
``horovodlite._testing`` (N ranks as threads): what each rank should get, computed in float64 with
the CPU kernels' scaling rules."""

from __future__ import annotations

import numpy as np
import torch

DTYPE_CODE = {torch.uint8: 0, torch.int8: 1, torch.int16: 2, torch.int32: 3, torch.int64: 4,
              torch.float16: 5, torch.bfloat16: 6, torch.float32: 7, torch.float64: 8,
              torch.bool: 9}
ALLREDUCE, ALLGATHER, BROADCAST, ALLTOALL, REDUCESCATTER = 0, 1, 2, 3, 4
AVERAGE, SUM, MIN, MAX, PRODUCT = 0, 1, 3, 4, 5
FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def to_bytes(t: torch.Tensor) -> bytes:
    t = t.contiguous()
    if t.dtype in (torch.bfloat16, torch.float16):
        t = t.view(torch.int16)
    if t.dtype == torch.bool:
        t = t.view(torch.uint8)
    return t.numpy().tobytes()


def from_bytes(b: bytes, dtype, shape) -> torch.Tensor:
    if len(b) == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(b), dtype=dtype).reshape(shape).clone()


def data(seed: int, rank: int, shape, dtype, op=SUM) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 100 + rank)
    if dtype in FLOATS:
        lo, hi = (0.5, 1.5) if op == PRODUCT else (-2.0, 2.0)
        return (torch.rand(shape, generator=g, dtype=torch.float64) * (hi - lo) + lo).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).to(torch.bool)
    lo = 1 if op == PRODUCT else (0 if dtype == torch.uint8 else -4)
    return torch.randint(lo, 3 if op == PRODUCT else 5, shape, generator=g).to(dtype)


def close(got: torch.Tensor, want: torch.Tensor, dtype, what=""):
    tol = {torch.float16: 1e-2, torch.bfloat16: 3e-2, torch.float32: 1e-5, torch.float64: 1e-12}
    t = tol.get(dtype, 0)
    np.testing.assert_allclose(got.to(torch.float64).numpy(), want.to(torch.float64).numpy(),
                               rtol=t, atol=t, err_msg=what)


def scaled(x: torch.Tensor, factor: float, dtype) -> torch.Tensor:
    x = x.to(torch.float64) * factor
    return x if dtype in FLOATS else torch.trunc(x)


def reduce_ref(xs, op, dtype, prescale=1.0, postscale=1.0):
    xs = [scaled(x, prescale, dtype) for x in xs]
    stack = torch.stack(xs)
    if op in (SUM, AVERAGE):
        out = stack.sum(0)
    elif op == MIN:
        out = stack.min(0).values
    elif op == MAX:
        out = stack.max(0).values
    else:
        out = stack.prod(0)
    return scaled(out, postscale / len(xs) if op == AVERAGE else postscale, dtype)
