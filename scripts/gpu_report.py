"""The tables of a GPU run, from the one archive scripts/gpu_check.sh leaves (or its folder).

    python scripts/gpu_report.py OUTDIR.tar.gz [--json]

Prints, as Markdown ready for docs/performance.md's GPU section: the steps (status, seconds), the
training step against plain torch and DDP, the 4 B allreduce in both loop styles against torch's
peer, the staged path against gloo per size, what the profile says per configuration (ms/step,
AccumulateGrad per call), the A/B rounds of ``--ab`` (median of each side, the ratio and the
range over rounds), and every target with its measured value. Figures a run did not produce are
shown as "not measured", never guessed. A run with the CPU standing in for the GPU (tests) says
so at the top. ``--json``: the parsed results (scripts/gpu_check_report.py's) instead.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_check_report  # noqa: E402

NOT_MEASURED = "not measured"


def unpack(source: Path, into: Path) -> Path:
    """The run's folder: ``source`` itself, or the one folder its archive holds."""
    if source.is_dir():
        return source
    with tarfile.open(source) as tar:
        try:
            tar.extractall(into, filter="data")
        except TypeError:  # Python before 3.11.4 has no filters
            tar.extractall(into)  # noqa: S202  (our own run's archive)
    folders = [p for p in into.iterdir() if p.is_dir()]
    if len(folders) != 1:
        raise SystemExit(f"gpu_report: {source} should hold one folder, it holds {folders}")
    return folders[0]


def fmt(value, unit="", digits=1) -> str:
    return NOT_MEASURED if value is None else f"{value:,.{digits}f}{unit}"


def table(head: list, rows: list) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def steps_table(results: dict) -> str:
    rows = [(name, s["status"], s["seconds"]) for name, s in results["steps"].items()]
    return table(["step", "status", "seconds"], rows)


def rate_share(rate, share) -> str:
    if rate is None or share is None:
        return NOT_MEASURED
    return f"{rate:,.0f} img/s = {100 * share:.1f} %"


def training_table(results: dict) -> str:
    rows = []
    for key, label in (("np1", "fp32"), ("bf16-np1", "bf16 autocast")):
        t = results["train"].get(key) or {}
        rates = t.get("per_second", {})
        ours = next((v for k, v in rates.items() if k.startswith("horovodlite")), None)
        ddp = next((v for k, v in rates.items() if k.startswith("DDP")), None)
        share = t.get("horovodlite_of_alone")
        ddp_share = t.get("ddp_of_alone")
        rows.append((f"ResNet-50, 1 GPU, {label}", rate_share(ours, share),
                     rate_share(ddp, ddp_share), fmt(t.get("horovodlite_over_ddp"), "x", 3)))
    return table(["training step", "horovodlite (share of plain torch)", "DDP",
                  "horovodlite / DDP"], rows)


def small_table(results: dict) -> str:
    small = results["profile"].get("small", {})
    peer = next((w for w in small if not w.startswith("horovodlite")), None)
    theirs = small.get(peer, {}) if peer else {}
    rows = []
    for who in ["horovodlite"] + sorted(w for w in small if w.startswith("horovodlite-")):
        ours = small.get(who, {})
        mode = "" if who == "horovodlite" else f" ({who.split('-', 1)[1]} completion)"
        for style, what in (("loop", "loop of allreduce_"), ("waited", "each op waited for")):
            a, b = ours.get(f"{style}_us"), theirs.get(f"{style}_us")
            rows.append((f"4 B, np 1, {what}{mode}", fmt(a, " us"), fmt(b, " us"),
                         fmt(a / b if a and b else None, "x", 2)))
        if ours:
            rows.append((f"  the waited op split: submit + wait{mode}",
                         f"{fmt(ours.get('submit_us'), ' us')} + {fmt(ours.get('wait_us'), ' us')}",
                         f"{fmt(theirs.get('submit_us'), ' us')} + "
                         f"{fmt(theirs.get('wait_us'), ' us')}", ""))
    return table(["CUDA allreduce", "horovodlite", f"torch {peer or 'peer'}", "ratio"], rows)


