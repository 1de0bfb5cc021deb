"""A job for ``horovodliterun --gloo`` (tests/test_gloo_launch.py, tests/test_multihost.py).

    python gloo_job.py check [--time]  every rank asserts its place (launcher variables against
                                       what the runtime found) and a few collectives, prints
                                       "OK <rank> <size> <local> <local size> <cross> <cross
                                       size> <host>"; --time: rank 0 also prints the time per
                                       4-byte and per 16 MiB allreduce
    python gloo_job.py data            every rank checks allreduces of every reduce op and dtype
                                       at odd sizes, one at a time and fused (and a 16 MiB + 12 B
                                       one, and that fusion does not change float32 sums' bits),
                                       allgather, broadcast and reducescatter against a reference
                                       each rank computes, and a shape mismatch named on every
                                       rank; prints "DATA <rank> <hierarchical allreduces>
                                       <allgathers> <reducescatters>"
    python gloo_job.py exit            rank 1 exits with status 3 after a few allreduces
    python gloo_job.py kill            rank 1 kills itself (SIGKILL) in a stream of allreduces;
                                       the others print "RAISED <rank> <unix time> <message>"
                                       for the HorovodInternalError they get, and exit 1
    python gloo_job.py foreign         before init, rank 0 starts a worker with another job's
                                       secret, claiming rank 1, at this job's rendezvous: it must
                                       be refused with the message; and neither the rendezvous
                                       nor the reports answer on this machine's other addresses;
                                       then the job runs as "check"
"""

import os
import socket
import subprocess
import sys
import time

import torch

import horovodlite.torch as hvd

# A line is one write (the ranks share one pipe; unbuffered, print writes its parts apart).
sys.stdout.reconfigure(line_buffering=True, write_through=False)

MPI_IDENTITY = ("OMPI_COMM_WORLD_", "PMIX_RANK", "PMI_RANK", "PMI_SIZE")


def check(timing: bool) -> None:
    r, n = hvd.rank(), hvd.size()
    env = os.environ
    assert hvd.gloo_enabled() and not hvd.mpi_enabled()
    assert not [k for k in env if k.startswith(MPI_IDENTITY)], "MPI variables leaked"
    placed = (int(env["HOROVOD_RANK"]), int(env["HOROVOD_SIZE"]), int(env["HOROVOD_LOCAL_RANK"]),
              int(env["HOROVOD_LOCAL_SIZE"]), int(env["HOROVOD_CROSS_RANK"]),
              int(env["HOROVOD_CROSS_SIZE"]))
    found = (r, n, hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size())
    assert placed == found, (placed, found)
    total = hvd.allreduce(torch.full((5,), float(r + 1)), op=hvd.Sum, name="sum")
    assert torch.equal(total, torch.full((5,), n * (n + 1) / 2)), total
    mean = hvd.allreduce(torch.full((3,), float(r)), name="mean")
    assert torch.allclose(mean, torch.full((3,), (n - 1) / 2)), mean
    gathered = hvd.allgather(torch.full((r + 1, 2), r), name="gather")
    assert gathered.tolist() == [[k, k] for k in range(n) for _ in range(k + 1)], gathered
    root = hvd.broadcast(torch.tensor([r * 10]), root_rank=n - 1, name="bcast")
    assert root.item() == (n - 1) * 10
    if timing:
        report_timing(r)
    print("OK", *found, socket.gethostname(), flush=True)


