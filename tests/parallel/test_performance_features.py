"""Response cache (hits, invalidation, disabled), deterministic fusion, the ring algorithm over MPI
against NumPy, and autotune agreement - each on every rank, at any size."""

import contextlib
import os
import socket
import time

import pytest
import torch
from helpers import DTYPES, OPS, assert_close, rank_data, reference_allreduce

import horovodlite.torch as hvd
from horovodlite.common.basics import _stats


@contextlib.contextmanager
def runtime(**env):
    """Restarts horovodlite with extra HOROVOD_* variables, then restores the default runtime."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update({k: str(v) for k, v in env.items()})
    hvd.shutdown()
    hvd.init()
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        hvd.shutdown()
        hvd.init()


def test_cache_invalidates_on_every_rank_when_a_shape_changes():
    n = hvd.size()
    for shape in [(4,), (4,), (4,), (7,), (7,), (4,)]:
        before = _stats()
        out = hvd.allreduce(torch.ones(shape), name="inv.w", op=hvd.Sum)
        assert out.shape == shape and torch.all(out == n)
        after = _stats()
        changed = after["invalidations"] > before["invalidations"]
        hit = after["cache_hits"] > before["cache_hits"]
        assert changed or hit or after["negotiations"] > before["negotiations"]
    counts = hvd.allgather_object(_stats()["invalidations"])
    assert len(set(counts)) == 1 and counts[0] >= 2  # (4)->(7) and (7)->(4), same on every rank


def test_cache_capacity_zero_negotiates_every_time():
    with runtime(HOROVOD_CACHE_CAPACITY=0):
        before = _stats()
        for _ in range(5):
            hvd.allreduce(torch.ones(3), name="nocache", op=hvd.Sum)
        after = _stats()
        assert after["cache_hits"] == before["cache_hits"] == 0
        assert after["negotiations"] - before["negotiations"] >= 5


def run_pattern(pattern, count=24):
    r = hvd.rank()
    tensors = [rank_data(900 + i, r, (257 + 31 * i,), torch.float32) for i in range(count)]
    names = [f"det.{i}" for i in range(count)]
    if pattern == "together":
        hs = [hvd.allreduce_async_(t, name=nm, op=hvd.Sum) for t, nm in zip(tensors, names)]
    elif pattern == "one-by-one":
        hs = []
        for t, nm in zip(tensors, names):
            hs.append(hvd.allreduce_async_(t, name=nm, op=hvd.Sum))
            time.sleep(0.002 * (1 + r))  # ranks drift: each cycle fuses something different
    elif pattern == "reversed":
        hs = [hvd.allreduce_async_(t, name=nm, op=hvd.Sum)
              for t, nm in reversed(list(zip(tensors, names)))][::-1]
    else:
        hs = [hvd.grouped_allreduce_async_(tensors, name="det.group", op=hvd.Sum)]
    for h in hs:
        hvd.synchronize(h)
    return tensors


def test_results_are_bit_identical_whatever_the_fusion():
    reference = run_pattern("together")
    for pattern in ("one-by-one", "reversed", "grouped", "together"):
        got = run_pattern(pattern)
        for a, b in zip(reference, got):
            assert torch.equal(a, b), f"{pattern} differs from submitting together"
    with runtime(HOROVOD_FUSION_THRESHOLD=0):
        for a, b in zip(reference, run_pattern("together")):
            assert torch.equal(a, b), "no fusion differs from fusion"
    with runtime(HOROVOD_FUSION_THRESHOLD=4096):
        for a, b in zip(reference, run_pattern("together")):
            assert torch.equal(a, b), "a small fusion threshold differs"


@pytest.mark.parametrize("algo", ["ring", "mpi"])
def test_both_algorithms_match_numpy_for_every_dtype_op_and_odd_size(algo):
    n, r = hvd.size(), hvd.rank()
    with runtime(HOROVOD_ALLREDUCE_ALGO=algo, HOROVOD_RING_SEGMENT_BYTES=1024):
        for dtype in DTYPES:
            for op_name, op in OPS.items():
                for count in (1, 2, n + 1, 1001):
                    seed = 7000 + DTYPES.index(dtype) * 100 + count
                    inputs = [rank_data(seed, k, (count,), dtype, op_name) for k in range(n)]
                    out = hvd.allreduce(inputs[r], op=op, name=f"{algo}.{dtype}.{op_name}.{count}")
                    assert_close(out, reference_allreduce(inputs, op_name, dtype), dtype,
                                 f"{algo} {op_name} {count}")


def test_autotune_converges_and_every_rank_agrees(tmp_path_factory):
    log = str(tmp_path_factory.mktemp("autotune") / f"autotune.{hvd.rank()}.csv")
    with runtime(HOROVOD_AUTOTUNE=1, HOROVOD_AUTOTUNE_LOG=log, HOROVOD_AUTOTUNE_WARMUP_SAMPLES=1,
                 HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE=3):
        tensors = [torch.ones(2048 * (1 + i % 3)) for i in range(16)]
        steps = 0
        while steps < 2000:
            hs = [hvd.allreduce_async_(t, name=f"tune.{i}", op=hvd.Sum)
                  for i, t in enumerate(tensors)]
            for h in hs:
                hvd.synchronize(h)
            steps += 1
            done = hvd.allgather_object(_stats()["autotune_converged"], name="tune.done")
            if all(done):
                break
        assert all(done), f"autotune did not converge in {steps} steps"
        keys = ("fusion_threshold_bytes", "cycle_time_ms", "allreduce_algorithm")
        chosen = hvd.allgather_object(tuple(_stats()[k] for k in keys), name="tune.params")
        assert len(set(chosen)) == 1, f"ranks disagree: {chosen}"
        if hvd.rank() == 0:
            rows = open(log).read().splitlines()
            assert rows[0].startswith("sample,phase,fusion_threshold_bytes") and len(rows) > 5



def ring_batches(r):
    """Rank r's fused batches, giving the ring every kind of message: small ones (carried inside
    the descriptor), large ones of few pieces (read from the peer's memory) and ones of many tiny
    pieces (sent as MPI messages)."""
    return {
        "small": [rank_data(40, r, (3,), torch.float32), rank_data(41, r, (5,), torch.float64)],
        "large": [rank_data(42 + i, r, (70_001 + i,), torch.float32) for i in range(3)],
        "tiny-pieces": [rank_data(50 + i, r, (16,), torch.float32) for i in range(700)],
        "half": [rank_data(45, r, (40_003,), torch.bfloat16)],
    }


def reduce_batches(tag):
    out = {}
    for kind, tensors in ring_batches(hvd.rank()).items():
        hs = [hvd.allreduce_async(t, name=f"{tag}.{kind}.{i}", op=hvd.Sum)
              for i, t in enumerate(tensors)]
        out[kind] = [hvd.synchronize(h) for h in hs]
    return out


def test_ring_single_copy_and_mpi_messages_give_the_same_bits():
    with runtime(HOROVOD_ALLREDUCE_ALGO="ring", HOROVOD_RING_SEGMENT_BYTES=65536):
        single = reduce_batches("sc")
        hvd.barrier()
        peers = _stats()["single_copy_peers"]
        used = hvd.allgather_object((socket.gethostname(), peers), name="sc.used")
    # Per pair: a rank exchanges by single copy with the other ranks of its host (all of them,
    # or none where the kernel forbids reading another process), never with another host's.
    for host in {h for h, _ in used}:
        on_host = [p for h, p in used if h == host]
        assert set(on_host) <= {0, len(on_host) - 1} and len(set(on_host)) == 1, (
            f"ranks of {host} disagree about single copy: {used}")
    with runtime(HOROVOD_ALLREDUCE_ALGO="ring", HOROVOD_RING_SEGMENT_BYTES=65536,
                 HOROVOD_RING_CMA=0):
        plain = reduce_batches("mpi")
        hvd.barrier()
        assert _stats()["single_copy_transports"] == 0
    everyone = [ring_batches(k) for k in range(hvd.size())]
    for kind, tensors in ring_batches(hvd.rank()).items():
        for i, t in enumerate(tensors):
            assert torch.equal(single[kind][i], plain[kind][i]), (
                f"{kind}[{i}]: single copy and MPI messages differ")
            expected = reference_allreduce([b[kind][i] for b in everyone], "Sum", t.dtype)
            assert_close(single[kind][i], expected, t.dtype, f"{kind}[{i}]")


@pytest.mark.parametrize("hold", ["1", "0"])
def test_held_work_still_progresses_for_a_poll_loop(hold):
    """HOROVOD_HOLD_UNTIL_WAIT holds new tensors until a thread waits: polling an unfinished
    handle counts as waiting, so a poll loop (which never blocks) finishes."""
    with runtime(HOROVOD_HOLD_UNTIL_WAIT=hold):
        t = torch.full((8,), float(hvd.rank() + 1))
        h = hvd.allreduce_async_(t, name="hold.poll", op=hvd.Sum)
        deadline = time.monotonic() + 20
        while not hvd.poll(h):
            assert time.monotonic() < deadline, f"rank {hvd.rank()}: poll never saw it finish"
            time.sleep(0.001)
        n = hvd.size()
        assert torch.equal(hvd.synchronize(h), torch.full((8,), n * (n + 1) / 2))


def test_held_work_is_sent_within_the_hold_limit():
    """A rank that submits and then computes for a second before synchronizing must not keep
    the ranks waiting for that op for the whole second: held work goes out after at most
    100 ms (the cap) even when nobody on that rank waits."""
    with runtime(HOROVOD_HOLD_UNTIL_WAIT="1"):
        hvd.barrier()
        t = torch.ones(4)
        h = hvd.allreduce_async_(t, name="hold.cap", op=hvd.Sum)
        if hvd.rank() == hvd.size() - 1:
            time.sleep(1.0)  # busy elsewhere: nobody waits on this rank
            hvd.synchronize(h)
        else:
            start = time.monotonic()
            hvd.synchronize(h)
            waited = time.monotonic() - start
            assert waited < 0.6, f"rank {hvd.rank()} waited {waited:.2f} s for held work"
        assert torch.equal(t, torch.full((4,), float(hvd.size())))


def _threads() -> dict:
    names = {}
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError), open(f"/proc/self/task/{tid}/comm") as f:
            names[int(tid)] = f.read().strip()
    return names


def _background_cpus() -> set:
    """The CPUs of this rank's background thread. Between two barriers: the thread has run (it
    names itself first thing) and no rank has gone on to shut down, which ends every rank's."""
    hvd.barrier()
    found = [tid for tid, name in _threads().items() if name == "hvdl-bg"]
    assert len(found) == 1, f"rank {hvd.rank()}: no one background thread among {_threads()}"
    cpus = os.sched_getaffinity(found[0])
    hvd.barrier()
    return cpus


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="Linux CPU affinity")
def test_ranks_are_pinned_one_per_cpu_only_when_asked():
    """horovodliterun starts ranks unbound, so each may use every CPU. By default a rank stays
    so; HOROVOD_BIND_RANKS=auto pins it (and its background thread) to the local-rank-th CPU when
    the host has as many ranks as CPUs, =1 always; back to the default restores the CPUs."""
    every = set(os.sched_getaffinity(int(open("/proc/self/stat").read().split()[3])))
    cpus = sorted(every)
    assert (os.sched_getaffinity(0), _background_cpus()) == (every, every)
    with runtime(HOROVOD_BIND_RANKS="auto"):
        expected = {cpus[hvd.local_rank()]} if hvd.local_size() == len(cpus) else every
        assert (os.sched_getaffinity(0), _background_cpus()) == (expected, expected)
        assert torch.all(hvd.allreduce(torch.ones(3), name="pinned", op=hvd.Sum) == hvd.size())
    with runtime(HOROVOD_BIND_RANKS=1):
        pinned = {cpus[hvd.local_rank() % len(cpus)]}
        assert (os.sched_getaffinity(0), _background_cpus()) == (pinned, pinned)
    assert (os.sched_getaffinity(0), _background_cpus()) == (every, every)


