"""``hvd.elastic.run``: retry a training function from the last commit after a failure.

Protocol of one call ``train(state, *args)`` (every rank runs it):

1. ``state.sync()``: every rank takes rank 0's state.
2. ``train(state, *args)``; when it returns, a barrier: ``run`` returns only once every rank's
   function has returned, so a rank that fails late still finds its peers ready to retry.
3. On ``HorovodInternalError`` (from any of the above): under rollback ``commit``,
   ``state.restore()`` to the last commit; under rollback ``step`` (the default: state.py)
   nothing is restored, and the sync of 1 takes the state of the survivor that applied the most
   steps. Then the reset (4-6) and back to 1.
   On ``HostsUpdatedInterrupt``: no restore; the reset (4-6), then back to 1 - or to 2 without
   the sync if the interrupt says ``skip_sync``. When it retires the ranks of hosts the
   discovery script no longer lists (discovery.py), ``state.sync()`` runs once more first, with
   every rank still there, so that what the leaving ranks processed counts.
4. Re-initialise horovodlite: ``shutdown()`` then ``init()`` with the arguments of the last
   ``init`` (after the ranks of retired hosts left: they exit here). This
   discards whatever the failure left behind (ops some ranks submitted and others never will,
   auto-name counters that diverged, handles) so the retry starts clean.
5. ``state.on_reset()`` (the registered reset callbacks).
6. Give up after ``reset_limit`` resets in a row - resets with no ``state.commit()`` between
   them: the last error propagates (the state is restored). A commit since the last reset
   starts the count again, so a long job survives any number of failures spread over its life
   (as a horovodrun job without --reset-limit does), while a failure that recurs before
   training can commit again ends the job instead of retrying forever. ``horovodliterun
   --reset-limit N`` (elastic without MPI) is the job's total, counted by the driver.

Why every rank resets. horovodlite has no elastic driver: the job is the ranks mpirun started
(plus those a growing job spawned), and ``init`` after ``shutdown`` is collective over all of
them. A failure seen by only some ranks still reaches the others: ``shutdown`` is job-wide, so a
rank that resets makes its peers' next collective raise ``HorovodInternalError``, and they reset
too. A rank that is gone (its process died) is survived only in elastic jobs on an MPI with ULFM
(``horovodliterun --elastic``): the runtime drops it and ``init`` starts on the survivors. A rank
that never reaches another collective is never survived (it is alive: nobody may drop it).
"""

from __future__ import annotations

import functools
import os
import shutil
import socket
import sys

from horovodlite.common import basics, elastic_worker, env_travel, launch_env
from horovodlite.common.exceptions import (
    HorovodArgumentError,
    HorovodInternalError,
    HostsUpdatedInterrupt,
)
from horovodlite.torch import step_vote
from horovodlite.torch.collectives import barrier
from horovodlite.torch.mpi_ops import shutdown

#: Resets in a row (no ``state.commit()`` between them) one ``run`` call performs before it lets
#: the error propagate. A failure that recurs deterministically (a bug, a rank that keeps
#: failing) would otherwise retry forever; failures between which training committed do not
#: add up. Override per function with ``@hvd.elastic.run(reset_limit=N)``.
DEFAULT_RESET_LIMIT = 5


def _log(message: str, who: str | None = None) -> None:
    where = f"{socket.gethostname()}:{os.getpid()}"
    try:
        who = who or f"rank {basics.rank()}/{basics.size()}"
    except ValueError:
        who = "rank ?"
    sys.stderr.write(f"[horovodlite {who} {where}] hvd.elastic: {message}\n")
    sys.stderr.flush()


