"""Every collective on CUDA tensors, on every rank (GPU machines only).

tests/test_gpu.py launches this file: at np=1 with NCCL (and again with hierarchical allreduce),
and at np=2 with the ranks sharing the GPU through host staging (HOROVOD_GPU_OPERATIONS=mpi),
plus np=2 with NCCL where there are two GPUs. Expectations are computed on the CPU from every
rank's regenerated input (helpers.py), so the same file passes whatever the path and size.
Nothing here has run on the development machine, which has no GPU; in the normal suite the file
is skipped as a whole when torch.cuda.is_available() is False.
"""

import os
import warnings

import pytest
import torch
from helpers import DTYPES, FLOATS, OPS, assert_close, rank_data, reference_allreduce

import horovodlite.torch as hvd

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(not hvd.cuda_built(), reason="horovodlite was built without CUDA"),
]

if torch.cuda.is_available():
    torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    DEV = torch.device("cuda", torch.cuda.current_device())
    SHARED = hvd.local_size() > torch.cuda.device_count()
else:
    DEV, SHARED = None, False


def gpu_data(seed, rank, shape, dtype, op_name="Sum"):
    if dtype == torch.bool:
        return (rank_data(seed, rank, shape, torch.int32) > 0).to(DEV)
    return rank_data(seed, rank, shape, dtype, op_name).to(DEV)


def cpu_inputs(seed, shape, dtype, op_name="Sum"):
    return [rank_data(seed, k, shape, dtype, op_name) for k in range(hvd.size())]


# Runs first (pytest keeps file order): this process's first CUDA collective starts the check.
def test_00_pinning_check_warns_only_when_ranks_share_a_gpu():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(3):
            out = hvd.allreduce(torch.ones(4, device=DEV), op=hvd.Sum, name=f"pin.{i}")
            assert out.device == DEV and torch.all(out == hvd.size())
        hvd.allreduce(torch.ones(1), name="pin.cpu")  # a later call polls the finished check
    shared = [w for w in caught if "share one GPU" in str(w.message)]
    assert bool(shared) == SHARED, [str(w.message) for w in caught]


def test_feature_probes():
    assert hvd.cuda_built()
    assert hvd.nccl_built() == 0 or hvd.nccl_built() >= 2000
    print(f"rank {hvd.rank()}: {DEV}, NCCL {hvd.nccl_built()}, "
          f"HOROVOD_GPU_OPERATIONS={os.environ.get('HOROVOD_GPU_OPERATIONS', 'nccl')}, "
          f"hierarchical={os.environ.get('HOROVOD_HIERARCHICAL_ALLREDUCE', '0')}")


# ---------------------------------------------------------------------------------- allreduce


@pytest.mark.parametrize("op_name", list(OPS))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_allreduce_every_dtype_and_op(dtype, op_name):
    if op_name == "Average" and dtype not in FLOATS:
        pytest.skip("integer Average truncates; covered on the CPU path")
    seed = DTYPES.index(dtype) * 10 + list(OPS).index(op_name)
    shape = (17, 3)
    pre, post = (0.5, 2.0) if dtype in FLOATS else (1.0, 1.0)
    x = gpu_data(seed, hvd.rank(), shape, dtype, op_name)
    out = hvd.allreduce(x, op=OPS[op_name], name=f"ar.{dtype}.{op_name}", prescale_factor=pre,
                        postscale_factor=post)
    assert out.device == DEV and out.dtype == dtype
    want = reference_allreduce(cpu_inputs(seed, shape, dtype, op_name), op_name, dtype, pre, post)
    assert_close(out.cpu(), want, dtype, f"{op_name} {dtype}")


@pytest.mark.parametrize("op", [hvd.Min, hvd.Max])
def test_bool_allreduce(op):
    x = gpu_data(3, hvd.rank(), (33,), torch.bool)
    out = hvd.allreduce(x, op=op, name=f"ar.bool.{op}")
    xs = torch.stack([rank_data(3, k, (33,), torch.int32) > 0 for k in range(hvd.size())])
    want = xs.all(0) if op == hvd.Min else xs.any(0)
    assert torch.equal(out.cpu(), want)


