"""hvd.elastic on every rank: TorchState sync/commit/restore, ElasticSampler sharding and
resumption, and hvd.elastic.run recovering from failures (raised on every rank, on one rank
only, a real collective mismatch, HostsUpdatedInterrupt) to the same result as a run without
failure. (Its own file: run shuts horovodlite down and initialises it again.)"""

import pytest
import torch

import horovodlite.torch as hvd

multi_rank = pytest.mark.skipif("hvd.size() < 2", reason="needs at least 2 ranks to disagree")


def small_training(seed, steps):
    """A model with buffers, SGD with momentum and an LR scheduler, trained ``steps`` steps."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(5, 4)).pow(2).mean().backward()
        opt.step()
        sched.step()
    return model, opt, sched


def fingerprint(state):
    """Everything a TorchState holds, as plain Python values (comparable across ranks)."""
    opt = state.optimizer.state_dict()
    return {
        "model": {k: v.tolist() for k, v in state.model.state_dict().items()},
        "momentum": {i: s["momentum_buffer"].tolist() for i, s in opt["state"].items()},
        "lr": [g["lr"] for g in opt["param_groups"]],
        "scheduler": state.scheduler.state_dict()["last_epoch"],
        "sampler": state.sampler.state_dict(),
        "epoch": state.epoch,
        "tag": state.tag,
    }


def make_state(r):
    model, opt, sched = small_training(seed=r, steps=r + 1)
    sampler = hvd.elastic.ElasticSampler(list(range(40)), seed=1)
    sampler.record_indices([r, 10 + r])
    return hvd.elastic.TorchState(model, opt, sampler=sampler, scheduler=sched, epoch=r,
                                  tag=f"rank{r}")


# ------------------------------------------------------------------------------ TorchState


def test_sync_makes_every_rank_equal_to_rank0(monkeypatch):
    monkeypatch.setenv("HOROVOD_ELASTIC_ROLLBACK", "commit")  # the snapshot it checks last
    r, n = hvd.rank(), hvd.size()
    state = make_state(r)  # every rank starts different
    root = make_state(0)
    state.sync()
    everyone = hvd.allgather_object(fingerprint(state), name="elastic.test.sync")
    for k in range(n):
        assert everyone[k] == everyone[0], f"rank {k} differs from rank 0 after sync"
    mine = fingerprint(state)
    expected = fingerprint(root)
    # Rank 0's values, but the processed samples of every rank.
    expected["sampler"]["processed_indices"] = sorted({i for k in range(n) for i in (k, 10 + k)})
    assert mine == expected
    # sync made the synchronised state every rank's snapshot.
    state.epoch, state.tag = 99, "changed"
    with torch.no_grad():
        state.model[0].weight.add_(1.0)
    state.restore()
    assert fingerprint(state) == mine


def test_commit_and_restore_round_trip(monkeypatch):
    monkeypatch.setenv("HOROVOD_ELASTIC_ROLLBACK", "commit")  # the snapshots are its
    r = hvd.rank()
    state = make_state(r)
    state.sync()
    state.commit()
    committed = fingerprint(state)
    # Move everything: train, step the scheduler, process samples, change the attributes.
    state.optimizer.zero_grad()
    state.model(torch.ones(3, 4)).sum().backward()
    state.optimizer.step()
    state.scheduler.step()
    state.sampler.record_batch(0, 4)
    state.epoch += 1
    moved = fingerprint(state)
    assert moved != committed
    state.restore()
    assert fingerprint(state) == committed
    # A later commit replaces the snapshot.
    state.epoch = 5
    state.commit()
    state.epoch = 6
    state.restore()
    assert state.epoch == 5


def sharded_adam_state():
    """A Linear, its Adam with shard="optimizer_state", and a synced TorchState of both."""
    model = torch.nn.Linear(4, 3)
    opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters(),
                                   shard="optimizer_state")
    state = hvd.elastic.TorchState(model, opt, epoch=0)
    state.sync()
    return model, opt, state


def test_growth_between_commits_keeps_a_sharded_optimizer_with_its_model(monkeypatch):
    """state.check_host_updates() between commits (the job is about to grow): training goes on
    from the live weights, so a sharded optimizer, which lays its state out again from its
    snapshot after the change, must be snapshotted now, not left at the last commit (its state
    would be a step older than the model's weights)."""
    from horovodlite.torch.elastic import discovery

    torch.manual_seed(0)
    model, opt, state = sharded_adam_state()

    def train():
        opt.zero_grad()
        model(torch.full((2, 4), float(hvd.rank() + 1))).sum().backward()
        opt.step()

    train()
    state.commit()
    train()  # past the commit
    state.epoch = 1
    live = opt.state_dict()
    monkeypatch.setattr(discovery, "active", lambda: True)
    monkeypatch.setattr(discovery, "updates_agreed", lambda: (1, []))
    with pytest.raises(hvd.HostsUpdatedInterrupt):
        state.check_host_updates()
    saved = state._handlers["optimizer"]._saved
    assert saved["state"][0]["step"] == live["state"][0]["step"] == 2, hvd.rank()
    assert torch.equal(saved["state"][0]["exp_avg"], live["state"][0]["exp_avg"]), hvd.rank()
    # A failure before the change completes (the sync after the interrupt loses a rank) restores
    # that snapshot: the model and the plain attributes must come back from the same point as
    # the optimizer (they came back from the commit before, a step behind its state)
    weights = model.weight.detach().clone()
    state.epoch = 5
    with torch.no_grad():
        model.weight.add_(1.0)
    state.restore()
    assert torch.equal(model.weight, weights), hvd.rank()
    assert state.epoch == 1 and opt.state_dict()["state"][0]["step"] == 2, hvd.rank()


def test_a_reset_before_the_first_commit_lays_a_sharded_optimizer_out_again(monkeypatch):
    """The first state.sync() failing (a rank lost) leaves no snapshot of a sharded optimizer:
    with no state to lose it is laid out afresh over the ranks now, not kept cut for the old
    number of ranks; holding state it cannot rebuild, it raises naming what to do."""
    from horovodlite.torch.elastic.handlers import OptimizerHandler

    model = torch.nn.Linear(4, 3)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters(),
                                   shard="gradients")
    handler = OptimizerHandler("optimizer", opt)
    opt._shard_size += 1  # as laid out before the job lost a rank
    handler.on_reset()
    assert opt._shard_size == hvd.size() and opt._shard_buckets[0].layout.size == hvd.size()
    opt.zero_grad()
    model(torch.ones(2, 4)).sum().backward()
    opt.step()  # now it holds state (momentum)
    opt._shard_size += 1
    with pytest.raises(hvd.HorovodInternalError, match="before the first commit"):
        handler.on_reset()


