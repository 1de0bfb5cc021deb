"""The shared-memory transport and control planes (csrc/backends/shm), and the hierarchical
control plane over them (csrc/comm/hierarchical_control_plane).

Two levels, through ``horovodlite._testing``:
- N threads of this process, each attaching the SAME named segment on its own: the ring and the
  transport collectives over ShmTransport (and single copy on top), scripted messages at the
  edges of the fragment protocol, ShmControlPlane and HierarchicalControlPlane scripts;
- real processes (multiprocessing, fork), one member each: ping-pong, allreduce, control rounds,
  a member killed while the others wait, attach timeouts.
No segment may be left in /dev/shm by any test (checked around each one).
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
from cpp_testing import load_testing_module

T = load_testing_module()
FLOAT32, FLOAT64 = 7, 8
SLOT_PAYLOAD = 4160 - 32
LAYERS = [pytest.param([], id="shm"), pytest.param("one-host", id="single-copy-over-shm")]
_names = itertools.count()


def segments():
    """This session's segments (the threads' and the processes' names carry our pid)."""
    mine = f"hvdl-test-{os.getpid()}-"
    return {p.name for p in Path("/dev/shm").iterdir() if p.name.startswith(mine)}


@pytest.fixture(autouse=True)
def no_segment_left():
    assert segments() == set()
    yield
    assert segments() == set()


def hosts_for(layer, n):
    return ["host"] * n if layer else []


# ------------------------------------------------------------------- transport, N threads


@pytest.mark.parametrize("layer", LAYERS)
@pytest.mark.parametrize("n", [1, 2, 3, 5])
@pytest.mark.parametrize("count,segment", [(7, 64), (5000, 1024), (300_000, 1 << 20)])
def test_ring_allreduce_over_shm(layer, n, count, segment):
    # 300k float64 = 2.4 MB: messages far larger than a slot (4 KiB) and a ring (66 KiB).
    xs = [np.random.default_rng(r).standard_normal(count) for r in range(n)]
    out = T.transport_collective("allreduce", [x.tobytes() for x in xs], dtype=FLOAT64,
                                 hosts=hosts_for(layer, n), segment=segment, transport="shm")
    want = np.sum(xs, axis=0)
    for got, peers in out:
        np.testing.assert_allclose(np.frombuffer(got), want, rtol=1e-12, atol=1e-12)
        assert peers == (n - 1 if layer else 0)


@pytest.mark.parametrize("layer", LAYERS)
@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_transport_collectives_over_shm(layer, n):
    hosts = hosts_for(layer, n)
    counts = [(r * 3779) % 9001 for r in range(n)]  # up to ~70 KB per block, one may be empty
    parts = [np.random.default_rng(r).standard_normal(c) for r, c in enumerate(counts)]
    out = T.transport_collective("allgather", [p.tobytes() for p in parts], [counts], FLOAT64,
                                 hosts=hosts, segment=8192, transport="shm")
    assert all(got == np.concatenate(parts).tobytes() for got, _ in out)
    inputs = [np.random.default_rng(10 + r).standard_normal(sum(counts)) for r in range(n)]
    out = T.transport_collective("reducescatter", [x.tobytes() for x in inputs], [counts],
                                 FLOAT64, hosts=hosts, segment=8192, transport="shm")
    total = np.sum(inputs, axis=0)
    for r, (got, _) in enumerate(out):
        lo = sum(counts[:r])
        np.testing.assert_allclose(np.frombuffer(got), total[lo:lo + counts[r]], rtol=1e-12)
    root = n - 1
    data = [np.full(20000, float(r)) for r in range(n)]
    out = T.transport_collective("broadcast", [x.tobytes() for x in data], root=root,
                                 dtype=FLOAT64, hosts=hosts, transport="shm")
    assert all(np.array_equal(np.frombuffer(g), data[root]) for g, _ in out)
    sends = [[(r * 3 + q) % 4 * 1500 for q in range(n)] for r in range(n)]
    inputs = [np.arange(sum(sends[r]), dtype=np.float32) + 100 * r for r in range(n)]
    out = T.transport_collective("alltoall", [x.tobytes() for x in inputs], sends, FLOAT32,
                                 hosts=hosts, transport="shm")
    for r, (got, _) in enumerate(out):
        want = np.concatenate([inputs[q][sum(sends[q][:r]):sum(sends[q][:r]) + sends[q][r]]
                               for q in range(n)])
        assert np.array_equal(np.frombuffer(got, dtype=np.float32), want)