def test_grouped_and_in_place_allreduce_fuse_mixed_sizes():
    r = hvd.rank()
    shapes = [(5,), (4097,), (1,), (3, 7), (0,)]
    xs = [gpu_data(i, r, s, torch.float32) for i, s in enumerate(shapes)]
    outs = hvd.grouped_allreduce(xs, op=hvd.Average, name="gar")
    for i, (s, out) in enumerate(zip(shapes, outs)):
        want = reference_allreduce(cpu_inputs(i, s, torch.float32), "Average", torch.float32)
        assert out.device == DEV
        assert_close(out.cpu(), want, torch.float32, f"tensor {i}")
    ys = [gpu_data(10 + i, r, s, torch.int16) for i, s in enumerate(shapes)]  # no int16 in NCCL
    hvd.grouped_allreduce_(ys, op=hvd.Sum, name="gar.int16")
    for i, (s, y) in enumerate(zip(shapes, ys)):
        want = reference_allreduce(cpu_inputs(10 + i, s, torch.int16), "Sum", torch.int16)
        assert_close(y.cpu(), want, torch.int16)


def test_many_async_allreduces_complete_in_any_synchronize_order():
    handles = [hvd.allreduce_async(torch.full((i + 1,), float(i), device=DEV), op=hvd.Sum,
                                   name=f"many.{i}") for i in range(40)]
    for i in reversed(range(40)):
        out = hvd.synchronize(handles[i])
        assert torch.all(out.cpu() == i * hvd.size())


# ------------------------------------------------------------------------- stream ordering


def test_no_stale_data_when_the_producer_kernel_is_still_running():
    n = hvd.size()
    x = torch.zeros(1 << 20, device=DEV)
    torch.cuda._sleep(200_000_000)  # keeps the current stream busy for a while
    x.fill_(hvd.rank() + 1.0)  # queued behind the sleep: not yet run at enqueue time
    out = hvd.synchronize(hvd.allreduce_async(x, op=hvd.Sum, name="stale.out"))
    assert torch.all(out == n * (n + 1) / 2).item()  # compared on the current stream


def test_in_place_result_is_ordered_before_the_callers_next_kernel():
    n = hvd.size()
    x = torch.zeros(1 << 20, device=DEV)
    torch.cuda._sleep(200_000_000)
    x.add_(1.0)
    hvd.allreduce_(x, op=hvd.Sum, name="stale.inplace")
    x.mul_(2.0)  # must see the reduced values
    assert torch.all(x == 2.0 * n).item()


def test_side_stream_producer_and_consumer():
    n, side = hvd.size(), torch.cuda.Stream()
    with torch.cuda.stream(side):
        x = torch.empty(1 << 18, device=DEV)
        torch.cuda._sleep(100_000_000)
        x.fill_(1.0)
        gathered = hvd.allgather(x.view(-1, 1), name="side.gather")  # output allocated on side
        total = gathered.sum()
    torch.cuda.current_stream().wait_stream(side)
    assert total.item() == float(n * (1 << 18))


# ------------------------------------------------------------------------ other collectives


@pytest.mark.parametrize("dtype", DTYPES + [torch.bool], ids=str)
def test_allgather_uneven_first_dims(dtype):
    r, n = hvd.rank(), hvd.size()
    mine = gpu_data(5, r, (r + 1, 3), dtype)
    out = hvd.allgather(mine, name=f"ag.{dtype}")
    want = torch.cat([gpu_data(5, k, (k + 1, 3), dtype).cpu() for k in range(n)])
    assert out.device == DEV and torch.equal(out.cpu(), want)
    outs = hvd.grouped_allgather([mine, mine[:, :1].contiguous()], name=f"gag.{dtype}")
    assert torch.equal(outs[1].cpu(), want[:, :1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64, torch.int16],
                         ids=str)
def test_broadcast_from_the_last_rank(dtype):
    root = hvd.size() - 1
    x = gpu_data(6, hvd.rank(), (9, 2), dtype)
    out = hvd.broadcast(x, root, name=f"bc.{dtype}")
    assert out.device == DEV and torch.equal(out.cpu(), rank_data(6, root, (9, 2), dtype))
    assert torch.equal(x.cpu(), rank_data(6, hvd.rank(), (9, 2), dtype))  # out of place
    hvd.broadcast_(x, root, name=f"bc_.{dtype}")
    assert torch.equal(x.cpu(), rank_data(6, root, (9, 2), dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32, torch.int16],
                         ids=str)
def test_alltoall_with_splits(dtype):
    r, n = hvd.rank(), hvd.size()
    splits = [(r + k) % 3 + 1 for k in range(n)]
    x = gpu_data(7, r, (sum(splits), 2), dtype)
    out, received = hvd.alltoall(x, splits=splits, name=f"a2a.{dtype}")
    pieces = []
    for k in range(n):
        theirs = [(k + j) % 3 + 1 for j in range(n)]
        start = sum(theirs[:r])
        pieces.append(rank_data(7, k, (sum(theirs), 2), dtype)[start:start + theirs[r]])
    assert out.device == DEV and torch.equal(out.cpu(), torch.cat(pieces))
    assert received.tolist() == [(k + r) % 3 + 1 for k in range(n)]


