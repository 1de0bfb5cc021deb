"""The bucket layout logic of horovodlite/torch/buckets.py, alone (no ranks): planning, the
agreed order, the parameter-set check and the off switch."""

from __future__ import annotations

import pytest
import torch

from horovodlite.common.exceptions import HorovodArgumentError
from horovodlite.torch.buckets import (
    agreed_order,
    bucket_view_enabled,
    check_same_params,
    plan_buckets,
)

F32, F64 = (torch.float32, "cpu"), (torch.float64, "cpu")


def test_plan_fills_buckets_in_order_up_to_the_threshold():
    assert plan_buckets([3, 1, 0, 2], [10, 10, 10, 10], [F32] * 4, 20) == [[3, 1], [0, 2]]
    assert plan_buckets([0, 1, 2], [10, 10, 10], [F32] * 3, 25) == [[0, 1], [2]]


def test_plan_gives_a_parameter_over_the_threshold_a_bucket_of_its_own():
    assert plan_buckets([0, 1, 2], [5, 50, 5], [F32] * 3, 20) == [[0], [1], [2]]


def test_plan_keeps_dtypes_apart_and_orders_buckets_by_first_member():
    keys = [F32, F64, F32, F64]
    assert plan_buckets([0, 1, 2, 3], [4] * 4, keys, 100) == [[0, 2], [1, 3]]
    assert plan_buckets([1, 0, 2, 3], [4] * 4, keys, 100) == [[1, 3], [0, 2]]


def test_plan_keeps_devices_apart():
    """CUDA parameters (devices are plain torch.device objects here: no GPU needed) share a
    bucket only with parameters of their dtype on their own device."""
    cpu, cuda0, cuda1 = (torch.device(d) for d in ("cpu", "cuda:0", "cuda:1"))
    keys = [(torch.float32, cpu), (torch.float32, cuda0), (torch.float32, cuda1),
            (torch.float32, cuda0), (torch.float16, cuda0), (torch.float32, cpu),
            (torch.float16, cuda0), (torch.float32, cuda1)]
    assert plan_buckets(range(8), [4] * 8, keys, 100) == [[0, 5], [1, 3], [2, 7], [4, 6]]
    # The threshold cuts each device's run on its own: cuda:0's second bucket opens while
    # the CPU's first is still filling.
    nbytes = [4, 6, 4, 6, 4, 4, 4, 4]
    assert plan_buckets([0, 1, 3, 5, 2], nbytes, keys, 8) == [[0, 5], [1], [3], [2]]


def test_plan_refuses_a_threshold_that_is_not_positive():
    with pytest.raises(HorovodArgumentError, match="threshold"):
        plan_buckets([0], [4], [F32], 0)


def test_agreed_order_is_rank_0s_then_the_unseen_in_index_order():
    orders = [[2, 0, 2, 9], [0, 1, 2, 3]]  # rank 0 saw 2 and 0 (duplicates, out-of-range dropped)
    assert agreed_order(orders, 4) == [2, 0, 1, 3]
    assert agreed_order([[]], 3) == [0, 1, 2]


def test_a_parameter_set_that_differs_names_the_parameter_and_the_ranks():
    same = [("a", (2,), "torch.float32"), ("b", (3,), "torch.float32")]
    check_same_params([same, list(same), list(same)])
    other = [("a", (2,), "torch.float32"), ("b", (4,), "torch.float32")]
    with pytest.raises(HorovodArgumentError,
                       match=r"#1 is 'b' \[3\].* on rank 0 but 'b' \[4\].* on rank 2.*\[2\]"):
        check_same_params([same, same, other])
    with pytest.raises(HorovodArgumentError, match="#2 is missing on rank 0 but 'c'"):
        check_same_params([same, same + [("c", (1,), "torch.float32")]])


def test_off_switch(monkeypatch):
    monkeypatch.delenv("HOROVOD_BUCKET_VIEW", raising=False)
    assert bucket_view_enabled(None) is True
    monkeypatch.setenv("HOROVOD_BUCKET_VIEW", "0")
    assert bucket_view_enabled(None) is False
    assert bucket_view_enabled(True) is True  # the argument wins over the knob
    monkeypatch.setenv("HOROVOD_BUCKET_VIEW", "maybe")
    with pytest.raises(HorovodArgumentError, match="HOROVOD_BUCKET_VIEW"):
        bucket_view_enabled(None)
    with pytest.raises(HorovodArgumentError, match="bucket_view"):
        bucket_view_enabled("yes")