def _barriers_failing(monkeypatch, plan):
    """state.py's barrier, which after the real barrier (so the ranks stay in step) raises
    HorovodInternalError where ``plan`` says: {call number: ranks}. A call number mapped to
    "skip" ranks raises there without the real barrier (a rank whose peers never came)."""
    from horovodlite.torch.elastic import state as state_module

    real, calls = state_module.barrier, [0]

    def barrier():
        calls[0] += 1
        ranks, skip = plan.get(calls[0], ((), ()))
        if hvd.rank() in skip:
            raise hvd.HorovodInternalError(f"simulated: peers lost before barrier {calls[0]}")
        real()
        if hvd.rank() in ranks:
            raise hvd.HorovodInternalError(f"simulated: aborted after barrier {calls[0]}")

    monkeypatch.setattr(state_module, "barrier", barrier)


@pytest.mark.skipif(hvd.size() < 2, reason="needs survivors that see a commit differently")
@pytest.mark.parametrize("completed_on_rank0", [True, False])
def test_survivors_that_see_a_commit_differently_restore_the_same_one(monkeypatch,
                                                                     completed_on_rank0):
    """A failure aborts the survivors at different points of a commit. Where its second barrier
    completed on rank 0 only, every rank keeps the new commit; where only rank 0 got past the
    first one (so nobody can complete the second), every rank goes back to the one before.
    Either way every rank restores the same commit (with one barrier, rank 0 kept the new one
    and the others the old: the sync then mixed them, and a batch was skipped or trained twice
    - wrong weights after a lost host). Rollback "commit": under "step" a commit takes no
    snapshot and has no barrier."""
    monkeypatch.setenv("HOROVOD_ELASTIC_ROLLBACK", "commit")
    model = torch.nn.Linear(2, 2)
    state = hvd.elastic.TorchState(model, None, batch=0)
    state.sync()
    state.batch = 1
    state.commit()  # commit 1: batch 1, on every rank
    state.batch = 2
    with torch.no_grad():
        model.weight.add_(1.0)
    others = tuple(range(1, hvd.size()))
    if completed_on_rank0:  # the second barrier of the next commit fails on the others
        _barriers_failing(monkeypatch, {2: (others, ())})
    else:  # the first one fails on the others; rank 0 waits in the second for nobody
        _barriers_failing(monkeypatch, {1: (others, ()), 2: ((), (0,))})
    try:
        state.commit()
        assert completed_on_rank0 and hvd.rank() == 0
    except hvd.HorovodInternalError:
        state.restore()
    monkeypatch.undo()
    monkeypatch.setenv("HOROVOD_ELASTIC_ROLLBACK", "commit")
    state.agree_on_commit()
    want_batch, want_commits = (2, 2) if completed_on_rank0 else (1, 1)
    assert (state.batch, state.commits) == (want_batch, want_commits), hvd.rank()
    seen = hvd.allgather_object((state.batch, state.commits, model.weight.sum().item()),
                                name="elastic.test.agree")
    assert all(v == seen[0] for v in seen), f"rank {hvd.rank()}: the ranks differ: {seen}"