@pytest.mark.parametrize("op_name", ["Average", "Sum"])
@pytest.mark.parametrize("rows", [7, 8])
def test_reducescatter_uneven_rows(op_name, rows):
    r, n = hvd.rank(), hvd.size()
    x = gpu_data(8, r, (rows, 3), torch.float32)
    out = hvd.reducescatter(x, op=OPS[op_name], name=f"rs.{op_name}.{rows}")
    full = reference_allreduce(cpu_inputs(8, (rows, 3), torch.float32), op_name, torch.float32)
    counts = [rows // n + (1 if k < rows % n else 0) for k in range(n)]
    lo = sum(counts[:r])
    assert out.device == DEV
    assert_close(out.cpu(), full[lo:lo + counts[r]], torch.float32)


# -------------------------------------------------------------------------------- errors


def test_grouped_op_on_two_devices_is_a_value_error():
    with pytest.raises(ValueError, match="one device"):
        hvd.grouped_allreduce_async([torch.ones(2, device=DEV), torch.ones(2)], name="mixed")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_a_second_gpu_in_one_process_is_a_value_error():
    other = torch.device("cuda", (DEV.index + 1) % torch.cuda.device_count())
    with pytest.raises(ValueError, match="one GPU per process"):
        hvd.allreduce_async(torch.ones(2, device=other), name="second.gpu")


@pytest.mark.skipif("hvd.size() < 2", reason="needs two ranks to disagree")
def test_cpu_on_one_rank_and_gpu_on_another_names_both():
    x = torch.ones(3) if hvd.rank() == 0 else torch.ones(3, device=DEV)
    with pytest.raises(hvd.HorovodInternalError, match=r"device mismatch.*rank 0 cpu.*rank 1 cuda"):
        hvd.synchronize(hvd.allreduce_async(x, name="placement"))
    out = hvd.allreduce(torch.ones(3, device=DEV), op=hvd.Sum, name="after.placement")
    assert torch.all(out == hvd.size()).item()


# ------------------------------------------------------------------------------- training


def test_distributed_optimizer_averages_cuda_gradients():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2).to(DEV)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    x = gpu_data(9, hvd.rank(), (8, 4), torch.float32)
    model(x).pow(2).sum().backward()
    opt.synchronize()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    for name, g in grads.items():
        gathered = hvd.allgather(g.unsqueeze(0), name=f"check.{name}")
        assert torch.allclose(gathered, gathered[0:1].expand_as(gathered)), name  # all agree
    with opt.skip_synchronize():
        opt.step()


