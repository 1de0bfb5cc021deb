"""GPU support that can be checked without a GPU: feature probes, argument checks for CUDA
tensors in a CPU-only build (with tensors that only claim to be on CUDA), CPU/GPU placement in
negotiation, the Python-side placement checks (device_check), and the bucket layout's decisions
for CUDA parameters (buckets.py, with stand-ins for the parameters, the reducer and the ranks)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from cpp_testing import load_testing_module

import horovodlite.torch as hvd
from horovodlite.torch import device_check, functions, submission
from horovodlite.torch.buckets import BucketLayout, device_can_bucket

ROOT = Path(__file__).parents[2]
T = load_testing_module()


class FakeCuda(torch.Tensor):
    """A tensor that reports device cuda:N but has no storage (works on CPU-only torch)."""

    @staticmethod
    def __new__(cls, shape, dtype=torch.float32, index=0):
        return torch.Tensor._make_wrapper_subclass(cls, shape, dtype=dtype,
                                                   device=f"cuda:{index}")

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise RuntimeError(f"FakeCuda has no data ({func})")


def test_feature_probes_agree():
    assert isinstance(hvd.cuda_built(), bool)
    assert isinstance(hvd.nccl_built(), int)
    if not hvd.cuda_built():
        assert hvd.nccl_built() == 0
    if hvd.nccl_built():
        assert hvd.nccl_built() >= 2000 and hvd.cuda_built()


@pytest.mark.skipif(hvd.cuda_built(), reason="checks the CPU-only build's message")
def test_cuda_tensors_in_a_cpu_only_build_are_value_errors_naming_the_build():
    script = textwrap.dedent(f"""
        import torch, horovodlite.torch as hvd
        import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_gpu_support import FakeCuda
        hvd.init()
        calls = {{
            "allreduce": lambda t: hvd.allreduce_async_(t, name="a"),
            "allgather": lambda t: hvd.allgather_async(t, name="g"),
            "broadcast": lambda t: hvd.broadcast_async_(t, 0, name="b"),
            "alltoall": lambda t: hvd.alltoall_async(t, name="x"),
            "reducescatter": lambda t: hvd.reducescatter_async(t, name="r"),
            "grouped_allreduce": lambda t: hvd.grouped_allreduce_async_([t], name="ga"),
        }}
        for op, call in calls.items():
            try:
                call(FakeCuda((4, 2)))
            except ValueError as e:
                msg = str(e)
                assert "cuda:0" in msg and "CPU-only" in msg and "without CUDA" in msg, msg
                print("ok", op)
            else:
                raise SystemExit(op + ": no ValueError")
        try:
            hvd.allreduce_async_(torch.empty(3, device="meta"), name="m")
        except ValueError as e:
            assert "meta" in str(e) and "not supported" in str(e), str(e)
            print("ok meta")
        out = hvd.allreduce(torch.ones(3), op=hvd.Sum, name="after")  # still usable
        assert torch.equal(out, torch.ones(3))
        hvd.shutdown()
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("ok ") == 7, proc.stdout


def test_negotiation_compares_placement_not_the_device_index():
    n = 3
    ok = [[[dict(name="g", device=r)] for r in range(n)]]  # cuda:0, cuda:1, cuda:2
    cycles, _ = T.negotiate(n, ok)
    assert all(c[0]["error"] == "" for c in cycles[0])
    mixed = [[[dict(name="m", device=-1 if r == 0 else 0)] for r in range(n)]]
    cycles, _ = T.negotiate(n, mixed)
    msg = cycles[0][0][0]["error"]
    assert "allreduce 'm': device mismatch" in msg
    assert "rank 0 cpu, rank 1 cuda:0, rank 2 cuda:0" in msg
    assert "CPU or GPU" in msg


def test_ranks_sharing_a_gpu_are_found_per_host():
    a0 = device_check.make_record("hostA", "uuid:0")
    a1 = device_check.make_record("hostA", "uuid:1")
    b0 = device_check.make_record("hostB", "uuid:0")
    rows = torch.cat([a0, a0, a1, b0])
    assert device_check.ranks_sharing_gpu(rows, 0) == [0, 1]
    assert device_check.ranks_sharing_gpu(rows, 1) == [0, 1]
    assert device_check.ranks_sharing_gpu(rows, 2) == []
    assert device_check.ranks_sharing_gpu(rows, 3) == []  # same GPU id, other host


def test_one_gpu_per_process_and_one_pinning_check(monkeypatch):
    monkeypatch.setattr(device_check, "gpu_identity", lambda device: f"fake:{device}")
    device_check._reset()
    submitted = []
    try:
        device_check.note(torch.ones(2), "allreduce", submitted.append)  # CPU: nothing
        assert submitted == [] and device_check._device is None
        submit = lambda record: submitted.append(record) or 7  # noqa: E731
        device_check.note([FakeCuda((2,), index=1)], "allreduce", submit)
        device_check.note(FakeCuda((2,), index=1), "allgather", submitted.append)
        assert device_check._device == 1 and len(submitted) == 1
        assert submitted[0].shape == (1, 32) and submitted[0].dtype == torch.uint8
        with pytest.raises(ValueError, match=r"one GPU per process.*cuda:1.*cuda:0"):
            device_check.note(FakeCuda((2,), index=0), "broadcast", submitted.append)
    finally:
        device_check._reset()


def test_pinning_check_warns_once_when_ranks_share_a_gpu():
    device_check._reset()
    rows = torch.cat([device_check.make_record("h", "g")] * 2)
    device_check._pending, device_check._device = 11, 0
    try:
        device_check.poll(lambda h: False, None, 0)  # not finished: nothing happens
        assert device_check._pending == 11
        with pytest.warns(RuntimeWarning, match=r"ranks \[0, 1\] share one GPU"):
            device_check.poll(lambda h: True, lambda h: rows, 1)
        assert device_check._pending is None and device_check._done
    finally:
        device_check._reset()


