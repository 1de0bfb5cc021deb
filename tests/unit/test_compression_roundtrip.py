"""Compression.none / fp16 / bf16 in one process: the wire dtype, the restored dtype, values
within the 16-bit type's precision, and non-floating tensors passing through untouched."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from horovodlite.torch.compression import Compression

FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
WIRE = {"none": None, "fp16": torch.float16, "bf16": torch.bfloat16}
# Relative precision of the wire type (half an ulp, as a bound for round-to-nearest).
EPS = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("name", list(WIRE))
def test_round_trip_restores_dtype(name, dtype):
    comp = getattr(Compression, name)
    tensor = (torch.arange(12, dtype=torch.float64).reshape(3, 4) / 7 - 0.5).to(dtype)
    wire, ctx = comp.compress(tensor)
    expected_wire = WIRE[name] or dtype
    assert wire.dtype == expected_wire
    if expected_wire == dtype:
        assert wire is tensor, "a tensor already in the wire dtype must not be copied"
    back = comp.decompress(wire, ctx)
    assert back.dtype == dtype and back.shape == tensor.shape
    tol = EPS.get(WIRE[name], 0.0) if WIRE[name] != dtype else 0.0
    torch.testing.assert_close(back.double(), tensor.double(), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int32, torch.int64, torch.bool])
@pytest.mark.parametrize("name", list(WIRE))
def test_integer_tensors_are_untouched(name, dtype):
    comp = getattr(Compression, name)
    tensor = torch.ones(5, dtype=dtype)
    wire, ctx = comp.compress(tensor)
    assert wire is tensor
    assert comp.decompress(wire, ctx) is tensor


@settings(max_examples=60, deadline=None)
@given(values=arrays(np.float32, st.integers(1, 64),
                     elements=st.floats(-1e4, 1e4, allow_nan=False, width=32)),
       name=st.sampled_from(["fp16", "bf16"]))
def test_round_trip_error_is_within_the_wire_precision(values, name):
    comp = getattr(Compression, name)
    tensor = torch.from_numpy(values)
    back = comp.decompress(*comp.compress(tensor))
    assert back.dtype == torch.float32
    bound = np.abs(values) * EPS[WIRE[name]] + 1e-7  # absolute slack for float16 subnormals
    assert np.all(np.abs(back.numpy() - values) <= bound)