def payload(size, seed):
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


@pytest.mark.parametrize("slots", [0, 2])
def test_messages_of_every_size_in_pieces_both_ways_at_once(slots):
    sizes = [0, 1, SLOT_PAYLOAD - 1, SLOT_PAYLOAD, SLOT_PAYLOAD + 1, 3 * SLOT_PAYLOAD,
             1 << 20, 3_000_001]
    msgs = []
    for i, size in enumerate(sizes):
        for src, dst in ((0, 1), (1, 0)):  # both directions posted before any wait
            msgs.append(dict(src=src, dst=dst, data=payload(size, i), send_pieces=1 + i % 3,
                             recv_pieces=1 + (i * 5) % 7))
    out = T.shm_messages(2, msgs, slots=slots)
    for m, (got, recv_error, send_error) in zip(msgs, out):
        assert (recv_error, send_error) == ("", "")
        assert got == m["data"]


def test_receive_larger_than_the_message_keeps_the_rest():
    out = T.shm_messages(2, [dict(src=0, dst=1, data=b"abc", room=10),
                             dict(src=0, dst=1, data=payload(10_000, 1), room=20_000,
                                  recv_pieces=4)])
    assert out[0][0] == b"abc" + b"\xee" * 7
    assert out[1][0] == payload(10_000, 1) + b"\xee" * 10_000
    assert [o[1] for o in out] == ["", ""]


def test_message_larger_than_the_receive_fails_naming_the_peer_and_the_stream_goes_on():
    msgs = [dict(src=2, dst=0, data=payload(50_000, 2), room=49_999),  # spans many slots
            dict(src=2, dst=0, data=b"next"),
            dict(src=1, dst=0, data=b"x" * 9, room=8)]
    got, error, send_error = T.shm_messages(3, msgs)[0]
    assert "a 50000-byte message from member 2 on tag 0 for a 49999-byte receive" in error
    assert got == b"\xee" * 49_999 and send_error == ""
    second, third = T.shm_messages(3, msgs)[1:]
    assert second == (b"next", "", "")
    assert "a 9-byte message from member 1" in third[1]


def test_tags_are_independent_channels():
    # Member 1 waits for tag 3 first although member 0 sent on tag 0 first: no head-of-line
    # blocking across tags, order kept within each tag.
    msgs = [dict(src=0, dst=1, tag=0, data=payload(100_000, 0)),
            dict(src=0, dst=1, tag=3, data=b"three"),
            dict(src=0, dst=1, tag=0, data=b"zero-2")]
    order = [msgs[1], msgs[0], msgs[2]]  # receive posting order on member 1 follows this list
    out = T.shm_messages(2, order)
    assert [o[0] for o in out] == [b"three", payload(100_000, 0), b"zero-2"]


