"""The rank reports' wire format (``report.py``, ``task.py``): JSON lines signed with the job's
report token, which never crosses the network.

1. The launcher, on accepting a connection, sends a challenge: ``{"challenge": "<32 hex>"}``,
   fresh for each connection.
2. From then on, every line either way is ``<mac> <json>``: the mac an HMAC-SHA256, keyed with the
   token (``HVDL_REPORT_TOKEN``), of the sender's side (``rank`` or ``launcher``), the line's
   number among that side's lines on this connection, the challenge and the JSON. A line whose
   mac does not match is refused: a process without the token cannot speak for a rank or for the
   launcher, and a line recorded from one connection (or earlier on this one) cannot be played
   again.
3. The rank's line 0 is its hello (``started``); the launcher's line 0 is ``{"event": "ok"}``,
   which tells the rank it reached its own launcher. To a rank added while the job runs (hello
   ``"added": true``: an elastic MPI job's growth, whose ranks MPI starts without the job's
   environment on a host added to it) the launcher then sends the job's environment
   (``env_parts``), which the rank wrapper lays over its own before it starts the rank: no
   value goes on a command line. Then the rank's heartbeats and exit, the launcher's notices (a
   lost host, a failed rank).

The launcher's heartbeats are empty lines, unsigned: they carry nothing but "this connection
lives", which an attacker could only fake by taking over the TCP connection itself.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets

RANK = "rank"
LAUNCHER = "launcher"
MAX_LINE = 65536  # a longer line (or unended garbage) is refused
ENV_PART = 60000  # bytes of variables' JSON in one "env" line: a line stays under MAX_LINE


def env_parts(env: dict) -> list:
    """The launcher's messages that hand ``env`` to an added rank: ``{"event": "env", "env":
    {...}}`` with at most ``ENV_PART`` bytes of JSON each, then ``{"event": "env", "end": true,
    "too_long": [names]}``: a variable whose own JSON exceeds ``ENV_PART`` stays behind, named
    there. The JSON escapes every non-ASCII character, newlines included: a value arrives
    exactly (``read_env_parts``)."""
    parts, part, size, too_long = [], {}, 0, []
    for name, value in sorted(env.items()):
        item = len(json.dumps({name: value}))
        if item > ENV_PART:
            too_long.append(name)
            continue
        if part and size + item > ENV_PART:
            parts.append({"event": "env", "env": part})
            part, size = {}, 0
        part[name], size = value, size + item
    if part:
        parts.append({"event": "env", "env": part})
    return parts + [{"event": "env", "end": True, "too_long": too_long}]


def read_env_part(message: dict, env: dict) -> list | None:
    """Adds one of ``env_parts``' messages to ``env``; the names left behind once it is the
    last, else None. ValueError for anything else."""
    if message.get("event") != "env":
        raise ValueError("the launcher sent no environment")
    if message.get("end"):
        return [str(n) for n in message.get("too_long", [])]
    part = message.get("env")
    if not isinstance(part, dict) or not all(isinstance(v, str) for v in part.values()):
        raise ValueError("the launcher's environment is not an object of strings")
    env.update(part)
    return None


def challenge() -> str:
    return secrets.token_hex(16)


def challenge_line(value: str) -> bytes:
    return (json.dumps({"challenge": value}) + "\n").encode()


def read_challenge(line: bytes) -> str:
    """The challenge from the launcher's first line; raises ValueError."""
    value = json.loads(line).get("challenge")
    if not isinstance(value, str) or len(value) != 32:
        raise ValueError("no challenge from the launcher")
    return value


class Channel:
    """One connection's signing: ``seal`` this side's messages, ``open`` the other side's.
    Not thread-safe: the caller serialises its sends (and its reads)."""

    def __init__(self, token: str, challenge_value: str, side: str):
        self._key = token.encode()
        self._challenge = challenge_value
        self._side = side
        self._other = LAUNCHER if side == RANK else RANK
        self._sent = 0
        self._received = 0

    def _mac(self, side: str, number: int, body: bytes) -> str:
        head = f"{side}:{number}:{self._challenge}:".encode()
        return hmac.new(self._key, head + body, hashlib.sha256).hexdigest()

    def seal(self, message: dict) -> bytes:
        body = json.dumps(message).encode()
        line = self._mac(self._side, self._sent, body).encode() + b" " + body + b"\n"
        self._sent += 1
        return line

    def open(self, line: bytes) -> bytes:
        """The JSON of the other side's next line; raises ValueError saying why it is refused."""
        mac, _, body = line.strip().partition(b" ")
        try:
            expected = self._mac(self._other, self._received, body)
            ok = hmac.compare_digest(mac.decode("ascii"), expected)
        except UnicodeDecodeError:
            ok = False
        if not ok:
            raise ValueError("a line not signed with the job's report token")
        self._received += 1
        return body
