"""The hosts of a job as the user gives them: ``-H host1:slots,host2:slots`` or ``--hostfile``
(both modes of horovodliterun place ranks by slot: host1 gets the first ones)."""

from __future__ import annotations


def read_hostfile(path: str, default_slots: int = 1) -> str:
    """A hostfile (`host slots=N`, `host:N` or `host`, one a line, # comments) as a -H value; a
    host without slots gets ``default_slots`` (``--slots-per-host``)."""
    hosts = []
    try:
        lines = open(path).read().splitlines()
    except OSError as e:
        raise SystemExit(f"horovodliterun: cannot read --hostfile {path}: {e.strerror}") from None
    for number, line in enumerate(lines, 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        host, slots = words[0], str(default_slots)
        if ":" in host:
            host, slots = host.rsplit(":", 1)
        for w in words[1:]:
            key, _, value = w.partition("=")
            if key == "slots":
                slots = value
        if not host or not slots.isdigit() or int(slots) < 1:
            raise SystemExit(f"horovodliterun: {path}:{number}: expected `host slots=N` or "
                             f"`host:N`, got {line.strip()!r}")
        hosts.append(f"{host}:{slots}")
    if not hosts:
        raise SystemExit(f"horovodliterun: --hostfile {path} names no host")
    return ",".join(hosts)


def host_slots(spec: str) -> list:
    """'a:2,b' -> [('a', 2), ('b', 1)]."""
    out = []
    for item in filter(None, spec.split(",")):
        host, _, slots = item.partition(":")
        out.append((host, int(slots) if slots.isdigit() else 1))
    return out
