"""horovodliterun's options that set the ranks' knobs, and horovodrun's options it takes or refuses.

A knob option sets one HOROVOD_* variable in every rank's environment, the name the core reads
(``csrc/common/config.cc``; ``python scripts/knob_table.py`` lists them):

    --fusion-threshold-mb 32        HOROVOD_FUSION_THRESHOLD=33554432
    --hierarchical-allreduce        HOROVOD_HIERARCHICAL_ALLREDUCE=1
    --gloo-timeout-seconds 60       HOROVOD_GLOO_TIMEOUT_SECONDS=60

``KNOB_FLAGS`` is that table. The launcher reads the same environment it gives the ranks, so
``--gloo-timeout-seconds`` also sets how long it waits for the survivors of a failed rank.

horovodrun's options that are launcher behaviour, not knobs: ``--slots-per-host`` (the slots of
a host given without ``:N``, in ``-H``, ``--hostfile`` and the discovery script's output),
``--tcp`` (MPI: Open MPI's TCP transport only, even between ranks of one host; under
``--gloo`` ranks on different hosts always talk TCP, and ranks of one host keep their shared
memory), ``--binding-args`` (MPI: mpirun's binding arguments instead of ``--bind-to none``),
``--disable-cache`` (horovodrun's own cache of its start-up checks, which horovodliterun does not
keep: it changes nothing; the response cache is ``--cache-capacity``).

``REFUSED``: horovodrun's options for what horovodlite does not have. Given on the command line
or in ``--config-file``, each stops the launcher with a message saying what to use instead,
rather than being accepted and ignored.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass


def _number(value: float) -> str:
    return f"{value:g}"


def _mib(value: float) -> str:
    return str(int(value * 1024 * 1024))


@dataclass(frozen=True)
class KnobFlag:
    flags: tuple  # the option's names
    knob: str  # the variable it sets
    kind: type | None  # the value's type; None: a switch, which sets the knob to ``value``
    help: str
    value: object = str  # the knob's text: a function of the option's value, or a switch's text
    choices: tuple | None = None

    @property
    def dest(self) -> str:
        return self.flags[0].lstrip("-").replace("-", "_")

    def knob_value(self, given) -> str | None:
        """The knob's text for the option's value; None when the option was not given."""
        if given is None or given is False:
            return None
        return self.value if self.kind is None else self.value(given)


KNOB_FLAGS = (
    KnobFlag(("--fusion-threshold-mb",), "HOROVOD_FUSION_THRESHOLD", float,
             "HOROVOD_FUSION_THRESHOLD in MiB", _mib),
    KnobFlag(("--cycle-time-ms",), "HOROVOD_CYCLE_TIME", float,
             "HOROVOD_CYCLE_TIME in milliseconds", _number),
    KnobFlag(("--cache-capacity",), "HOROVOD_CACHE_CAPACITY", int, "HOROVOD_CACHE_CAPACITY"),
    KnobFlag(("--hierarchical-allreduce",), "HOROVOD_HIERARCHICAL_ALLREDUCE", None,
             "HOROVOD_HIERARCHICAL_ALLREDUCE=1 (default auto)", "1"),
    KnobFlag(("--hierarchical-allgather",), "HOROVOD_HIERARCHICAL_ALLGATHER", None,
             "HOROVOD_HIERARCHICAL_ALLGATHER=1 (default auto)", "1"),
    KnobFlag(("--timeline-filename",), "HOROVOD_TIMELINE", str,
             "HOROVOD_TIMELINE: write a Chrome trace here"),
    KnobFlag(("--timeline-mark-cycles",), "HOROVOD_TIMELINE_MARK_CYCLES", None,
             "HOROVOD_TIMELINE_MARK_CYCLES=1", "1"),
    KnobFlag(("--autotune",), "HOROVOD_AUTOTUNE", None, "HOROVOD_AUTOTUNE=1", "1"),
    KnobFlag(("--autotune-log-file",), "HOROVOD_AUTOTUNE_LOG", str, "HOROVOD_AUTOTUNE_LOG"),
    KnobFlag(("--autotune-warmup-samples",), "HOROVOD_AUTOTUNE_WARMUP_SAMPLES", int,
             "HOROVOD_AUTOTUNE_WARMUP_SAMPLES"),
    KnobFlag(("--autotune-steps-per-sample",), "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", int,
             "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE"),
    KnobFlag(("--stall-check-warning-time-seconds",), "HOROVOD_STALL_CHECK_TIME_SECONDS", float,
             "HOROVOD_STALL_CHECK_TIME_SECONDS", _number),
    KnobFlag(("--stall-check-shutdown-time-seconds",), "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS",
             float, "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", _number),
    KnobFlag(("--no-stall-check",), "HOROVOD_STALL_CHECK_DISABLE", None,
             "HOROVOD_STALL_CHECK_DISABLE=1", "1"),
    KnobFlag(("--log-level",), "HOROVOD_LOG_LEVEL", str, "HOROVOD_LOG_LEVEL",
             choices=("trace", "debug", "info", "warning", "error", "fatal")),
    KnobFlag(("--log-hide-timestamp", "--log-without-timestamp"), "HOROVOD_LOG_HIDE_TIME", None,
             "HOROVOD_LOG_HIDE_TIME=1: log lines without timestamps", "1"),
    KnobFlag(("--gloo-timeout-seconds",), "HOROVOD_GLOO_TIMEOUT_SECONDS", float,
             "HOROVOD_GLOO_TIMEOUT_SECONDS: how long a Gloo-controller rank waits for a silent "
             "peer (default 30); the launcher gives the survivors of a failed rank as long",
             _number),
)

_AUTOTUNE_SEARCH = ("horovodlite's autotune is a coordinate search over small grids, not "
                    "Bayesian optimisation: drop it (--autotune-warmup-samples and "
                    "--autotune-steps-per-sample shape the search)")

# (names, the value's type or None for a switch, what to do instead)
REFUSED = (
    (("--num-nccl-streams",), int,
     "horovodlite runs its NCCL operations on one stream per GPU: drop it"),
    (("--autotune-bayes-opt-max-samples",), int, _AUTOTUNE_SEARCH),
    (("--autotune-gaussian-process-noise",), float, _AUTOTUNE_SEARCH),
    (("--jsrun",), None,
     "horovodliterun does not start jobs with jsrun: in an LSF allocation use --mpi (mpirun "
     "reads the allocation) or --gloo with -H/--hostfile"),
)


def _dest(flags: tuple) -> str:
    return flags[0].lstrip("-").replace("-", "_")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The knob options, horovodrun's launcher options and the refused ones (see the top)."""
    knobs = p.add_argument_group("knobs (each sets a HOROVOD_* variable on every rank)")
    for f in KNOB_FLAGS:
        if f.kind is None:
            knobs.add_argument(*f.flags, dest=f.dest, action="store_true", help=f.help)
        else:
            knobs.add_argument(*f.flags, dest=f.dest, type=f.kind, choices=f.choices,
                               help=f.help)
    p.add_argument("--slots-per-host", type=int,
                   help="the slots of a host given without :N (in -H, --hostfile and the "
                        "discovery script's output; default 1)")
    p.add_argument("--disable-cache", action="store_true",
                   help="horovodrun's: run the start-up checks every time; horovodliterun "
                        "caches none, so this changes nothing (the response cache: "
                        "--cache-capacity)")
    p.add_argument("--tcp", action="store_true",
                   help="MPI mode: Open MPI's TCP transport only, also between ranks of one "
                        "host (--mca pml ob1 --mca btl tcp,self); under --gloo ranks on "
                        "different hosts always use TCP and this changes nothing")
    p.add_argument("--binding-args",
                   help="MPI mode: mpirun's process binding arguments, e.g. '--bind-to core "
                        "--map-by socket' or '--rankfile FILE', instead of --bind-to none")
    refused = p.add_argument_group("horovodrun options horovodlite does not take")
    for flags, kind, instead in REFUSED:
        if kind is None:
            refused.add_argument(*flags, dest=_dest(flags), action="store_true",
                                 help=f"refused: {instead}")
        else:
            refused.add_argument(*flags, dest=_dest(flags), type=kind, help=f"refused: {instead}")


