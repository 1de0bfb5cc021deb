"""hvd.elastic's pure-Python parts, in one process and without hvd.init(): snapshots of
ObjectState/TorchState, the sampler's partition, and run's retry protocol with its collaborators
(reset, final agreement) replaced by recorders."""

import pytest
import torch

import horovodlite.torch as hvd
from horovodlite.torch.elastic.runner import retry_loop
from horovodlite.torch.elastic.sampler import partition


def trained_sgd(steps=3):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(4, 3)).pow(2).sum().backward()
        opt.step()
        sched.step()
    return model, opt, sched


def snapshot(model, opt, sched):
    return ({k: v.clone() for k, v in model.state_dict().items()},
            {i: s["momentum_buffer"].clone() for i, s in opt.state_dict()["state"].items()},
            opt.param_groups[0]["lr"], sched.state_dict()["last_epoch"])


def assert_same(a, b):
    for k in a[0]:
        assert torch.equal(a[0][k], b[0][k]), k
    assert a[1].keys() == b[1].keys()
    for i in a[1]:
        assert torch.equal(a[1][i], b[1][i]), i
    assert a[2:] == b[2:]


# ------------------------------------------------------------------------------- states


def test_torch_state_restore_returns_to_the_last_save():
    model, opt, sched = trained_sgd()
    state = hvd.elastic.TorchState(model, opt, scheduler=sched, epoch=1, history=[1])
    state.save()
    saved = snapshot(model, opt, sched)
    for _ in range(2):  # train further: parameters, momentum, lr and scheduler all move
        opt.zero_grad()
        model(torch.ones(2, 3)).sum().backward()
        opt.step()
        sched.step()
    state.epoch = 7
    state.history.append(2)  # mutating a tracked list must not reach the snapshot
    state.restore()
    assert_same(snapshot(model, opt, sched), saved)
    assert state.epoch == 1 and state.history == [1]
    # The restored optimizer state is a copy: stepping again leaves the snapshot intact.
    opt.zero_grad()
    model(torch.ones(2, 3)).sum().backward()
    opt.step()
    state.restore()
    assert_same(snapshot(model, opt, sched), saved)


def test_constructor_snapshots_and_restore_clears_gradients():
    model, opt, sched = trained_sgd(steps=1)
    state = hvd.elastic.TorchState(model=model, optimizer=opt, batch=0)
    before = snapshot(model, opt, sched)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    state.batch = 5
    state.restore()  # no save yet: back to construction time
    assert state.batch == 0
    assert_same(snapshot(model, opt, sched), before)
    assert all(p.grad is None for p in model.parameters())


def test_assigning_a_new_model_switches_the_handler():
    state = hvd.elastic.TorchState(torch.nn.Linear(2, 2))
    new = torch.nn.Linear(2, 2)
    state.model = new
    weight = new.weight.detach().clone()
    with torch.no_grad():
        new.weight.add_(1.0)
    state.restore()
    assert state.model is new and torch.equal(new.weight, weight)


def test_optional_model_and_optimizer_are_plain_attributes():
    state = hvd.elastic.TorchState(epoch=3)
    assert state.model is None and state.optimizer is None and state.epoch == 3
    assert sorted(state._handlers) == [] and "model" in state._object_names


def test_base_state_requires_the_three_methods():
    state = hvd.elastic.State()
    for method in (state.save, state.restore, state.sync):
        with pytest.raises(NotImplementedError, match="State must implement"):
            method()


# ----------------------------------------------------------------------------- sampler


