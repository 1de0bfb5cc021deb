"""Slurm's list forms, read in one place: host list expressions (``SLURM_JOB_NODELIST``,
``SLURM_STEP_NODELIST``) and per-node counts (``SLURM_TASKS_PER_NODE``,
``SLURM_JOB_CPUS_PER_NODE``). ``common/launchers.py`` reads them for a task srun started (its
rank 0's host, its node's task count); ``runner/allocation.py`` for the hosts and slots of the
allocation horovodliterun runs in."""

from __future__ import annotations

import re


def _split_outside_brackets(text: str) -> list:
    parts, depth, current = [], 0, ""
    for c in text:
        depth += (c == "[") - (c == "]")
        if depth < 0:
            raise ValueError(f"unbalanced brackets in {text!r}")
        if c == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += c
    if depth:
        raise ValueError(f"unbalanced brackets in {text!r}")
    return parts + [current]


def _range_values(body: str) -> list:
    """'01-03,7' -> ['01', '02', '03', '7'] (leading zeros kept at the width of the start)."""
    out = []
    for item in body.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:-(\d+))?\s*", item)
        if not m:
            raise ValueError(f"bad range {item!r}")
        low, high = m.group(1), m.group(2) or m.group(1)
        if int(high) < int(low):
            raise ValueError(f"range {item!r} runs backwards")
        out += [str(n).zfill(len(low)) for n in range(int(low), int(high) + 1)]
    return out


def expand_nodelist(spec: str) -> list:
    """A Slurm host list expression as host names: ``node[01-03,07],gpu5`` gives node01,
    node02, node03, node07, gpu5; ``rack[1-2]-n[1-2]`` gives rack1-n1, rack1-n2, rack2-n1,
    rack2-n2. ValueError for what is not one."""
    hosts = []
    for item in _split_outside_brackets(spec.strip()):
        item = item.strip()
        if not item:
            continue
        names = [""]
        for literal, body in re.findall(r"([^\[]*)(?:\[([^\]]*)\])?", item):
            values = _range_values(body) if body else [""]
            names = [n + literal + v for n in names for v in values]
        hosts += names
    if not hosts:
        raise ValueError(f"no host in {spec!r}")
    return hosts


def expand_counts(spec: str) -> list:
    """Slurm's per-node counts: ``2(x3),1`` gives [2, 2, 2, 1]. ValueError for what is not
    one."""
    out = []
    for part in spec.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not m:
            raise ValueError(f"bad count {part!r} in {spec!r}")
        out += [int(m.group(1))] * int(m.group(2) or 1)
    return out


__all__ = ["expand_nodelist", "expand_counts"]