# ------------------------------------------------------- bucket views: CUDA parameters, stand-ins


def test_a_cuda_device_can_bucket_only_as_this_processs_gpu_in_a_cuda_build(monkeypatch):
    monkeypatch.setattr(device_check, "_device", 1)
    monkeypatch.setattr(submission, "CUDA_BUILT", True)
    assert device_can_bucket(torch.device("cpu"))
    assert device_can_bucket(torch.device("cuda:1"))
    assert not device_can_bucket(torch.device("cuda:0"))  # not the GPU the check accepted
    assert not device_can_bucket(torch.device("meta"))
    monkeypatch.setattr(device_check, "_device", None)  # no CUDA collective yet
    assert not device_can_bucket(torch.device("cuda:1"))
    monkeypatch.setattr(device_check, "_device", 1)
    monkeypatch.setattr(submission, "CUDA_BUILT", False)  # a CPU-only build
    assert not device_can_bucket(torch.device("cuda:1"))
    assert device_can_bucket(torch.device("cpu"))


class _Reducer:
    """What BucketLayout._build and report() call on the C++ reducer, recorded."""

    def __init__(self, n):
        self.order, self.device, self.layout = list(range(n)), None, None

    def ready_order(self):
        return self.order

    def set_device(self, device):
        self.device = device

    def set_buckets(self, members, negotiated, labels):
        self.layout = members

    def layout_key(self):
        return []

    def bucket_report(self):
        return [dict(name=f"b{k}", bytes=0, members=list(m), copies=0, fallback_steps=0,
                     fallback="") for k, m in enumerate(self.layout)]


class _Opt:
    """The DistributedOptimizer attributes the layout reads, for parameters hooked on the C++
    reducer in this order."""

    def __init__(self, named):
        self._hvd_native = [p for _, p in named]
        self._hvd_hooks = dict.fromkeys(self._hvd_native)
        self._parameter_names = {p: n for n, p in named}
        self._hvd_sparse_seen = {}
        self._hvd_reducer = _Reducer(len(named))
        self._hvd_device = -1
        self._hvd_local = False

    def _hvd_params(self):
        return list(self._hvd_native)


def _stand_in_params():
    """A CPU parameter and two on cuda:1 (float32, float16), each with a gradient."""
    cpu = torch.zeros(3, requires_grad=True)
    cpu.grad = torch.zeros(3)
    gpu = FakeCuda((4, 2), index=1).requires_grad_()
    gpu.grad = FakeCuda((4, 2), index=1)
    half = FakeCuda((5,), dtype=torch.float16, index=1).requires_grad_()
    half.grad = FakeCuda((5,), dtype=torch.float16, index=1)
    return [("w.cpu", cpu), ("w.gpu", gpu), ("b.half", half)]


def _build(monkeypatch, other_rank_can_bucket=None):
    """BucketLayout._build on the stand-ins, with one other rank that agrees (its eligibility
    `other_rank_can_bucket`, default: ours)."""
    def allgather_object(obj, name=None, process_set=None):
        signature, eligible, order, generation = obj
        theirs = eligible if other_rank_can_bucket is None else other_rank_can_bucket
        return [obj, (signature, theirs, order, generation)]

    monkeypatch.setattr(functions, "allgather_object", allgather_object)
    opt = _Opt(_stand_in_params())
    layout = BucketLayout(True, "grad.opt0", None)
    layout.threshold = 1 << 20
    layout._build(opt)
    return opt, layout.report(opt)


@pytest.mark.parametrize("cuda_built, gpu", [(True, 1), (True, 0), (True, None), (False, 1)],
                         ids=["this-gpu", "another-gpu", "no-gpu-yet", "cpu-only-build"])
def test_bucket_layout_of_cuda_parameters(monkeypatch, cuda_built, gpu):
    """CUDA parameters on the GPU the placement check accepted are bucketed, per dtype and apart
    from the CPU's, and the reducer takes that GPU's gradients; otherwise they stay outside and
    the reason does not say "not on the CPU"."""
    monkeypatch.setattr(submission, "CUDA_BUILT", cuda_built)
    monkeypatch.setattr(device_check, "_device", gpu)
    opt, report = _build(monkeypatch)
    assert report["state"] == "built", report
    members = [b["members"] for b in report["buckets"]]
    if cuda_built and gpu == 1:
        assert members == [["w.cpu"], ["w.gpu"], ["b.half"]], report
        assert [b["device"] for b in report["buckets"]] == ["cpu", "cuda:1", "cuda:1"]
        assert report["outside"] == [] and report["reason"] == "", report
        assert opt._hvd_reducer.device == 1 and opt._hvd_device == 1
    else:
        assert members == [["w.cpu"]], report
        assert report["outside"] == ["w.gpu", "b.half"], report
        assert report["reason"].startswith("2 parameter(s) outside buckets"), report
        assert "not on the CPU" not in report["reason"], report
        assert "this process's GPU" in report["reason"], report
        assert opt._hvd_reducer.device is None and opt._hvd_device == -1


def test_a_cuda_parameter_another_rank_cannot_bucket_stays_outside_on_every_rank(monkeypatch):
    monkeypatch.setattr(submission, "CUDA_BUILT", True)
    monkeypatch.setattr(device_check, "_device", 1)
    opt, report = _build(monkeypatch, other_rank_can_bucket=[True, False, True])
    assert [b["members"] for b in report["buckets"]] == [["w.cpu"], ["b.half"]], report
    assert report["outside"] == ["w.gpu"] and "['w.gpu']" in report["reason"], report
    assert opt._hvd_reducer.device == 1
