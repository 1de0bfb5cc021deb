"""The timeline file's layout keeps it valid JSON whatever moment the job dies at: rank 0 records
enough traffic to outgrow the first preallocated region, reads the file while recording goes on,
and checks that a write cut at any page boundary (where Linux stops a killed write) would still
leave a valid trace. Every rank checks its allreduce results."""

import json
import os
import tempfile
import time

import torch

import horovodlite.torch as hvd

PAGE = os.sysconf("SC_PAGE_SIZE")
FIRST_REGION = 1 << 20  # csrc/core/timeline.cc kInitialRegion


def record(steps, tensors):
    n = hvd.size()
    for step in range(steps):
        outs = hvd.grouped_allreduce([torch.full((3,), float(hvd.rank() + step))] * tensors,
                                     name=f"pages.{step % 7}", op=hvd.Sum)
        expected = sum(range(n)) + n * step
        assert all(torch.all(o == expected) for o in outs)


def traced(file_name, body):
    """Runs body() on every rank while a timeline records; returns rank 0's events (else None)."""
    path = hvd.broadcast_object(os.path.join(tempfile.mkdtemp(), file_name)
                                if hvd.rank() == 0 else None, name=f"{file_name} path")
    hvd.start_timeline(path)
    try:
        body()
    finally:
        hvd.stop_timeline()
    if hvd.rank() != 0:
        return None
    with open(path) as f:
        return json.load(f)


def test_timeline_is_valid_json_mid_run_and_at_every_page_boundary():
    path = hvd.broadcast_object(os.path.join(tempfile.mkdtemp(), "pages.json")
                                if hvd.rank() == 0 else None, name="timeline path")
    hvd.start_timeline(path, mark_cycles=True)
    try:
        record(steps=60, tensors=60)
        hvd.barrier()
        if hvd.rank() == 0:
            # The writer flushes every 50 ms; nothing new is recorded meanwhile. On a loaded
            # machine a flush comes late: read again until the last events are in (10 s at most).
            deadline = time.monotonic() + 10
            while True:
                time.sleep(0.1)
                with open(path) as f:
                    mid = f.read()
                if len(mid) > FIRST_REGION or time.monotonic() > deadline:
                    break
            assert len(mid) > FIRST_REGION, len(mid)  # the region grew at least once
            padding = len(mid) - len(mid.rstrip())  # a region grows x4: at most 3/4 is spaces
            assert mid.rstrip().endswith("]") and padding < 3 * len(mid) // 4 + 2
            assert any(e.get("name") == "ALLREDUCE" for e in json.loads(mid))
        record(steps=5, tensors=10)
    finally:
        hvd.stop_timeline()
    if hvd.rank() != 0:
        return
    with open(path) as f:
        data = f.read()
    assert data.endswith("\n]") and not data[-3].isspace()  # padding trimmed at stop
    assert not os.path.exists(path + ".hvdl-tmp")
    events = json.loads(data)
    assert sum(e.get("name") == "ALLREDUCE" for e in events) >= 65 * 10
    # A killed write leaves the bytes up to some page boundary; behind them are the region's
    # spaces and the bracket. So no event may cross a page boundary ...
    raw = data.encode()
    offset = 0
    for line in raw.split(b"\n"):
        obj = line.rstrip(b" ,")
        if obj.startswith(b"{"):
            first, last = offset, offset + len(obj) - 1
            assert first // PAGE == last // PAGE, f"event at bytes {first}-{last}: {obj[:80]}"
        offset += len(line) + 1
    # ... and a cut at a page boundary, with spaces and the bracket behind it, parses.
    boundaries = list(range(PAGE, len(raw) - 1, PAGE))
    for boundary in boundaries[:3] + boundaries[len(boundaries) // 2:][:3] + boundaries[-3:]:
        cut = raw[:boundary] + b" " * 10 + b"]"
        try:
            json.loads(cut)
        except json.JSONDecodeError as e:
            raise AssertionError(f"cut at byte {boundary} is not valid JSON: {e}") from None


def test_fused_batch_phases_tile_each_tensors_collective_span():
    """Execution is recorded per fused batch and expanded per tensor by the writer: on every
    tensor's track, NEGOTIATE ends where QUEUE and the ALLREDUCE span start, the phases inside
    follow each other without gaps up to the span's end, and the tensors of one batch share
    their phase times."""
    names = [f"grouped_allreduce.tile.{i}" for i in range(8)]

    def steps():
        for step in range(6):
            outs = hvd.grouped_allreduce([torch.full((50 + i,), float(step)) for i in range(8)],
                                         name="tile", op=hvd.Sum)
            assert all(torch.all(o == step * hvd.size()) for o in outs)

    events = traced("batch.json", steps)
    if events is None:
        return
    tracks = {e["args"]["name"]: e["tid"] for e in events if e.get("name") == "thread_name"}
    spans = [e for e in events if e.get("ph") == "X"]
    assert set(names) <= set(tracks), tracks
    phases_by_step = {}
    for name in names:
        mine = sorted((e for e in spans if e["tid"] == tracks[name]), key=lambda e: e["ts"])
        outer = [e for e in mine if e["name"] == "ALLREDUCE"]
        assert len(outer) == 6, (name, outer)
        for step, op in enumerate(outer):
            end = op["ts"] + op["dur"]
            negotiate = [e for e in mine if e["name"] == "NEGOTIATE_ALLREDUCE"
                         and e["ts"] + e["dur"] == op["ts"]]
            assert len(negotiate) == 1, (name, op, mine)
            inner = [e for e in mine if e is not op and e["name"] != "NEGOTIATE_ALLREDUCE"
                     and op["ts"] <= e["ts"] < end]
            assert inner[0]["name"] == "QUEUE" and inner[0]["ts"] == op["ts"], inner
            for before, after in zip(inner, inner[1:]):
                assert before["ts"] + before["dur"] == after["ts"], (before, after)
            assert inner[-1]["ts"] + inner[-1]["dur"] == end, (inner, op)
            phases = tuple((e["name"], e["ts"], e["dur"]) for e in inner[1:])
            phases_by_step.setdefault(step, set()).add(phases)
    assert len(phases_by_step) == 6
    assert all(len(p) == 1 for p in phases_by_step.values()), phases_by_step  # one batch each


def test_negotiation_args_name_dtype_and_shape_when_they_change():
    shapes = [4, 4, 6, 6, 6]

    def steps():
        for n in shapes:
            out = hvd.allreduce(torch.ones(n, dtype=torch.float64), name="reshaped", op=hvd.Sum)
            assert out.shape == (n,) and torch.all(out == hvd.size())

    events = traced("args.json", steps)
    if events is None:
        return
    tid = next(e["tid"] for e in events if e.get("name") == "thread_name"
               and e["args"]["name"] == "allreduce.reshaped")
    negotiate = sorted((e for e in events
                        if e["tid"] == tid and e["name"] == "NEGOTIATE_ALLREDUCE"),
                       key=lambda e: e["ts"])
    described = [(e["args"].get("dtype"), e["args"].get("shape")) for e in negotiate
                 if "shape" in e.get("args", {})]
    assert len(negotiate) == len(shapes)
    assert described == [("float64", "[4]"), ("float64", "[6]")], negotiate
