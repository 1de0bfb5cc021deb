"""What a process outside a horovodlite job can do to it over the network (issue 37): a plain c10d
TCPStore client on the job's store, and raw connections to the store and the rank reports. No
secret is used to sign or to read anything: where a stranger needs a key's name, the test gives
it the name (as someone who saw it cross the network would have it), computed here.
Imported by the test scripts (tests/scripts/ is their sys.path[0])."""

from __future__ import annotations

import datetime
import json
import os
import socket

import torch.distributed as dist

from horovodlite.common import launch_env, signed_store

# what a stranger writes where a signed value belongs: the format, with a tag it cannot make
FAKE_TAG = bytes(signed_store.TAG_BYTES)


def store_address() -> tuple:
    return (os.environ[launch_env.GLOO_RENDEZVOUS_ADDR],
            int(os.environ[launch_env.GLOO_RENDEZVOUS_PORT]))


def client():
    """A plain TCPStore client on the job's store: anyone who reaches the port has one."""
    addr, port = store_address()
    return dist.TCPStore(addr, port, None, False, datetime.timedelta(seconds=10))


def name_seen_on_the_wire(*namespace_and_key) -> str:
    """The full name of a job key (the test computes it; a stranger could only have seen it)."""
    *namespace, key = namespace_and_key
    return signed_store.prefix(os.environ[launch_env.RENDEZVOUS_SECRET], *namespace) + key


def forge(store, name: str, value) -> None:
    """Writes ``value`` under ``name``, in the signed format but with a tag made up."""
    data = value.encode() if isinstance(value, str) else value
    store.set(name, FAKE_TAG + data)


def garbage_to(addr: str, port: int) -> list:
    """Connects to addr:port a few times, each time sending something no job member would:
    random bytes, a rank's hello with a made-up signature, an old-style hello with a guessed
    token, a long line without an end. Returns what it sent, one word each."""
    rank_hello = json.dumps({"event": "started", "rank": 0, "host": "evil", "pid": 1})
    blobs = {"random": os.urandom(4096) + b"\n",
             "forged-hello": ("0" * 64 + " " + rank_hello + "\n").encode(),
             "token-hello": (json.dumps({"event": "started", "rank": 0, "host": "evil", "pid": 1,
                                         "token": "guess"}) + "\n").encode(),
             "unended": b"x" * 200000}
    for blob in blobs.values():
        with socket.create_connection((addr, port), timeout=10) as s:
            s.settimeout(10)
            try:
                s.sendall(blob)
                s.shutdown(socket.SHUT_WR)
                while s.recv(4096):  # until the other side closes (or ignores us)
                    pass
            except OSError:
                pass
    return list(blobs)


def garbage_to_the_job() -> None:
    """Garbage to the job's store and to its launcher's rank reports (see ``garbage_to``)."""
    addr, port = store_address()
    garbage_to(addr, port)
    report_to = launch_env.parse_report_to(os.environ[launch_env.REPORT_TO])
    for report_addr, report_port in report_to:
        garbage_to(report_addr, report_port)