def test_sync_gives_every_rank_rank0s_commit_count():
    """A worker that joins a running job starts at 0 commits; agree_on_commit compares counts,
    so the sync makes them rank 0's."""
    state = hvd.elastic.ObjectState(epoch=0)
    state.commits = 7 if hvd.rank() == 0 else 0
    state.sync()
    assert state.commits == 7, hvd.rank()


def test_a_commit_after_a_consolidated_rank0_save_is_collective_on_every_rank():
    """consolidate_state_dict(to=0) makes state_dict() local on rank 0 and refused elsewhere
    until the next step; the elastic state's snapshot (and broadcast_optimizer_state) gather
    the state collectively regardless (they raised on every rank but 0)."""
    model, opt, state = sharded_adam_state()
    opt.zero_grad()
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    opt.consolidate_state_dict(to=0)
    state.commit()
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert state._handlers["optimizer"]._saved["state"][0]["step"] == 1, hvd.rank()


def test_a_reset_forgets_what_the_sharded_optimizer_learnt_of_the_last_step():
    """shard="gradients" learns from the step before whether buckets were retired during
    backward; a rank that joins at a reset has not seen that step, so every rank forgets it
    (the survivors would gather the ranges, the newcomer not: a hang)."""
    model = torch.nn.Linear(4, 3)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   shard="gradients")
    opt.zero_grad()
    model(torch.ones(2, 4)).sum().backward()
    opt.step()  # without synchronize(): the next step may retire buckets during backward
    assert opt._overlap_early
    opt._hvd_abandon_step()
    assert not opt._overlap_early


# --------------------------------------------------------------------------- ElasticSampler


def test_every_index_exactly_once_per_epoch():
    n = hvd.size()
    dataset = list(range(10 * n))
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=7)
    orders = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        mine = list(sampler)
        assert len(mine) == len(sampler) == 10
        everyone = hvd.allgather_object(mine, name=f"elastic.test.once.{epoch}")
        flat = [i for share in everyone for i in share]
        assert sorted(flat) == dataset, f"epoch {epoch}: not a partition"
        orders.append(mine)
    assert orders[0] != orders[1], "set_epoch must change the order"


def test_padding_repeats_only_what_is_needed():
    n = hvd.size()
    dataset = list(range(10 * n + 1))  # not divisible when n > 1
    sampler = hvd.elastic.ElasticSampler(dataset, seed=2)
    everyone = hvd.allgather_object(list(sampler), name="elastic.test.padding")
    assert len({len(share) for share in everyone}) == 1  # same number of steps everywhere
    flat = [i for share in everyone for i in share]
    assert set(flat) == set(dataset)
    assert len(flat) - len(dataset) == (n - len(dataset) % n) % n


