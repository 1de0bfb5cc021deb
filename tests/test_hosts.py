"""Tests of the multi-host test fixture (tests/hosts, docs/test_hosts.md): hvdl-host0..K-1 are
separate machines as far as names, network, hostnames and processes go; Open MPI starts ranks on
them through the rsh agent. Jobs across them: test_multihost.py.

The first test brings up and removes its own single host, before the module's shared hosts
exist (pytest runs a file's tests in order; the module fixture is made at its first user).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from hosts.fixture import HOSTCTL, hostctl, hosts_fixture, hosts_in_use, start_hosts, stop_hosts

REPO = str(Path(__file__).resolve().parents[1])

hosts = hosts_fixture(2)


def test_up_status_down_leaves_nothing():
    if hosts_in_use():
        pytest.skip("test hosts are in use by another fixture of this session: not removing them")
    h = start_hosts(1)
    try:
        status = hostctl("status")
        assert status.returncode == 0, status.stdout + status.stderr
        assert "hvdl-host0: 10.213.0.1, holder" in status.stdout, status.stdout
        assert "hvdl-host1" not in status.stdout, status.stdout
        state = os.environ.get("HVDL_HOSTS_STATE", "/run/hvdl-hosts")
        holder = int(Path(state, "hvdl-host0.pid").read_text())
        assert h.run("hvdl-host0", "hostname").stdout.strip() == "hvdl-host0"
    finally:
        stop_hosts()  # `down`, and raises unless `status` then says nothing is left
    status = hostctl("status")
    assert status.returncode == 3 and "nothing left" in status.stdout, status.stdout
    assert "hvdl-" not in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                         text=True).stdout
    assert "hvdl-" not in subprocess.run(["ip", "-o", "link", "show"], capture_output=True,
                                         text=True).stdout
    assert not Path(f"/proc/{holder}").exists() or "hvdl-hosts-holder" not in Path(
        f"/proc/{holder}/cmdline").read_text(errors="replace")
    again = hostctl("down")  # idempotent
    assert again.returncode == 0, again.stderr


def test_hostnames_names_and_routes(hosts):
    for i, name in enumerate(hosts.names):
        out = hosts.run(name, "hostname; getent hosts hvdl-host0 hvdl-host1; ip -4 -o addr show "
                              "dev eth0; ip route", check=True).stdout
        lines = out.splitlines()
        assert lines[0] == name
        assert lines[1].split() == ["10.213.0.1", "hvdl-host0"]
        assert lines[2].split() == ["10.213.0.2", "hvdl-host1"]
        assert f"inet {hosts.addresses[i]}/24" in lines[3]
        routes = lines[4:]  # only the hosts' subnet: no default route, nowhere else to send to
        assert len(routes) == 1 and routes[0].startswith("10.213.0.0/24 dev eth0"), routes


def test_pid_namespaces_differ(hosts):
    ns = {}
    for name in hosts.names:
        out = hosts.run(name, "readlink /proc/self/ns/pid; ls /proc | grep -c '^[0-9]'",
                        check=True).stdout.split()
        ns[name] = out[0]
        assert int(out[1]) < 20, f"{name} sees {out[1]} processes: not its own /proc"
    assert len(set(ns.values()) | {os.readlink("/proc/self/ns/pid")}) == len(hosts.names) + 1


def test_dev_shm_is_per_host(hosts):
    name = f"/dev/shm/hvdl-test-{os.getpid()}"
    hosts.run("hvdl-host0", ["touch", name], check=True)
    try:
        assert hosts.run("hvdl-host0", ["test", "-e", name]).returncode == 0
        assert hosts.run("hvdl-host1", ["test", "-e", name]).returncode == 1
        assert not os.path.exists(name)
    finally:
        hosts.run("hvdl-host0", ["rm", "-f", name])


_PEEK = r"""
import ctypes, errno, os, sys
class iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
libc = ctypes.CDLL(None, use_errno=True)
libc.process_vm_readv.restype = ctypes.c_ssize_t
libc.process_vm_readv.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_void_p,
                                  ctypes.c_ulong, ctypes.c_ulong]
def readv(pid, addr):
    buf = ctypes.create_string_buffer(8)
    local, remote = iovec(ctypes.cast(buf, ctypes.c_void_p), 8), iovec(addr, 8)
    n = libc.process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    return "ok" if n == 8 else errno.errorcode.get(ctypes.get_errno(), "?")
def kill0(pid):
    try:
        os.kill(pid, 0)
        return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]
