"""hvd.SyncBatchNorm equals torch.nn.BatchNorm on the concatenated global batch: outputs, running
statistics, input gradients (this rank's rows of the global input gradient) and weight/bias
gradients (summed over ranks), with uneven and empty per-rank batches; eval mode; errors.

Rank r holds its own rows; every rank rebuilds every rank's rows from (seed, rank) and runs the
reference BatchNorm on their concatenation locally. The loss is the sum over ranks of
``(y_r * w_r).sum()`` with a fixed random ``w_r`` per rank, so the reference gradient is that of
one loss over the global batch.
"""

import pytest
import torch

import horovodlite.torch as hvd

C = 3
REFERENCE = {2: torch.nn.BatchNorm1d, 3: torch.nn.BatchNorm1d, 4: torch.nn.BatchNorm2d,
             5: torch.nn.BatchNorm3d}


def rows_of(rank, sizes):
    return sizes[rank % len(sizes)]


def rank_input(rank, rows, dims, dtype, step=0):
    g = torch.Generator().manual_seed(1000 * step + rank)
    spatial = {2: (), 3: (5,), 4: (2, 3), 5: (2, 2, 2)}[dims]
    x = torch.randn(rows, C, *spatial, generator=g, dtype=torch.float64) * (rank + 1) + rank
    w = torch.randn(rows, C, *spatial, generator=g, dtype=torch.float64)
    return x.to(dtype), w.to(dtype)


def make_pair(dims, affine, track, momentum, dtype):
    sbn = hvd.SyncBatchNorm(C, eps=1e-3, momentum=momentum, affine=affine,
                            track_running_stats=track).to(dtype)
    bn = REFERENCE[dims](C, eps=1e-3, momentum=momentum, affine=affine,
                         track_running_stats=track).to(dtype)
    if affine:
        with torch.no_grad():
            g = torch.Generator().manual_seed(7)
            weight = torch.rand(C, generator=g, dtype=torch.float64) + 0.5
            bias = torch.randn(C, generator=g, dtype=torch.float64)
            for m in (sbn, bn):
                m.weight.copy_(weight)
                m.bias.copy_(bias)
    return sbn, bn


def check_step(sbn, bn, dims, sizes, dtype, tol, step):
    n, r = hvd.size(), hvd.rank()
    inputs = [rank_input(k, rows_of(k, sizes), dims, dtype, step) for k in range(n)]
    x = inputs[r][0].clone().requires_grad_(True)
    y = sbn(x)
    (y * inputs[r][1]).sum().backward()
    big_x = torch.cat([xi for xi, _ in inputs]).requires_grad_(True)
    big_y = bn(big_x)
    (big_y * torch.cat([wi for _, wi in inputs])).sum().backward()
    lo = sum(rows_of(k, sizes) for k in range(r))
    hi = lo + rows_of(r, sizes)
    close = dict(rtol=tol, atol=tol)
    torch.testing.assert_close(y, big_y[lo:hi].detach(), **close, msg=f"rank {r} output")
    torch.testing.assert_close(x.grad, big_x.grad[lo:hi], **close, msg=f"rank {r} input grad")
    if sbn.affine:
        for name in ("weight", "bias"):
            local = getattr(sbn, name).grad
            total = hvd.allreduce(local, op=hvd.Sum, name=f"sbn.{name}.grad.{step}")
            torch.testing.assert_close(total, getattr(bn, name).grad, **close,
                                       msg=f"rank {r} {name} grad")
            getattr(sbn, name).grad = None
            getattr(bn, name).grad = None
    if sbn.track_running_stats:
        torch.testing.assert_close(sbn.running_mean, bn.running_mean, **close)
        torch.testing.assert_close(sbn.running_var, bn.running_var, **close)
        assert int(sbn.num_batches_tracked) == int(bn.num_batches_tracked)


@pytest.mark.parametrize("momentum", [0.1, None])
@pytest.mark.parametrize("affine,track", [(True, True), (False, True), (True, False)])
@pytest.mark.parametrize("dims", [2, 3, 4, 5])
def test_matches_batch_norm_on_the_global_batch(dims, affine, track, momentum):
    sbn, bn = make_pair(dims, affine, track, momentum, torch.float64)
    sizes = [4, 2, 3]  # uneven per-rank batches
    for step in range(2):  # running stats accumulate over steps
        check_step(sbn, bn, dims, sizes, torch.float64, 1e-10, step)
    sbn.eval()
    bn.eval()
    x, _ = rank_input(hvd.rank(), 3, dims, torch.float64, step=9)
    torch.testing.assert_close(sbn(x), bn(x), rtol=1e-10, atol=1e-10, msg="eval output")


def test_float32_and_an_empty_rank():
    sbn, bn = make_pair(4, True, True, 0.1, torch.float32)
    sizes = [3, 0, 5]  # rank 1 (if any) holds no rows at all
    check_step(sbn, bn, 4, sizes, torch.float32, 1e-4, 0)


def test_trains_inside_a_model_with_the_distributed_optimizer():
    """Conv -> SyncBatchNorm -> mean: one optimizer step equals the full-batch reference."""
    n, r = hvd.size(), hvd.rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(2, C, 3, padding=1), hvd.SyncBatchNorm(C),
                                torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(C * 16, 1))
    model = model.double()
    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Conv2d(2, C, 3, padding=1), torch.nn.BatchNorm2d(C),
                                    torch.nn.ReLU(), torch.nn.Flatten(),
                                    torch.nn.Linear(C * 16, 1)).double()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(12, 2, 4, 4, generator=g, dtype=torch.float64)
    y = torch.randn(12, 1, generator=g, dtype=torch.float64)
    per = 12 // n
    # The averaged gradient of per-rank mean losses equals the full-batch mean loss gradient.
    torch.nn.functional.mse_loss(model(x[r * per:(r + 1) * per]), y[r * per:(r + 1) * per]) \
        .backward()
    torch.nn.functional.mse_loss(reference(x), y).backward()
    opt.step()
    ref_opt.step()
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(model[1].running_var, reference[1].running_var)


def test_errors():
    sbn = hvd.SyncBatchNorm(C)
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        sbn(torch.randn(C))
    with pytest.raises(ValueError, match="4 channels.*num_features=3"):
        sbn(torch.randn(2, 4))
    rows = 1 if hvd.rank() == 0 else 0  # one value per channel in the whole global batch
    with pytest.raises(ValueError, match="more than 1 value per channel across all ranks"):
        sbn(torch.randn(rows, C))


def test_convert_sync_batchnorm_keeps_parameters_and_stats():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(1, C, 1), torch.nn.BatchNorm2d(C))
    bn = model[1]
    bn.running_mean.fill_(0.25)
    converted = hvd.SyncBatchNorm.convert_sync_batchnorm(model)
    assert isinstance(converted[1], hvd.SyncBatchNorm) and converted[1] is not bn
    assert converted[1].weight is bn.weight and converted[1].bias is bn.bias
    assert torch.equal(converted[1].running_mean, torch.full((C,), 0.25))
