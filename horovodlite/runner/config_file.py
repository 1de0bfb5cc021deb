"""horovodliterun --config-file F: the launcher's options from a YAML file.

The file is a mapping of long option names to values, ``-`` or ``_`` alike:

    num-proc: 4
    hosts: node1:2,node2:2
    gloo: true
    fusion_threshold_mb: 32
    timeline-filename: /tmp/timeline.json
    blacklist-cooldown-range: [10, 100]

A flag's value is ``true`` or ``false``; an option of several values takes a list, and so may a
repeatable one (``env-exclude: ['WANDB_*', 'MY_*']``). Options on the command line override the
file (its values become the parser's defaults); a repeatable option given on the command line
adds to the file's. Unknown names, and
values of the wrong kind, are an error naming them; the command to run and ``--config-file``
itself cannot be given in the file. Unlike Horovod's file, there are no sections (``params:``,
``timeline:`` ...): every key is an option of ``horovodliterun --help``.
"""

from __future__ import annotations

import argparse

NOT_IN_FILE = ("help", "version", "config_file", "command", "check_build")


def _read(path: str, fail) -> dict:
    try:
        import yaml
    except ImportError:
        fail("--config-file needs PyYAML (pip install pyyaml)")
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except OSError as e:
        fail(f"--config-file {path}: cannot read it: {e.strerror}")
    except yaml.YAMLError as e:
        fail(f"--config-file {path}: not valid YAML: {e}")
    if data is None:
        return {}
    if not isinstance(data, dict):
        fail(f"--config-file {path}: expected a mapping of option names to values, got a "
             f"{type(data).__name__}")
    return data


def _action(parser: argparse.ArgumentParser, key) -> argparse.Action | None:
    name = str(key).strip().lstrip("-").replace("_", "-")
    for option in (f"--{name}", f"-{name}"):
        action = parser._option_string_actions.get(option)
        if action is not None and action.dest not in NOT_IN_FILE:
            return action
    return None


KINDS = {int: "an integer", float: "a number"}


def _scalar(action: argparse.Action, value, say):
    if isinstance(value, (dict, list)) or value is None:
        say(f"expected one value, got {value!r}")
    kind = KINDS.get(action.type, "a value")
    if isinstance(value, bool) and action.type is not None:
        say(f"expected {kind}, got {value!r}")
    try:
        converted = action.type(value) if action.type else str(value)
    except (TypeError, ValueError):
        say(f"expected {kind}, got {value!r}")
    if action.choices is not None and converted not in action.choices:
        say(f"{converted!r} is not one of {', '.join(map(str, action.choices))}")
    return converted


def _value(action: argparse.Action, value, say):
    if isinstance(action, argparse._AppendAction):
        # a repeatable option (--env-exclude): one value or a list of them, each whole - a
        # string kept as the default would be iterated as its characters ('*' among them)
        return [_scalar(action, v, say) for v in (value if isinstance(value, list) else [value])]
    if action.nargs == 0:  # a flag (store_true, store_const: --gloo, --verbose, ...)
        if not isinstance(value, bool):
            say(f"expected true or false, got {value!r}")
        return action.const if value else action.default
    if isinstance(action.nargs, int):
        if not isinstance(value, list) or len(value) != action.nargs:
            say(f"expected a list of {action.nargs} values, got {value!r}")
        return [_scalar(action, v, say) for v in value]
    return _scalar(action, value, say)


def defaults(parser: argparse.ArgumentParser, path: str) -> dict:
    """The file's options as {dest: value} for ``parser.set_defaults``; exits through
    ``parser.error`` naming what is wrong."""
    data = _read(path, parser.error)
    unknown = [str(k) for k in data if _action(parser, k) is None]
    if unknown:
        parser.error(f"--config-file {path}: unknown option(s) {', '.join(map(repr, unknown))} "
                     "(keys are the long options of horovodliterun --help, without the dashes)")
    out = {}
    for key, value in data.items():
        action = _action(parser, key)

        def say(problem, key=key):
            parser.error(f"--config-file {path}: {key}: {problem}")

        value = _value(action, value, say)
        if action.nargs == 0 and value == action.default:
            # a switch turned off (`mpi: false`) says nothing about the other switches that set
            # the same option: `gloo: true` with `mpi: false` is Gloo, in either order
            out.setdefault(action.dest, value)
            continue
        if action.dest in out and out[action.dest] not in (action.default, value):
            others = [k for k in data if k != key and _action(parser, k).dest == action.dest]
            say(f"contradicts {', '.join(map(str, others))} (both set, choose one)")
        out[action.dest] = value
    return out
