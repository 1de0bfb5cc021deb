"""Behaviours of Horovod that Horovod code relies on (issue 15): name reuse once a collective has
completed, exception types that both ``except ValueError`` and ``except RuntimeError`` catch,
``sparse_as_dense`` with ``SparseAdam``, and process-set barriers that wait only for their own
members. (broadcast_optimizer_state's gradients: test_state.py; an optimizer on a rank outside
its process set: test_optimizer_beyond_horovod.py.)"""

import time

import pytest
import torch

import horovodlite.torch as hvd

multi = pytest.mark.skipif(hvd.size() < 2, reason="needs at least 2 ranks")


def wait_done(handle, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not hvd.poll(handle):
        assert time.monotonic() < deadline, f"handle {handle} not done after {timeout}s"
        time.sleep(0.001)


# ------------------------------------------------------- 1. a completed name is free again


def test_name_is_free_once_its_collective_completed_without_synchronize():
    n = hvd.size()
    first = hvd.allreduce_async(torch.ones(3), name="parity.reuse", op=hvd.Sum)
    wait_done(first)
    second = hvd.allreduce_async(torch.full((3,), 2.0), name="parity.reuse", op=hvd.Sum)
    assert torch.equal(hvd.synchronize(second), torch.full((3,), 2.0 * n))
    # The first handle was never synchronized: its result is still there.
    assert torch.equal(hvd.synchronize(first), torch.full((3,), float(n)))
    with pytest.raises(ValueError, match="unknown or was already synchronized"):
        hvd.synchronize(first)


def test_fire_and_forget_handles_do_not_block_the_name():
    """Code that submits under one name every step and never synchronizes (e.g. a metric it
    does not read) keeps working: each step's collective has completed by the time the next
    step's barrier does."""
    n = hvd.size()
    handles = []
    for step in range(4):
        handles.append(hvd.allreduce_async(torch.full((2,), float(step)), name="parity.metric",
                                           op=hvd.Sum))
        hvd.barrier()
        wait_done(handles[-1])
    for step, h in enumerate(handles):
        assert torch.equal(hvd.synchronize(h), torch.full((2,), float(step * n)))


def test_grouped_and_inplace_names_are_freed_too():
    n = hvd.size()
    tensors = [torch.ones(2), torch.ones(5)]
    h = hvd.grouped_allreduce_async_(tensors, name="parity.group", op=hvd.Sum)
    wait_done(h)
    again = hvd.grouped_allreduce([torch.ones(2), torch.ones(5)], name="parity.group",
                                  op=hvd.Sum)
    assert all(torch.equal(t, torch.full_like(t, n)) for t in again)
    assert all(torch.equal(t, torch.full_like(t, n)) for t in hvd.synchronize(h))


# A name really still in flight is refused: test_errors.py.


# ------------------------------------------------------------- 3. exception types


def _bad_calls():
    """(description, call) for argument errors of every public call, made the same way on
    every rank so that none of them leaves a peer waiting."""
    param = torch.nn.Parameter(torch.ones(2))
    sgd = torch.optim.SGD([param], lr=0.1)
    return {
        "reducescatter Adasum": lambda: hvd.reducescatter(torch.ones(4), op=hvd.Adasum),
        "reducescatter Min": lambda: hvd.reducescatter(torch.ones(4), op=hvd.Min),
        "allreduce unknown op": lambda: hvd.allreduce(torch.ones(2), op=17),
        "allreduce average and op": lambda: hvd.allreduce(torch.ones(2), average=True,
                                                          op=hvd.Sum),
        "allreduce_ non-contiguous": lambda: hvd.allreduce_(torch.ones(3, 2).t()),
        "allreduce complex": lambda: hvd.allreduce(torch.ones(2, dtype=torch.complex64)),
        "Adasum on integers": lambda: hvd.allreduce(torch.ones(2, dtype=torch.int32),
                                                    op=hvd.Adasum),
        "broadcast root out of range": lambda: hvd.broadcast(torch.ones(2), root_rank=99),
        "broadcast_object root": lambda: hvd.broadcast_object(1, root_rank=99),
        "alltoall int64 splits": lambda: hvd.alltoall(
            torch.ones(hvd.size()), splits=torch.ones(hvd.size(), dtype=torch.int64)),
        "grouped_allreduce empty": lambda: hvd.grouped_allreduce([]),
        "synchronize unknown handle": lambda: hvd.synchronize(987654),
        "unregistered process set": lambda: hvd.allreduce(
            torch.ones(2), process_set=hvd.ProcessSet([0])),
        "process_set not a ProcessSet": lambda: hvd.allreduce(torch.ones(2), process_set=[0]),
        "sparse allreduce Min": lambda: hvd.sparse_allreduce_async(
            torch.ones(2).to_sparse(), name="parity.sparse", op=hvd.Min),
        "DistributedOptimizer twice": lambda: hvd.DistributedOptimizer(
            hvd.DistributedOptimizer(sgd)),
        "backward_passes_per_step=0": lambda: hvd.DistributedOptimizer(
            torch.optim.SGD([param], lr=0.1), backward_passes_per_step=0),
        "broadcast_parameters of an int": lambda: hvd.broadcast_parameters(5, root_rank=0),
        "elastic.run reset_limit": lambda: hvd.elastic.run(lambda state: None,
                                                           reset_limit=-1),
    }


@pytest.mark.parametrize("what", list(_bad_calls()))
def test_argument_errors_are_both_value_and_runtime_errors(what):
    call = _bad_calls()[what]
    with pytest.raises(RuntimeError) as caught:  # what Horovod code written for its C++ catches
        call()
    assert isinstance(caught.value, ValueError)  # what code for its Python checks catches
    assert isinstance(caught.value, hvd.HorovodArgumentError)
    assert not isinstance(caught.value, hvd.HorovodInternalError)
    # The runtime keeps working on every rank afterwards.
    assert torch.equal(hvd.allreduce(torch.ones(1), name=f"parity.after.{what}", op=hvd.Sum),
                       torch.full((1,), float(hvd.size())))


def test_not_initialized_is_both_too():
    hvd.shutdown()
    try:
        with pytest.raises(RuntimeError, match="hvd.init"):
            hvd.allreduce(torch.ones(1))
        with pytest.raises(ValueError, match="hvd.init"):
            hvd.rank()
    finally:
        hvd.init()


def test_mismatch_is_an_internal_error_on_every_rank():
    """A disagreement between ranks is found by negotiation, after submission: that stays a
    HorovodInternalError (a RuntimeError, as on Horovod), not an argument error."""
    if hvd.size() < 2:
        pytest.skip("needs at least 2 ranks")
    with pytest.raises(hvd.HorovodInternalError) as caught:
        hvd.allreduce(torch.ones(2 + hvd.rank()), name="parity.mismatch")
    assert isinstance(caught.value, RuntimeError)
    assert not isinstance(caught.value, ValueError)


# --------------------------------------------- 5. sparse_as_dense with SparseAdam


def _embedding_loss(emb, rank):
    idx = torch.tensor([rank % 7, (rank + 2) % 7, 4])
    weights = torch.arange(1.0, 4.0, dtype=torch.float64) * (rank + 1)
    return (emb(idx).sum(1) * weights).sum()


def _embedding(seed=5):
    torch.manual_seed(seed)
    return torch.nn.Embedding(7, 3, sparse=True).double()


def test_sparse_as_dense_with_sparse_adam_steps():
    n = hvd.size()
    # Reference: one process, the average of every rank's gradient, handed to SparseAdam.
    ref = _embedding()
    ref_opt = torch.optim.SparseAdam(ref.parameters(), lr=0.05)
    emb = _embedding()
    opt = hvd.DistributedOptimizer(torch.optim.SparseAdam(emb.parameters(), lr=0.05),
                                   named_parameters=emb.named_parameters(),
                                   sparse_as_dense=True)
    for _ in range(3):
        grad = torch.zeros(7, 3, dtype=torch.float64)
        for r in range(n):
            probe = _embedding()
            probe.load_state_dict(ref.state_dict())
            _embedding_loss(probe, r).backward()
            grad += probe.weight.grad.to_dense() / n
        ref_opt.zero_grad()
        ref.weight.grad = grad.to_sparse(1)
        ref_opt.step()

        opt.zero_grad()
        _embedding_loss(emb, hvd.rank()).backward()
        opt.step()  # SparseAdam raised on the dense gradient before
        assert emb.weight.grad.is_sparse
        torch.testing.assert_close(emb.weight.grad.to_dense(), grad)
    torch.testing.assert_close(emb.weight.detach(), ref.weight.detach())


def test_sparse_as_dense_keeps_dense_gradients_for_other_optimizers():
    emb = _embedding()
    opt = hvd.DistributedOptimizer(torch.optim.Adam(emb.parameters(), lr=0.05),
                                   sparse_as_dense=True)
    _embedding_loss(emb, hvd.rank()).backward()
    opt.step()  # Adam takes dense gradients only
    assert not emb.weight.grad.is_sparse


# ------------------------------------------------------------- 6. process-set barriers


@multi
@pytest.mark.parametrize("which", ["first", "second", "last"])
def test_process_set_barriers_are_independent(which):
    """Two sets created just before with add_process_set, after collectives they shared: the
    sleeper's set waits for it at its barrier, the other set's barrier completes at once."""
    n, r = hvd.size(), hvd.rank()
    sleeper = {"first": 0, "second": 1, "last": n - 1}[which]
    if which == "last" and n - 1 <= 1:
        pytest.skip(f"rank {n - 1} is already covered at size {n}")
    hvd.shutdown()
    hvd.init(process_sets="dynamic")
    try:
        assert torch.equal(hvd.allreduce(torch.ones(2), name="parity.shared", op=hvd.Sum),
                           torch.full((2,), float(n)))
        hvd.barrier()
        evens = hvd.add_process_set(list(range(0, n, 2)))
        odds = hvd.add_process_set(list(range(1, n, 2)))
        mine = evens if r % 2 == 0 else odds
        if r == sleeper:
            time.sleep(5)
        start = time.monotonic()
        hvd.barrier(process_set=mine)
        waited = time.monotonic() - start
        if r % 2 != sleeper % 2:
            assert waited < 3.0, f"rank {r}: the other set's barrier held it {waited:.1f}s"
        elif r != sleeper:
            assert waited > 4.0, f"rank {r}: passed its set's barrier before the sleeper"
        # Both sets keep working, and so does the whole job.
        total = hvd.allreduce(torch.ones(1), name="parity.set", op=hvd.Sum, process_set=mine)
        assert total.item() == len(mine.ranks)
        hvd.barrier()
        assert hvd.remove_process_set(evens) and hvd.remove_process_set(odds)
    finally:
        hvd.shutdown()
        hvd.init()
