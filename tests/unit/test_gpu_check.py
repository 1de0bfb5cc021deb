"""scripts/gpu_check.sh, the lent GPU machine's one command, on a machine without a GPU.

Its syntax; the dry run (every step listed, nothing run, pip never asked to reach an index);
unknown steps refused; the budget honoured; two real steps (env, --check-build) with the report
they leave; and scripts/gpu_check_report.py on the files a GPU run leaves (guard refusal, pytest
counts, benchmark figures, the issue's targets). The benchmarks' own GPU code runs with the CPU
standing in, in tests/test_training_examples.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
STEPS = ["env", "mpi", "build-distro", "check-build", "bench-allreduce-np1",
         "bench-train-np1", "bench-train-bf16-np1", "bench-allreduce-np2", "profile-np1",
         "profile-staged-np2", "gpu-tests", "gpu-tests-host"]
AB_STEPS = ["env", "mpi", "build-distro", "ab-build", "ab-bench"]
# The profile on the CPU standing in for the GPU: a small model, few steps (the plumbing only).
STAND_IN = dict(HVDL_BENCH_CUDA_STAND_IN="1", HOROVODLITE_NO_REBUILD="1",
                HVDL_GPU_CHECK_PROFILE_ARGS="--model mlp --steps 2 --warmup 1 --ops 50")
sys.path.insert(0, str(ROOT / "scripts"))

import gpu_check_report  # noqa: E402
import gpu_report  # noqa: E402


def run(*args, timeout=300, **env) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout,
                          env={**os.environ, "PYTHON": sys.executable, **env})


def steps(out: Path) -> list:
    return [line.split("\t") for line in (out / "steps.tsv").read_text().splitlines()]


def test_syntax():
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0


def test_dry_run_lists_every_step_and_stays_offline(tmp_path):
    proc = run("--dry-run", str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [s[0] for s in steps(tmp_path)] == STEPS
    assert {s[1] for s in steps(tmp_path)} == {"dry-run"}
    pip = [line for line in proc.stdout.splitlines() if "pip install" in line]
    assert pip and all(line.count("pip install") == line.count("--no-index") for line in pip)
    assert "download" not in proc.stdout
    assert "CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++" in proc.stdout
    for step in STEPS:
        assert f"[{step}]" in proc.stdout
    results = json.loads((tmp_path / "results.json").read_text())
    assert list(results["steps"]) == STEPS
    with tarfile.open(f"{tmp_path}.tar.gz") as tar:  # the one archive, beside OUTDIR
        assert f"{tmp_path.name}/steps.tsv" in tar.getnames()


def test_ab_dry_run_lists_its_steps_and_refuses_an_unknown_revision(tmp_path):
    proc = run("--ab", "HEAD", "--dry-run", "--archive", str(tmp_path / "a.tgz"),
               str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [s[0] for s in steps(tmp_path / "out")] == AB_STEPS
    bench = next(line for line in proc.stdout.splitlines() if "[ab-bench]" in line)
    rounds = re.findall(r"round (\d): (base|work)", bench)
    assert rounds == [("1", "base"), ("1", "work"), ("2", "work"), ("2", "base"),
                      ("3", "base"), ("3", "work")]  # alternating which goes first
    assert "git archive 'HEAD'" in proc.stdout
    assert (tmp_path / "a.tgz").exists()
    proc = run("--ab", "no-such-revision", str(tmp_path / "x"))
    assert proc.returncode == 2 and "neither a folder" in proc.stderr


def test_profile_steps_archive_and_report_with_the_cpu_standing_in(tmp_path, capsys):
    out = tmp_path / "gc"
    proc = run("--only", "profile-np1,profile-staged-np2", str(out), timeout=240, **STAND_IN)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [s[:2] for s in steps(out)] == [["profile-np1", "ok"], ["profile-staged-np2", "ok"]]
    names = {p.name for p in (out / "profile").iterdir()}
    for who in ("plain", "horovodlite", "ddp"):
        assert {f"step_{who}.txt", f"step_{who}.json.gz"} <= names
    assert {"small_horovodlite.txt", "small_gloo.json.gz", "timeline_staged.json"} <= names
    assert gpu_report.main([f"{out}.tar.gz"]) == 0
    text = capsys.readouterr().out
    assert "CPU stood in for the GPU" in text
    loop = next(line for line in text.splitlines() if "loop of allreduce_" in line)
    assert "not measured" not in loop and loop.count(" us") == 2
    for label in ("1 MiB", "16 MiB", "64 MiB"):  # the profile run's staged figures
        row = next(line for line in text.splitlines() if line.startswith(f"| {label} |"))
        assert row.rstrip(" |").split("| ")[-1].count(" ms") == 2, row
    assert "np1 4 B (loop): <= 1.5 x torch gloo" in text
    assert "np1 4 B (waited): <= 1.5 x torch gloo" in text
    steps_rows = [line for line in text.splitlines() if line.startswith("| horovodlite (mlp")]
    assert steps_rows and "not measured" not in steps_rows[0]


def test_ab_bench_alternates_and_reports_with_the_cpu_standing_in(tmp_path, capsys):
    # ab-build is skipped, so "base" imports the same build as "work": the plumbing only.
    # 8 runs of the benchmark: about 65 s alone, over 200 s (the step's limit on a GPU
    # machine) beside the suite's other lanes.
    out = tmp_path / "ab"
    proc = run("--ab", "HEAD", "--only", "ab-bench", str(out), timeout=660,
               HVDL_GPU_CHECK_AB_ROUNDS="2", HVDL_GPU_CHECK_AB_SECONDS="600",
               HVDL_GPU_CHECK_SECONDS="620", **STAND_IN)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    made = sorted(p.parent.name for p in (out / "ab").glob("*/profile.json"))
    assert made == ["base-np1-r1", "base-np1-r2", "base-np2-r1", "base-np2-r2",
                    "work-np1-r1", "work-np1-r2", "work-np2-r1", "work-np2-r2"]
    assert gpu_report.main([str(out)]) == 0
    text = capsys.readouterr().out
    for metric in ("step horovodlite ms", "4 B horovodlite loop us", "staged 67108864 B "
                   "horovodlite ms"):
        row = next(line for line in text.splitlines() if line.startswith(f"| {metric} |"))
        assert "not measured" not in row and row.count("x") >= 2, row


def test_unknown_steps_and_usage_are_refused(tmp_path):
    proc = run("--only", "env,bogus", str(tmp_path))
    assert proc.returncode == 2 and "unknown step bogus" in proc.stderr
    assert run().returncode == 2


def test_a_spent_budget_skips_steps(tmp_path):
    proc = run("--only", "env,check-build", str(tmp_path), HVDL_GPU_CHECK_SECONDS="5")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [s[:2] for s in steps(tmp_path)] == [["env", "skipped"], ["check-build", "skipped"]]


def test_env_and_check_build_run_and_are_reported(tmp_path):
    proc = run("--only", "env,check-build", str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [s[:2] for s in steps(tmp_path)] == [["env", "ok"], ["check-build", "ok"]]
    assert "torch" in (tmp_path / "env.log").read_text()
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["check_build"]["verdict"] == "everything ran"
    assert any(line.startswith("[X] CPU: allreduce") for line in results["check_build"]["ran"])


def allreduce_json(peer, rows):
    return json.dumps(dict(np=1, device="cuda", gpu="NVIDIA H100 80GB HBM3", peer=peer, rows=[
        dict(case="single", bytes=n, library=lib, seconds=us * 1e-6)
        for n, libs in rows.items() for lib, us in libs.items()]))


def test_the_report_of_a_gpu_run(tmp_path):
    (tmp_path / "steps.tsv").write_text(
        "build-distro\tok\t0\t40\ncheck-build\tok\t0\t9\nbuild-default\tfailed\t1\t3\n"
        "gpu-tests\tfailed\t1\t100\n")
    (tmp_path / "build-distro.log").write_text(
        "-- horovodlite: CUDA ON (HVDL_WITH_CUDA=AUTO), NCCL ON (HVDL_WITH_NCCL=AUTO). Found: "
        "nvcc 13.0. Not found: nothing.\nlibstdc++ symbols defined by the module: 0\n")
    (tmp_path / "build-default.log").write_text(
        "the machine's compilers: CC=/opt/w/gcc CXX=/opt/w/g++ CUDAHOSTCXX=/opt/w/g++\n"
        "CMake Error at cmake/HvdlLibstdcxx.cmake:150 (message):\n"
        "  horovodlite: the compiler CXX=/opt/w/g++ links libstdc++ statically into shared\n"
        "  libraries (a test library built with it defines std::ostream::_M_insert<long>\n"
        "  itself), ... CXX=/usr/bin/g++ ... (see docs/troubleshooting.md).\n")
    (tmp_path / "check-build.log").write_text(
        "Running one allreduce on one rank:\n    [X] CPU: allreduce ...: correct\n"
        "    [X] GPU: allreduce ... on cuda:0 (NVIDIA H100): correct\n\n"
        "check-build: everything ran\n")
    (tmp_path / "gpu-tests.log").write_text("FAILED tests/test_gpu.py::x - boom\n"
                                            "1 failed, 250 passed, 9 skipped in 99.0s\n")
    (tmp_path / "allreduce-np1.json").write_text(allreduce_json("torch nccl", {
        4: {"torch nccl": 14.5, "horovodlite": 20.0, "hvdl on CPU": 3.0}}))
    (tmp_path / "allreduce-np2.json").write_text(allreduce_json("torch gloo", {
        4: {"torch gloo": 368, "horovodlite": 354}, 64 * 2**20: {"torch gloo": 37300,
                                                                 "horovodlite": 48800}}))
    (tmp_path / "train-np1.json").write_text(json.dumps(dict(horovodlite_of_alone=0.965)))
    assert gpu_check_report.main([str(tmp_path), "480", "300"]) == 0
    r = json.loads((tmp_path / "results.json").read_text())
    assert r["steps"]["gpu-tests"]["status"] == "failed" and r["steps"]["gpu-tests"]["log_tail"]
    assert r["builds"]["build-distro"]["module_libstdcxx_symbols"] == 0
    assert r["builds"]["build-distro"]["cuda_line"].startswith("horovodlite: CUDA ON")
    default = r["builds"]["build-default"]
    assert default["libstdcxx_guard"] == "refused" and "CXX=/opt/w/g++" in default["guard_message"]
    assert default["compilers"].startswith("CC=/opt/w/gcc")
    assert r["check_build"]["verdict"] == "everything ran" and len(r["check_build"]["ran"]) == 2
    assert (r["gpu_tests"]["passed"], r["gpu_tests"]["failed"], r["gpu_tests"]["skipped"]) == (
        250, 1, 9)
    assert r["gpu_tests"]["failures"] == ["FAILED tests/test_gpu.py::x - boom"]
    t = r["targets"]
    assert t["np1 4 B: horovodlite <= 1.5 x torch NCCL"] == dict(value=1.38, met=True)
    assert t["np2 staged 64 MiB: no slower than gloo"]["met"] is False
    assert "np2 staged 1 MiB: no slower than gloo" not in t  # not measured: no verdict
    assert t["ResNet-50 1 GPU fp32: >= 98% of plain torch"] == dict(value=0.965, met=False)