def cmdline(pid):
    try:
        return open("/proc/%d/cmdline" % pid, "rb").read().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""
marker = sys.argv[1]
for arg in sys.argv[2:]:
    pid, addr = (int(x, 0) for x in arg.split(":"))
    print(pid, readv(pid, addr), kill0(pid), repr(cmdline(pid)))
print("visible", [p for p in os.listdir("/proc") if p.isdigit() and cmdline(int(p)) == marker])
"""


def _root_pid(ns_pid: int, pidns: str) -> int:
    """The PID here of the process that is ``ns_pid`` in the PID namespace ``pidns``."""
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{p}/ns/pid") != pidns:
                continue
            nspid = re.search(r"^NSpid:\s+(.*)$", Path(f"/proc/{p}/status").read_text(), re.M)
        except OSError:
            continue
        if nspid and nspid.group(1).split()[-1] == str(ns_pid):
            return int(p)
    raise AssertionError(f"no process {ns_pid} in {pidns}")


def test_host1_cannot_reach_host0_processes(hosts):
    marker = "sleep 271"
    out = hosts.run("hvdl-host0", f"readlink /proc/self/ns/pid; {marker} >/dev/null 2>&1 & "
                                  "echo $!", check=True).stdout.split()
    pidns0, ns_pid = out[0], int(out[1])
    try:
        pid = _root_pid(ns_pid, pidns0)
        with open(f"/proc/{pid}/maps") as maps:
            addr = int(next(line for line in maps if " r" in line).split("-")[0], 16)
        targets = [f"{pid}:{addr}", f"{ns_pid}:{addr}"]
        # from here (the root PID namespace) the sleeper can be read and signalled ...
        here = subprocess.run([sys.executable, "-c", _PEEK, marker, targets[0]],
                              capture_output=True, text=True, check=True).stdout.splitlines()
        assert here[0].split()[1:3] == ["ok", "ok"], here
        assert here[1] != "visible []", here
        # ... from host1 it is invisible, by its PID here or its PID on host0
        there = hosts.run("hvdl-host1", [sys.executable, "-c", _PEEK, marker, *targets],
                          check=True).stdout.splitlines()
        assert there[0].split()[1:3] == ["ESRCH", "ESRCH"], there
        ns_pid_there = there[1].split(maxsplit=3)
        assert ns_pid_there[1:3] == ["ESRCH", "ESRCH"] or ns_pid_there[3] != repr(marker), there
        assert there[2] == "visible []", there
    finally:
        hosts.run("hvdl-host0", ["kill", str(ns_pid)])


def _tbf_rate(qdiscs: str) -> str:
    m = re.search(r"qdisc tbf \S+ root .*?rate (\S+)", qdiscs)
    return m.group(1) if m else f"no root tbf in {qdiscs!r}"


def test_links_are_shaped(hosts):
    def rates():
        found = []
        for i, name in enumerate(hosts.names):
            bridge_side = subprocess.run(["tc", "qdisc", "show", "dev", f"hvdl-veth{i}"],
                                         capture_output=True, text=True, check=True).stdout
            host_side = hosts.run(name, "tc qdisc show dev eth0", check=True).stdout
            found += [_tbf_rate(bridge_side), _tbf_rate(host_side)]
        return found

    assert rates() == ["1Gbit"] * 2 * hosts.k
    try:
        hosts.set_rate("200mbit")
        assert rates() == ["200Mbit"] * 2 * hosts.k
    finally:
        hosts.set_rate("1gbit")
    assert rates() == ["1Gbit"] * 2 * hosts.k


def test_mpirun_places_ranks_on_both_hosts(hosts):
    # Plain mpirun across the hosts, no horovodlite: about 1 s. Once in a full run (2026-11-28,
    # while the other lane compiled) it hung past 120 s; that is Open MPI's runtime, not what
    # this checks, so a hung first try gets one more.
    try:
        r = hosts.mpirun(["hostname"], "hvdl-host0:2,hvdl-host1:2", np=4, timeout=60)
    except subprocess.TimeoutExpired:
        r = hosts.mpirun(["hostname"], "hvdl-host0:2,hvdl-host1:2", np=4, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert Counter(r.stdout.split()) == {"hvdl-host0": 2, "hvdl-host1": 2}, r.stdout


def test_hostctl_agent_refuses_unknown_host(hosts):
    r = subprocess.run([HOSTCTL, "hvdl-host99", "true"], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 255 and "no host 'hvdl-host99'" in r.stderr, r.stderr