def test_footprint_formula():
    for size in (2, 3, 4, 8, 16, 32):
        bytes_, slots = T.shm_footprint(size)
        rings = size * (size - 1) * 4
        fit = (4 << 20) // (rings * 4160)
        want_slots = max(2, min(16, 1 << (fit.bit_length() - 1) if fit else 0))
        assert slots == want_slots, size
        assert bytes_ == 64 + 64 * size + rings * (128 + slots * 4160), size
    assert T.shm_footprint(8)[0] < 4 << 20
    # The control plane's segment: a star with two tags, four slots, and the OR area.
    words = 1 + 2 * 16  # the controller's words for a 1024-entry response cache
    bytes_, slots = T.shm_footprint(8, tags=2, star=True, slots=4, words=words)
    area = 64 + ((2 * words * 8 + 63) // 64) * 64
    assert bytes_ == 64 + 64 * 8 + 8 * area + 2 * 7 * 2 * (128 + 4 * 4160)


def test_cancel_ends_a_wait_and_every_later_call():
    error, seconds = T.shm_cancel_while_waiting(100)
    assert error.count("shutting down (test)") == 2, error
    assert "receive from member 1" in error
    assert seconds < 10


# ------------------------------------------------------------------ control planes, threads


def or_script(n, rounds, seed=0, words=None):
    rng = np.random.default_rng(seed)
    script = []
    for k in range(rounds):
        w = words or 1 + k % 4  # the count may change from round to round
        sparse = [rng.integers(0, 1 << 62, w) & rng.integers(0, 1 << 62, w)
                  & rng.integers(0, 1 << 62, w) for _ in range(n)]  # ~1 bit in 8 set
        script.append(("or", [[int(x) for x in sparse[r]] + [k] for r in range(n)]))
    return script


def strings_step(kind, n, k):
    lengths = [0, 1, 7, SLOT_PAYLOAD + 5, 20_000]
    return (kind, [bytes([65 + (r + k) % 26]) * lengths[(r + k) % len(lengths)]
                   for r in range(n)])


def full_script(n, rounds=120):
    script = or_script(n, rounds)
    for k in range(0, rounds, 15):
        script.insert(k, strings_step("gather", n, k))
        script.insert(k + 1, strings_step("bcast", n, k))
    return script


def check(script, out, n):
    for k, step in enumerate(script):
        kind, per_rank = step
        for r in range(n):
            got = out[r][k]
            if kind == "or":
                want = [0] * len(per_rank[0])
                for words in per_rank:
                    want = [a | b for a, b in zip(want, words)]
                assert got == want, (k, r)
            elif kind == "gather":
                assert got == (per_rank if r == 0 else []), (k, r)
            else:
                assert got == per_rank[0], (k, r)


@pytest.mark.parametrize("n", [1, 2, 3, 5])
@pytest.mark.parametrize("jitter_us", [0, 150])
def test_shm_control_plane_rounds_gathers_broadcasts(n, jitter_us):
    script = full_script(n)
    out = T.shm_control_plane([list(range(n))], script, jitter_us=jitter_us)
    check(script, out, n)


LAYOUTS = {
    "one-host": [[0, 1, 2]],
    "interleaved-2": [[0, 2, 4], [1, 3]],
    "interleaved-3": [[0, 3, 6], [1, 4, 7], [2, 5]],
    "lone-root": [[0], [1, 2, 3]],
    "one-per-host": [[0], [1], [2]],
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("jitter_us", [0, 150])
def test_hierarchical_control_plane(layout, jitter_us):
    hosts = LAYOUTS[layout]
    n = sum(len(h) for h in hosts)
    script = full_script(n, rounds=80)
    out = T.shm_control_plane(hosts, script, hierarchical=True, jitter_us=jitter_us)
    check(script, out, n)


@pytest.mark.parametrize("member,error", [
    # (local size, local rank, cross size, cross rank, job size, local ranks, root ranks)
    ((3, 0, 2, 0, 5, [0, 2, 4], [0, 1]), ""),
    ((3, 1, 0, 0, 5, [0, 2, 4], [0, 1]), ""),
    ((2, 0, 2, 1, 5, [1, 3], [0, 1]), ""),
    ((3, 0, 0, 0, 3, [0, 1, 2], [0]), ""),
    ((2, 0, 0, 0, 5, [1, 3], [0, 1]), "a root of a job on several hosts needs a cross"),
    ((2, 1, 2, 1, 5, [1, 3], [0, 1]), "a cross transport on a member that is not the root"),
    ((2, 0, 2, 0, 5, [1, 3], [0, 1]), "cross member 0 of 2 is global rank 1"),
    ((3, 0, 2, 1, 5, [2, 0, 4], [1, 2]), "global rank 0 must be member 0"),
    ((2, 0, 2, 0, 4, [0, 3], [1, 0]), "cross member 0 must be global rank 0's host"),
    ((2, 0, 2, 0, 4, [0, 5], [0, 1]), "local rank 5 out of range"),
    ((2, 0, 2, 0, 4, [0], [0, 1]), "1 local ranks for a local control plane of 2"),
], ids=lambda x: x if isinstance(x, str) else None)
def test_hierarchical_layout_is_checked(member, error):
    message, rank = T.check_hierarchical_layout(*member)
    if error:
        assert error in message and rank == -1
    else:
        assert message == "" and rank == member[5][member[1]]


def test_word_counts_must_agree():
    with pytest.raises(RuntimeError, match=r"rank 1 passed 2 words, rank 0 1|"
                                           r"rank 0 passed 1 words, rank 1 2"):
        T.shm_control_plane([[0, 1]], [("or", [[1], [2, 3]])])


def test_more_words_than_the_segment_holds_is_an_argument_error():
    with pytest.raises(RuntimeError, match="a bitwise OR of 9 words; the segment holds 8"):
        T.shm_control_plane([[0]], [("or", [[0] * 9])], max_words=8)


# ------------------------------------------------------------------------ real processes


def _member(job, queue):
    result = T.shm_member(job)
    result["rank"], result["returned"] = job["rank"], time.monotonic()
    queue.put(result)


def start(n, members=None, name=None, queue=None, **job):
    """Starts `members` (default all) of the n-member group `name` (default a new one), one
    process each; returns them by member, the result queue and the name."""
    ctx = mp.get_context("fork")
    queue = queue or ctx.Queue()
    name = name or f"/hvdl-test-{os.getpid()}-proc-{next(_names)}"
    procs = {}
    for r in members if members is not None else range(n):
        spec = dict(job, name=name, rank=r, size=n)
        p = ctx.Process(target=_member, args=(spec, queue), daemon=True)
        p.start()
        procs[r] = p
    return procs, queue, name


def collect(procs, queue, count, timeout=60):
    results = {}
    for _ in range(count):
        r = queue.get(timeout=timeout)
        results[r["rank"]] = r
    for p in procs.values():
        p.join(timeout=timeout)
    return results


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("job", [
    dict(action="pingpong", bytes=4, iterations=2000),
    dict(action="pingpong", bytes=100_000, iterations=50),
    dict(action="allreduce", bytes=8 * 100_003, iterations=5),
    dict(action="allreduce", bytes=8 * 100_003, iterations=5, single_copy=True),
    dict(plane="control", action="bor", iterations=3000),
    dict(plane="control", action="gather", iterations=40),
], ids=["pingpong-4B", "pingpong-100KB", "allreduce", "allreduce-single-copy", "bor", "gather"])
def test_processes(n, job):
    procs, queue, _ = start(n, **job)
    results = collect(procs, queue, n)
    assert {r: res["error"] for r, res in results.items()} == {r: "" for r in range(n)}


@pytest.mark.parametrize("job", [
    dict(action="wait_recv", peer=2),
    dict(plane="control", action="wait_bor", iterations=1),
    dict(plane="control", action="wait_gather", iterations=1),
], ids=["transport-wait", "test-bitwise-or", "gather"])
def test_a_killed_member_is_named_by_the_waiting_ones(job, tmp_path):
    ready = tmp_path / "ready"
    procs, queue, name = start(3, members=[0, 1], **job)
    victim = start(3, members=[2], name=name, **dict(job, action="hang",
                                                      ready_file=str(ready)))[0][2]
    deadline = time.monotonic() + 30
    while not ready.exists():
        assert time.monotonic() < deadline, "the victim never attached"
        time.sleep(0.01)
    time.sleep(0.3)  # the others are inside their waits by now
    killed = time.monotonic()
    os.kill(victim.pid, signal.SIGKILL)
    victim.join()
    waiting = [0] if job["action"] == "wait_gather" else [0, 1]
    results = collect(procs, queue, 2)
    for r in waiting:
        res = results[r]
        assert f"rank 2 (pid {victim.pid}) exited" in res["error"], res
        assert res["returned"] - killed < 3.0, res  # ~0.1 s: a liveness check every 64 ms


def test_attach_timeout_names_the_member_that_never_attached():
    procs, queue, _ = start(3, members=[0, 1], action="pingpong", timeout_ms=500)
    results = collect(procs, queue, 2)
    for r in (0, 1):
        assert "rank 2 never attached within 500 ms" in results[r]["error"], results[r]


def test_attach_timeout_names_a_missing_creator():
    procs, queue, _ = start(2, members=[1], action="pingpong", timeout_ms=300)
    error = collect(procs, queue, 1)[1]["error"]
    assert "rank 0 never created it within 300 ms (it does not exist)" in error


@pytest.mark.parametrize("hosts", [[[0, 1], [2, 3]], [[0, 1, 2], [3]], [[0, 1], [2, 3], [4, 5]]],
                         ids=["2x2", "3+1", "3x2"])
def test_a_flat_ring_over_shared_memory_and_a_blocking_network_completes(hosts):
    """RoutedTransport: rank 0 blocked on the network must keep streaming its message to rank 1
    through shared memory (a ring of 2 slots, 1 MiB messages), or the ring deadlocks."""
    n = sum(len(h) for h in hosts)
    out = T.routed_ring_allreduce(hosts, count=(1 << 20) + 3, segment=1 << 20, slots=2)
    assert out == [("", True)] * n, out