def test_permutation_is_deterministic_for_a_seed():
    dataset = list(range(30))
    a = hvd.elastic.ElasticSampler(dataset, seed=11)
    b = hvd.elastic.ElasticSampler(dataset, seed=11)
    c = hvd.elastic.ElasticSampler(dataset, seed=12)
    plain = hvd.elastic.ElasticSampler(dataset, shuffle=False)
    assert list(a) == list(b) and list(a) != list(c)
    assert list(plain) == dataset[hvd.rank()::hvd.size()]


def test_record_batch_state_dict_and_reset_resume_with_unprocessed_only():
    n = hvd.size()
    dataset = list(range(12 * n))
    sampler = hvd.elastic.ElasticSampler(dataset, seed=3)
    first = list(sampler)
    for batch_idx in range(2):  # the ranks process two batches of 3 each, together
        sampler.record_batch(batch_idx, 3)
    # every rank's two batches count as processed: each rank's step applied all of them
    everyones = hvd.allgather_object(first[:6], name="elastic.test.first")
    assert sampler.get_processed_indices() == set().union(*everyones)
    assert len(sampler.get_processed_indices()) == 6 * n
    # load_state_dict alone resumes this rank's own bookkeeping.
    resumed = hvd.elastic.ElasticSampler(dataset, seed=3)
    resumed.load_state_dict(sampler.state_dict())
    assert not set(resumed) & sampler.get_processed_indices()
    # Through TorchState.sync every rank learns what every rank processed and re-partitions.
    state = hvd.elastic.TorchState(sampler=resumed)
    state.sync()
    processed = set().union(*hvd.allgather_object(sampler.get_processed_indices(),
                                                  name="elastic.test.processed"))
    assert resumed.get_processed_indices() == processed and len(processed) == 6 * n
    everyone = hvd.allgather_object(list(resumed), name="elastic.test.resumed")
    flat = [i for share in everyone for i in share]
    assert sorted(flat) == sorted(set(dataset) - processed)
    assert len(resumed) == 6
    # A new epoch forgets the processed samples.
    resumed.set_epoch(1)
    assert resumed.get_processed_indices() == set() and len(resumed) == 12


# ------------------------------------------------------------------------------ elastic.run

STEPS, COMMIT_EVERY, FAIL_AT = 10, 3, 7


def inject(scenario, failures):
    """Called between backward and step (gradient allreduces in flight) at FAIL_AT, at most once
    and only before the first reset."""
    if scenario is None or failures["left"] == 0:
        return
    failures["left"] -= 1
    r, n = hvd.rank(), hvd.size()
    if scenario == "every_rank":
        raise hvd.HorovodInternalError(f"simulated failure on rank {r}")
    if scenario == "last_rank_only":  # the others learn of it in their next collective
        if r == n - 1:
            raise hvd.HorovodInternalError(f"simulated failure on rank {r}")
    elif scenario == "mismatch":  # a real failed collective, on every rank
        hvd.allreduce(torch.zeros(2 if r == 0 else 3), name="elastic.test.mismatch")
    elif scenario == "hosts_updated":
        raise hvd.HostsUpdatedInterrupt(False)


def train_with(scenario):
    """Trains STEPS steps under hvd.elastic.run, committing every COMMIT_EVERY steps; returns
    the state and how many resets happened."""
    torch.manual_seed(100 + hvd.rank())  # every rank starts different: the first sync fixes it
    model = torch.nn.Linear(4, 2)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                   named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, opt, batch=0, losses=[])
    resets = []
    failures = {"left": 1}
    # A rank knocked out by a faster peer's failure before reaching its own injection must not
    # inject after the reset: that would be a second, different failure.
    state.register_reset_callbacks([lambda: resets.append(hvd.size()),
                                    lambda: failures.update(left=0)])

    @hvd.elastic.run(reset_limit=2)
    def train(state):
        while state.batch < STEPS:
            g = torch.Generator().manual_seed(1000 * state.batch + hvd.rank())
            state.optimizer.zero_grad()
            loss = state.model(torch.randn(8, 4, generator=g)).pow(2).mean()
            loss.backward()
            if state.batch == FAIL_AT:
                inject(scenario, failures)
            state.optimizer.step()
            state.losses.append(hvd.allreduce(loss.detach(), name="elastic.test.loss").item())
            state.batch += 1
            if state.batch % COMMIT_EVERY == 0:
                state.commit()
        return state.batch

    assert train(state) == STEPS
    return state, resets


