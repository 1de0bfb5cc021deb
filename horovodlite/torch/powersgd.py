"""PowerSGD gradient compression with error feedback (Vogels, Karimireddy and Jaggi, 2019), for
``hvd.DistributedOptimizer(..., compression=hvd.Compression.powersgd(rank=4))``.

Per step and per compressed gradient, seen as a matrix ``M`` (n x m: the first dimension by the
rest, so a convolution's weight is out-channels by the rest), on every rank ``i``:

1. ``M_i = grad_i + e_i`` (``e_i``: what earlier steps left out on this rank, the error
   feedback), ``Q``: the last step's reduced Q (the same on every rank), orthonormalised.
2. ``P_i = M_i Q`` (n x r) goes out at once, from the gradient hook, overlapping the rest of
   backward: ``P = sum_i P_i``.
3. At ``synchronize()``: ``P`` orthonormalised (Gram-Schmidt, the same on every rank: every rank
   holds the same reduced P), ``Q_i = M_i^T P`` (m x r) goes out with the optimizer's op,
   ``Q = op_i Q_i``. While it travels, ``e_i = M_i - P Q_i^T`` (what this rank's own
   approximation leaves out).
4. ``grad = P Q^T``: the op (average or sum) of the ranks' rank-r approximations ``P P^T M_i``.

Only P and Q travel: ``r (n + m)`` numbers instead of ``n m``. Vectors (biases, norms), sparse
gradients and matrices where ``r (n + m) >= n m`` travel uncompressed, as do all gradients
during the first ``warmup_steps`` steps.

Every rank takes the same decisions from the same numbers: whether a tensor is compressed (its
shape and the step), Q's random start (seeded by the parameter's name), the orthonormalisation
(of the reduced P). A step whose reduced P or Q is not finite (a rank's gradient overflowed
under a loss scaler, which then skips the step) leaves Q and the error feedback as they were.
A column of the reduced Q that is all zeros (no rank had a gradient there) keeps its old value,
so a parameter idle for a step does not lose its subspace.

State (``opt.state_dict()["powersgd"]``): the step count, Q and this rank's error per parameter
name. ``broadcast_optimizer_state`` (and so ``hvd.elastic.TorchState.sync``) sends the root's
step and Qs to every rank; each rank keeps its own error feedback while the number of ranks is
the one it was made with, and starts it again from zero when that changed (logged).
"""

from __future__ import annotations

import hashlib
import logging
import zlib

import torch

from horovodlite.common.exceptions import HorovodArgumentError
from horovodlite.common.process_sets import global_process_set
from horovodlite.torch.compression import PowerSGD
from horovodlite.torch.mpi_ops import (
    Sum,
    allreduce_async_,
    grouped_allreduce_async_,
    synchronize,
)

log = logging.getLogger("horovodlite")

_EPS = 1e-8


def orthonormalize_(m: torch.Tensor) -> torch.Tensor:
    """Gram-Schmidt on the columns of ``m`` (n x r), in place: each column normalised, then
    removed from the ones after it. A zero column stays zero."""
    for i in range(m.shape[1]):
        col = m[:, i:i + 1]
        col.div_(col.norm() + _EPS)
        if i + 1 < m.shape[1]:
            rest = m[:, i + 1:]
            rest.sub_(col * (col.t() @ rest))
    return m


def initial_q(seed: int, name: str, m: int, rank: int) -> torch.Tensor:
    """Q's random start for the parameter ``name`` (m x rank, float32, on the CPU): normal
    values from a generator seeded by ``seed`` and the name, so every rank starts alike."""
    g = torch.Generator().manual_seed(zlib.crc32(hashlib.sha1(f"{seed}/{name}".encode()).digest()))
    return torch.randn(m, rank, generator=g)


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype P, Q and the error are computed in: float64 stays, the rest is float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


class PowerSGDStep:
    """One parameter's compressed reduction during a step (the state machine of the steps in
    the module docstring). Memory: M is the gradient itself (a view) when there is no error
    feedback to add and no dtype to change, else one new matrix, which then becomes the next
    error feedback in place; the result is written straight into the gradient."""

    __slots__ = ("state", "p", "name", "wire_name", "M", "own", "P", "memory", "Qi", "wire",
                 "handle", "error", "finite")

    def __init__(self, state, p, name, wire_name):
        self.state, self.p, self.name, self.wire_name = state, p, name, wire_name
        self.error = None

    def launch_p(self) -> None:
        """Step 1-2, from the gradient hook: ``P_i = M_i Q`` goes out."""
        state, grad = self.state, self.p.grad.detach()
        with torch.profiler.record_function("horovodlite.powersgd.compress"):
            G = grad.reshape(grad.shape[0], -1)
            work = _work_dtype(grad.dtype)
            error = state.error.get(self.name) if state.config.error_feedback else None
            if error is not None and error.shape == G.shape and error.device == G.device:
                M = torch.add(G.to(work), error)
            else:
                M = G.to(work)
            self.M, self.own = M, M.data_ptr() != G.data_ptr()
            Q = state.q.get(self.name)
            if Q is None or Q.shape != (M.shape[1], state.config.rank):
                Q = state.initial_q(self.name, M.shape[1], M)
            self.memory = Q.to(device=M.device, dtype=work)  # kept if this step fails
            self.P = M @ orthonormalize_(self.memory.clone())
        self.handle = allreduce_async_(self.P, name=f"{self.wire_name}.powersgd.p", op=Sum,
                                       process_set=state.process_set)

    def prepare_q(self) -> None:
        """Step 3, at ``synchronize()``: the reduced P orthonormalised, ``Q_i = M_i^T P``."""
        synchronize(self.handle)
        with torch.profiler.record_function("horovodlite.powersgd.orthonormalize"):
            self.finite = torch.isfinite(self.P).all()
            orthonormalize_(self.P)
            self.Qi = self.M.t() @ self.P
        self.wire = self.Qi.clone()

    def error_feedback(self) -> None:
        """While Q travels: what this rank's own approximation leaves out, ``M - P Q_i^T``
        (in M's memory when it is ours)."""
        if self.state.config.error_feedback:
            with torch.profiler.record_function("horovodlite.powersgd.error_feedback"):
                if self.own:
                    self.error = self.M.addmm_(self.P, self.Qi.t(), alpha=-1)
                else:
                    self.error = torch.addmm(self.M, self.P, self.Qi.t(), alpha=-1)
        self.M = None

    @property
    def params(self) -> list:
        return [self.p]

    def finish(self, compression=None) -> None:
        """Step 4: ``grad = P Q^T``; Q and the error kept for the next step, unless the
        reduced P or Q is not finite (the same decision on every rank: they hold the same)."""
        state = self.state
        self.handle.wait()
        Q, P = self.wire, self.P
        with torch.profiler.record_function("horovodlite.powersgd.decompress"):
            grad = self.p.grad
            if grad.is_contiguous() and grad.dtype == P.dtype:
                torch.mm(P, Q.t(), out=grad.view(grad.shape[0], -1))
            else:
                grad.copy_((P @ Q.t()).view(grad.shape))
            if bool(self.finite) and bool(torch.isfinite(Q).all()):
                nonzero = Q.abs().amax(dim=0, keepdim=True) > 0  # a column no rank used
                state.q[self.name] = Q if bool(nonzero.all()) else \
                    torch.where(nonzero, Q, self.memory)
                if self.error is not None:
                    state.error[self.name] = self.error
        self.P = self.memory = self.Qi = self.wire = self.error = None