def test_distributed_optimizer_enqueues_cuda_gradients_in_cpp():
    """Once the placement check has accepted this process's GPU, the C++ hooks take its
    gradients during backward (nothing left for Python's path); the result is every rank's
    average."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2).to(DEV)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)  # the GPU's first collective
    for step in range(2):
        opt.zero_grad()
        model(torch.ones(3, 4, device=DEV) * (hvd.rank() + 1)).sum().backward()
        if step == 1:  # by the second step the reducer knows the device
            assert set(opt._hvd_pending) == set(model.parameters())
            assert not opt._hvd_pending.own, "a CUDA gradient was left to Python's path"
        opt.synchronize()
        mean = 3 * (hvd.size() + 1) / 2
        assert torch.allclose(model.weight.grad.cpu(), torch.full((2, 4), mean))
        with opt.skip_synchronize():
            opt.step()
    assert opt._hvd_device == DEV.index


@pytest.mark.parametrize("opt_cls, kwargs", [(torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
                                             (torch.optim.Adam, {"lr": 0.01})],
                         ids=["sgd", "adam"])
def test_bucket_views_on_cuda_give_the_per_gradient_paths_parameters(opt_cls, kwargs):
    """Bucket views on CUDA (docs/bucket_views.md): every gradient lives in a bucket on this GPU,
    one device allocation per bucket, reduced in place; over steps of SGD and Adam the
    parameters are bit-identical to bucket_view=False, and with zero_grad(set_to_none=False)
    no gradient is copied."""
    runs = []
    for bucket_view in (True, False):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                                    torch.nn.Linear(16, 16), torch.nn.ReLU(),
                                    torch.nn.Linear(16, 4)).to(DEV)
        opt = hvd.DistributedOptimizer(opt_cls(model.parameters(), **kwargs),
                                       named_parameters=model.named_parameters(),
                                       bucket_view=bucket_view)
        opt._hvd_buckets.threshold = 512  # bytes: several buckets
        runs.append((model, opt))
    for step in range(5):
        x = gpu_data(40 + step, hvd.rank(), (6, 8), torch.float32)
        y = gpu_data(60 + step, hvd.rank(), (6, 4), torch.float32)
        for model, opt in runs:
            opt.zero_grad(set_to_none=step < 2)  # set_to_none=False from step 2 on
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    (on, opt_on), (off, opt_off) = runs
    for (name, p), q in zip(on.named_parameters(), off.parameters()):
        assert torch.equal(p, q), f"rank {hvd.rank()}: {opt_cls.__name__} {name} differs"
    report = opt_on.bucket_report()
    params = dict(on.named_parameters())
    assert report["state"] == "built" and report["outside"] == [], report
    assert sorted(m for b in report["buckets"] for m in b["members"]) == sorted(params), report
    assert len(report["buckets"]) > 1, report
    for b in report["buckets"]:
        assert b["device"] == str(DEV), report
        assert b["copies"] == 0 and b["fallback_steps"] == 0, report  # last step: no copies
        grads = [params[m].grad for m in b["members"]]
        # One device allocation per bucket: every member's gradient is a view into it.
        assert all(g.device == DEV for g in grads), b
        assert len({g.untyped_storage().data_ptr() for g in grads}) == 1, b
        assert grads[0].untyped_storage().nbytes() == b["bytes"], b
    assert opt_off.bucket_report()["state"] == "off"
    assert opt_on._hvd_device == DEV.index


class _LateGrad(torch.autograd.Function):
    """Identity whose backward keeps its stream busy first: the gradient lands late there."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        torch.cuda._sleep(200_000_000)
        return grad * 1.0  # queued behind the sleep


def test_a_bucket_waits_for_a_member_accumulated_on_a_side_stream():
    """Two parameters in one bucket, one of them used on a side stream whose backward is slow
    there: the bucket's allreduce (submitted from whichever hook comes last, on that hook's
    stream) must still see both gradients accumulated, every step."""
    n, side = hvd.size(), torch.cuda.Stream()
    a = torch.nn.Parameter(torch.zeros(1 << 16, device=DEV))
    b = torch.nn.Parameter(torch.zeros(1 << 16, device=DEV))
    opt = hvd.DistributedOptimizer(torch.optim.SGD([a, b], lr=0.0),
                                   named_parameters=[("a", a), ("b", b)])
    opt._hvd_buckets.threshold = 1 << 20  # one bucket for both
    mean = (n + 1) / 2
    for step in range(3):
        opt.zero_grad(set_to_none=False)
        side.wait_stream(torch.cuda.current_stream())  # after zero_grad's zero_() on ours
        with torch.cuda.stream(side):
            ya = (_LateGrad.apply(a) * (hvd.rank() + 1.0)).sum()
        torch.cuda.current_stream().wait_stream(side)
        yb = (b * (hvd.rank() + 1.0)).sum()
        (ya + yb).backward()
        opt.synchronize()
        assert torch.all(a.grad == mean).item(), f"step {step}: {a.grad[:4].tolist()}"
        assert torch.all(b.grad == mean).item(), f"step {step}: {b.grad[:4].tolist()}"
        with opt.skip_synchronize():
            opt.step()
    report = opt.bucket_report()
    assert report["state"] == "built", report
    assert [sorted(bk["members"]) for bk in report["buckets"]] == [["a", "b"]], report


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_a_gradient_on_a_second_gpu_raises_naming_both_devices_then_training_goes_on():
    other = torch.device("cuda", (DEV.index + 1) % torch.cuda.device_count())
    hvd.allreduce(torch.ones(1, device=DEV), name="claim.gpu")  # this process's GPU is DEV
    stray = torch.nn.Linear(2, 1).to(other)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(stray.parameters(), lr=0.1),
                                   named_parameters=stray.named_parameters())
    stray(torch.ones(1, 2, device=other)).sum().backward()
    with pytest.raises(ValueError, match=rf"one GPU per process.*cuda:{DEV.index}.*"
                                         rf"cuda:{other.index}"):
        opt.step()
    model = torch.nn.Linear(2, 1).to(DEV)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    model(torch.ones(1, 2, device=DEV)).sum().backward()
    opt.step()
    assert torch.allclose(model.bias.grad.cpu(), torch.ones(1))