def check(args, error) -> None:
    """Stops (``error(message)``) on a refused option or options that contradict each other."""
    for flags, _, instead in REFUSED:
        if getattr(args, _dest(flags)) not in (None, False):
            error(f"{flags[0]}: {instead}")
    if args.slots_per_host is not None and args.slots_per_host < 1:
        error(f"--slots-per-host {args.slots_per_host}: expected at least 1")


def check_gloo(args, error) -> None:
    """The options that need mpirun, under --gloo or --elastic without MPI."""
    if args.binding_args:
        error("--binding-args is for mpirun (--mpi); without MPI pin ranks with "
              "HOROVOD_BIND_RANKS=1 (local rank i to the i-th CPU), or run the command under "
              "numactl/taskset")


def knob_env(args) -> dict:
    """{knob: value} of the knob options given (``KNOB_FLAGS``)."""
    env = {}
    for f in KNOB_FLAGS:
        value = f.knob_value(getattr(args, f.dest, None))
        if value is not None:
            env[f.knob] = value
    return env


def with_slots(spec: str, slots: int | None) -> str:
    """``-H``'s value with ``slots`` for every host given without ``:N`` (unchanged when
    ``slots`` is None)."""
    if not slots:
        return spec
    return ",".join(h if ":" in h else f"{h}:{slots}" for h in spec.split(",") if h)


def discovery_with_slots(text: str, slots: int | None) -> str:
    """A host discovery script's output with ``slots`` for every line without ``:N``."""
    if not slots:
        return text
    lines = []
    for line in text.splitlines():
        word = line.strip()
        bare = word and not word.startswith("#") and ":" not in word
        lines.append(f"{word}:{slots}" if bare else line)
    return "\n".join(lines) + "\n"


__all__ = ["KNOB_FLAGS", "REFUSED", "KnobFlag", "add_arguments", "check", "check_gloo",
           "knob_env", "with_slots", "discovery_with_slots"]
