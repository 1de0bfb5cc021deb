"""Deterministic per-rank data and NumPy references, shared by the parallel tests.

Every rank can regenerate every other rank's input from (seed, rank), so each rank computes the
expected result of a collective locally, in NumPy, without communicating.
"""

from __future__ import annotations

import numpy as np
import torch

import horovodlite.torch as hvd

DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64]
FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
OPS = {"Average": hvd.Average, "Sum": hvd.Sum, "Min": hvd.Min, "Max": hvd.Max,
       "Product": hvd.Product}


def rank_data(seed: int, rank: int, shape, dtype, op_name: str = "Sum") -> torch.Tensor:
    """Small values so that sums and products of up to 3 ranks never overflow any dtype."""
    rng = np.random.default_rng(seed * 1000 + rank)
    if dtype in FLOATS:
        if op_name == "Product":
            arr = rng.uniform(0.5, 1.5, size=shape)
        else:
            arr = rng.normal(size=shape)
        return torch.from_numpy(arr.astype(np.float64)).to(dtype)
    lo = 0 if dtype == torch.uint8 else -4
    hi = 3 if op_name == "Product" else 5
    if op_name == "Product":
        lo = 1 if dtype == torch.uint8 else -2
    arr = rng.integers(lo, hi, size=shape)
    return torch.from_numpy(arr.astype(np.int64)).to(dtype)


def as_f64(t: torch.Tensor) -> np.ndarray:
    return t.to(torch.float64).numpy() if t.dtype in FLOATS else t.to(torch.int64).numpy()


def scale(x: np.ndarray, factor: float, dtype) -> np.ndarray:
    if factor == 1.0:
        return x
    y = x * factor
    return y if dtype in FLOATS else np.trunc(y)


def reference_allreduce(inputs, op_name: str, dtype, prescale=1.0, postscale=1.0) -> np.ndarray:
    """What horovodlite promises: prescale each input, reduce, then postscale (and divide by the
    number of ranks for Average). Integers are scaled in float64 and truncated."""
    xs = [scale(as_f64(t), prescale, dtype) for t in inputs]
    if op_name in ("Sum", "Average"):
        out = np.sum(xs, axis=0)
    elif op_name == "Min":
        out = np.min(xs, axis=0)
    elif op_name == "Max":
        out = np.max(xs, axis=0)
    else:
        out = np.prod(xs, axis=0)
    post = postscale / len(inputs) if op_name == "Average" else postscale
    return scale(out, post, dtype)


def assert_close(actual: torch.Tensor, expected: np.ndarray, dtype, what: str = "") -> None:
    got = as_f64(actual)
    if dtype == torch.float16:
        tol = dict(rtol=1e-2, atol=1e-2)
    elif dtype == torch.bfloat16:
        tol = dict(rtol=3e-2, atol=3e-2)
    elif dtype == torch.float32:
        tol = dict(rtol=1e-5, atol=1e-5)
    elif dtype == torch.float64:
        tol = dict(rtol=1e-12, atol=1e-12)
    else:
        tol = dict(rtol=0, atol=0)
    np.testing.assert_allclose(got, expected.astype(np.float64),
                               err_msg=f"rank {hvd.rank()} {what}", **tol)
