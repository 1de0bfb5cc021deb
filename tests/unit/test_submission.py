"""The Python submission core (horovodlite/torch/submission.py) in one process, without
hvd.init(): ``synchronize`` dispatches to the result handler recorded with each handle, ``then``
chains a step after it, and unknown handles go to the binding (which raises). The binding is
replaced by a fake that records what it was asked."""

import pytest
import torch

from horovodlite.torch import submission as sub


class FakeBinding:
    """wait/wait_done/poll of the _C module for handles this test hands out."""

    def __init__(self):
        self.results = {}  # handle -> (outputs, extra)
        self.calls = []

    def wait(self, handle):
        self.calls.append(("wait", handle))
        if handle not in self.results:
            raise ValueError(f"unknown handle {handle}")
        return self.results.pop(handle)

    def wait_done(self, handle):
        self.calls.append(("wait_done", handle))
        self.results.pop(handle)

    def poll(self, handle):
        return handle in self.results


@pytest.fixture
def fake(monkeypatch):
    binding = FakeBinding()
    monkeypatch.setattr(sub, "_C", binding)
    monkeypatch.setattr(sub, "_handles", {})
    return binding


def submitted(fake, handler, handle, kept=None, outputs=(), extra=()):
    fake.results[handle] = (list(outputs), list(extra))
    assert sub.submit(handler, "allreduce", lambda: handle, None, kept) == handle
    return handle


def test_each_handler_builds_its_result(fake):
    t, u = torch.ones(2), torch.zeros(3)
    assert sub.synchronize(submitted(fake, sub.in_place, 1, t)) is t
    group = sub.synchronize(submitted(fake, sub.in_place_group, 2, (t, u)))
    assert isinstance(group, list) and group[0] is t and group[1] is u
    assert sub.synchronize(submitted(fake, sub.first_output, 3, t, outputs=[u])) is u
    assert sub.synchronize(submitted(fake, sub.all_outputs, 4, None, outputs=[u, t])) == [u, t]
    out, received = sub.synchronize(submitted(fake, sub.alltoall_pair, 5, t, outputs=[u],
                                              extra=[1, 2]))
    assert out is u and received.dtype == torch.int32 and received.tolist() == [1, 2]
    assert sub.synchronize(submitted(fake, sub.last_joined, 6, extra=[2])) == 2
    assert sub.synchronize(submitted(fake, sub.no_result, 7)) is None
    # in-place results need no output lists: wait_done, not wait
    assert [c for c in fake.calls if c[0] == "wait_done"] == [("wait_done", 1), ("wait_done", 2),
                                                               ("wait_done", 7)]


def test_a_handle_is_synchronized_once_and_unknown_ones_go_to_the_binding(fake):
    h = submitted(fake, sub.in_place, 11, torch.ones(1))
    sub.synchronize(h)
    with pytest.raises(ValueError, match="unknown handle 11"):
        sub.synchronize(h)
    with pytest.raises(ValueError, match="unknown handle 12"):
        sub.synchronize(12)


def test_then_post_processes_the_handlers_result(fake):
    t = torch.ones(3)
    h = submitted(fake, sub.in_place, 21, t)
    assert sub.then(h, lambda r: (r.sum().item(), r is t)) == h
    assert sub.synchronize(h) == (3.0, True)
    h = sub.then(submitted(fake, sub.first_output, 22, t, outputs=[t * 2]), lambda r: r + 1)
    assert sub.then(h, lambda r: r * 10) == h  # chains twice
    assert sub.synchronize(h).tolist() == [30.0, 30.0, 30.0]


def test_a_custom_handler_gets_the_handle_and_what_was_kept(fake):
    seen = []
    h = sub.submit(lambda handle, kept: seen.append((handle, kept)) or "done", "allgather",
                   lambda: 31, None, ("a", "b"))
    assert sub.poll(h) is False  # the fake binding knows nothing of it
    assert sub.synchronize(h) == "done" and seen == [(31, ("a", "b"))]


def test_a_failed_enqueue_records_nothing(fake):
    def refuse():
        raise ValueError("still pending")

    with pytest.raises(ValueError, match="still pending"):
        sub.submit(sub.in_place, "allreduce", refuse, None, torch.ones(1))
    assert sub._handles == {}


def test_names_count_per_op_and_reset(monkeypatch):
    monkeypatch.setattr(sub, "_counters", {})
    monkeypatch.setattr(sub, "_barriers", {})
    assert sub.op_name("allreduce") == "allreduce.noname.0"
    assert sub.op_name("broadcast") == "broadcast.noname.0"
    assert sub.op_name("allreduce") == "allreduce.noname.1"
    assert sub.group_names("grouped_allreduce", None, 2) == ["grouped_allreduce.noname.0.0",
                                                             "grouped_allreduce.noname.0.1"]
    assert [sub.barrier_name(0), sub.barrier_name(3), sub.barrier_name(0)] == [
        "barrier.0.0", "barrier.3.0", "barrier.0.1"]
    ran = []
    monkeypatch.setattr(sub, "_resets", [lambda: ran.append(1)])
    sub.reset()
    assert ran == [1] and sub.op_name("allreduce") == "allreduce.noname.0"
    assert sub.barrier_name(0) == "barrier.0.0"
