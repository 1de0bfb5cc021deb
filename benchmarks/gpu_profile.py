"""Where the GPU path's time goes, in one run: profiles and split timings to analyse elsewhere.

    horovodliterun -np 1 python benchmarks/gpu_profile.py OUTDIR [--cases step,small]
    horovodliterun -np 2 python benchmarks/gpu_profile.py OUTDIR --cases staged

Cases (rank 0 writes; the ranks place themselves as benchmarks/gpu_setup.py says):
- ``step``: a training step (ResNet-50 of benchmarks/train_step.py, batch 64; ``--amp bf16``)
  of plain torch, horovodlite's DistributedOptimizer and DDP: ms/step over ``--steps`` timed
  steps each, then torch.profiler over 3 more. ``step_<who>.txt`` holds the profiler's tables
  (by self CPU and by self device time), ``step_<who>.json.gz`` its Chrome trace.
- ``small``: 4 B allreduces of a CUDA tensor, horovodlite and torch.distributed's peer, in two
  styles: ``loop`` (``--ops`` in-place allreduces back to back, then one device synchronize:
  the rate a stream of small ops gets) and ``waited`` (each op submitted, waited for and the
  device synchronized: its latency, split into submit and wait). Profiled as ``small_<who>``.
- ``staged``: allreduces of 4 B to 64 MiB at np 2 on one GPU, through host memory
  (HOROVOD_GPU_OPERATIONS=mpi): median ms per size, horovodlite and gloo on the CUDA tensors.
  With HOROVOD_TIMELINE set, horovodlite's timeline of them is the staged path's profile.

``--completions stream,host`` (the default) runs horovodlite's configurations under each
HOROVOD_GPU_COMPLETION mode (re-initialised between them); the default mode's (stream's) rows
are ``horovodlite``, the other's ``horovodlite-host``.

Every figure also goes to ``profile.json`` (one object per case and configuration, appended):
scripts/gpu_report.py turns them into docs/performance.md's tables. HVDL_BENCH_CUDA_STAND_IN=1 runs
the same code on the CPU (tests: the plumbing, not a measurement).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_setup  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import train_step  # noqa: E402  (the models)
import train_step_cuda  # noqa: E402  (the peer's start)
from torch.profiler import ProfilerActivity, profile  # noqa: E402

import horovodlite.torch as hvd  # noqa: E402

STAGED_SIZES = (4, 1 << 20, 16 << 20, 64 << 20)
DEFAULT_COMPLETION = "stream"  # HOROVOD_GPU_COMPLETION's default (csrc/common/config.cc)


def median_us(xs) -> float:
    return round(1e6 * statistics.median(xs), 2)


class Writer:
    def __init__(self, out: str, plan):
        self.out, self.plan = out, plan
        os.makedirs(out, exist_ok=True)

    def record(self, **fields) -> None:
        if hvd.rank() != 0:
            return
        fields.update(np=hvd.size(), gpu=self.plan.name())
        line = json.dumps(fields)
        print(line, flush=True)
        with open(os.path.join(self.out, "profile.json"), "a") as f:
            f.write(line + "\n")

    def dump(self, prof, tag: str, header: str) -> None:
        """The profiler's tables and its Chrome trace (gzipped), rank 0's."""
        if hvd.rank() != 0:
            return
        path = os.path.join(self.out, tag)
        events = prof.key_averages()
        with open(path + ".txt", "w") as f:
            f.write(header + "\n\n")
            f.write(events.table(sort_by="self_cpu_time_total", row_limit=30))
            if not self.plan.stand_in:
                f.write("\n\n" + events.table(sort_by="self_device_time_total", row_limit=15))
        prof.export_chrome_trace(path + ".json")
        with open(path + ".json", "rb") as src, gzip.open(path + ".json.gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.remove(path + ".json")


def activities(plan):
    return [ProfilerActivity.CPU] + ([] if plan.stand_in else [ProfilerActivity.CUDA])


def profiled(args, plan, w: Writer, tag: str, fields: dict, body) -> dict:
    """Runs ``body`` under torch.profiler (not with --no-profile), records ``fields`` (with
    what ``extra(prof)`` adds) and writes the tables and the trace."""
    if args.no_profile:
        w.record(**fields)
        return fields
    with profile(activities=activities(plan)) as prof:
        body()
        plan.synchronize()
    if fields.get("case") == "step":
        fields["accumulate_grad_us"] = per_call_us(prof, "torch::autograd::AccumulateGrad")
    w.record(**fields)
    w.dump(prof, tag, json.dumps(fields))
    return fields


def per_call_us(prof, name: str):
    """Mean CPU microseconds per call of the profiled op ``name`` (None when absent)."""
    for e in prof.key_averages():
        if e.key == name and e.count:
            return round(e.cpu_time_total / e.count, 2)
    return None


def completion(mode: str) -> str:
    """Restarts horovodlite under HOROVOD_GPU_COMPLETION=``mode`` when it runs under another;
    the label of its rows."""
    if os.environ.get("HOROVOD_GPU_COMPLETION", DEFAULT_COMPLETION) != mode:
        os.environ["HOROVOD_GPU_COMPLETION"] = mode
        hvd.shutdown()
        hvd.init()
    return "horovodlite" if mode == DEFAULT_COMPLETION else f"horovodlite-{mode}"


def configurations(args, peer: str) -> list:
    """(label, completion mode or None) in the order they run: the peer's first, then ours."""
    return [(peer, None)] + [(None, mode) for mode in args.completions]


def who_runs(mode, peer: str) -> str:
    """The label of a configuration: ``peer`` (mode None) or horovodlite, restarted under
    ``mode`` when needed."""
    return peer if mode is None else completion(mode)