@pytest.mark.parametrize("algo", ["mpi", "ring"])
def test_tensors_side_by_side_are_reduced_where_they_are(algo):
    """A group whose tensors lie side by side in one allocation (a gradient bucket's views) is
    reduced in that memory, without the fusion buffer, whatever the algorithm; ranks whose
    tensors lie apart pack theirs (even ranks here), and every rank gets the same result."""
    n, r = hvd.size(), hvd.rank()
    sizes = (1000, 3, 4096, 17)
    scale = 0.5
    with runtime(HOROVOD_ALLREDUCE_ALGO=algo):
        for round_ in range(3):
            seeds = [8000 + 10 * round_ + k for k in range(len(sizes))]
            ranks = [[rank_data(seed, k, (size,), torch.float32)
                      for seed, size in zip(seeds, sizes)] for k in range(n)]
            if r % 2 == 1:  # one allocation, views side by side
                flat = torch.cat(ranks[r])
                tensors = list(flat.split(sizes))
            else:
                flat, tensors = None, [t.clone() for t in ranks[r]]
            hvd.grouped_allreduce_(tensors, op=hvd.Sum, prescale_factor=scale,
                                   name=f"side_by_side.{algo}.{round_}")
            for k, t in enumerate(tensors):
                want = reference_allreduce([ranks[j][k] for j in range(n)], "Sum",
                                           torch.float32, prescale=scale)
                assert_close(t, want, torch.float32, f"rank {r} tensor {k}")
            if flat is not None:
                assert flat.data_ptr() == tensors[0].data_ptr()
        fusion = _stats()["fusion_buffer_bytes"]
        if r % 2 == 1 or n == 1:
            assert fusion == 0, f"rank {r}: tensors side by side went through the fusion buffer"