class _GroupWait:
    """The grouped allreduce of a step's Qs, waited for once by whichever job comes first."""

    __slots__ = ("handle", "done")

    def __init__(self, handle):
        self.handle, self.done = handle, False

    def wait(self) -> None:
        if not self.done:
            self.done = True
            synchronize(self.handle)


class PowerSGDState:
    """One DistributedOptimizer's PowerSGD state: the step count, and per parameter name the
    reduced Q and this rank's error feedback."""

    def __init__(self, config: PowerSGD, process_set=global_process_set):
        self.config = config
        self.process_set = process_set
        self.step = 0
        self.q: dict = {}
        self.error: dict = {}
        self.size = None  # the number of ranks the error feedback was made with

    def compressing(self, grad) -> bool:
        """Whether ``grad`` goes out compressed this step (the same answer on every rank)."""
        return (self.step >= self.config.warmup_steps and not grad.is_sparse
                and grad.dtype.is_floating_point and self.config.compresses(grad.shape))

    def initial_q(self, name: str, m: int, like: torch.Tensor) -> torch.Tensor:
        return initial_q(self.config.seed, name, m, self.config.rank).to(like.device,
                                                                         like.dtype)

    def launch(self, p, name: str, wire_name: str) -> PowerSGDStep:
        self.size = self.process_set.size()
        job = PowerSGDStep(self, p, name, wire_name)
        job.launch_p()
        return job

    def launch_q(self, jobs: list, op, prescale, postscale, name: str) -> None:
        """Step 3 of every compressed parameter: their Q_i go out as one grouped allreduce per
        dtype (one negotiation), in the order of their names (the same on every rank)."""
        jobs = sorted(jobs, key=lambda j: j.wire_name)
        for job in jobs:
            job.prepare_q()
        for dtype in sorted({j.wire.dtype for j in jobs}, key=str):
            group = [j for j in jobs if j.wire.dtype == dtype]
            wait = _GroupWait(grouped_allreduce_async_(
                [j.wire for j in group], name=f"{name}.{str(dtype)[6:]}", op=op,
                prescale_factor=prescale, postscale_factor=postscale,
                process_set=self.process_set))
            for job in group:
                job.handle = wait
        for job in jobs:
            job.error_feedback()

    def step_done(self) -> None:
        self.step += 1

    # ------------------------------------------------------------------------------ state

    def state_dict(self) -> dict:
        return {"step": self.step, "rank": self.config.rank, "size": self.size,
                "q": dict(self.q), "error": dict(self.error)}

    def load_state_dict(self, sd: dict) -> None:
        if sd.get("rank", self.config.rank) != self.config.rank:
            raise HorovodArgumentError(
                f"load_state_dict: the PowerSGD state was saved with rank={sd['rank']}, this "
                f"optimizer compresses with rank={self.config.rank}")
        self.step = int(sd["step"])
        self.q = {k: v.clone() for k, v in sd.get("q", {}).items()}
        self.error = {k: v.clone() for k, v in sd.get("error", {}).items()}
        self.size = sd.get("size")
        size = self.process_set.size()
        if size is not None:  # saved with another number of ranks: the error starts again
            self.adopt(self.step, self.q, size)

    def adopt(self, step: int, q: dict, size: int) -> None:
        """The root's step and Qs, after ``broadcast_optimizer_state``: the error feedback
        stays this rank's own, or starts again from zero where the number of ranks changed
        since it was made."""
        self.step, self.q = step, q
        if self.error and self.size is not None and self.size != size:
            log.info("PowerSGD: the error feedback of %d parameter(s) starts again from zero: "
                     "it was made with %d ranks, the job now has %d", len(self.error),
                     self.size, size)
            self.error = {}
        self.size = size


__all__ = ["initial_q", "PowerSGDState", "PowerSGDStep", "orthonormalize_"]
