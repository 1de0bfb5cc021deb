"""Summarise a horovodlite timeline: where did the time go?

    python -m horovodlite.timeline timeline.json [--top 10] [--plot where_time_went.png]

Prints per-operation counts, the time spent negotiating (waiting for every rank to submit),
queued, copying into/out of the fusion buffer and transferring, and the slowest tensors. With
--plot, draws one stacked bar per step (a step = the k-th occurrence of the tensors) showing
negotiation vs copies vs transfer (matplotlib).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict

COPY = {"MEMCPY_IN_FUSION_BUFFER", "MEMCPY_OUT_FUSION_BUFFER"}
QUEUE = {"QUEUE"}


def category(name: str) -> str:
    if name.startswith("NEGOTIATE_"):
        return "negotiate"
    if name in COPY:
        return "copy"
    if name in QUEUE:
        return "queue"
    return "transfer"


def load_spans(path: str):
    """Returns (spans, tracks). Spans are dicts tid/name/start/end/depth/args, from complete
    events ("X", what horovodlite writes) or begin/end pairs; depth is the nesting level within
    the tensor's track (0 = NEGOTIATE_* and <OP>, 1 = the phases inside <OP>)."""
    with open(path) as f:
        events = json.load(f)
    tracks = {e["tid"]: e["args"]["name"] for e in events
              if e.get("ph") == "M" and e.get("name") == "thread_name"}
    spans, stacks = [], defaultdict(list)
    for e in events:
        ph = e.get("ph")
        if ph == "X":
            spans.append({"tid": e["tid"], "name": e["name"], "start": e["ts"],
                          "end": e["ts"] + e.get("dur", 0), "args": e.get("args", {})})
        elif ph == "B":
            stacks[e["tid"]].append(e)
        elif ph == "E" and stacks[e["tid"]]:
            b = stacks[e["tid"]].pop()
            spans.append({"tid": b["tid"], "name": b["name"], "start": b["ts"], "end": e["ts"],
                          "args": b.get("args", {})})
    by_track = defaultdict(list)
    for sp in spans:
        by_track[sp["tid"]].append(sp)
    for track in by_track.values():
        # Outer spans first at equal starts, then assign depth by containment.
        track.sort(key=lambda sp: (sp["start"], -(sp["end"] - sp["start"])))
        open_spans = []
        for sp in track:
            while open_spans and open_spans[-1]["end"] <= sp["start"] and \
                    open_spans[-1]["end"] - open_spans[-1]["start"] > 0:
                open_spans.pop()
            while open_spans and not (open_spans[-1]["start"] <= sp["start"] and
                                      sp["end"] <= open_spans[-1]["end"]):
                open_spans.pop()
            sp["depth"] = len(open_spans)
            open_spans.append(sp)
    return spans, tracks


def analyse(spans, tracks):
    ops = defaultdict(int)           # executed collectives per op
    time_by = defaultdict(float)     # category -> microseconds
    per_tensor = defaultdict(float)  # tensor -> total microseconds (negotiate + execute)
    steps = defaultdict(lambda: defaultdict(float))
    occurrence = defaultdict(int)
    for s in sorted(spans, key=lambda s: s["start"]):
        dur = s["end"] - s["start"]
        tensor = tracks.get(s["tid"], str(s["tid"]))
        if s["depth"] == 0:
            per_tensor[tensor] += dur
            if s["name"].startswith("NEGOTIATE_"):
                occurrence[tensor] += 1
            else:
                ops[s["name"]] += 1
        if s["depth"] == 0 and s["name"].startswith("NEGOTIATE_") or s["depth"] == 1:
            cat = category(s["name"])
            time_by[cat] += dur
            steps[max(occurrence[tensor] - 1, 0)][cat] += dur
    return ops, time_by, per_tensor, steps


def report(path: str, top: int) -> str:
    spans, tracks = load_spans(path)
    ops, time_by, per_tensor, steps = analyse(spans, tracks)
    total = sum(time_by.values()) or 1.0
    lines = [f"timeline {path}: {len(tracks)} tensors, {sum(ops.values())} collectives"]
    lines.append("operations: " + ", ".join(f"{k} x{v}" for k, v in sorted(ops.items())))
    lines.append("time by phase (summed over tensors):")
    for cat in ("negotiate", "queue", "copy", "transfer"):
        share = 100 * time_by[cat] / total
        lines.append(f"  {cat:<10} {time_by[cat] / 1e3:10.3f} ms  {share:5.1f}%")
    lines.append(f"slowest tensors (negotiation + execution, top {top}):")
    for name, us in sorted(per_tensor.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"  {us / 1e3:10.3f} ms  {name}")
    lines.append(f"steps: {len(steps)}")
    return "\n".join(lines)


def plot(path: str, out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spans, tracks = load_spans(path)
    _, _, _, steps = analyse(spans, tracks)
    xs = sorted(steps)
    bottom = [0.0] * len(xs)
    fig, ax = plt.subplots(figsize=(max(6, len(xs) * 0.3), 4))
    for cat, color in (("negotiate", "tab:orange"), ("queue", "tab:gray"),
                       ("copy", "tab:blue"), ("transfer", "tab:green")):
        vals = [steps[x][cat] / 1e3 for x in xs]
        ax.bar(xs, vals, bottom=bottom, label=cat, color=color)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_xlabel("step (k-th occurrence of each tensor)")
    ax.set_ylabel("ms (summed over tensors)")
    ax.set_title("where the time went per step")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m horovodlite.timeline", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file")
    p.add_argument("--top", type=int, default=10, help="how many slowest tensors to list")
    p.add_argument("--plot", metavar="PNG", help="draw time per step into this image")
    args = p.parse_args(argv)
    print(report(args.file, args.top))
    if args.plot:
        plot(args.file, args.plot)
        print(f"plot written to {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