def _retire(hosts: list, old_rank: int | None, old_size: int | None) -> None:
    """The ranks of ``hosts`` leave the job; this process exits if it is one of them.
    Collective over the job, horovodlite shut down."""
    me = socket.gethostname()
    leaving = me in hosts  # the names were gathered from the ranks' own gethostname()
    new_rank = basics._C.retire(leaving)
    gone = [r for r, n in enumerate(new_rank) if n < 0]
    names = ", ".join(hosts)
    who = f"rank {old_rank}/{old_size}"
    if leaving:
        _log(f"rank {old_rank} retires: its host {me} is no longer in the host discovery "
             "output; leaving the job", who)
        raise SystemExit(0)
    if old_rank is not None and new_rank[old_rank] == 0:
        _log(f"retired rank{'s' if len(gone) > 1 else ''} {', '.join(map(str, gone))} of "
             f"{len(new_rank)} (host{'s' if len(hosts) > 1 else ''} {names} left the host "
             f"discovery output); {len(new_rank) - len(gone)} remain", who)


def _reinit_gloo(error: BaseException) -> None:
    """Step 4 for a worker of ``horovodliterun --elastic`` (the Gloo controller): shut down,
    then continue in the driver's next rendezvous round - asked for after a failure, published
    already after HostsUpdatedInterrupt - with the rank it gives; leave if the round retires
    this worker (its host left the discovery output)."""
    old_rank, old_size = ((basics.rank(), basics.size()) if basics.is_initialized()
                          else (None, None))
    basics._stop(f"elastic reset after {type(error).__name__}: {error}")
    shutdown()
    updated = isinstance(error, HostsUpdatedInterrupt)
    r = elastic_worker.next_round(failed=not updated)
    if elastic_worker.leaving(r):
        _log(f"rank {old_rank} retires: its host {socket.gethostname()} is no longer in the "
             "host discovery output; leaving the job", f"rank {old_rank}/{old_size}")
        raise SystemExit(launch_env.RETIRED_STATUS)
    basics._init_again()
    if basics.rank() == 0:
        _log(f"round {r.number}: {r.reason}; {basics.size()} rank"
             f"{'s' if basics.size() != 1 else ''} on {', '.join(dict.fromkeys(r.hosts))}")
    _check_min_np(error)


def _restarted_by_torchrun() -> bool:
    """torchrun with --max-restarts: its agent restarts every worker after a failure (they
    resume from the user's checkpoint), so a reset here would only wait for the dead."""
    return int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0) > 0


def _reinit(error: BaseException) -> None:
    """Step 4: shut down (telling the peers why) and initialise again - on the survivors, if
    the job lost ranks (an elastic job on an MPI with ULFM: see docs/elastic.md), without the
    ranks of hosts that left the discovery output."""
    from horovodlite.torch.elastic import discovery

    if elastic_worker.active():
        return _reinit_gloo(error)
    if _restarted_by_torchrun() and isinstance(error, HorovodInternalError):
        _log(f"{error}; ending this worker: torchrun restarts the job (--max-restarts "
             f"{os.environ.get('TORCHELASTIC_MAX_RESTARTS')}), from your last checkpoint")
        basics._stop(f"ended for torchrun to restart the job after: {error}")
        raise TorchrunRestart(str(error)) from error

    old_rank, old_size = ((basics.rank(), basics.size()) if basics.is_initialized()
                          else (None, None))
    basics._stop(f"elastic reset after {type(error).__name__}: {error}")
    shutdown()  # the runtime is already stopped: this clears names, handles, counters
    discovery.forget_job()
    updated = isinstance(error, HostsUpdatedInterrupt)
    retire = discovery.take_retirement() if updated else []
    if retire:
        _retire(retire, old_rank, old_size)
    add, host = discovery.take_request() if updated else (0, "")
    if add:  # the new ranks run this program too, and join at their hvd.init()
        command, argv = sys.executable, list(sys.orig_argv[1:])
        if launch_env.reports_to() and old_size is not None:
            # under horovodliterun's wrapper, as the ranks mpirun started: the launcher then
            # knows them ("rank 3 (added while training) ... exited with signal 9"); they
            # become ranks old_size.. of the grown job
            argv = ["-m", "horovodlite.runner.task", "--added-as", str(old_size), "--",
                    command, *argv]
        secret: list = []
        if host:
            command, argv, secret = growth_command(command, argv)
        basics._C.request_growth(add, command, argv, host, secret)
    basics._init_again()
    blocked = discovery.note_runtime_losses()  # every rank: the same losses, the same blacklist
    if blocked and basics.rank() == 0 and discovery.active():
        for name, seconds, failures in blocked:
            until = ("for the rest of the job" if seconds == float("inf")
                     else f"for {seconds:g} s (--blacklist-cooldown-range)")
            _log(f"host {name} blacklisted {until}: the job lost ranks there ({failures} "
                 f"time{'s' if failures > 1 else ''}); no new ranks start there")
    if add and basics.rank() == 0:
        where = f" on {host}, added to the job" if host else ""
        _log(f"started {add} new rank{'s' if add > 1 else ''}{where} (host discovery): "
             f"ranks {basics.size() - add}..{basics.size() - 1}")
    _check_min_np(error)


