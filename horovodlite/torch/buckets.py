"""Bucket views for ``DistributedOptimizer`` (docs/bucket_views.md): gradients that live in the
memory their allreduce runs on.

The C++ reducer (``_C.GradReducer``, csrc/torch/grad_buckets.cc) holds each bucket's flat tensor,
makes every member's ``p.grad`` a view into it and allreduces the bucket in place once every
member is ready (on the host, gradients that autograd put in tensors of their own are reduced
there instead, and a bucket whose gradients all come so gives its flat tensor up). This module
decides the layout:

1. Observe. The first step after construction (or after the set of parameters changed) runs the
   per-gradient path; the reducer records the order in which gradients became ready.
2. Agree. At the end of that step's ``synchronize()`` every rank of the process set sends, in
   one ``allgather_object``, its parameters' names, shapes and dtypes, which of them can live in
   a bucket here, and its ready order. A parameter set that differs between ranks raises on every
   rank, naming the first parameter and the ranks that differ. A parameter is bucketed only if
   every rank can bucket it, and the layout follows rank 0's ready order, so every rank builds
   the same buckets (names and shapes) whatever order its own backward ran in.
3. Lay out (``plan_buckets``): per (dtype, device), in that order, buckets of at most the fusion
   threshold; a parameter larger than the threshold gets a bucket of its own. A bucket is one
   flat tensor allocated like its first member: on a CUDA device, one device allocation.

CUDA parameters are bucketed on the GPU this process runs collectives on (the one the placement
check accepted, ``device_check``) in a build with CUDA; elsewhere they stay on the per-gradient
path, whose placement checks raise what they raise. The C++ reducer orders the bucket's
allreduce after every member's accumulation on the CUDA streams (csrc/torch/grad_buckets.cc).

The layout is rebuilt (agree, lay out, from the ready order of the step that just ended) when
the parameters on the reducer change or one of them is frozen or unfrozen (checked at the end
of ``synchronize()``; do it on every rank), and observed again after an elastic reset. Until
then the old layout stays: a bucket whose member cannot join it this step (frozen, removed, a
sparse gradient or one of another dtype, device or shape) goes out member by member, which the
C++ reducer first agrees with the other ranks (csrc/torch/bucket_agreement.cc): a rank that
changed a parameter alone makes every rank raise, naming it. ``HOROVOD_BUCKET_VIEW=0`` or
``DistributedOptimizer(bucket_view=False)`` turns bucket views off.
"""

from __future__ import annotations

import os

import torch

from horovodlite._extension import load
from horovodlite.common.exceptions import HorovodArgumentError
from horovodlite.torch import device_check, submission

_C = load()

# Labels name at most this many members; the full list is in the report.
_LABEL_MEMBERS = 3


