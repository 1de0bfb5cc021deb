"""Bad input and cross-rank mismatches: ValueError at call time (nothing enqueued), and
HorovodInternalError from synchronize on every rank naming each rank's value; the runtime keeps
working afterwards."""

import re

import pytest
import torch

import horovodlite.torch as hvd

multi_rank = pytest.mark.skipif("hvd.size() < 2", reason="needs at least 2 ranks to disagree")


def check_next_collective_works(tag):
    out = hvd.allreduce(torch.ones(3), op=hvd.Sum, name=f"after.{tag}")
    assert torch.all(out == hvd.size())


def expect_mismatch(handle, *fragments):
    with pytest.raises(hvd.HorovodInternalError) as info:
        hvd.synchronize(handle)
    msg = str(info.value)
    for frag in fragments:
        assert frag in msg, f"rank {hvd.rank()}: {frag!r} not in {msg!r}"
    return msg


@multi_rank
def test_shape_mismatch_names_every_rank():
    r, n = hvd.rank(), hvd.size()
    shape = (4, 4) if r == 0 else (4, 5)
    h = hvd.allreduce_async(torch.zeros(shape), name="mm.shape")
    listing = ", ".join(f"rank {k} float32[4,{4 if k == 0 else 5}]" for k in range(n))
    msg = expect_mismatch(h, "allreduce.mm.shape: shape mismatch", listing)
    assert "rank 0 float32[4,4]" in msg and f"rank {n - 1} float32[4,5]" in msg
    check_next_collective_works("shape")


@multi_rank
def test_dtype_mismatch_names_every_rank():
    r = hvd.rank()
    dtype = torch.float32 if r == 0 else torch.float64
    h = hvd.allreduce_async(torch.zeros(3, dtype=dtype), name="mm.dtype")
    expect_mismatch(h, "dtype mismatch", "rank 0 float32[3]", "rank 1 float64[3]")
    check_next_collective_works("dtype")


@multi_rank
def test_op_mismatch():
    op = hvd.Sum if hvd.rank() == 0 else hvd.Max
    h = hvd.allreduce_async(torch.zeros(3), name="mm.op", op=op)
    expect_mismatch(h, "reduce op mismatch", "rank 0 Sum", "rank 1 Max")
    check_next_collective_works("op")


@multi_rank
def test_scale_factor_mismatch():
    r = hvd.rank()
    h = hvd.allreduce_async(torch.zeros(3), name="mm.pre", prescale_factor=1.0 + r)
    expect_mismatch(h, "prescale_factor mismatch", "rank 0 1", "rank 1 2")
    h = hvd.allreduce_async(torch.zeros(3), name="mm.post", postscale_factor=1.0 + r)
    expect_mismatch(h, "postscale_factor mismatch")
    check_next_collective_works("scale")


@multi_rank
def test_mismatch_inside_a_group_fails_the_group_only():
    r = hvd.rank()
    good, bad = torch.ones(2), torch.zeros(2 + r)
    h = hvd.grouped_allreduce_async([good, bad], name="mm.group", op=hvd.Sum)
    expect_mismatch(h, "grouped_allreduce.mm.group.1: shape mismatch")
    check_next_collective_works("group")


def test_non_contiguous_tensor_is_rejected_at_call_time():
    t = torch.zeros(4, 6).t()
    with pytest.raises(ValueError, match=r"allreduce\.nc: the tensor is not contiguous"):
        hvd.allreduce_async(t, name="nc")
    check_next_collective_works("nc")


def test_unsupported_dtype_is_rejected_at_call_time():
    with pytest.raises(ValueError, match=r"allreduce\.cx: unsupported dtype.*complex"):
        hvd.allreduce_async_(torch.zeros(2, dtype=torch.complex64), name="cx")


def test_duplicate_pending_name_is_rejected_and_nothing_is_enqueued():
    """A name is refused while its collective is in flight on this rank (once it has completed
    it is free again, synchronized or not: test_dropin_parity.py). Rank 0 submits first; the
    others only after a barrier that rank 0 enters after its check, so the first collective
    cannot have completed when rank 0 reuses the name."""
    n = hvd.size()
    if n == 1:
        h = hvd.allreduce_async(torch.ones(2), name="dup", op=hvd.Sum)
    elif hvd.rank() == 0:
        h = hvd.allreduce_async(torch.ones(2), name="dup", op=hvd.Sum)
        with pytest.raises(ValueError, match=r"allreduce\.dup: a collective with this name is "
                                             r"still pending on this rank \(handle \d+, not "
                                             r"completed yet\)"):
            hvd.allreduce_async(torch.ones(2), name="dup")
        hvd.barrier()
    else:
        hvd.barrier()
        h = hvd.allreduce_async(torch.ones(2), name="dup", op=hvd.Sum)
    assert torch.all(hvd.synchronize(h) == n)
    # The refused call enqueued nothing: the name works normally afterwards.
    assert torch.all(hvd.allreduce(torch.ones(2), name="dup", op=hvd.Sum) == n)


def test_average_together_with_op_is_rejected():
    with pytest.raises(ValueError, match="either op= or the deprecated average="):
        hvd.allreduce(torch.ones(2), average=True, op=hvd.Sum)


def test_unknown_handle():
    with pytest.raises(ValueError, match=r"handle 987654 is unknown or was already synchronized"):
        hvd.synchronize(987654)


def test_bool_average_is_rejected():
    with pytest.raises(ValueError, match="Average is undefined for bool"):
        hvd.allreduce(torch.ones(2, dtype=torch.bool), name="bool.avg")


def test_bool_min_max():
    r, n = hvd.rank(), hvd.size()
    t = torch.tensor([True, r == 0, False])
    anded = hvd.allreduce(t, op=hvd.Min, name="bool.min")
    ored = hvd.allreduce(t, op=hvd.Max, name="bool.max")
    assert anded.tolist() == [True, n == 1, False]
    assert ored.tolist() == [True, True, False]


def test_error_messages_say_what_to_do():
    r = hvd.rank()
    h = hvd.allreduce_async(torch.zeros(1 + (r > 0)), name="mm.hint")
    if hvd.size() > 1:
        msg = expect_mismatch(h, "every rank must submit the same shape under one name")
        assert re.search(r"rank \d+ float32\[\d\]", msg)
    else:
        hvd.synchronize(h)
