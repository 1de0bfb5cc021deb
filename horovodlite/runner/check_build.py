"""``horovodliterun --check-build``: what this build has, proved by running it.

Prints the version, the frameworks, the controllers and the tensor operations the installed
extension was built with, then runs one allreduce on one rank on the CPU and, when the build has
CUDA and torch sees a GPU, one on the GPU, and says what ran and whether the result was right.

Every part runs in a child process (``python -m horovodlite.runner.check_build --worker PART``):
an extension that crashes (a module carrying its own libstdc++ segfaulted at its first
collective, docs/troubleshooting.md) is reported with the signal that ended it instead of taking
the check down with it. Exit status 0 when everything that could run ran and was right, else 1.

HVDL_TEST_CHECK_BUILD_CRASH=PART (tests only) makes that part's child kill itself with SIGSEGV.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

WORKER_TIMEOUT = 180.0  # seconds: importing torch and a singleton MPI start take a few
ELEMENTS = 1024  # elements of the tensor reduced
TROUBLESHOOTING = "docs/troubleshooting.md"


# ------------------------------------------------------------------------------ the children


def _maybe_crash(part: str) -> None:
    if os.environ.get("HVDL_TEST_CHECK_BUILD_CRASH") == part:
        os.kill(os.getpid(), signal.SIGSEGV)


def _info() -> dict:
    """What the extension says about itself (imports it; runs nothing)."""
    _maybe_crash("info")
    import torch

    import horovodlite
    from horovodlite import _extension
    from horovodlite.common import basics

    c = _extension.load()
    return dict(
        version=horovodlite.__version__,
        module=c.__file__,
        torch=torch.__version__,
        torch_cuda=torch.version.cuda,
        mpi=bool(c.mpi_built()),
        mpi_library=c.mpi_library_version().strip().splitlines()[0].split(",")[0]
        if c.mpi_built() else "",
        transport=c.transport_version(),
        gloo=bool(basics.gloo_built()),
        cuda=bool(basics.cuda_built()),
        nccl=int(basics.nccl_built()),
        gpus=torch.cuda.device_count() if torch.cuda.is_available() else 0,
        gpu_operations=os.environ.get("HOROVOD_GPU_OPERATIONS", "nccl"),
    )


def _allreduce(device: str) -> dict:
    """One in-place Sum of float32[ELEMENTS] on this rank alone, checked against the input."""
    _maybe_crash(device)
    import torch

    import horovodlite.torch as hvd

    start = time.perf_counter()
    hvd.init()
    if device == "cuda":
        torch.cuda.set_device(0)
    where = torch.device(device)
    t = torch.arange(ELEMENTS, dtype=torch.float32, device=where)
    expected = t.clone() * hvd.size()
    hvd.allreduce_(t, op=hvd.Sum, name=f"check_build.{device}")
    if device == "cuda":
        torch.cuda.synchronize()
    ok = bool(torch.equal(t, expected))
    out = dict(ok=ok, size=hvd.size(), seconds=time.perf_counter() - start,
               device=str(t.device))
    if device == "cuda":
        out["gpu"] = torch.cuda.get_device_name(0)
    if not ok:
        out["got"] = t[:4].tolist()
    hvd.shutdown()
    return out


def _worker(part: str) -> int:
    result = _info() if part == "info" else _allreduce(part)
    print("HVDL_CHECK_BUILD " + json.dumps(result), flush=True)
    return 0


# ------------------------------------------------------------------------------- the parent


class Outcome:
    """A child's result: ``data`` (its JSON) or ``error`` (why there is none)."""

    def __init__(self, data: dict | None = None, error: str = "", output: str = ""):
        self.data, self.error, self.output = data, error, output


def _child_env() -> dict:
    # A singleton: none of a surrounding job's launcher variables.
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("OMPI_COMM_WORLD", "PMIX_", "PMI_", "HVDL_REPORT_"))}


def run_part(part: str, timeout: float = WORKER_TIMEOUT) -> Outcome:
    cmd = [sys.executable, "-m", "horovodlite.runner.check_build", "--worker", part]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              env=_child_env(), stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        out = "".join(x.decode(errors="replace") if isinstance(x, bytes) else x
                      for x in (e.stdout, e.stderr) if x)
        return Outcome(error=f"did not finish within {timeout:.0f} s", output=out)
    output = proc.stdout + proc.stderr
    if proc.returncode < 0:
        sig = -proc.returncode
        name = signal.Signals(sig).name if sig in signal.valid_signals() else str(sig)
        return Outcome(error=f"the process was killed by signal {sig} ({name})", output=output)
    for line in proc.stdout.splitlines():
        if line.startswith("HVDL_CHECK_BUILD "):
            return Outcome(data=json.loads(line.split(" ", 1)[1]), output=output)
    return Outcome(error=f"the process exited with status {proc.returncode}", output=output)


