"""Nothing an algorithm over a Transport posted is outstanding when it returns, on success or on
error (csrc/comm/transport.h). Every algorithm - the ring, the transport collectives, the
hierarchical ones, the hierarchical control plane's gathers and broadcast, the single-copy and
routed layers - runs on rank threads over counting transports (csrc/testing/faulty_transport.h)
with one failure injected: a post, a wait, or a lost rank, at calls spread over the whole run
(first, last and between) of the first or last rank. Every rank must return (no hang), some
rank must report the failure, and no rank may leave a request posted or wait on one twice."""

from __future__ import annotations

import pytest
from cpp_testing import load_testing_module

T = load_testing_module()

FLAT = ["ring_allreduce", "allgather", "reducescatter", "broadcast", "alltoall",
        "single_copy_allreduce", "routed_allreduce"]
HIERARCHICAL = ["hierarchical_allreduce", "hierarchical_allgather", "hierarchical_reducescatter"]
# The control plane's local part (the in-process fabric) cannot fail, so one rank per host.
CONTROL = ["control_or", "control_gather", "control_broadcast"]


def grid(op):
    return (3, 1) if op in CONTROL else (3, 2)


def check(op, ranks, what):
    statuses = [s for s, _, _ in ranks]
    assert any(statuses), f"{op} {what}: no rank reported the failure: {ranks}"
    for rank, (status, left, misuse) in enumerate(ranks):
        assert left == 0, f"{op} {what}: rank {rank} left {left} requests posted ({status})"
        assert misuse == 0, f"{op} {what}: rank {rank} waited on unposted requests"


@pytest.mark.parametrize("op", FLAT + HIERARCHICAL + CONTROL)
def test_without_failures_every_rank_succeeds_and_nothing_is_left(op):
    ranks, _ = T.faulty_run(op, *grid(op))
    assert ranks == [("", 0, 0)] * len(ranks)


@pytest.mark.parametrize("kind", ["post", "wait", "peer"])
@pytest.mark.parametrize("op", FLAT + HIERARCHICAL + CONTROL)
def test_a_failure_anywhere_leaves_nothing_posted(op, kind):
    hosts, per_host = grid(op)
    n = hosts * per_host
    for rank in (0, n - 1):
        _, calls = T.faulty_run(op, hosts, per_host, kind, rank, 10**9)  # counts the calls
        assert calls > 0, f"{op}: rank {rank} made no {kind} calls"
        for at in sorted({0, calls // 3, 2 * calls // 3, calls - 1}):
            ranks, _ = T.faulty_run(op, hosts, per_host, kind, rank, at)
            check(op, ranks, f"{kind} #{at} of {calls} at rank {rank}")
