"""The ring's single-copy read (comm/single_copy): pieces of another process's memory copied
straight into pieces of ours with process_vm_readv, here read from this very process."""

import os

import pytest
from cpp_testing import load_testing_module
from hypothesis import given, settings
from hypothesis import strategies as st

T = load_testing_module()
pytestmark = pytest.mark.skipif(not T.single_copy_built(), reason="Linux only")


def split(total, cuts):
    """Piece sizes cutting `total` bytes at the given offsets (empty pieces allowed)."""
    points = sorted(min(c, total) for c in cuts)
    edges = [0, *points, total]
    return [b - a for a, b in zip(edges, edges[1:])]


@settings(max_examples=200, deadline=None)
@given(payload=st.binary(min_size=0, max_size=5000),
       remote_cuts=st.lists(st.integers(0, 5000), max_size=40),
       local_cuts=st.lists(st.integers(0, 5000), max_size=40))
def test_any_piece_layouts_on_both_sides_copy_every_byte_in_order(payload, remote_cuts,
                                                                  local_cuts):
    remote = split(len(payload), remote_cuts)
    local = split(len(payload), local_cuts)
    assert T.single_copy_read(payload, remote, local) == payload


def test_more_pieces_than_one_system_call_takes():
    payload = bytes(range(256)) * 12  # 3072 bytes in 3072 one-byte pieces on one side
    assert T.single_copy_read(payload, [1] * len(payload), [len(payload)]) == payload
    assert T.single_copy_read(payload, [len(payload)], [1] * len(payload)) == payload


def test_sizes_that_disagree_are_an_error_naming_both():
    with pytest.raises(Exception, match="single copy of 10 bytes into 9 bytes"):
        T.single_copy_read(b"0123456789", [10], [9])


def test_a_process_that_cannot_be_read_is_an_error_naming_it_and_the_way_out():
    # A pid that does not exist (beyond pid_max): the message says what failed and the knob.
    with pytest.raises(Exception, match=r"pid 2147483646 failed: .*HOROVOD_RING_CMA=0"):
        T.single_copy_read(b"abc", [3], [3], pid=2147483646)


def test_reading_our_own_pid_explicitly_works():
    assert T.single_copy_read(b"xyz" * 100, [150, 150], [1, 299], pid=os.getpid()) == b"xyz" * 100