def case_step(args, plan, w: Writer) -> None:
    for who, mode in [("plain", None)] + configurations(args, "ddp"):
        one_step_configuration(args, plan, w, who_runs(mode, who))


def one_step_configuration(args, plan, w: Writer, who: str) -> None:
    device = plan.torch_device
    model = train_step.make_model(args.model).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if who.startswith("horovodlite"):
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    elif who == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=plan.ddp_device_ids)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = (t.to(device) for t in train_step.make_batch(args.model, args.batch_size, hvd.rank()))

    def step():
        opt.zero_grad(set_to_none=True)
        with plan.autocast(args.amp):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()

    def three_steps():
        for _ in range(3):
            step()

    for _ in range(args.warmup):
        step()
    plan.synchronize()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        plan.synchronize()
        times.append(time.perf_counter() - t0)
    fields = dict(case="step", who=who, model=args.model, amp=args.amp or "fp32",
                  batch=args.batch_size, ms_per_step=round(1e3 * statistics.median(times), 3),
                  ms_min=round(1e3 * min(times), 3), parameters=sum(1 for _ in model.parameters()))
    profiled(args, plan, w, f"step_{who}", fields, three_steps)


def small_ops(t, who: str):
    """(submit, wait) of an in-place 4 B allreduce for ``who``."""
    if who.startswith("horovodlite"):
        return (lambda: hvd.allreduce_async_(t, name="profile.small", op=hvd.Sum)), hvd.synchronize
    return (lambda: dist.all_reduce(t, async_op=True)), (lambda h: h.wait())


def case_small(args, plan, w: Writer) -> None:
    t = torch.ones(1, device=plan.torch_device)
    for who, mode in configurations(args, plan.peer_backend):
        label = who_runs(mode, who)
        one_small_configuration(args, plan, w, label, *small_ops(t, label))


def one_small_configuration(args, plan, w: Writer, who: str, submit, wait) -> None:
    def ops():
        for _ in range(min(300, args.ops)):
            wait(submit())

    for _ in range(args.ops // 10):
        wait(submit())
    plan.synchronize()
    rounds = []
    for _ in range(5):  # loop: back to back, one synchronize at the end
        t0 = time.perf_counter()
        for _ in range(args.ops):
            wait(submit())  # in-place allreduce_ as a user writes it: submit, then wait
        plan.synchronize()
        rounds.append((time.perf_counter() - t0) / args.ops)
    sub, wt = [], []
    for _ in range(args.ops):  # waited: each op's latency, the device synchronized too
        t0 = time.perf_counter()
        h = submit()
        t1 = time.perf_counter()
        wait(h)
        plan.synchronize()
        t2 = time.perf_counter()
        sub.append(t1 - t0)
        wt.append(t2 - t1)
    total = [a + b for a, b in zip(sub, wt)]
    fields = dict(case="small", who=who, bytes=4, loop_us=median_us(rounds),
                  waited_us=median_us(total), submit_us=median_us(sub), wait_us=median_us(wt),
                  waited_p90_us=round(1e6 * sorted(total)[len(total) * 9 // 10], 2))
    profiled(args, plan, w, f"small_{who}", fields, ops)


def case_staged(args, plan, w: Writer) -> None:
    for nbytes in STAGED_SIZES:
        t = torch.ones(max(1, nbytes // 4), device=plan.torch_device)
        for who, mode in configurations(args, plan.peer_backend):
            one_staged_configuration(plan, w, who_runs(mode, who), t, nbytes)


def one_staged_configuration(plan, w: Writer, who: str, t, nbytes: int) -> None:
    reps = 100 if nbytes <= 4096 else (20 if nbytes <= 1 << 20 else 5)

    def one():
        if who.startswith("horovodlite"):
            hvd.allreduce_(t, name=f"profile.staged.{nbytes}", op=hvd.Sum)
        else:
            dist.all_reduce(t)

    for _ in range(2):
        one()
    plan.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        one()
        plan.synchronize()
        times.append(time.perf_counter() - t0)
    w.record(case="staged", who=who, bytes=nbytes, shared_gpu=plan.shared,
             ms=round(1e3 * statistics.median(times), 4))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="folder for the tables, traces and profile.json")
    p.add_argument("--cases", default="step,small", help="step, small, staged (comma separated)")
    p.add_argument("--model", default="resnet50", choices=list(train_step.BATCHES))
    p.add_argument("--batch-size", type=int, default=None, help="default: the model's")
    p.add_argument("--amp", choices=["bf16"], default=None)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--steps", type=int, default=20, help="timed steps per configuration")
    p.add_argument("--ops", type=int, default=1000, help="4 B ops per style (small)")
    p.add_argument("--completions", default="stream,host",
                   help="HOROVOD_GPU_COMPLETION modes to run horovodlite under (comma separated)")
    p.add_argument("--no-profile", action="store_true",
                   help="the timings alone: no torch.profiler run, no tables or traces")
    args = p.parse_args(argv)
    cases = args.cases.split(",")
    args.completions = args.completions.split(",")
    if set(args.completions) - {"host", "stream"}:
        p.error(f"--completions: host and/or stream, not {args.completions}")
    unknown = set(cases) - {"step", "small", "staged"}
    if unknown:
        p.error(f"unknown case(s) {sorted(unknown)}; the cases: step, small, staged")
    if args.batch_size is None:
        args.batch_size = train_step.BATCHES[args.model][2]
    plan = gpu_setup.setup("benchmarks/gpu_profile.py", hvd)
    torch.backends.cudnn.benchmark = True
    train_step_cuda.init_peer(plan.peer_backend)
    w = Writer(args.out, plan)
    for case in cases:
        {"step": case_step, "small": case_small, "staged": case_staged}[case](args, plan, w)
        dist.barrier()
    dist.destroy_process_group()
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