@pytest.mark.parametrize("n,replicas", [(12, 3), (10, 3), (7, 2), (2, 3), (1, 3), (5, 1)])
@pytest.mark.parametrize("shuffle", [True, False])
def test_partition_covers_everything_with_equal_shares(n, replicas, shuffle):
    shares = [partition(n, set(), shuffle, 4, 0, replicas, r) for r in range(replicas)]
    assert len({len(s) for s in shares}) == 1, shares  # same step count on every rank
    flat = [i for s in shares for i in s]
    assert set(flat) == set(range(n))
    assert len(flat) == -(-n // replicas) * replicas  # padding only up to a multiple


def test_partition_excludes_processed_and_is_deterministic():
    processed = {0, 3, 4, 9}
    a = [partition(10, processed, True, 1, 2, 2, r) for r in range(2)]
    assert a == [partition(10, processed, True, 1, 2, 2, r) for r in range(2)]
    assert set(a[0] + a[1]) == set(range(10)) - processed
    assert partition(10, set(), False, 0, 0, 2, 1) == [1, 3, 5, 7, 9]
    orders = {tuple(partition(50, set(), True, s, e, 1, 0)) for s, e in [(0, 0), (0, 1), (1, 0)]}
    assert len(orders) == 2  # seed + epoch: (0, 1) and (1, 0) are the same order, (0, 0) not


def test_partition_of_nothing_left():
    assert [partition(4, {0, 1, 2, 3}, True, 0, 0, 3, r) for r in range(3)] == [[], [], []]


# ------------------------------------------------------------------------- retry protocol


class RecordingState(hvd.elastic.ObjectState):
    """An ObjectState whose sync is local, recording the protocol's calls."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.calls = []

    def sync(self):
        self.calls.append("sync")

    def restore(self):
        self.calls.append("restore")
        super().restore()


def run_protocol(func, state, limit=3, finish=lambda: None):
    resets = []
    state.register_reset_callbacks([lambda: state.calls.append("callback")])
    result = retry_loop(func, state, (), {}, limit, reset=resets.append, finish=finish)
    return result, resets


@pytest.fixture
def rollback(monkeypatch, request):
    monkeypatch.setenv("HOROVOD_ELASTIC_ROLLBACK", request.param)
    return request.param


@pytest.mark.parametrize("rollback", ["commit", "step"], indirect=True)
def test_internal_error_resets_and_syncs_restoring_only_under_commit(rollback):
    state = RecordingState(step=0)
    attempts = []

    def train(s):
        attempts.append(s.step)
        s.step += 1
        if len(attempts) == 1:
            raise hvd.HorovodInternalError("simulated")
        return s.step

    result, resets = run_protocol(train, state)
    if rollback == "commit":
        assert attempts == [0, 0] and result == 1  # the retry started from the snapshot
        assert state.calls == ["sync", "restore", "callback", "sync"]
    else:  # the step that failed is the only one lost: the state goes on from where it was
        assert attempts == [0, 1] and result == 2
        assert state.calls == ["sync", "callback", "sync"]
    assert len(resets) == 1 and "simulated" in str(resets[0])


def test_a_state_of_the_users_own_rolls_back_to_its_commit(monkeypatch):
    """Only the user's save/restore/sync know what a consistent state of theirs is."""
    monkeypatch.setenv("HOROVOD_ELASTIC_ROLLBACK", "step")

    class Mine(hvd.elastic.State):
        def __init__(self):
            super().__init__()
            self.calls = []

        def save(self):
            self.calls.append("save")

        def restore(self):
            self.calls.append("restore")

        def sync(self):
            self.calls.append("sync")

    state, tries = Mine(), []

    def train(s):
        tries.append(1)
        if len(tries) == 1:
            raise hvd.HorovodInternalError("simulated")

    retry_loop(train, state, (), {}, 3, reset=lambda e: None, finish=lambda: None)
    assert state.rollback_mode() == "commit" and state.calls == ["sync", "restore", "sync"]


def test_the_rollback_setting_is_checked_by_name(monkeypatch):
    from horovodlite.common import launch_env

    assert launch_env.rollback({}) == "step"
    assert launch_env.rollback({"HOROVOD_ELASTIC_ROLLBACK": " Commit "}) == "commit"
    with pytest.raises(ValueError, match="HOROVOD_ELASTIC_ROLLBACK='last': expected step or "
                                         "commit"):
        launch_env.rollback({"HOROVOD_ELASTIC_ROLLBACK": "last"})


def test_torch_state_counts_the_steps_its_optimizers_apply_and_shards_roll_back(monkeypatch):
    monkeypatch.setenv("HOROVOD_ELASTIC_ROLLBACK", "step")
    model, opt, sched = trained_sgd(steps=1)
    state = hvd.elastic.TorchState(model, opt, scheduler=sched, epoch=0)
    assert state.applied == 0 and state.rollback_mode() == "step"
    for _ in range(3):
        opt.zero_grad()
        model(torch.ones(2, 3)).sum().backward()
        opt.step()
    assert state.applied == 3
    other = torch.optim.Adam(model.parameters())
    state.optimizer = other  # the new one's steps count, the old one's no longer
    opt.step()
    other.step()
    assert state.applied == 4
    # commit() takes no snapshot under "step": restore() finds the constructor's
    state.epoch = 5
    state.commit()
    state.restore()
    assert state.epoch == 0 and state.commits == 1
    monkeypatch.setenv("HOROVOD_ELASTIC_ROLLBACK", "commit")
    assert state.rollback_mode() == "commit"


@pytest.mark.parametrize("skip_sync", [False, True])
def test_hosts_updated_skips_restore(skip_sync):
    state = RecordingState(step=0)

    def train(s):
        s.step += 1
        if s.step == 1:
            raise hvd.HostsUpdatedInterrupt(skip_sync)
        return s.step

    result, resets = run_protocol(train, state)
    assert result == 2  # not rolled back
    expected = ["sync", "callback"] + ([] if skip_sync else ["sync"])
    assert state.calls == expected and len(resets) == 1


def test_retiring_hosts_syncs_with_every_rank_before_the_reset(monkeypatch):
    """When the interrupt retires the ranks of hosts that left the discovery output, the state
    is synced once more before the reset (the leaving ranks still take part), then again."""
    from horovodlite.torch.elastic import discovery

    state = RecordingState(step=0)
    monkeypatch.setattr(discovery, "_retiring", ["gone-host"])

    def train(s):
        s.step += 1
        if s.step == 1:
            raise hvd.HostsUpdatedInterrupt(False)
        return s.step

    resets = []

    def reset(error):
        resets.append(list(state.calls))
        discovery.take_retirement()

    state.register_reset_callbacks([lambda: state.calls.append("callback")])
    assert retry_loop(train, state, (), {}, 3, reset=reset, finish=lambda: None) == 2
    assert resets == [["sync", "sync"]]  # the start's sync, then the one with every rank
    assert state.calls == ["sync", "sync", "callback", "sync"]


@pytest.mark.parametrize("rollback", ["commit"], indirect=True)
def test_gives_up_after_the_limit_with_the_last_error(rollback):
    state = RecordingState()
    raised = []

    def train(s):
        raised.append(hvd.HorovodInternalError(f"failure {len(raised)}"))
        raise raised[-1]

    with pytest.raises(hvd.HorovodInternalError) as info:
        run_protocol(train, state, limit=2)
    assert info.value is raised[-1] and len(raised) == 3
    assert state.calls.count("callback") == 2 and state.calls[-1] == "restore"
    if hasattr(BaseException, "add_note"):  # Python >= 3.11
        assert "hvd.elastic.run gave up after 2 resets" in info.value.__notes__[-1]


def test_the_limit_counts_resets_in_a_row_only():
    """Failures with a commit between them do not add up (a long job survives any number of
    them, as horovodrun's does without --reset-limit); failures with none do."""
    state = RecordingState(step=0)
    failures = []

    def train(s):
        s.commit()  # progress, then a failure: five times, against a limit of 2
        if len(failures) < 5:
            failures.append(hvd.HorovodInternalError(f"failure {len(failures)}"))
            raise failures[-1]
        return "done"

    result, resets = run_protocol(train, state, limit=2)
    assert result == "done" and len(resets) == 5 and state.commits == 6


def test_failed_final_agreement_retries():
    state = RecordingState()
    outcomes = iter([hvd.HorovodInternalError("peer reset"), None])

    def finish():
        error = next(outcomes)
        if error is not None:
            raise error

    result, resets = run_protocol(lambda s: "done", state, finish=finish)
    assert result == "done" and len(resets) == 1


def test_other_exceptions_propagate_without_reset():
    state = RecordingState()

    def train(s):
        raise KeyError("user bug")

    with pytest.raises(KeyError):
        run_protocol(train, state)
    assert state.calls == ["sync"]


def test_run_decorator_forms_and_limit_validation():
    def train(state):
        return state

    assert hvd.elastic.run(train).__wrapped__ is train
    assert hvd.elastic.run(reset_limit=0)(train).__name__ == "train"
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(ValueError, match="reset_limit must be an int >= 0"):
            hvd.elastic.run(reset_limit=bad)(train)


# ------------------------------------------------------------------------- host discovery


def test_discovery_output_is_parsed_per_host():
    from horovodlite.torch.elastic.discovery import parse_hosts, parse_slots

    text = "# comment\nhvdl-host0:2\n\n hvdl-host1 \nnode.example.com:4\nhvdl-host0:1\n"
    assert parse_hosts(text) == {"hvdl-host0": 3, "hvdl-host1": 1, "node.example.com": 4}
    assert parse_slots(text) == 8
    assert parse_hosts("") == {}


def test_removed_hosts_are_the_job_hosts_no_longer_listed(capsys):
    from horovodlite.torch.elastic import discovery

    job = ["a", "a", "b.cluster", "c"]
    assert discovery.removed_hosts(job, {"a": 2, "b": 1, "c": 1}) == []  # short names match
    assert discovery.removed_hosts(job, {"a.cluster": 2, "c": 1}) == ["b.cluster"]
    assert discovery.removed_hosts(job, {"a": 2}) == ["b.cluster", "c"]
    assert discovery.listed("b.cluster", {"b.other": 1})  # the short names agree
    assert not discovery.listed("b", {"bb": 1})
    assert discovery.removed_hosts(job, {"localhost": 4}) == []  # one machine's usual output
    # an output listing none of the job's hosts is a broken script, not "retire everyone"
    discovery._warned_unlisted = False
    assert discovery.removed_hosts(job, {"10.0.0.5": 4}) == []
    assert "lists none of the job's hosts" in capsys.readouterr().err


def test_growth_beyond_the_allocation_picks_the_first_new_host():
    from horovodlite.torch.elastic.discovery import new_host

    found = {"a": 2, "b": 1, "c": 4}
    assert new_host(found, {"a"}, 3) == ("b", 1)       # as many as its slots
    assert new_host(found, {"a", "b"}, 3) == ("c", 3)  # up to the room left
    assert new_host(found, {"a", "b", "c"}, 3) == ("", 0)
    assert new_host(found, {"a"}, 0) == ("", 0)        # at --max-np already
    assert new_host({"localhost": 4}, {"a"}, 2) == ("", 0)  # one machine: mpirun places


@pytest.fixture
def fresh_blacklist(monkeypatch):
    from horovodlite.torch.elastic import discovery

    monkeypatch.setattr(discovery, "_failures", {})
    monkeypatch.setattr(discovery, "_blocked_until", {})
    monkeypatch.delenv("HVDL_BLACKLIST_COOLDOWN", raising=False)
    return discovery


def test_a_host_that_lost_ranks_gets_no_new_ones_for_the_rest_of_the_job(fresh_blacklist):
    d = fresh_blacklist
    found = {"a": 2, "b.cluster": 2, "c": 1}
    assert d.usable(found) == found
    # two ranks of b lost in one recovery: one failure of b
    assert d.note_lost(["b", "b"], now=0.0) == [("b", float("inf"), 1)]
    assert d._failures == {"b": 1}
    assert d.blacklisted(now=1e9) == ["b"]
    assert d.usable(found, now=1e9) == {"a": 2, "c": 1}  # short names match
    # one machine: blacklisting its host blacklists "localhost" (it lists every host)
    assert d.usable({"localhost": 3}, now=0.0) == {}
    # growth beyond the allocation skips it too
    assert d.new_host(d.usable(found, now=0.0), {"a"}, 4) == ("c", 1)


def test_cooldown_doubles_per_failure_up_to_the_maximum(fresh_blacklist, monkeypatch):
    d = fresh_blacklist
    monkeypatch.setenv("HVDL_BLACKLIST_COOLDOWN", "10,25")
    assert d.launch_env.cooldown_range() == (10.0, 25.0)
    assert d.note_lost(["h"], now=100.0) == [("h", 10.0, 1)]
    assert d.blacklisted(now=109.9) == ["h"] and d.blacklisted(now=110.0) == []
    assert d.usable({"h": 2}, now=110.0) == {"h": 2}  # back after the cooldown
    assert d.note_lost(["h"], now=200.0) == [("h", 20.0, 2)]
    assert d.note_lost(["h"], now=300.0) == [("h", 25.0, 3)]  # 40 capped at MAX


def test_runtime_losses_are_counted_once(fresh_blacklist, monkeypatch):
    d = fresh_blacklist
    lost = ["x"]
    monkeypatch.setattr(d.basics, "_C", type("C", (), {"lost_hosts": staticmethod(lambda: lost)}))
    monkeypatch.setattr(d, "_lost_seen", 0)
    assert [h for h, _, _ in d.note_runtime_losses()] == ["x"]
    assert d.note_runtime_losses() == []  # nothing new since
    lost.append("y")
    assert [h for h, _, _ in d.note_runtime_losses()] == ["y"]
    assert d._failures == {"x": 1, "y": 1}


@pytest.mark.parametrize("every,expected", [
    ([(6, 2, True), (6, 2, True), (6, 2, True)], (0, False)),  # all equal: nothing bulky sent
    ([(5, 2, True), (6, 2, True), (6, 3, True)], (1, True)),  # rank 1 applied the last step
    ([(7, 3, True), (7, 3, True), (0, 0, None)], (0, True)),  # a newcomer takes everything
    ([(7, 3, False), (6, 3, True), (7, 3, True)], (2, True)),  # rank 0 holds part of a state
    ([(0, 0, None), (0, 0, None)], (0, True)),  # the start: rank 0's
    ([(0, 7, None), (0, 0, None)], (0, True)),  # commits before hvd.elastic.run: still the start
], ids=["equal", "one-ahead", "newcomer", "interrupted-sync", "start", "committed-before"])
def test_step_rollback_syncs_from_the_survivor_that_applied_the_most(monkeypatch, every,
                                                                      expected):
    from horovodlite.torch import functions
    from horovodlite.torch.elastic import state as state_module

    monkeypatch.setenv("HOROVOD_ELASTIC_ROLLBACK", "step")
    monkeypatch.setattr(state_module, "is_initialized", lambda: True)
    monkeypatch.setattr(functions, "allgather_object", lambda obj, name=None: every)
    assert hvd.elastic.ObjectState(step=0)._source() == expected


@pytest.mark.parametrize("mine,behind", [((7, True), False), ((6, True), True),
                                         ((7, False), True), ((0, None), True)],
                         ids=["as-far-whole", "a-step-behind", "part-of-a-state", "newcomer"])
def test_only_a_rank_behind_the_source_holds_part_of_a_state_while_it_receives(monkeypatch,
                                                                              mine, behind):
    """Rank 0 sends its state to a newcomer and dies mid-sync (seen in
    benchmarks/fault_tolerance.py): the survivors that had applied as many steps received their
    own values, so they still hold a whole state and the job goes on from one of them; before,
    every receiver counted as partial and the job stopped with "no rank holds a whole state"."""
    from horovodlite.torch import functions
    from horovodlite.torch.elastic import state as state_module

    class Applied(hvd.elastic.ObjectState):
        applied = mine[0]

    monkeypatch.setenv("HOROVOD_ELASTIC_ROLLBACK", "step")
    monkeypatch.setattr(state_module, "is_initialized", lambda: True)
    monkeypatch.setattr(functions, "allgather_object",
                        lambda obj, name=None: [(7, 3, True), (*mine[:1], 3, mine[1]),
                                                (0, 0, None)])
    s = Applied(step=0)
    s._synced = mine[1]
    assert s._source() == (0, True) and s._behind is behind


def test_step_rollback_with_no_whole_state_left_stops_naming_the_way_out(monkeypatch):
    from horovodlite.torch import functions
    from horovodlite.torch.elastic import state as state_module

    monkeypatch.setenv("HOROVOD_ELASTIC_ROLLBACK", "step")
    monkeypatch.setattr(state_module, "is_initialized", lambda: True)
    monkeypatch.setattr(functions, "allgather_object",
                        lambda obj, name=None: [(7, 3, False), (6, 3, False)])
    with pytest.raises(RuntimeError, match="HOROVOD_ELASTIC_ROLLBACK=commit"):
        hvd.elastic.ObjectState(step=0)._source()


def test_a_reset_forgets_the_grad_scalers_stage_of_the_failed_step():
    """A failure after scaler.unscale_(opt) left the optimizer "unscaled": without the reset
    forgetting it, the retried step's scaler.step(opt) skipped its unscale and applied gradients
    still multiplied by the scale (65536 times the step)."""
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16)
    state = hvd.elastic.TorchState(model, opt, scaler=scaler)
    scaler.scale(model(torch.ones(1, 2)).sum()).backward()
    scaler.unscale_(opt)  # ... and the step's collective fails here
    state.on_reset()
    opt.zero_grad()
    before = model.weight.detach().clone()
    scaler.scale(model(torch.ones(1, 2)).sum()).backward()
    scaler.step(opt)  # unscales this step's gradients: a step of lr * 1, not lr * 65536
    scaler.update()
    assert torch.allclose(before - model.weight.detach(), torch.full_like(before, 0.1))
