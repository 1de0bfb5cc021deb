"""The gradient-reducing half of ``hvd.DistributedOptimizer``: a mixin placed in front of the
wrapped optimizer's class (see ``optimizer.py`` for how the object is built).

Protocol, per training step and per parameter ``p`` that requires a gradient:

1. backward: autograd accumulates into ``p.grad`` and then runs our hook. The hook counts the
   pass; on the ``backward_passes_per_step``-th pass it launches the allreduce of ``p.grad`` at
   once (in place, or on a compressed copy), so communication overlaps with the rest of
   backward. In the common case - no compression, not in a group, not Adasum - the hook is C++
   (``_C.GradReducer``, csrc/torch/grad_reducer.h): no GIL and no Python frame per gradient; it
   leaves a gradient that is sparse or not contiguous to this module's general path, which
   launches it at ``synchronize()``. ``HOROVOD_NATIVE_GRADIENT_HOOKS=0`` puts every parameter on
   the Python hook (``register_post_accumulate_grad_hook``). A parameter in a group waits until
   every member of its group is ready and the group goes out as one
   ``grouped_allreduce_async_``.
2. ``synchronize()``: launches what the hooks did not - parameters unused on this rank (their
   gradient is None: we reduce zeros, because the other ranks are waiting for the collective) and
   partial accumulations (an epoch that ended mid-accumulation) - then waits for every handle
   (the C++ path's in one call) and writes the result into ``p.grad``. Counters reset, so the
   next pass starts clean. An error is raised once every handle was waited for.
3. ``step()``: ``synchronize()`` (unless inside ``skip_synchronize()``), then the wrapped step.

Every gradient's allreduce is named ``grad.opt<k>.<parameter name>`` (so it negotiates, and shows
in timelines and errors, as ``allreduce.grad.opt<k>.<parameter name>``; a group's as
``grouped_allreduce.grad.opt<k>.group<g>.<i>``) where ``k`` counts the optimizers this process
created for the process set, so several DistributedOptimizers (a GAN's generator and
discriminator) never collide, and every rank uses the same names as long as the ranks create
their optimizers in the same order. Parameters are reduced when they require a gradient at the
time of the step, so freezing or unfreezing layers between steps works (do it on every rank).
So does replacing a parameter of a param group (``group["params"][i] = c``, which must be named
in ``named_parameters`` if that was given) or its data's dtype or device (``p.data =
p.data.double()``, ``model.double()``): the hooks follow at the next ``zero_grad()`` or
``step()``; until then such a parameter is reduced at ``step()``, after backward.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
import weakref

import torch

from horovodlite._extension import load
from horovodlite.common.exceptions import HorovodArgumentError
from horovodlite.torch import step_vote, summary
from horovodlite.torch.grad_launch import _GradLaunch
from horovodlite.torch.in_flight import NativeHook
from horovodlite.torch.powersgd import PowerSGDStep
from horovodlite.torch.submission import (
    op_name,
)

_C = load()

STEP_AFTER_SYNC_WARNING = (
    "optimizer.step() called without optimizer.skip_synchronize() context after "
    "optimizer.synchronize(). The gradients were already reduced, so step() does not reduce them "
    "again; use `with optimizer.skip_synchronize(): optimizer.step()` after an explicit "
    "synchronize() to make that intent explicit and silence this warning."
)


class OutstandingAllreduceError(RuntimeError, AssertionError):
    """The optimizer was asked to touch gradients whose allreduces are still in flight.

    Also an AssertionError, which is what Horovod raised in this situation, so existing
    handlers keep working.
    """


def _on_grad_ready(optimizer_ref, param) -> None:
    """The post-accumulate-grad hook. Holds the optimizer weakly: a discarded optimizer's hooks
    do nothing instead of launching collectives nobody waits for."""
    optimizer = optimizer_ref()
    if optimizer is not None:
        optimizer._hvd_grad_ready(param)


class _DistributedOptimizer(_GradLaunch):
    """Mixin in front of the wrapped optimizer's class. ``optimizer._hvd_setup`` fills in the
    ``_hvd_*`` attributes; the wrapped class's ``__init__`` is never run again."""

    # ------------------------------------------------------------------ parameters and hooks

    def _hvd_params(self) -> list:
        """Every parameter of every param group, in order, each once."""
        seen, out = set(), []
        for group in self.param_groups:
            for p in group["params"]:
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
        return out

    def _hvd_refresh(self) -> None:
        """Names parameters added (or swapped into a group: ``group["params"][i] = c``) since
        the last call, hooks every parameter that now requires a gradient (a parameter unfrozen
        after construction gets its hook here) and unhooks the ones no group holds any more.

        Runs twice per step (zero_grad, synchronize). The parameters are scanned again only
        when the identity of some group's parameters changed (a tuple of ids per group, a few
        microseconds for hundreds of parameters); between scans only the ones not hooked yet
        are looked at. A parameter missing from ``named_parameters`` raises before anything
        changes, and again at every call until it is named or removed."""
        signature = tuple(tuple(map(id, group["params"])) for group in self.param_groups)
        if signature != self._hvd_signature:
            params = self._hvd_params()
            if self._hvd_named is not None:
                self._hvd_check_groups_named()
            for p in params:
                if p not in self._parameter_names:
                    self._parameter_names[p] = self._hvd_name_new_param(p)
                    self._hvd_negotiated[p] = op_name("allreduce", self._hvd_wire_name(p))
                    self._hvd_delay[p] = self.backward_passes_per_step
            held = {id(p) for p in params}
            for p in [p for p in self._hvd_hooks if id(p) not in held]:
                self._hvd_unhook(p)
            self._hvd_unhooked = [p for p in params
                                  if p not in self._hvd_hooks and not self._hvd_local]
            self._hvd_signature = signature
        if self._hvd_unhooked:
            waiting = []
            for p in self._hvd_unhooked:
                if p.requires_grad:
                    self._hvd_hooks[p] = self._hvd_hook(p)
                else:
                    waiting.append(p)
            self._hvd_unhooked = waiting

    def _hvd_hook(self, p):
        """Hooks ``p``: on the C++ reducer in the common case, else with a Python hook."""
        reducer = self._hvd_reducer
        if reducer is not None and p not in self._hvd_group_of and p.is_leaf:
            self._hvd_native.append(p)
            reducer.add(p, self._parameter_names[p], self._hvd_negotiated[p])
            return NativeHook(reducer)
        self._hvd_python.append(p)
        hook = functools.partial(_on_grad_ready, weakref.ref(self))
        return p.register_post_accumulate_grad_hook(hook)

    def _hvd_unhook(self, p) -> None:
        """``p`` left the param groups: its gradient is not reduced any more (an allreduce of it
        already in flight is still waited for) and it leaves its group."""
        handle = self._hvd_hooks.pop(p)
        if isinstance(handle, NativeHook):
            # The reducer's index of p: the last one (an earlier one is p hooked before).
            index = max(i for i, q in enumerate(self._hvd_native) if q is p)
            self._hvd_reducer.remove(index)
        else:
            handle.remove()
            self._hvd_python = [q for q in self._hvd_python if q is not p]
            self._hvd_delay.pop(p, None)
        group = self._hvd_group_of.pop(p, None)
        if group is not None:
            self._hvd_groups[group] = [m for m in self._hvd_groups[group] if m is not p]

    def _hvd_check_groups_named(self) -> None:
        """Raises naming the first parameter of the param groups that ``named_parameters``
        does not name (added or swapped in after wrapping)."""
        for g, group in enumerate(self.param_groups):
            for i, p in enumerate(group["params"]):
                if p not in self._parameter_names:
                    self._hvd_check_named(p, f"param_groups[{g}]['params'][{i}]")

    def _hvd_name_new_param(self, p) -> str:
        """The name of a parameter seen for the first time: from ``named_parameters`` if it
        was given, else ``noname.<i>`` in param-group order (the same on every rank)."""
        if self._hvd_named is not None:
            self._hvd_check_named(p)
            return self._hvd_named[p]
        name = f"noname.{self._hvd_next_index}"
        self._hvd_next_index += 1
        return name

    def _hvd_check_named(self, p, where: str = "added with add_param_group()") -> None:
        if p not in self._hvd_named:
            raise HorovodArgumentError(
                f"DistributedOptimizer: a parameter of shape {list(p.shape)} ({where}) is not "
                "in named_parameters; name every parameter the optimizer updates (pass "
                "named_parameters covering the parameters you add or swap in later)"
            )

    def _hvd_remove_hooks(self) -> None:
        for handle in self._hvd_hooks.values():
            handle.remove()
        self._hvd_hooks.clear()
        self._hvd_python.clear()
        self._hvd_native.clear()
        self._hvd_signature = None  # the next refresh hooks every parameter again
        # A detached C++ reducer hooks and launches nothing again (its indices would also no
        # longer match _hvd_native): the hooks the next refresh adds are Python's.
        self._hvd_reducer = None
        self._hvd_pending.reducer = None
        if "_hvd_buckets" in self.__dict__:
            self._hvd_buckets.invalidate(self, "hooks removed")

    def _hvd_wire_name(self, p) -> str:
        return f"{self._hvd_prefix}.{self._parameter_names[p]}"

    def _hvd_reset_counters(self) -> None:
        k = self.backward_passes_per_step
        self._hvd_delay = {p: k for p in self._hvd_python}
        if self._hvd_reducer is not None:
            self._hvd_reducer.reset_counters()

    # ------------------------------------------------------------------------------ hooks

    def _hvd_grad_ready(self, p) -> None:
        """Counts one backward pass for ``p``; launches its reduction on the k-th pass."""
        if p not in self._parameter_names or not p.requires_grad:
            return
        remaining = self._hvd_delay.get(p, self.backward_passes_per_step)
        if remaining == 0:
            raise RuntimeError(_C.too_many_passes_message(self._parameter_names[p],
                                                          self.backward_passes_per_step))
        self._hvd_delay[p] = remaining - 1
        self._hvd_fresh_sync = False
        if remaining == 1:
            self._hvd_on_ready(p)

    def _hvd_on_ready(self, p) -> None:
        """``p`` has all its local passes: launch it, or its group once the group is ready."""
        group = self._hvd_group_of.get(p)
        if group is None:
            self._hvd_launch([p], None)
            return
        members = [m for m in self._hvd_groups[group] if m.requires_grad]
        if all(self._hvd_delay[m] == 0 for m in members):
            self._hvd_launch(members, group)

    # ------------------------------------------------------------------------- public API

    def synchronize(self) -> None:
        """Finishes this step's gradient reduction: launches the allreduces the hooks did not
        (parameters unused on this rank, partial accumulations), waits for all of them, and
        writes the results into ``p.grad``. Collective: every rank must call it (``step()``
        does). Afterwards the accumulation counters start again. On a rank outside the
        optimizer's process set it does nothing: that rank trains on its own gradients."""
        if self._hvd_local:
            return
        error = vote = None
        try:
            self._hvd_refresh()
        except Exception as exc:  # a parameter not named: nothing changed, go on with the rest
            error = exc
        if self._hvd_find_unused:
            try:
                vote = self._hvd_start_unused_vote()
            except Exception as exc:
                error = error or exc
        try:
            self._hvd_launch_missing()
        except Exception as exc:  # what did go out is waited for before raising
            error = error or exc
        if self._hvd_reducer is not None:
            try:
                _warn_replaced(self._hvd_reducer.wait_all())
            except Exception as exc:
                error = error or exc
        launched = {id(v): v for v in self._hvd_pending.own.values()}.values()
        compressed = [p for p in launched if isinstance(p, PowerSGDStep)]
        if compressed:  # PowerSGD: the second reduction (Q) of every matrix first
            try:
                self._hvd_powersgd.launch_q(compressed, self.op, self._hvd_prescale,
                                            self._hvd_postscale, f"{self._hvd_prefix}.powersgd.q")
            except Exception as exc:
                error = error or exc
        compression = self._hvd_wire_compression()
        for pending in launched:
            try:
                pending.finish(compression)
            except Exception as exc:  # wait for the rest before raising the first failure
                error = error or exc
        self._hvd_pending.clear()
        if vote is not None:
            try:
                self._hvd_end_unused_vote(vote)
            except Exception as exc:
                error = error or exc
        self._hvd_site = None
        if self._hvd_resparsify:  # reduced densely, handed back in the layout autograd made
            for p, sparse_dim in self._hvd_sparse_seen.items():
                if p.grad is not None and not p.grad.is_sparse:
                    p.grad = p.grad.to_sparse(sparse_dim)
        self._hvd_reset_counters()
        self._hvd_fresh_sync = True
        if error is not None:
            raise error
        if self._hvd_powersgd is not None:
            self._hvd_powersgd.step_done()
        # Bucket views: a changed parameter set drops the layout; the first step observed
        # builds one (collective; every rank got here without error).
        self._hvd_buckets.check(self)
        self._hvd_buckets.after_synchronize(self)

    def bucket_report(self) -> dict:
        """The gradient buckets (docs/bucket_views.md): ``enabled``, ``state`` ("off",
        "observing": the next step records the ready order, "built"), ``reason`` (why off, or
        what is left outside), ``buckets`` (per bucket: negotiated ``name``, ``bytes``,
        ``device`` its memory is on, ``members`` by name, ``views`` (whether its gradients live
        in its flat tensor), gradient ``copies`` made last step, ``own``: members reduced in
        tensors of their own last step, ``fallback_steps`` and the last ``fallback`` reason)
        and ``outside`` (parameters reduced one by one)."""
        return self._hvd_buckets.report(self)

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Inside this context ``step()`` does not synchronize. Use it after an explicit
        ``synchronize()``, e.g. to clip the reduced gradients first::

            loss.backward()
            optimizer.synchronize()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            with optimizer.skip_synchronize():
                optimizer.step()
        """
        self._hvd_should_sync = False
        try:
            yield
        finally:
            self._hvd_should_sync = True

    def step(self, closure=None):
        """Synchronizes (unless inside ``skip_synchronize()``) and runs the wrapped step.

        Right after an explicit ``synchronize()`` (no backward since), ``step()`` warns that
        ``skip_synchronize()`` was forgotten and does not reduce the gradients a second time
        (Horovod reduces them again, which is wrong for op=Sum). A ``closure`` is evaluated
        once, before the gradients are reduced."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._hvd_should_sync and not self._hvd_fresh_sync:
            _refuse_unreduced_inf_check(self)
        if self._hvd_should_sync:
            reducer = self._hvd_reducer
            if self._hvd_fresh_sync and not (reducer is not None and reducer.fired()):
                # One warning per such call, as in Horovod; Python's default warning filter
                # shows it once per call site.
                warnings.warn(STEP_AFTER_SYNC_WARNING, UserWarning, stacklevel=2)
            else:
                self.synchronize()
        elif self._hvd_pending:
            raise OutstandingAllreduceError(
                "optimizer.step() inside skip_synchronize() while gradient allreduces are in "
                f"flight ({self._hvd_pending_names()}); call optimizer.synchronize() before "
                "the skip_synchronize() block."
            )
        self._hvd_fresh_sync = False
        if step_vote.active():  # hvd.elastic.run, rollback "step": every rank got here
            step_vote.vote(getattr(self, "process_set", None))
        super().step()
        summary.step_completed()  # HOROVOD_SUMMARY_STEPS: every rank steps, so it is collective
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clears gradients and restarts gradient accumulation. Raises if allreduces of this
        step are still in flight (they would write into the cleared gradients)."""
        if self._hvd_pending:
            raise OutstandingAllreduceError(
                "optimizer.zero_grad() was called after loss.backward() but before "
                "optimizer.step() or optimizer.synchronize(): the allreduces of "
                f"{self._hvd_pending_names()} are still in flight. Call optimizer.step() (or "
                "optimizer.synchronize()) first."
            )
        # Hooks for parameters unfrozen since the last step. A built bucket layout is kept
        # until the end of the next synchronize() even if the parameters changed: a rank alone
        # in dropping it would send gradients under other names than the others (a bucket a
        # changed member cannot join goes out member by member, agreed with the other ranks).
        self._hvd_refresh()
        self._hvd_reset_counters()
        self._hvd_fresh_sync = False
        super().zero_grad(set_to_none=set_to_none)

    def load_state_dict(self, state_dict) -> None:
        """Loads the wrapped optimizer's state; gradient accumulation restarts."""
        if self._hvd_pending:
            raise OutstandingAllreduceError(
                "optimizer.load_state_dict() while the allreduces of "
                f"{self._hvd_pending_names()} are in flight; call optimizer.step() or "
                "synchronize() first."
            )
        powersgd = self.__dict__.get("_hvd_powersgd")
        if "powersgd" in state_dict:
            state_dict = dict(state_dict)
            saved = state_dict.pop("powersgd")
            if powersgd is not None:
                powersgd.load_state_dict(saved)
        super().load_state_dict(state_dict)
        self._hvd_reset_counters()

    def state_dict(self) -> dict:
        """The wrapped optimizer's state, and with PowerSGD its state under ``"powersgd"``
        (the step count, each matrix's Q and this rank's error feedback)."""
        out = super().state_dict()
        powersgd = self.__dict__.get("_hvd_powersgd")
        if powersgd is not None:
            out["powersgd"] = powersgd.state_dict()
        return out

    def _hvd_abandon_step(self) -> None:
        """Drops this step's reductions after a failure (``hvd.elastic`` rolls back): their
        handles die with the runtime at the elastic reset, so they are not waited for. The
        gradients of the failed step are cleared and accumulation restarts, so the retried
        step does not add to partial sums. A dense gradient is cleared to a dense zero tensor
        (not to None): a sparse parameter's gradient that ``zero_grad(set_to_none=False)`` or
        ``broadcast_optimizer_state`` made dense stays dense, so the retried step reduces and
        applies it as a step without the failure would (found by the combination grid:
        Adagrad, an embedding's sparse gradient, PowerSGD)."""
        self._hvd_pending.clear()
        if self._hvd_reducer is not None:
            self._hvd_reducer.abandon()
        # The ranks after a reset may differ: the buckets are laid out again.
        self._hvd_buckets.invalidate(self, "elastic reset")
        self._hvd_reset_counters()
        self._hvd_fresh_sync = False
        for p in self._hvd_params():
            dense = p.grad is not None and not p.grad.is_sparse
            # a fresh tensor, not the old one zeroed: it may be a view of a dropped bucket
            p.grad = torch.zeros_like(p.grad) if dense else None

    def add_param_group(self, param_group) -> None:
        """Adds a param group; its parameters get names (generated, or looked up in
        ``named_parameters``) and hooks. A parameter missing from ``named_parameters`` is
        refused before anything changes."""
        params = param_group["params"]
        params = [params] if isinstance(params, torch.Tensor) else list(params)
        if self._hvd_named is not None:
            for p in params:
                self._hvd_check_named(p)
        super().add_param_group({**param_group, "params": params})
        self._hvd_refresh()

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Changes how many backward passes are accumulated locally before each allreduce."""
        _check_passes(passes)
        if self._hvd_pending:
            raise OutstandingAllreduceError(
                "set_backward_passes_per_step() while allreduces are in flight; call "
                "optimizer.step() first."
            )
        self.backward_passes_per_step = int(passes)
        if self._hvd_reducer is not None:
            self._hvd_reducer.set_passes(self.backward_passes_per_step)
        self._hvd_reset_counters()

    def _hvd_pending_names(self) -> str:
        names = sorted(self._parameter_names[p] for p in self._hvd_pending)
        more = f" and {len(names) - 3} more" if len(names) > 3 else ""
        return ", ".join(f"'{n}'" for n in names[:3]) + more


# torch's Optimizer wraps a class's ``step`` to run step hooks unless it is marked ``hooked``;
# our step calls the wrapped class's (already hooked) step, so the hooks must not run twice.
_DistributedOptimizer.step.hooked = True


def _refuse_unreduced_inf_check(optimizer) -> None:
    """A fused optimizer takes GradScaler's other path: the scaler checks ``.grad`` for inf/nan
    itself and hands ``found_inf`` to ``step()``. Without ``synchronize()`` first it checked this
    rank's own gradients, before they were reduced: a rank that overflowed alone would skip the
    step while the others take it. Refused, on every rank (they all take this path)."""
    if "found_inf" in optimizer.__dict__:
        raise HorovodArgumentError(
            "DistributedOptimizer.step() from GradScaler.step() with a fused optimizer, without "
            "optimizer.synchronize() first: the scaler checked this rank's own gradients for "
            "inf/nan before they were reduced, so ranks could skip different steps. Call "
            "optimizer.synchronize() and scaler.unscale_(optimizer) before, and "
            "scaler.step(optimizer) inside `with optimizer.skip_synchronize():`")


def _warn_replaced(found) -> None:
    """``found``: the reducer's (parameters whose ``p.grad`` was replaced after backward sent it
    and before ``synchronize()`` (``p.grad = t``, ``p.grad.data = t``), those whose ``p.grad``
    was changed in place meanwhile). Replaced: the average went into the tensor that
    was sent, and this rank trains on the user's, unreduced. Changed in place (the
    ``scaler.unscale_(optimizer)`` or clipping before ``synchronize()`` of a wrong recipe): a
    race with the allreduce writing the same memory. Misuses (as in Horovod), never silent."""
    replaced, changed = found
    if not replaced and not changed:
        return
    from horovodlite.common.basics import rank

    def names(ns):
        return f"{len(ns)} parameter(s) (" + ", ".join(repr(n) for n in ns[:5]) + \
            (" ..." if len(ns) > 5 else "") + ")"

    if replaced:
        warnings.warn(
            f"rank {rank()}: the gradient of {names(replaced)} was replaced while its allreduce "
            "was in flight (p.grad or p.grad.data assigned after backward, before "
            "synchronize()): the average went into the tensor that was sent, so p.grad holds "
            "this rank's own value. Change gradients after synchronize()",
            RuntimeWarning, stacklevel=4)
    if changed:
        warnings.warn(
            f"rank {rank()}: the gradient of {names(changed)} was changed in place while its "
            "allreduce was in flight (e.g. scaler.unscale_(optimizer) or clipping before "
            "optimizer.synchronize()): it raced with the average being written into it. Call "
            "optimizer.synchronize() first, then change gradients, then step inside "
            "`with optimizer.skip_synchronize():`",
            RuntimeWarning, stacklevel=4)


def _check_passes(passes) -> None:
    if isinstance(passes, bool) or not isinstance(passes, int) or passes <= 0:
        raise HorovodArgumentError(
            f"backward_passes_per_step must be a positive int, got {passes!r}"
        )


__all__ = ["OutstandingAllreduceError", "STEP_AFTER_SYNC_WARNING"]
