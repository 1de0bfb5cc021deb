"""The job's c10d store under its secret: keys a stranger cannot name, values it cannot forge.

A TCPStore answers anyone who reaches its port, and its traffic is not encrypted. Where a
launcher made a secret for the job (``horovodliterun --gloo``, ``--elastic``, ``horovodlite.ray``,
``horovodlite.spark``: ``HVDL_RENDEZVOUS_SECRET``), every key the job uses is reached through a
``SignedStore``:

- Its NAME lives under a prefix that is an HMAC-SHA256 of the namespace (the job id and round,
  or the elastic driver's rounds) keyed with the secret: a client without the secret cannot
  name any of the job's keys, so it cannot read them, and nothing in the store lets it derive
  the secret or a prefix (the store holds no hash of the secret).
- Its VALUE is stored as ``tag || value``, the tag an HMAC-SHA256 of the key's full name and the
  value keyed with the secret. ``get`` checks it: a value that fails (written by someone who saw
  the key's name on the wire, but has no secret) raises ``TamperedError`` naming the key; it is
  never returned. The full name in the tag keeps a signed value from being replayed under
  another key (another rank's, another round's).

The class is a Python ``torch.distributed.Store``: c10d's C++ code (ProcessGroupGloo exchanging
its pair addresses, a ``PrefixStore`` above it) calls it like any store, and so reads verified
values. Counters (``add``) cannot carry a tag; they are only under the hidden prefix, and the
job's protocol does not rely on them where a secret exists: a stranger who saw a counter's name
can add any amount to it (a negative one too). Where the protocol needs a count, it claims
write-once signed keys instead (``claim``), and where it needs the latest of a sequence it
reads the write-once keys themselves, not a mutable pointer that an older signed value could
roll back (``elastic_rounds.py``).

``mark_job`` and ``check_job`` replace the stored hash of the secret: the launcher's store holds
one signed value under a key named by the secret, which a worker of another job cannot find.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac

import torch.distributed as dist

TAG_BYTES = 32  # HMAC-SHA256
JOB_KEY = "job"  # the job's marker, under prefix(secret, "job")
JOB_VALUE = b"horovodlite"


class TamperedError(RuntimeError):
    """A value in the job's store is not signed with the job's secret."""


def _key(secret: str) -> bytes:
    return secret.encode()


def prefix(secret: str, *parts) -> str:
    """The hidden prefix of a namespace (``parts``: e.g. the job id and the round)."""
    text = "prefix:" + "/".join(str(p) for p in parts)
    return "hvdl/" + hmac.new(_key(secret), text.encode(), hashlib.sha256).hexdigest()[:32] + "/"


def tag(secret: str, name: str, value: bytes) -> bytes:
    return hmac.new(_key(secret), b"value:" + name.encode() + b"\0" + value,
                    hashlib.sha256).digest()


def _bytes(value) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


class SignedStore(dist.Store):
    """``store``'s keys under ``prefix(secret, *namespace)``, their values signed (see the top).
    ``label`` names the namespace in errors ("round 3 of the rendezvous at ADDR:PORT").
    Thread-safe as the store under it is; every call blocks as that store's does."""

    def __init__(self, store, secret: str, namespace: tuple, label: str):
        super().__init__()
        self.store = store
        self.prefix = prefix(secret, *namespace)
        self.label = label
        self._secret = secret
        self.tampered = ""  # the last TamperedError's message (c10d's C++ may reword it)

    def _name(self, key: str) -> str:
        return self.prefix + key

    def raw(self, sub: str):
        """A c10d PrefixStore under this namespace's hidden prefix, without signatures (for
        C++ code that writes and reads its own values, e.g. the Gloo watchdog's heartbeats)."""
        return dist.PrefixStore(self.prefix + sub, self.store)

    def open(self, key: str, stored: bytes) -> bytes:
        """The value of ``key`` from what the store holds; raises TamperedError."""
        name = self._name(key)
        value = stored[TAG_BYTES:]
        if len(stored) < TAG_BYTES or not hmac.compare_digest(
                stored[:TAG_BYTES], tag(self._secret, name, value)):
            self.tampered = (
                f"the rendezvous was tampered with: key '{key}' of {self.label} holds a value "
                "not signed with this job's secret (written by a process outside the job, "
                "which could reach the store's port); the value is not used")
            raise TamperedError(self.tampered)
        return value

    # -- c10d's Store interface ------------------------------------------------------------
    def set(self, key, value) -> None:
        name = self._name(key)
        data = _bytes(value)
        self.store.set(name, tag(self._secret, name, data) + data)

    def get(self, key) -> bytes:
        return self.open(key, self.store.get(self._name(key)))

    def multi_get(self, keys) -> list:
        names = [self._name(k) for k in keys]
        stored = self.store.multi_get(names)
        return [self.open(k, s) for k, s in zip(keys, stored)]

    def check(self, keys) -> bool:
        return self.store.check([self._name(k) for k in keys])

    def wait(self, keys, timeout=None) -> None:
        names = [self._name(k) for k in keys]
        if timeout is None:
            self.store.wait(names)
        else:
            self.store.wait(names, timeout)

    def claim(self, key, value) -> bool:
        """Sets ``key`` only if nobody has (compare-and-set on the store): whether this call
        did. A write-once signed key is what a stranger can neither forge nor roll back - a
        signed value it replays under the same name is the same value - unlike a counter."""
        name = self._name(key)
        data = _bytes(value)
        signed = tag(self._secret, name, data) + data
        return bytes(self.store.compare_set(name, b"", signed)) == signed

    def add(self, key, amount) -> int:
        return self.store.add(self._name(key), amount)

    def delete_key(self, key) -> bool:
        return self.store.delete_key(self._name(key))

    def num_keys(self) -> int:
        return self.store.num_keys()

    def set_timeout(self, timeout) -> None:
        self.store.set_timeout(timeout)


def job_store(store, secret: str, where: str) -> SignedStore:
    return SignedStore(store, secret, ("job",), f"the job's rendezvous at {where}")


def mark_job(store, secret: str, where: str) -> None:
    """The launcher (or the rank hosting the store): the job's marker (see the top)."""
    job_store(store, secret, where).set(JOB_KEY, JOB_VALUE)


def check_job(store, secret: str, where: str, timeout: float | None) -> bool:
    """Whether ``store`` holds this secret's job: waits up to ``timeout`` s for its marker (None:
    looks once). Raises TamperedError when the marker is there but not signed."""
    signed = job_store(store, secret, where)
    if timeout is None:
        if not signed.check([JOB_KEY]):
            return False
    else:
        try:
            signed.wait([JOB_KEY], datetime.timedelta(seconds=timeout))
        except Exception:  # noqa: BLE001 - c10d's timeout error
            return False
    return signed.get(JOB_KEY) == JOB_VALUE