def staged_table(results: dict) -> str:
    rows = []
    by_size = {r["bytes"]: r for r in results["allreduce"].get("np2") or [] if "bytes" in r}
    profiled = results["profile"].get("staged", {})
    for nbytes in sorted(set(by_size) | set(profiled) | {1 << 20, 16 << 20, 64 << 20}):
        row = by_size.get(nbytes, {})
        prof = profiled.get(nbytes, {})
        ours = row.get("horovodlite_us")
        theirs = row.get("peer_us")
        p_ours = prof.get("horovodlite")
        p_theirs = next((v for k, v in prof.items() if not k.startswith("horovodlite")), None)
        rows.append((size_label(nbytes), fmt(ours and ours / 1e3, " ms", 3),
                     fmt(theirs and theirs / 1e3, " ms", 3),
                     fmt(ours / theirs if ours and theirs else None, "x", 2),
                     f"{fmt(p_ours, ' ms', 3)} / {fmt(p_theirs, ' ms', 3)}"))
    return table(["np 2 on one GPU, staged", "horovodlite", "gloo (CUDA tensors)", "ratio",
                  "profile run: horovodlite / gloo"], rows)


def profile_table(results: dict) -> str:
    step = results["profile"].get("step", {})
    rows = []
    for who in sorted(set(step) | {"plain", "horovodlite", "horovodlite-host", "ddp"}):
        r = step.get(who, {})
        rows.append((f"{who} ({r['model']}, batch {r['batch']}, {r['amp']})" if r else who,
                     fmt(r.get("ms_per_step"), " ms", 2), fmt(r.get("accumulate_grad_us"), " us"),
                     r.get("parameters", "")))
    return table(["profiled step", "ms/step", "AccumulateGrad per call", "parameters"], rows)


def ab_table(results: dict) -> str:
    rows = []
    for metric, sides in sorted(results.get("ab", {}).items()):
        base, work = sides.get("base", []), sides.get("work", [])
        if not base or not work:
            rows.append((metric, fmt(None), fmt(None), "", ""))
            continue
        b, w = statistics.median(base), statistics.median(work)
        rows.append((metric, f"{b:.4g}", f"{w:.4g}", f"{w / b:.3f}x",
                     f"{min(work) / max(base):.3f}-{max(work) / min(base):.3f}x"))
    return table(["A/B metric (median over rounds)", "base", "work", "work / base",
                  "range"], rows)


def targets_table(results: dict) -> str:
    rows = [(name, t["value"], "met" if t["met"] else "**not met**")
            for name, t in results["targets"].items()]
    return table(["target", "measured", "verdict"], rows) if rows else "No target measured."


def size_label(n: int) -> str:
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} B"


def render(results: dict) -> str:
    parts = []
    if results.get("stand_in"):
        parts.append("**The CPU stood in for the GPU in this run: a test of the plumbing, not a "
                     "measurement.**")
    gpu = next((line for line in results.get("env", []) if "torch" in line), "")
    parts.append(f"Run: {results.get('elapsed_seconds')} s of a {results.get('budget_seconds')} s "
                 f"budget. {gpu}".strip())
    parts += ["### Steps", steps_table(results)]
    if results["steps"].get("ab-bench"):
        parts += ["### A/B", ab_table(results)]
    else:
        parts += ["### Training", training_table(results), "### Small allreduces",
                  small_table(results), "### Staged through host memory", staged_table(results),
                  "### Profile", profile_table(results)]
    parts += ["### Targets", targets_table(results)]
    return "\n\n".join(parts) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("source", type=Path, help="the archive (OUTDIR.tar.gz) or the run's folder")
    p.add_argument("--json", action="store_true", help="the parsed results as JSON")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        out = unpack(args.source, Path(tmp))
        saved = gpu_check_report.load_json(out, "results.json") or {}
        results = gpu_check_report.report(out, saved.get("budget_seconds"),
                                          saved.get("elapsed_seconds"))
    print(json.dumps(results, indent=1) if args.json else render(results), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
