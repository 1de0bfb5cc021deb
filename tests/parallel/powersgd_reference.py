"""PowerSGD with error feedback in plain torch, written apart from horovodlite's: one process holds
every rank's gradients and computes what the ranks' reduced gradient must be.

It orthonormalises with ``torch.linalg.qr`` (Householder) where horovodlite uses Gram-Schmidt:
the two give the same column spaces up to column signs, and P P^T M does not depend on those
signs, so results agree to float order. It computes in float64.

Units: each rank's matrix ``M_i`` is its gradient as the optimizer reduces it plus its own
error feedback; the result is the op (``"average"`` or ``"sum"``) of the ranks' P P^T M_i.
"""

from __future__ import annotations

import torch


def compresses(shape, rank: int) -> bool:
    if len(shape) < 2:
        return False
    n, m = shape[0], int(torch.Size(shape[1:]).numel())
    return rank * (n + m) < n * m


def _orth(m: torch.Tensor) -> torch.Tensor:
    return torch.linalg.qr(m, mode="reduced").Q


class Reference:
    """``initial_q(name, m)``: the Q a parameter starts from (m x rank)."""

    def __init__(self, rank: int, warmup_steps: int, size: int, initial_q,
                 error_feedback: bool = True, op: str = "average"):
        self.rank, self.warmup, self.size = rank, warmup_steps, size
        self.initial_q, self.error_feedback, self.op = initial_q, error_feedback, op
        self.step = 0
        self.q = {}
        self.errors = [{} for _ in range(size)]

    def _combine(self, tensors):
        total = torch.stack(tensors).sum(0)
        return total / len(tensors) if self.op == "average" else total

    def reduce(self, grads: list) -> dict:
        """``grads``: per rank, name -> gradient (None: the rank has none, reduced as zeros).
        Returns name -> the reduced gradient every rank must hold (float64)."""
        names = sorted({n for g in grads for n, t in g.items() if t is not None})
        out = {}
        for name in names:
            like = next(g[name] for g in grads if g.get(name) is not None)
            ranks = [(g.get(name) if g.get(name) is not None else torch.zeros_like(like))
                     .double() for g in grads]
            if self.step < self.warmup or not compresses(like.shape, self.rank):
                out[name] = self._combine(ranks)
                continue
            n = like.shape[0]
            Ms = [g.reshape(n, -1).clone() for g in ranks]
            if self.error_feedback:
                for i, M in enumerate(Ms):
                    e = self.errors[i].get(name)
                    if e is not None:
                        M += e
            q_old = self.q.get(name)
            if q_old is None:
                q_old = self.initial_q(name, Ms[0].shape[1]).double()
            Q = _orth(q_old)
            P = sum(M @ Q for M in Ms)
            finite = bool(torch.isfinite(P).all())
            P = _orth(P) if finite else P
            Qs = [M.t() @ P for M in Ms]
            Qred = self._combine(Qs)
            out[name] = (P @ Qred.t()).reshape(like.shape)
            if finite and bool(torch.isfinite(Qred).all()):
                nonzero = Qred.abs().amax(dim=0, keepdim=True) > 0
                self.q[name] = torch.where(nonzero, Qred, Q)
                if self.error_feedback:
                    for i, M in enumerate(Ms):
                        self.errors[i][name] = M - P @ Qs[i].t()
            else:
                self.q[name] = Q
        self.step += 1
        return out