def growth_command(command: str, argv: list, env=os.environ) -> tuple:
    """(command, argv, secret) of ranks spawned on a host added to the job: its MPI daemon has
    no copy of the job's environment (the daemons mpirun started hand it to the ranks spawned on
    their hosts, the added host's daemon does not). The job's secrets (the report token) are
    ``secret``, for MPI_Comm_spawn's environment info key (MPI sets them in the new processes'
    environment, as mpirun's -x does for the others). The rest of the environment: under
    horovodliterun's rank wrapper (``argv`` runs ``horovodlite.runner.task``, which reaches the
    launcher with the token), the launcher sends it to the wrapper (``report_channel.env_parts``):
    only the launcher's address goes on the command line (env(1)), which ps shows and the spawn
    request carries, and every value arrives exactly. Without the wrapper
    (``--no-rank-reports``, plain mpirun) the command goes through env(1) with the variables
    that reach other hosts, but values with a newline."""
    travel = env_travel.job_environment(env)
    secret = [kv for kv in travel if kv.split("=", 1)[0] in launch_env.SECRETS]
    public = [kv for kv in travel if kv.split("=", 1)[0] not in launch_env.SECRETS]
    report_to = launch_env.reports_to(env)
    if report_to and argv[:2] == ["-m", "horovodlite.runner.task"]:
        # only where the launcher is (an address): the wrapper gets the rest from it
        public = [f"{launch_env.REPORT_TO}={report_to}"]
    return shutil.which("env") or "/usr/bin/env", [*public, command, *argv], secret


def min_np() -> int:
    """``horovodliterun --min-np``; 1 when not given."""
    return launch_env.min_np()


class BelowMinNp(HorovodInternalError):
    """Fewer ranks than ``--min-np`` are left: ``run`` stops instead of resetting again."""


class TorchrunRestart(HorovodInternalError):
    """Under torchrun --max-restarts a failure ends the worker: torchrun restarts them all."""


def _check_min_np(error: BaseException) -> None:
    size, floor = basics.size(), min_np()
    if size < floor:
        raise BelowMinNp(
            f"hvd.elastic: only {size} rank{'s remain' if size != 1 else ' remains'}, fewer than "
            f"--min-np {floor}; stopping. The failure: {error}"
        ) from error


def _all_finished() -> None:
    """Step 2's barrier; it fails with HorovodInternalError if a peer is resetting."""
    barrier()