def nccl_text(code: int) -> str:
    """23203 -> '2.32.3' (NCCL_VERSION_CODE; before 2.9: 1000 x major + 100 x minor + patch)."""
    if code >= 20900:
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"


def _box(flag: bool) -> str:
    return "[X]" if flag else "[ ]"


def describe(info: dict) -> list:
    """The build's capabilities, as lines."""
    nccl = info["nccl"]
    cuda = info["cuda"]
    transport = info["transport"] or ""
    return [
        f"horovodlite v{info['version']} ({info['module']})",
        "",
        "Available frameworks:",
        f"    [X] PyTorch {info['torch']}"
        + (f" (CUDA {info['torch_cuda']})" if info.get("torch_cuda") else " (no CUDA)"),
        "",
        "Available controllers:",
        f"    {_box(info['mpi'])} MPI" + (f" ({info['mpi_library']})" if info["mpi"] else ""),
        f"    {_box(info['gloo'])} Gloo",
        "",
        "Available tensor operations:",
        f"    {_box(nccl)} NCCL" + (f" {nccl_text(nccl)}" if nccl else ""),
        f"    {_box(cuda)} CUDA" + (" (CUDA tensors: kernels, host staging)" if cuda else ""),
        f"    {_box(info['mpi'])} " + (transport if transport.startswith("MPI") else
                                            f"MPI ({transport})" if info["mpi"] else "MPI"),
        f"    {_box(info['gloo'])} Gloo",
    ]


def _failure(what: str, outcome: Outcome, module: str = "<the _C module>") -> list:
    lines = [f"    [!] {what}: FAILED: {outcome.error}"]
    if "signal" in outcome.error:
        lines.append("        the extension crashed. A module that carries its own libstdc++ "
                     f"does this (check: nm -D --defined-only {module} | grep "
                     f"_ZNSo9_M_insert); see {TROUBLESHOOTING}.")
    tail = outcome.output.strip().splitlines()[-15:]
    lines += ["        | " + line for line in tail]
    return lines


def _ran(what: str, outcome: Outcome, how: str, module: str) -> tuple:
    if outcome.data is None:
        return False, _failure(what, outcome, module)
    d = outcome.data
    verdict = "correct" if d["ok"] else f"WRONG (first elements {d.get('got')})"
    device = d["device"] + (f" ({d['gpu']})" if d.get("gpu") else "")
    line = (f"    {_box(d['ok'])} {what}: allreduce (Sum, in place) of float32[{ELEMENTS}] on "
            f"{device}, {d['size']} rank{'s' if d['size'] > 1 else ''}{how}: {verdict} "
            f"({d['seconds']:.2f} s with start-up)")
    return d["ok"], [line]


def check_build(out=None) -> int:
    """Prints the report; 0 when everything ran and was right, else 1."""
    out = out or sys.stdout

    def say(*lines):
        for line in lines:
            print(line, file=out, flush=True)

    info = run_part("info")
    if info.data is None:
        say("horovodlite --check-build", *_failure("loading the extension", info))
        return 1
    say(*describe(info.data), "", "Running one allreduce on one rank:")
    d = info.data
    ok, lines = _ran("CPU", run_part("cpu"), " through MPI", d["module"])
    say(*lines)
    if not d["cuda"]:
        say("    [ ] GPU: not run: this build has no CUDA (see docs/gpu.md)")
    elif not d["gpus"]:
        say("    [ ] GPU: not run: no GPU visible (torch.cuda.is_available() is False)")
    else:
        how = (f" through NCCL {nccl_text(d['nccl'])}"
               if d["nccl"] and d["gpu_operations"] != "mpi" else " staged through host memory")
        gpu_ok, lines = _ran("GPU", run_part("cuda"), how, d["module"])
        ok = ok and gpu_ok
        say(*lines)
    say("", "check-build: " + ("everything ran" if ok else f"FAILED (see above and "
                                                             f"{TROUBLESHOOTING})"))
    return 0 if ok else 1


def main(argv: list | None = None) -> int:
    p = argparse.ArgumentParser(prog="horovodlite.runner.check_build")
    p.add_argument("--worker", choices=["info", "cpu", "cuda"])
    args = p.parse_args(argv)
    if args.worker:
        return _worker(args.worker)
    return check_build()


if __name__ == "__main__":
    sys.exit(main())
