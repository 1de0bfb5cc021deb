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


def test_timeline_is_valid_json_mid_run_and_at_every_page_boundary():
    path = hvd.broadcast_object(os.path.join(tempfile.mkdtemp(), "pages.json")
                                if hvd.rank() == 0 else None, name="timeline path")
    hvd.start_timeline(path, mark_cycles=True)
    try:
        record(steps=60, tensors=60)
        hvd.barrier()
        if hvd.rank() == 0:
            time.sleep(0.3)  # the writer flushes every 50 ms; nothing new is recorded meanwhile
            with open(path) as f:
                mid = f.read()
            assert len(mid) > FIRST_REGION, len(mid)  # the region grew at least once
            assert mid.rstrip().endswith("]") and len(mid) - len(mid.rstrip()) < len(mid) // 2 + 2
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
