"""benchmarks/scale_launch.py's cases at 8 and 64 ranks, so that the benchmark cannot rot: every
rank started through the fake ssh agent and registered (with the launcher's reports and in the
store), their ranks unique and complete, the launcher's status 0; the elastic driver's round
without the lost host's workers, in order; every client of the store rendezvous met with the
right layout. No timing is checked."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import scale_launch  # noqa: E402
import scale_standins  # noqa: E402

SIZES = [8, 64]


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("launcher", ["gloo", "elastic"])
def test_launch(n, launcher):
    row = scale_launch.launch(n, launcher, delay=0.01, timeout=60.0)
    assert row.get("errors") is None, row
    assert row["case"] == "launch" and row["launcher"] == launcher and row["ranks"] == n
    assert row["status"] == 0
    assert row["registered"] == n and row["complete"], row
    assert row["hosts"] == (n + 7) // 8
    assert row["seconds"] is not None and row["seconds"] > 0
    if launcher == "elastic":
        assert row["rounds"] == [0] and row["workers_unique"]


@pytest.mark.parametrize("n", SIZES)
def test_elastic_round(n):
    row = scale_launch.elastic_round(n)
    assert row["case"] == "elastic_round" and row["ranks"] == n
    assert row["round"] == 1
    assert row["members"] == n - (8 if n >= 16 else 1)
    assert row["membership_ok"] and row["stopped_ok"], row


@pytest.mark.parametrize("n", SIZES)
def test_store_rendezvous(n):
    row = scale_launch.store_rendezvous(n, timeout=60.0)
    assert row.get("errors") is None, row
    assert row["case"] == "store_rendezvous" and row["launcher"] == "tcpstore"
    assert row["met"] == n and row["layout_ok"]
    assert row["seconds"] is not None


def test_rows_and_json(capsys):
    rows = scale_launch.launch_rows([8], json_lines=True, cases=("elastic_round",),
                                    launch_ranks=None)
    assert [r["case"] for r in rows] == ["elastic_round"]
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith("{")


def test_remote_line_parsed():
    env, command = scale_standins.parse_line(
        "cd /w && exec env A=1 B='x y' python -m horovodlite.runner.task -- true")
    assert env == {"A": "1", "B": "x y"}
    assert command == ["python", "-m", "horovodlite.runner.task", "--", "true"]


def test_forwarder_serves_many_pipes_from_one_thread():
    """The launcher's output forwarding (``rank_output.Forwarder``) takes one thread for every
    rank's pipes, not two per rank; lines stay whole and prefixed, a carriage return is no line
    end, a last line without a newline gets one."""
    import io
    import os
    import threading

    from horovodlite.runner import rank_output

    out, err = io.BytesIO(), io.BytesIO()
    fw = rank_output.Forwarder(stdout=out, stderr=err)
    before = threading.active_count()
    writers = []
    for rank in range(40):
        for stream in ("stdout", "stderr"):
            r, w = os.pipe()
            fw.add(rank, stream, os.fdopen(r, "rb"))
            writers.append((rank, stream, w))
    assert threading.active_count() <= before + 1
    for rank, stream, w in writers:
        os.write(w, f"{stream} {rank}\nbar\r50%".encode())
        os.close(w)
    fw.join(10)
    lines = out.getvalue().split(b"\n")[:-1] + err.getvalue().split(b"\n")[:-1]
    expected = [f"[{rank}]<{stream}>:{text}".encode() for rank in range(40)
                for stream in ("stdout", "stderr") for text in (f"{stream} {rank}", "bar\r50%")]
    assert sorted(lines) == sorted(expected)
    r, w = os.pipe()  # pipes added after the others ended are served too
    fw.add(1, "stdout", os.fdopen(r, "rb"))
    os.write(w, b"again\n")
    os.close(w)
    fw.join(10)
    assert out.getvalue().endswith(b"[1]<stdout>:again\n")


def test_driver_reads_one_counter_while_nobody_asked_for_a_reset():
    """The elastic driver looks for reset requests every 0.2 s: while none was made, that look
    is one store call, not one per worker; requests still count once each."""
    import torch.distributed as dist

    from horovodlite.common import elastic_rounds as er

    calls = []

    class Counting:
        def __init__(self, store):
            self.store = store

        def __getattr__(self, name):
            calls.append(name)
            return getattr(self.store, name)

    store = Counting(dist.HashStore())
    workers = [str(w) for w in range(2048)]
    assert er.resets_requested(store, 0, workers) == 0
    assert len(calls) == 1
    er.request_reset(store, 0, "5")
    er.request_reset(store, 0, "5")
    er.request_reset(store, 0, "7")
    assert er.resets_requested(store, 0, workers) == 2
    assert er.resets_requested(store, 1, workers) == 0