@pytest.mark.parametrize("scenario", [
    "every_rank", "last_rank_only",
    pytest.param("mismatch", marks=multi_rank),
    "hosts_updated",
])
def test_run_recovers_to_the_result_without_failure(scenario):
    reference, no_resets = train_with(None)
    state, resets = train_with(scenario)
    assert no_resets == [] and resets == [hvd.size()]
    assert len(state.losses) == STEPS
    assert torch.allclose(torch.tensor(state.losses), torch.tensor(reference.losses), atol=1e-6)
    for p, q in zip(state.model.parameters(), reference.model.parameters()):
        assert torch.allclose(p, q, atol=1e-6), scenario
    for s, t in zip(state.optimizer.state_dict()["state"].values(),
                    reference.optimizer.state_dict()["state"].values()):
        assert torch.allclose(s["momentum_buffer"], t["momentum_buffer"], atol=1e-6)
    everyone = hvd.allgather_object(state.model.weight.tolist(), name="elastic.test.final")
    assert all(w == everyone[0] for w in everyone)


class Visits(torch.nn.Module):
    """counts[epoch, i]: how many times sample i was trained on in that epoch (all ranks)."""

    def __init__(self, epochs, n):
        super().__init__()
        self.register_buffer("counts", torch.zeros(epochs, n))


def test_sampler_resumes_after_a_failure_without_repeating_samples():
    r, n, batch, epochs = hvd.rank(), hvd.size(), 2, 2
    dataset = list(range(12 * n))
    sampler = hvd.elastic.ElasticSampler(dataset, seed=5)
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch, sampler=sampler)
    state = hvd.elastic.TorchState(Visits(epochs, len(dataset)), sampler=sampler, epoch=0)
    failures = {"left": 1}

    @hvd.elastic.run
    def train(state):
        while state.epoch < epochs:
            for batch_idx, idx in enumerate(loader):
                local = torch.zeros(len(dataset))
                local[idx] += 1
                seen = hvd.allreduce(local, op=hvd.Sum, name="elastic.test.visits")
                state.model.counts[state.epoch] += seen
                state.sampler.record_batch(batch_idx, batch)
                if batch_idx % 2 == 1:
                    state.commit()
                if state.epoch == 1 and batch_idx == 2 and failures["left"] and r == n - 1:
                    failures["left"] -= 1
                    raise hvd.HorovodInternalError("simulated failure mid-epoch")
            state.epoch += 1
            state.sampler.set_epoch(state.epoch)
            state.commit()

    train(state)
    assert failures["left"] == (1 if r != n - 1 else 0)
    assert torch.equal(state.model.counts, torch.ones(epochs, len(dataset)))


def test_run_gives_up_after_the_reset_limit_with_the_last_error(monkeypatch):
    monkeypatch.setenv("HOROVOD_ELASTIC_ROLLBACK", "commit")  # rollback "step": see below
    state = hvd.elastic.TorchState(torch.nn.Linear(2, 2), attempts=0)
    resets, raised = [], []
    state.register_reset_callbacks([lambda: resets.append(1)])

    @hvd.elastic.run(reset_limit=1)
    def train(state):
        state.attempts += 1
        raised.append(hvd.HorovodInternalError(f"failure {len(raised)}"))
        raise raised[-1]

    with pytest.raises(hvd.HorovodInternalError) as info:
        train(state)
    assert info.value is raised[-1] and len(raised) == 2 and len(resets) == 1
    assert state.attempts == 0  # restored to the last snapshot (the sync) before giving up
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum, name="elastic.test.after").item() == hvd.size()


@multi_rank
def test_reset_initialises_with_the_same_static_process_sets():
    evens = hvd.ProcessSet(list(range(0, hvd.size(), 2)))
    hvd.shutdown()
    hvd.init(process_sets=[evens])
    try:
        state = hvd.elastic.TorchState(step=0)
        failures = {"left": 1}

        @hvd.elastic.run
        def train(state):
            if failures["left"]:
                failures["left"] -= 1
                raise hvd.HorovodInternalError("simulated")
            if evens.included():
                out = hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=evens,
                                    name="elastic.test.evens")
                assert out.item() == evens.size()
            return evens.size()

        assert train(state) == len(evens.ranks) and failures["left"] == 0
    finally:
        hvd.shutdown()
        hvd.init()  # the other tests expect a plain init