def data() -> None:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "parallel"))
    from helpers import DTYPES, OPS, assert_close, rank_data, reference_allreduce

    from horovodlite.common.basics import _stats

    r, n = hvd.rank(), hvd.size()
    sizes = (1, 7, 1001, 65537)

    def close(got, want, dtype, what):  # half precision rounds once per stage: grows with n
        if dtype in (torch.float16, torch.bfloat16):
            import numpy as np

            atol = (0.01 if dtype == torch.float16 else 0.03) * max(1.0, n / 3)
            np.testing.assert_allclose(got.double().numpy(), want, rtol=3e-2, atol=atol,
                                       err_msg=f"rank {r} {what}")
        else:
            assert_close(got, want, dtype, what)

    for di, dtype in enumerate(DTYPES):
        for oi, (op_name, op) in enumerate(OPS.items()):
            ins = {c: [rank_data(di * 100 + oi * 10 + i, k, (c,), dtype, op_name)
                       for k in range(n)] for i, c in enumerate(sizes)}
            want = {c: reference_allreduce(ins[c], op_name, dtype) for c in sizes}
            for c in sizes:  # one at a time
                got = hvd.allreduce(ins[c][r], op=op, name=f"one.{dtype}.{op_name}.{c}")
                close(got, want[c], dtype, f"alone {op_name} {dtype} x{c}")
            handles = {c: hvd.allreduce_async(ins[c][r], op=op, name=f"fused.{dtype}.{op_name}.{c}")
                       for c in sizes}  # together: one fused batch
            for c, h in handles.items():
                close(hvd.synchronize(h), want[c], dtype, f"fused {op_name} {dtype} x{c}")
    big = [rank_data(7, k, ((4 << 20) + 3,), torch.float32) for k in range(n)]
    alone = hvd.allreduce(big[r], op=hvd.Sum, name="big.alone")
    assert_close(alone, reference_allreduce(big, "Sum", torch.float32), torch.float32, "16 MiB")
    small = rank_data(8, r, (999,), torch.float32)
    h = [hvd.allreduce_async(big[r], op=hvd.Sum, name="big.fused"),
         hvd.allreduce_async(small, op=hvd.Sum, name="small.fused")]
    assert torch.equal(hvd.synchronize(h[0]), alone), "fused with another, the sum's bits changed"
    hvd.synchronize(h[1])
    mine = rank_data(9, r, (r + 2, 5), torch.float64)  # first dimensions differ by rank
    got = hvd.allgather(mine, name="gather")
    assert torch.equal(got, torch.cat([rank_data(9, k, (k + 2, 5), torch.float64)
                                       for k in range(n)])), "allgather"
    mine = rank_data(12, r, (70_001 + r,), torch.float32)  # over 256 KiB in all: hierarchical
    got = hvd.allgather(mine, name="gather.big")
    assert torch.equal(got, torch.cat([rank_data(12, k, (70_001 + k,), torch.float32)
                                       for k in range(n)])), "large allgather"
    root = rank_data(10, n - 1, (100_003,), torch.int32)
    got = hvd.broadcast(rank_data(10, r, (100_003,), torch.int32), root_rank=n - 1, name="bcast")
    assert torch.equal(got, root), "broadcast"
    rows = 3 * n + 1  # uneven: the first ranks get one row more
    ins = [rank_data(11, k, (rows, 7), torch.float32) for k in range(n)]
    got = hvd.reducescatter(ins[r], op=hvd.Sum, name="rs")
    total = torch.from_numpy(reference_allreduce(ins, "Sum", torch.float32)).float()
    start = sum(rows // n + (k < rows % n) for k in range(r))
    assert_close(got, total[start:start + got.shape[0]].double().numpy(), torch.float32, "rs")
    ins = [rank_data(13, k, (rows, 30_001), torch.float32) for k in range(n)]  # hierarchical
    got = hvd.reducescatter(ins[r], op=hvd.Sum, name="rs.big")
    total = torch.from_numpy(reference_allreduce(ins, "Sum", torch.float32)).float()
    assert_close(got, total[start:start + got.shape[0]].double().numpy(), torch.float32,
                 "large reducescatter")
    shape = (4, 4) if r == 0 else (4, 5)  # a mismatch: named on every rank, then work goes on
    try:
        hvd.allreduce(torch.zeros(shape), name="mm")
    except hvd.HorovodInternalError as e:
        listing = ", ".join(f"rank {k} float32[4,{4 if k == 0 else 5}]" for k in range(n))
        assert "allreduce.mm: shape mismatch" in str(e) and listing in str(e), str(e)
    else:
        raise AssertionError(f"rank {r}: no error for mismatched shapes")
    after = hvd.allreduce(torch.ones(3), op=hvd.Sum, name="after.mm")
    assert torch.equal(after, torch.full((3,), float(n))), after
    stats = _stats()
    print("DATA", r, stats["hierarchical_allreduces"], stats["hierarchical_allgathers"],
          stats["hierarchical_reducescatters"], flush=True)


def per_call(tensor, name: str, warmup: int, count: int) -> float:
    for i in range(warmup):
        hvd.allreduce_(tensor, op=hvd.Sum, name=f"{name}.w{i}")
    start = time.perf_counter()
    for _ in range(count):
        hvd.allreduce_(tensor, op=hvd.Sum, name=name)
    return (time.perf_counter() - start) / count


def report_timing(rank: int) -> None:
    small = per_call(torch.zeros(1), "t4", 20, 300)
    large = per_call(torch.zeros(4 << 20), "t16m", 2, 5)
    if rank == 0:
        print(f"TIMING 4-byte allreduce {small * 1e6:.0f} us, 16 MiB allreduce "
              f"{large * 1e3:.1f} ms ({16 / large / 1024:.2f} GiB/s algorithm bandwidth)",
              flush=True)


def killed(rank: int) -> None:
    print("UP rank", rank, flush=True)
    try:
        for i in range(100000):
            if rank == 1 and i == 50:
                print(f"KILLING {time.time():.3f}", flush=True)
                os.kill(os.getpid(), 9)
            hvd.allreduce(torch.ones(1000), name=f"step{i}")
    except hvd.HorovodInternalError as e:
        print(f"RAISED {rank} {time.time():.3f} {e}".replace("\n", " "), flush=True)
        sys.exit(1)
    sys.exit("no error after the kill")


def foreign() -> None:
    env = dict(os.environ, HVDL_RENDEZVOUS_SECRET="another-jobs-secret", HOROVOD_RANK="1")
    env.pop("HVDL_NOTICE_FD", None)
    worker = subprocess.run([sys.executable, "-c", "import horovodlite.torch as hvd; hvd.init()"],
                            env=env, capture_output=True, text=True, timeout=60)
    assert worker.returncode != 0, worker.stdout + worker.stderr
    assert "belongs to another horovodlite job" in worker.stderr, worker.stderr
    assert "this worker is refused" in worker.stderr, worker.stderr
    print("REFUSED", worker.stderr.strip().splitlines()[-1], flush=True)
    from horovodlite.runner.report import interface_addresses

    addr = os.environ["HOROVOD_GLOO_RENDEZVOUS_ADDR"]
    ports = [int(os.environ["HOROVOD_GLOO_RENDEZVOUS_PORT"]),
             int(os.environ["HVDL_REPORT_TO"].rpartition(":")[2])]
    others = [a for a in interface_addresses() if a != addr]
    for other in others:
        for port in ports:
            with socket.socket() as s:
                s.settimeout(5)
                assert s.connect_ex((other, port)) != 0, f"{other}:{port} answers"
    print("NOT ON", ",".join(others) or "(no other address here)", flush=True)


def main() -> None:
    mode = sys.argv[1]
    if mode == "foreign" and os.environ["HOROVOD_RANK"] == "0":
        foreign()
    hvd.init()
    if mode == "exit":
        for i in range(5):
            hvd.allreduce(torch.ones(3), name=f"a{i}")
        if hvd.rank() == 1:
            sys.exit(3)
        hvd.allreduce(torch.ones(3), name="never")
    elif mode == "kill":
        killed(hvd.rank())
    elif mode == "data":
        data()
    else:
        check("--time" in sys.argv)


if __name__ == "__main__":
    main()