def retry_loop(func, state, args, kwargs, reset_limit: int, reset=_reinit,
               finish=_all_finished):
    """Runs steps 1-6 with ``reset(error)`` and ``finish()`` as collaborators (tests replace
    them to exercise the protocol without MPI). Returns ``func``'s result."""
    resets = 0
    skip_sync = False
    committed = _commits(state)  # the commit count at the last reset: progress since it?
    while True:
        try:
            if not skip_sync:
                # every rank restores the same commit (state.py), then takes rank 0's state;
                # before every sync, so that every rank of the job - one that failed, one that
                # was interrupted, one that just joined - runs the same collectives
                getattr(state, "agree_on_commit", lambda: None)()
                state.sync()
            with step_vote.voting(_rollback(state) == "step"):
                result = func(state, *args, **kwargs)
            finish()
            return result
        except HorovodInternalError as exc:
            error, skip_sync = exc, False
            skip_restore = _rollback(state) == "step"
            if not skip_restore:
                state.restore()
        except HostsUpdatedInterrupt as exc:
            error, skip_sync, skip_restore = exc, exc.skip_sync, True
            if _retiring():  # the leaving ranks' processed samples must count: sync with them
                state.sync()
        if _commits(state) != committed:  # training committed since the last reset: the
            resets, committed = 0, _commits(state)  # failures are not in a row
        if resets >= reset_limit:
            if hasattr(error, "add_note"):
                error.add_note(f"hvd.elastic.run gave up after {resets} resets "
                               f"in a row without a commit (reset_limit={reset_limit})")
            raise error
        resets += 1
        rolled_back = (" (state rolled back to the last commit)" if not skip_restore else
                       " (no rollback: the survivors keep their state)"
                       if isinstance(error, HorovodInternalError) else "")
        _log(f"reset {resets} of at most {reset_limit}{rolled_back} after "
             f"{type(error).__name__}: {error}")
        before = basics.size() if basics.is_initialized() else None
        while True:
            try:
                reset(error)
                break
            except (BelowMinNp, TorchrunRestart, elastic_worker.JobEnded,
                    elastic_worker.NotInJob):
                raise
            except HorovodInternalError as exc:  # the re-initialisation failed too
                if resets >= reset_limit:
                    raise
                resets += 1
                error = exc
                _log(f"reset {resets} of at most {reset_limit}: the re-initialisation failed: "
                     f"{exc}")
        if basics.is_initialized() and basics.rank() == 0:
            at = f"commit {state.commits}" if state.commits else "the start (no commit yet)"
            if _rollback(state) == "step":  # every step applied is a commit
                at = f"step {_applied(state)} (no rollback; {state.commits} commits)"
            sizes = f"{before} -> {basics.size()}" if before else f"{basics.size()}"
            _log(f"continuing from {at} with {sizes} ranks")
        state.on_reset()


def _commits(state) -> tuple:
    """How far ``state`` got: its commits (commit() is collective, so every rank agrees) and
    the optimizer steps it applied; 0 for a state without the counters."""
    return getattr(state, "commits", 0), _applied(state)


def _applied(state) -> int:
    return getattr(state, "applied", 0)


def _rollback(state) -> str:
    """``step`` or ``commit`` (state.py); ``commit`` for a state that does not say."""
    mode = getattr(state, "rollback_mode", None)
    return mode() if callable(mode) else "commit"


def _retiring() -> bool:
    from horovodlite.torch.elastic import discovery

    if elastic_worker.active():  # the driver's next round drops workers on purpose
        return elastic_worker.retiring()
    return bool(discovery.retiring())


def _check_limit(reset_limit) -> int:
    if isinstance(reset_limit, bool) or not isinstance(reset_limit, int) or reset_limit < 0:
        raise HorovodArgumentError(
            f"hvd.elastic.run: reset_limit must be an int >= 0, got {reset_limit!r}"
        )
    return reset_limit


def run(func=None, *, reset_limit: int | None = None):
    """Decorator: ``func(state, *args, **kwargs)`` is retried from ``state``'s last commit when
    a collective fails (see the module docstring for the protocol).

    Use as ``@hvd.elastic.run`` or ``@hvd.elastic.run(reset_limit=N)``: give up after N resets
    in a row, with no ``state.commit()`` between them (default ``DEFAULT_RESET_LIMIT``, 5; 0
    disables retries). Call collectives only inside ``func``: its first step is a collective
    sync of ``state``.
    """
    if func is None:
        return functools.partial(run, reset_limit=reset_limit)
    limit = _check_limit(DEFAULT_RESET_LIMIT if reset_limit is None else reset_limit)

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        return retry_loop(func, state, args, kwargs, limit)

    return wrapper


__all__ = ["run", "retry_loop", "DEFAULT_RESET_LIMIT"]
