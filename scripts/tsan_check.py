"""ThreadSanitizer over the core's threads: builds the TSan variant of the extension
(scripts/sanitize.py --sanitize thread) and runs the C++ unit tests whose ranks and background
threads are threads of one process (horovodlite._testing: the handle table's waits, the tensor
queue's wake-ups, launcher notices, stream completion's failure path, the device in-flight
window, the transport failures that abort every algorithm, the negotiation), and a small program
for the one path those cannot reach (scripts/tsan_payload_check.cc: TorchPayload's device events
read by WaitForHandle after an abort, CUDA ops only), then summarises what TSan reported.

    python scripts/tsan_check.py                        # build/sanitize-thread
    HVDL_SANITIZE_ROOT=/tmp/hvdl-san python scripts/tsan_check.py [-- unit/test_x.py ...]

Reports go to files (TSAN_OPTIONS log_path), not to stderr: pytest captures a test's stderr
and shows it only when the test fails, and a race does not fail a test. The summary lists each
distinct report (its SUMMARY line and the first frames of csrc of both accesses); the exit status
is 1 when a test failed or TSan reported something outside the suppressions below, else 0
(pytest exits 66, TSan's exit code, after an unsuppressed report).
docs/sanitizers.md has the measured run and why TSan needs what `environment` sets here.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import sanitize  # noqa: E402

KIND = "thread"
TESTS = ["unit/test_handle_waits.py", "unit/test_queue_wakes.py",
         "unit/test_launcher_notices.py", "unit/test_stream_failure.py",
         "unit/test_device_inflight.py", "unit/test_transport_failures.py",
         "unit/test_negotiation.py"]

# Reports that are not ours, each with why:
SUPPRESSIONS = """\
# glibc's dynamic TLS: a thread_local of a dlopen()ed module (handle_table.cc's CompletionBatch
# depth, ring.cc's) gets its block from malloc in __tls_get_addr on the thread's first use;
# glibc frees it in _dl_deallocate_tls when a later thread takes over the dead one's cached stack.
# The hand-over is ordered by glibc's stack cache lock, which TSan cannot see (ld.so is not
# instrumented): "race" between malloc in tls_get_addr_tail and free in _dl_deallocate_tls.
race:_dl_deallocate_tls
# memcpy & co. called by torch's own code (TensorIterator's shapes, copied between torch's OpenMP
# threads): torch and its libgomp, whose thread team's hand-offs TSan cannot see, are not
# instrumented ("race" in c10::SmallVectorImpl::operator=, test_scale.py, test_config.py).
called_from_lib:libtorch_cpu.so
called_from_lib:libgomp.so
# test_shm.py forks its members (die_after_fork=0 below lets a forked child start threads): in
# the child, torch's fork handlers unlock mutexes the parent's threads held at the fork ("unlock
# of an unlocked mutex" in libtorch_python.so); uninstrumented, nothing of ours.
mutex:libtorch_python.so
"""


def environment(logs: Path) -> dict[str, str]:
    env = sanitize.environment(KIND)
    supp = logs / "tsan.supp"
    supp.write_text(SUPPRESSIONS)
    env["TSAN_OPTIONS"] = ":".join([
        f"log_path={logs / 'tsan'}",      # one file per process: tsan.<pid>
        f"suppressions={supp}",
        "halt_on_error=0",                # every report of a run, not the first only
        # test_shm.py forks its members from a process with threads; by default TSan kills a
        # forked child that starts a thread, and the test waited 60 s for each member's result
        "die_after_fork=0",
        "second_deadlock_stack=1",
        "history_size=4",                 # the "previous access" stacks of a long test
    ])
    # (sanitize.environment turns UCX's memory hooks off: see there)
    env["HOROVODLITE_NO_REBUILD"] = "1"  # built just before; cpp_testing's build is a no-op
    return env


def reports(logs: Path) -> list[str]:
    out = []
    for f in sorted(logs.glob("tsan.[0-9]*")):
        out += [b for b in f.read_text(errors="replace").split("==================")
                if "WARNING: ThreadSanitizer" in b]
    return out


def describe(report: str) -> str:
    """The report's SUMMARY line and, per access, its thread and first frame of ours (csrc/,
    scripts/; else the first frame) as file:line, without addresses (distinct reports only)."""
    summary = next((ln for ln in report.splitlines() if ln.startswith("SUMMARY:")), "?")
    lines = [summary]
    for head, stack in re.findall(r"\n  (\S[^\n]*:)\n((?:    #[^\n]*\n)+)", report):
        if head.startswith(("Location", "Thread", "Mutex")):
            continue
        ours = re.search(r" (\S*/(?:csrc|scripts)/\S+:\d+)", stack)
        first = (re.findall(r"(\S+:\d+)", stack.splitlines()[0]) or ["?"])[-1]
        where = ours.group(1).split("/main/")[-1] if ours else first
        lines.append("    " + re.sub(r" at 0x[0-9a-f]+", "", head) + " " + where)
    return "\n".join(lines)


def payload_check(logs: Path) -> int:
    """scripts/tsan_payload_check.cc built with TSan and run; its exit status (66: a report)."""
    import torch

    tdir = Path(torch.__file__).parent
    exe = logs / "tsan_payload_check"
    abi = f"-D_GLIBCXX_USE_CXX11_ABI={int(torch.compiled_with_cxx11_abi())}"
    subprocess.run(["c++", "-std=c++20", "-fsanitize=thread", "-O1", "-g", abi,
                    f"-I{ROOT / 'csrc'}", f"-I{tdir / 'include'}",
                    str(ROOT / "scripts" / "tsan_payload_check.cc"),
                    str(ROOT / "csrc" / "core" / "handle_table.cc"), "-o", str(exe),
                    f"-L{tdir / 'lib'}", "-lc10", f"-Wl,-rpath,{tdir / 'lib'}", "-pthread"],
                   check=True)
    env = {**os.environ, "TSAN_OPTIONS": f"log_path={logs / 'tsan'}:halt_on_error=0"}
    return subprocess.run([str(exe)], env=env, timeout=300).returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timeout", type=float, default=900, help="for the test run, seconds")
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    tests = argv[split + 1:] or TESTS

    start = time.monotonic()
    sanitize.build(KIND)
    built = time.monotonic()
    logs = sanitize.folder(KIND) / "tsan-logs"
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir(parents=True)
    # From tests/, like the ASan lane: `python -m` puts the working folder first on sys.path, and
    # the source tree's horovodlite is the unsanitized one. sys.executable: a pyenv shim is a
    # shell script, and shells crash at start with libtsan preloaded.
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
           "-o", "faulthandler_timeout=120", *tests]
    try:
        proc = subprocess.run(cmd, cwd=ROOT / "tests", env=environment(logs),
                              timeout=args.timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        print(f"tsan_check: the tests ran past {args.timeout:.0f} s", file=sys.stderr)
        rc = 124
    end = time.monotonic()
    payload_rc = payload_check(logs)

    found = reports(logs)
    distinct: dict[str, int] = {}
    for r in found:
        key = describe(r)
        distinct[key] = distinct.get(key, 0) + 1
    print(f"tsan_check: build {built - start:.0f} s, tests {end - built:.0f} s "
          f"(pytest exit {rc}); logs in {logs}")
    if not distinct:
        print("tsan_check: ThreadSanitizer reported nothing (beyond SUPPRESSIONS here)")
    for key, n in distinct.items():
        print(f"tsan_check: {n} x {key}")
    print(f"tsan_check: tsan_payload_check.cc (TorchPayload's events on the abort path) "
          f"exit {payload_rc}")
    return 1 if rc != 0 or payload_rc != 0 or distinct else 0


if __name__ == "__main__":
    sys.exit(main())