def _switch(var: str, default: str) -> bool:
    value = os.environ.get(var, "").strip().lower() or default
    if value in ("0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    raise HorovodArgumentError(f"{var} must be 0 or 1, got {value!r}")


def send_buckets_now() -> bool:
    """``HOROVOD_BUCKET_SEND_NOW`` (default on): a bucket whose gradients are all ready goes out
    at once, its allreduce overlapping the rest of backward, instead of being held back, like
    other new work, to fuse with what comes later (``HOROVOD_CYCLE_TIME``,
    ``HOROVOD_HOLD_UNTIL_WAIT``): a bucket is fused already."""
    return _switch("HOROVOD_BUCKET_SEND_NOW", "1")


def bucket_view_enabled(argument) -> bool:
    """The constructor's ``bucket_view`` argument, else ``HOROVOD_BUCKET_VIEW`` (default on)."""
    if argument is not None:
        if not isinstance(argument, bool):
            raise HorovodArgumentError(f"bucket_view must be a bool or None, got {argument!r}")
        return argument
    return _switch("HOROVOD_BUCKET_VIEW", "1")


def plan_buckets(order, nbytes, keys, threshold: int) -> list:
    """Buckets of indices: ``order`` (indices) cut per ``keys[i]`` (dtype and device) into runs
    of at most ``threshold`` bytes (``nbytes[i]`` each); an index larger than the threshold
    alone. Buckets come in the order of their first member. Pure: every rank computes the same
    plan from the same arguments."""
    if threshold <= 0:
        raise HorovodArgumentError(f"bucket threshold must be positive, got {threshold}")
    buckets, open_, filled = [], {}, {}
    for i in order:
        key, size = keys[i], nbytes[i]
        b = open_.get(key)
        if b is None or filled[b] + size > threshold:
            b = len(buckets)
            buckets.append([])
            filled[b] = 0
            open_[key] = b
        buckets[b].append(i)
        filled[b] += size
    return buckets


def device_can_bucket(device: torch.device) -> bool:
    """Whether a parameter on ``device`` can live in a bucket here: the CPU, or the CUDA device
    this process runs collectives on (the one the placement check accepted) in a build with
    CUDA. Any other device stays on the per-gradient path (which defers it to the Python path's
    placement checks)."""
    if device.type == "cpu":
        return True
    if device.type == "cuda":
        return (submission.CUDA_BUILT and device.index is not None
                and device_check._device == device.index)
    return False


def agreed_order(orders: list, size: int) -> list:
    """Rank 0's ready order (indices below ``size``, each once), then the indices it did not see
    ready, in index order."""
    seen, out = set(), []
    for i in orders[0]:
        if 0 <= i < size and i not in seen:
            seen.add(i)
            out.append(i)
    return out + [i for i in range(size) if i not in seen]


def check_same_params(signatures: list) -> None:
    """Raises (on every rank: each has every rank's list) naming the first parameter whose name,
    shape or dtype differs between ranks."""
    reference = signatures[0]
    for rank, sig in enumerate(signatures[1:], start=1):
        if sig == reference:
            continue
        for k in range(max(len(sig), len(reference))):
            ours = sig[k] if k < len(sig) else None
            theirs = reference[k] if k < len(reference) else None
            if ours != theirs:
                break
        differing = [r for r, s in enumerate(signatures) if s != reference]
        raise HorovodArgumentError(
            "DistributedOptimizer: the ranks optimize different parameters: parameter "
            f"#{k} is {_describe(theirs)} on rank 0 but {_describe(ours)} on rank {rank} "
            f"(ranks differing from rank 0: {differing}). Every rank must wrap the same "
            "parameters, in the same order.")


def _describe(entry) -> str:
    if entry is None:
        return "missing"
    name, shape, dtype = entry
    return f"'{name}' {list(shape)} {dtype}"


class BucketLayout:
    """The bucket state of one DistributedOptimizer: off, observing, or built."""

    def __init__(self, enabled: bool, prefix: str, process_set,
                 off_reason: str = "turned off (bucket_view=False or HOROVOD_BUCKET_VIEW=0)"):
        self.enabled = enabled
        self.prefix = prefix
        self.process_set = process_set
        self.state = "observing" if enabled else "off"
        self.reason = "" if enabled else off_reason
        self.threshold = None  # bytes per bucket; None: the fusion threshold
        self.generation = 0  # layouts built (the most of any rank's, agreed at each build):
        # part of bucket names, so a new layout never meets the response cache's entries of an
        # old one
        self.signature = None  # what the layout was built for (see _signature)
        self.members = []  # per bucket, the parameters
        self.last_rebuild = ""  # why the layout was last dropped

    # ------------------------------------------------------------------ called by the optimizer

    def check(self, opt) -> None:
        """At the end of a successful ``synchronize()``: a change of the reducer's parameters
        (added, removed, frozen, unfrozen) drops the layout, and ``after_synchronize`` builds
        the next one at once."""
        if self.state == "built" and self._signature(opt) != self.signature:
            fallbacks = [b["fallback"] for b in opt._hvd_reducer.bucket_report()
                         if b["fallback"]]
            self.invalidate(opt, "the optimizer's parameters changed" + (
                f" (last fallback: {fallbacks[-1]})" if fallbacks else ""))

    def invalidate(self, opt, reason: str) -> None:
        if self.state == "off":
            return
        if opt._hvd_reducer is not None:
            opt._hvd_reducer.clear_buckets()
        self.state = "observing"
        self.reason = reason
        self.last_rebuild = reason
        self.members = []

    def after_synchronize(self, opt) -> None:
        """End of a successful ``synchronize()``: the first one while observing builds the
        layout (collective: every rank of the process set calls it at the same step)."""
        if self.state != "observing" or opt._hvd_reducer is None or opt._hvd_local:
            return
        self._build(opt)

    def report(self, opt) -> dict:
        names = opt._parameter_names
        buckets = []
        if opt._hvd_reducer is not None and self.state == "built":
            for b in opt._hvd_reducer.bucket_report():
                members = [opt._hvd_native[i] for i in b["members"]]
                b["members"] = [names[p] for p in members]
                # The flat tensor is allocated like its first member (SetBuckets), and every
                # member is on that device.
                b["device"] = str(members[0].device) if members else ""
                buckets.append(b)
        bucketed = {id(p) for ps in self.members for p in ps}
        outside = [names[p] for p in opt._hvd_params()
                   if p in names and id(p) not in bucketed and p.requires_grad]
        return {"enabled": self.enabled, "state": self.state, "reason": self.reason,
                "buckets": buckets, "outside": outside, "last_rebuild": self.last_rebuild}

    # --------------------------------------------------------------------------- building

    def _native_params(self, opt) -> list:
        """(reducer index, parameter) of the parameters on the reducer now."""
        last = {}
        for i, p in enumerate(opt._hvd_native):
            last[id(p)] = i  # a parameter hooked again: its latest index
        return [(i, opt._hvd_native[i]) for i in sorted(last.values())
                if opt._hvd_native[i] in opt._hvd_hooks]

    @staticmethod
    def _signature(opt):
        # Per parameter on the reducer: index, identity, requires_grad, dtype and device
        # (module.double() keeps the parameters and changes their data). From C++: the check
        # runs twice per step, and a tuple per parameter in Python took ~0.4 ms for 200.
        return opt._hvd_reducer.layout_key()

    def _eligible(self, opt, p) -> bool:
        g = p.grad
        return (p.requires_grad and device_can_bucket(p.device) and p.is_contiguous()
                and p not in opt._hvd_sparse_seen and g is not None and not g.is_sparse
                and g.dtype == p.dtype and g.device == p.device and g.shape == p.shape)

    def _build(self, opt) -> None:
        from horovodlite.torch.functions import allgather_object

        natives = self._native_params(opt)
        names = opt._parameter_names
        signature = [(names[p], tuple(p.shape), str(p.dtype)) for _, p in natives]
        eligible = [self._eligible(opt, p) for _, p in natives]
        position = {i: k for k, (i, _) in enumerate(natives)}
        order = [position[i] for i in opt._hvd_reducer.ready_order() if i in position]
        # One name for every layout: after an elastic reset the survivors have built layouts
        # and a worker added to the job has not, so a per-process count in the name would
        # never match. The count travels instead, and the ranks continue from the largest.
        gathered = allgather_object((signature, eligible, order, self.generation),
                                    name=f"{self.prefix}.bucket_layout",
                                    process_set=self.process_set)
        self.generation = max(g[3] for g in gathered)
        try:
            check_same_params([g[0] for g in gathered])
        except HorovodArgumentError as exc:
            self.state, self.reason = "off", str(exc)
            raise
        everywhere = [all(g[1][k] for g in gathered) for k in range(len(natives))]
        agreed = [k for k in agreed_order([g[2] for g in gathered], len(natives))
                  if everywhere[k]]
        tensors = [p for _, p in natives]
        keys = [(p.dtype, p.device) for p in tensors]
        nbytes = [p.numel() * p.element_size() for p in tensors]
        threshold = self.threshold or int(_C.config()["fusion_threshold_bytes"])
        plan = plan_buckets(agreed, nbytes, keys, max(threshold, 1))
        members, negotiated, labels = [], [], []
        for b, ks in enumerate(plan):
            member_names = [signature[k][0] for k in ks]
            shown = ",".join(member_names[:_LABEL_MEMBERS])
            more = len(member_names) - _LABEL_MEMBERS
            label = f"bucket{self.generation}.{b}[{shown}{f',+{more}' if more > 0 else ''}]"
            members.append([natives[k][0] for k in ks])
            negotiated.append(f"allreduce.{self.prefix}.{label}")
            labels.append(f"{self.prefix}.{label}")
        cuda = {tensors[k].device.index for ks in plan for k in ks
                if tensors[k].device.type == "cuda"}
        if cuda:
            # The GPU _eligible accepted (device_check's): the reducer's per-gradient path then
            # takes this device's gradients too, as it would from the next synchronize() on, so
            # a bucket that falls back is still reduced from the hooks.
            (device,) = cuda
            if opt._hvd_device != device:
                opt._hvd_reducer.set_device(device)
                opt._hvd_device = device
        with torch.no_grad():
            opt._hvd_reducer.set_buckets(members, negotiated, labels)
        self.members = [[tensors[k] for k in ks] for ks in plan]
        self.generation += 1
        self.signature = self._signature(opt)
        self.state = "built"
        left = [signature[k][0] for k in range(len(natives)) if not everywhere[k]]
        self.reason = ("" if not left else
                       f"{len(left)} parameter(s) outside buckets (sparse, not contiguous, "
                       "on a device other than the CPU or this process's GPU, or without a "
                       f"gradient on some rank): {left[:5]}")


__all__ = ["BucketLayout", "agreed_order", "bucket_view_enabled", "check_same_params",
           "device_can_bucket", "plan_buckets", "send_buckets_now"]
