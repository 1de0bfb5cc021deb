"""The CUDA kernels against their CPU reference, bit for bit (GPU machines only).

``_testing.device_ops_scale_copy`` runs the build's CudaDeviceOps (the batched ScaleCopy kernel,
one launch for every region) on raw device pointers; the expectation is the CPU kernel
(``_testing.scale``, comm/reduce_kernels) on the same bytes. Without a GPU (or in a CPU-only
build) every test here is skipped; the same logic runs on the CPU in test_device_path.py, and
the kernel is compiled and linked by test_cuda_build.py.
"""

from __future__ import annotations

import pytest
import torch
from cpp_testing import load_testing_module

import horovodlite.torch as hvd

T = load_testing_module()

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(not hvd.cuda_built(), reason="horovodlite was built without CUDA"),
]

DTYPE_CODE = {torch.uint8: 0, torch.int8: 1, torch.int16: 2, torch.int32: 3, torch.int64: 4,
              torch.float16: 5, torch.bfloat16: 6, torch.float32: 7, torch.float64: 8,
              torch.bool: 9}
TILE = T.batch_tile_elements
SIZES = [1, 0, TILE - 1, TILE, TILE + 1, 3, 100_000, 3 * TILE + 5]


def values(n: int, dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return (torch.rand(n, generator=g, dtype=torch.float64) * 16 - 8).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).to(torch.bool)
    lo = 0 if dtype == torch.uint8 else -16
    return torch.randint(lo, lo + 33, (n,), generator=g).to(dtype)


def raw(t: torch.Tensor) -> bytes:
    t = t.contiguous().cpu()
    if t.dtype in (torch.float16, torch.bfloat16):
        t = t.view(torch.int16)
    if t.dtype == torch.bool:
        t = t.view(torch.uint8)
    return t.numpy().tobytes()


@pytest.mark.parametrize("dtype", list(DTYPE_CODE))
@pytest.mark.parametrize("factor", [1.0, 0.5, 3.0, -0.25])
@pytest.mark.parametrize("in_place", [False, True])
def test_batched_scale_copy_matches_the_cpu_kernel(dtype, factor, in_place):
    if factor < 0 and dtype == torch.uint8:
        pytest.skip("negative factors have no uint8 result")
    device = torch.device("cuda", torch.cuda.current_device())
    srcs = [values(n, dtype, seed=i).to(device) for i, n in enumerate(SIZES)]
    expected = [T.scale(raw(s), DTYPE_CODE[dtype], factor) for s in srcs]
    dsts = srcs if in_place else [torch.full_like(s, 0) for s in srcs]
    torch.cuda.synchronize()  # horovodlite's stream does not know about torch's here
    regions = [(d.data_ptr(), s.data_ptr(), s.numel()) for d, s in zip(dsts, srcs)]
    T.device_ops_scale_copy(device.index, regions, DTYPE_CODE[dtype], factor)
    for n, d, want in zip(SIZES, dsts, expected):
        assert raw(d) == want, f"{dtype} x{factor}: {n} elements differ"


def test_thousands_of_regions_in_one_launch():
    device = torch.device("cuda", torch.cuda.current_device())
    srcs = [torch.full((i % 7,), float(i), device=device) for i in range(5000)]
    dsts = [torch.zeros_like(s) for s in srcs]
    torch.cuda.synchronize()
    T.device_ops_scale_copy(device.index, [(d.data_ptr(), s.data_ptr(), s.numel())
                                           for d, s in zip(dsts, srcs)], DTYPE_CODE[torch.float32],
                            2.0)
    for i, d in enumerate(dsts):
        assert torch.equal(d.cpu(), torch.full((i % 7,), 2.0 * i))
