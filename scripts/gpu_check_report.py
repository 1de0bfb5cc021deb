"""Writes OUTDIR/results.json for scripts/gpu_check.sh from what its steps left in OUTDIR.

    python scripts/gpu_check_report.py OUTDIR [BUDGET_SECONDS ELAPSED_SECONDS]

Reads steps.tsv (step, status, exit code, seconds), each step's log and the benchmarks' JSON
files, and records: every step's status (with the end of its log when it did not succeed); the
builds (CMake's CUDA/NCCL line, what the libstdc++ guard said, how many of libstdc++'s own
symbols the module defines); --check-build's verdicts; the GPU tests' counts; the benchmark
figures; and the issue's targets for the GPU path with the measured value and whether it is met.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

GUARD_REPAIRED = "links libstdc++ statically into shared libraries; linking"
GUARD_REFUSED = "links libstdc++ statically into shared libraries (a test library"


def read_steps(out: Path) -> dict:
    steps = {}
    path = out / "steps.tsv"
    for line in path.read_text().splitlines() if path.exists() else []:
        fields = line.split("\t")
        if len(fields) == 4:
            name, status, rc, seconds = fields
            steps[name] = dict(status=status, exit_code=int(rc), seconds=int(seconds),
                               log=f"{name}.log")
    return steps


def log_text(out: Path, name: str) -> str:
    path = out / f"{name}.log"
    return path.read_text(errors="replace") if path.exists() else ""


def one_line(text: str) -> str:
    return " ".join(text.split())  # CMake wraps its messages


def parse_build(text: str) -> dict:
    flat = one_line(text)
    out = {}
    found = re.search(r"horovodlite: CUDA (ON|OFF) .*?Not found: [^.]*\.", flat)
    if found:
        out["cuda_line"] = found.group(0)
    compilers = re.search(r"the machine's compilers: (.*?CUDAHOSTCXX=\S+)", flat)
    if compilers:
        out["compilers"] = compilers.group(1)
    if GUARD_REFUSED in flat:
        out["libstdcxx_guard"] = "refused"
        message = re.search(r"horovodlite: the compiler .*?troubleshooting\.md\)\.", flat)
        out["guard_message"] = message.group(0) if message else ""
    elif GUARD_REPAIRED in flat:
        out["libstdcxx_guard"] = "repaired"
        message = re.search(r"horovodlite: (CXX|CUDAHOSTCXX)=\S+ links libstdc\+\+ [^(]*", flat)
        out["guard_message"] = message.group(0).strip() if message else ""
    else:
        out["libstdcxx_guard"] = "nothing to repair"
    symbols = re.search(r"libstdc\+\+ symbols defined by the module: (\d+)", text)
    if symbols:
        out["module_libstdcxx_symbols"] = int(symbols.group(1))
    return out


def parse_check_build(text: str) -> dict:
    out = {"ran": [line.strip() for line in text.splitlines()
                   if re.match(r"\s+\[[X !]\] (CPU|GPU)", line)]}
    verdict = re.search(r"^check-build: (.*)$", text, re.M)
    out["verdict"] = verdict.group(1) if verdict else "no verdict (see the log)"
    signal = re.search(r"killed by signal \d+ \(\w+\)", text)
    if signal:
        out["crash"] = signal.group(0)
    return out


def parse_pytest(text: str) -> dict:
    counts = {}
    summary = [line for line in text.splitlines() if re.search(r"\d+ (passed|failed|error)", line)]
    for word in ("passed", "failed", "skipped", "error", "errors", "xfailed"):
        found = re.search(rf"(\d+) {word}\b", summary[-1]) if summary else None
        if found:
            counts[word.rstrip("s") if word == "errors" else word] = int(found.group(1))
    counts["failures"] = [line for line in text.splitlines() if line.startswith("FAILED ")]
    return counts


def load_json(out: Path, name: str):
    path = out / name
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def allreduce_figures(result) -> list:
    """Per size: horovodlite, its peer and horovodlite on CPU tensors, in microseconds."""
    if not result:
        return []
    rows = {}
    for r in result["rows"]:
        if r["case"] == "single":
            rows.setdefault(r["bytes"], {})[r["library"]] = r["seconds"] * 1e6
    peer = result["peer"]
    figures = []
    for nbytes, libs in sorted(rows.items()):
        row = dict(bytes=nbytes, horovodlite_us=libs.get("horovodlite"),
                   peer=peer, peer_us=libs.get(peer), hvdl_cpu_tensors_us=libs.get("hvdl on CPU"))
        if row["horovodlite_us"] and row["peer_us"]:
            row["horovodlite_over_peer"] = row["horovodlite_us"] / row["peer_us"]
        figures.append(row)
    fusion = {r["library"]: r["seconds"] * 1e6 for r in result["rows"] if r["case"] == "fusion"}
    if fusion:
        figures.append(dict(case="fusion 200 x 64 KiB", us=fusion))
    return figures


def _size(figures, nbytes):
    return next((f for f in figures if f.get("bytes") == nbytes), None)


def load_lines(path: Path) -> list:
    """The JSON objects of a file of one object per line (benchmarks/gpu_profile.py's)."""
    try:
        text = path.read_text()
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def profile_figures(out: Path) -> dict:
    """profile/profile.json by case: step (ms/step, AccumulateGrad per call), small (4 B in both
    loop styles), staged (ms per size), each keyed by who ran it."""
    figures: dict = {}
    for row in load_lines(out / "profile" / "profile.json"):
        case = row.get("case")
        if case == "staged":
            figures.setdefault("staged", {}).setdefault(row["bytes"], {})[row["who"]] = row["ms"]
        elif case in ("step", "small"):
            figures.setdefault(case, {})[row["who"]] = row
    return figures


def ab_figures(out: Path) -> dict:
    """ab/<tree>-<np>-r<round>/profile.json: per metric, every round's value for base and work."""
    metrics: dict = {}
    for path in sorted((out / "ab").glob("*-r*/profile.json")):
        tree = path.parent.name.split("-")[0]
        for row in load_lines(path):
            if row.get("case") == "step":
                key = f"step {row['who']} ms"
                value = row["ms_per_step"]
            elif row.get("case") == "small":
                for style in ("loop", "waited"):
                    metrics.setdefault(f"4 B {row['who']} {style} us", {}).setdefault(
                        tree, []).append(row[f"{style}_us"])
                continue
            elif row.get("case") == "staged":
                key = f"staged {row['bytes']} B {row['who']} ms"
                value = row["ms"]
            else:
                continue
            metrics.setdefault(key, {}).setdefault(tree, []).append(value)
    return metrics


def targets(results: dict) -> dict:
    """The GPU path's targets (issue: as fast as DDP where users train, 2/2), where the figures
    exist: ResNet-50 at >= 98 % of plain torch and ahead of DDP (fp32, bf16); a 4 B allreduce
    at np 1 within 1.5x torch NCCL's time in both loop styles; staged no slower than gloo at
    every size from 1 MiB to 64 MiB."""
    out = {}
    for key, label in (("np1", "fp32"), ("bf16-np1", "bf16")):
        train = results["train"].get(key)
        if train:
            share = train.get("horovodlite_of_alone")
            if share is not None:
                out[f"ResNet-50 1 GPU {label}: >= 98% of plain torch"] = dict(
                    value=round(share, 4), met=share >= 0.98)
            ratio = train.get("horovodlite_over_ddp")
            if ratio is not None:
                out[f"ResNet-50 1 GPU {label}: ahead of DDP"] = dict(
                    value=round(ratio, 4), met=ratio >= 1.0)
    small = results.get("profile", {}).get("small", {})
    peer = next((w for w in small if not w.startswith("horovodlite")), None)
    if "horovodlite" in small and peer:
        for ours in sorted(w for w in small if w.startswith("horovodlite")):
            mode = "" if ours == "horovodlite" else f", {ours.split('-', 1)[1]} completion"
            for style in ("loop", "waited"):
                ratio = small[ours][f"{style}_us"] / small[peer][f"{style}_us"]
                out[f"np1 4 B ({style}{mode}): <= 1.5 x torch {peer}"] = dict(
                    value=round(ratio, 2), met=ratio <= 1.5)
    else:
        row = _size(results["allreduce"].get("np1") or [], 4)
        if row and row.get("horovodlite_over_peer") is not None:
            out["np1 4 B: horovodlite <= 1.5 x torch NCCL"] = dict(
                value=round(row["horovodlite_over_peer"], 2),
                met=row["horovodlite_over_peer"] <= 1.5)
    for nbytes in (1 << 20, 16 << 20, 64 << 20):
        row = _size(results["allreduce"].get("np2") or [], nbytes)
        if row and row.get("horovodlite_over_peer") is not None:
            out[f"np2 staged {nbytes >> 20} MiB: no slower than gloo"] = dict(
                value=round(row["horovodlite_over_peer"], 2),
                met=row["horovodlite_over_peer"] <= 1.0)
    return out


def report(out: Path, budget: int | None = None, elapsed: int | None = None) -> dict:
    steps = read_steps(out)
    for name, step in steps.items():
        if step["status"] not in ("ok", "dry-run", "skipped"):
            step["log_tail"] = log_text(out, name).strip().splitlines()[-20:]
    results = dict(budget_seconds=budget, elapsed_seconds=elapsed, steps=steps,
                   env=log_text(out, "env").strip().splitlines()[-12:])
    results["builds"] = {name: parse_build(log_text(out, name))
                         for name in ("build-distro", "build-default") if name in steps}
    if "build-default" in steps and "check-build:" in log_text(out, "build-default"):
        results["builds"]["build-default"]["check_build"] = parse_check_build(
            log_text(out, "build-default"))
    if "check-build" in steps:
        results["check_build"] = parse_check_build(log_text(out, "check-build"))
    if "gpu-tests" in steps:
        results["gpu_tests"] = parse_pytest(log_text(out, "gpu-tests"))
    results["allreduce"] = {key: allreduce_figures(load_json(out, f"allreduce-{key}.json"))
                            for key in ("np1", "np2")}
    results["train"] = {key: load_json(out, f"train-{key}.json") for key in ("np1", "bf16-np1")}
    results["profile"] = profile_figures(out)
    results["ab"] = ab_figures(out)
    results["targets"] = targets(results)
    stand_in = [name for name in out.glob("*.json") if name.name != "results.json"
                and "standing in" in str((load_json(out, name.name) or {}).get("gpu", ""))]
    stand_in += [path for path in [out / "profile" / "profile.json", *out.glob("ab/*/profile.json")]
                 if any("standing in" in str(row.get("gpu", "")) for row in load_lines(path))]
    if stand_in:  # HVDL_BENCH_CUDA_STAND_IN: a test of the plumbing, not a measurement
        results["stand_in"] = sorted(str(p.relative_to(out)) for p in stand_in)
        for target in results["targets"].values():
            target["note"] = "CPU standing in for the GPU: not a measurement"
    return results


def main(argv: list) -> int:
    out = Path(argv[0])
    budget = int(argv[1]) if len(argv) > 1 else None
    elapsed = int(argv[2]) if len(argv) > 2 else None
    results = report(out, budget, elapsed)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    for name, target in results["targets"].items():
        print(f"gpu_check: target {name}: {target['value']} "
              f"({'met' if target['met'] else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
