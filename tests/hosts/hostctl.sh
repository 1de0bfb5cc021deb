#!/usr/bin/env bash
# hostctl.sh - turns this one machine into K test "hosts" hvdl-host0..K-1, so that multi-host
# behaviour (Open MPI over TCP between machines, per-host local ranks, ...) can be tested for real.
#
# Each host N is
#   - a network namespace hvdl-hostN: lo up, eth0 = 10.213.0.(N+1)/24, the other end of that veth
#     (hvdl-vethN) on the bridge hvdl-br0 = 10.213.0.254/24 in the root namespace. No default
#     route: from a host, only 10.213.0.0/24 (and its own lo) can be reached;
#   - its own UTS (hostname hvdl-hostN), IPC, PID and mount namespaces (its own /proc and
#     /dev/shm; /etc/hosts names every host), kept alive by a holder process: PID 1 of the host's
#     PID namespace, an init that reaps orphans. Processes of different hosts cannot see, signal
#     or read each other;
#   - links shaped by tbf at RATE (default 1gbit) on both ends of its veth (both directions);
#   - its own TMPDIR ($STATE/tmp/hvdl-hostN, removed by `down`) for everything `run` and the
#     agent start there: Open MPI names its session folders after pids (/tmp/prted.PID), and pids
#     repeat across hosts' PID namespaces and across `up`s, so a shared /tmp made daemons of two
#     hosts (or a killed host's leftovers) collide ("A daemon failed to report back", status 213).
# Files (/, /tmp, the checkout), CPUs, memory and kernel are this machine's (docs/test_hosts.md).
# While hosts exist, the kernel's per-session scheduling groups are off (sched_autogroup_enabled
# = 0; `down` restores it): the hosts' processes share the cores as one machine's do.
#
# Usage (as root; needs ip, tc, unshare, nsenter, setsid, flock and python3 >= 3.9):
#   hostctl.sh up K [--rate RATE]      remove leftovers of an earlier run, create hvdl-host0..K-1
#   hostctl.sh down                    remove hosts, holders, veths, bridge, qdiscs (idempotent)
#   hostctl.sh status                  what exists; exit 0: all up, 3: nothing left, 1: partial
#   hostctl.sh run HOST CMD [ARG...]   run CMD on HOST with this cwd and environment (like a
#                                      shell on that machine); exits with CMD's status
#   hostctl.sh rate RATE               change the rate of every link (tc units: 100mbit, 1gbit)
#                                      (up and rate: the tbf burst holds HVDL_HOSTS_BURST_MS of
#                                      data, default 4 ms; 2 halves the shaper's buffer)
#   hostctl.sh mpi-args                print the mpirun arguments that use these hosts (not -H),
#                                      for the Open MPI of ${MPIRUN:-mpirun} (4 or 5)
#   hostctl.sh agent HOST CMDLINE...   Open MPI's rsh agent (what ssh is on a cluster): runs the
#   hostctl.sh HOST CMDLINE...         command line with sh -c on HOST, in a login-like
#                                      environment (PATH, HOME, USER, LOGNAME, SHELL, LANG and
#                                      that host's TMPDIR; nothing else of the caller's, as over
#                                      ssh) in $HOME.
#                                      The second form is the one mpirun uses
#                                      (--prtemca plm_ssh_agent /path/to/hostctl.sh)
#   hostctl.sh check                   can hosts be made here? exit 0, or 2 with the reason
#
# e.g.  tests/hosts/hostctl.sh up 2
#       OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 tests/hosts/hostctl.sh run \
#         hvdl-host0 mpirun $(tests/hosts/hostctl.sh mpi-args) -H hvdl-host0:2,hvdl-host1:2 \
#         -np 4 hostname
#       tests/hosts/hostctl.sh down
#
# How the agent works: mpirun runs on a host, inside that host's PID namespace, and the kernel
# lets a process enter only its own PID namespace or one below it (setns), never a sibling's. So
# `up` also starts a small broker in the root namespace, listening on $STATE/agent.sock; the agent
# hands it its stdin/stdout/stderr (SCM_RIGHTS) and the command line, the broker runs
# `nsenter -t HOLDER --net --uts --ipc --pid --mount -- sh -c CMDLINE` on those descriptors and
# sends back the exit status. If the agent goes away first, the broker ends the command (TERM,
# then KILL after 5 s).
#
# State (holder PIDs, hosts file, broker socket) is in $HVDL_HOSTS_STATE (default /run/hvdl-hosts).
# Only one set of hosts can exist at a time on a machine: the names and addresses are fixed.
set -euo pipefail

STATE=${HVDL_HOSTS_STATE:-/run/hvdl-hosts}
BRIDGE=hvdl-br0
SUBNET=10.213.0
BRIDGE_ADDR=$SUBNET.254
DEFAULT_RATE=1gbit
MAX_HOSTS=200
AUTOGROUP=/proc/sys/kernel/sched_autogroup_enabled

die() { echo "hostctl.sh: $*" >&2; exit 1; }
host_name() { echo "hvdl-host$1"; }
host_addr() { echo "$SUBNET.$(($1 + 1))"; }
valid_host() { [[ $1 =~ ^hvdl-host([0-9]+)$ ]] && [[ -f $STATE/$1.pid ]]; }

# A host's holder: PID 1 of its PID namespace, reaps orphans as init does.
HOLDER_PY='
import os, signal
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
while True:
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass
    signal.sigwait({signal.SIGCHLD})
'

# The broker (root namespace). argv: STATE. Serves one thread per agent connection.
BROKER_PY='
import json, os, re, signal, socket, subprocess, sys, threading, time
state = sys.argv[1]
path = os.path.join(state, "agent.sock")
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind(path)
os.chmod(path, 0o600)
srv.listen(128)
srv.settimeout(2.0)

def end_when_agent_leaves(conn, proc):
    try:
        while conn.recv(1024):
            pass
    except OSError:
        pass
    if proc.poll() is None:  # the agent went away first: end the command, as sshd would
        for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 0)):
            try:
                os.killpg(proc.pid, sig)
            except OSError:
                return
            deadline = time.monotonic() + wait
            while proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            if proc.poll() is not None:
                return

def handle(conn):
    fds = []
    try:
        data, fds, _, _ = socket.recv_fds(conn, 8, 3)
        while len(data) < 8:
            data += conn.recv(8 - len(data)) or b"\0" * 8
        size = int.from_bytes(data[:8], "big")
        body = b""
        while len(body) < size:
            chunk = conn.recv(size - len(body))
            if not chunk:
                return
            body += chunk
        req = json.loads(body)
        if len(fds) != 3:
            return
        pidfile = os.path.join(state, req["host"] + ".pid")
        if not re.fullmatch(r"hvdl-host[0-9]+", req["host"]) or not os.path.exists(pidfile):
            os.write(fds[2], ("hostctl.sh agent: no host %r here\n" % req["host"]).encode())
            conn.sendall(b"255")
            return
        holder = open(pidfile).read().strip()
        cwd = req["cwd"] or os.environ.get("HOME", "/")
        argv = ["nsenter", "-t", holder, "--net", "--uts", "--ipc", "--pid", "--mount",
                "--wd=" + cwd, "--", "/bin/sh", "-c", req["cmd"]]
        env = dict(os.environ, TMPDIR=os.path.join(state, "tmp", req["host"]))
        proc = subprocess.Popen(argv, stdin=fds[0], stdout=fds[1], stderr=fds[2],
                                start_new_session=True, env=env)
        for fd in fds:
            os.close(fd)
        fds = []
        threading.Thread(target=end_when_agent_leaves, args=(conn, proc), daemon=True).start()
        rc = proc.wait()
        try:
            conn.sendall(str(128 - rc if rc < 0 else rc).encode())
            conn.shutdown(socket.SHUT_RDWR)  # wakes the watcher thread; close alone would not
        except OSError:
            pass  # the agent is gone
    except Exception as e:  # noqa: BLE001 - one bad request must not end the broker
        print("broker: %r" % (e,), file=sys.stderr, flush=True)
    finally:
        for fd in fds:
            os.close(fd)
        conn.close()

while os.path.exists(path):  # `down` removes the state folder: then the broker ends by itself
    try:
        conn, _ = srv.accept()
    except socket.timeout:
        continue
    conn.settimeout(None)
    threading.Thread(target=handle, args=(conn,), daemon=True).start()
'

# The agent's side. argv: SOCKET HOST CWD WORD... (the words are joined by spaces, as ssh does).
CLIENT_PY='
import json, os, signal, socket, sys
signal.signal(signal.SIGINT, signal.SIG_DFL)
path, host, cwd = sys.argv[1:4]
cmd = " ".join(sys.argv[4:])
fds = []
for fd in (0, 1, 2):
    try:
        os.fstat(fd)
        fds.append(fd)
    except OSError:
        fds.append(os.open(os.devnull, os.O_RDWR))
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect(path)
except OSError as e:
    sys.exit("hostctl.sh agent: cannot reach the broker at %s (%s): is `hostctl.sh up` done?"
             % (path, e.strerror))
body = json.dumps({"host": host, "cwd": cwd, "cmd": cmd}).encode()
socket.send_fds(s, [len(body).to_bytes(8, "big")], fds)
s.sendall(body)
rc = b""
while True:
    chunk = s.recv(64)
    if not chunk:
        break
    rc += chunk
sys.exit(int(rc) if rc else 255)
'

# ---------------------------------------------------------------------------------------------
check() {
  local t
  [[ $(id -u) == 0 ]] || { echo "not root (network namespaces and bridges need root)"; return 2; }
  for t in ip tc unshare nsenter setsid flock python3; do
    command -v "$t" >/dev/null || { echo "'$t' is not installed"; return 2; }
  done
  python3 -c 'import socket, sys; sys.exit(not hasattr(socket, "send_fds"))' 2>/dev/null \
    || { echo "python3 is older than 3.9 (no socket.send_fds)"; return 2; }
  local err
  if ! err=$(unshare --net --uts --ipc --pid --mount --fork true 2>&1); then
    echo "cannot create namespaces here: unshare --net --uts --ipc --pid --mount: $err"
    return 2
  fi
}

rate_burst() {  # tbf burst in bytes for a tc rate: $HVDL_HOSTS_BURST_MS (4) ms of data, >= 16 KiB
  awk -v r="$1" -v ms="${HVDL_HOSTS_BURST_MS:-4}" 'BEGIN {
    if (match(tolower(r), /^[0-9.]+/) == 0) exit 1
    n = substr(r, 1, RLENGTH); u = tolower(substr(r, RLENGTH + 1)); m = 1
    if (u ~ /^[kmgt]/) m = 1000 ^ index("kmgt", substr(u, 1, 1))
    if (u ~ /^[kmgt]i/) m = 1024 ^ index("kmgt", substr(u, 1, 1))
    if (u ~ /bps$/) m *= 8; else if (u !~ /bit$/ && u != "") exit 1
    if (ms !~ /^[0-9.]+$/ || ms <= 0) exit 1
    b = int(n * m / 8 * ms / 1000); if (b < 16384) b = 16384; print b }'
}

shape() {  # shape N RATE: tbf on both ends of host N's veth
  local n=$1 rate=$2 burst
  burst=$(rate_burst "$rate") || die "bad rate '$rate' (use tc units, e.g. 100mbit, 1gbit)"
  tc qdisc replace dev "hvdl-veth$n" root tbf rate "$rate" burst "$burst" latency 50ms
  tc -n "$(host_name "$n")" qdisc replace dev eth0 root tbf rate "$rate" burst "$burst" latency 50ms
}

holder_of() {  # the PID (here) of the process that is PID 1 in host $1's PID namespace
  local p nspid
  for p in $(ip netns pids "$1" 2>/dev/null); do
    nspid=$(awk '/^NSpid:/ {print $NF, NF}' "/proc/$p/status" 2>/dev/null) || continue
    [[ $nspid == "1 3" ]] && { echo "$p"; return 0; }
  done
  return 1
}

spawn() {  # spawn LOG CMD...: CMD in the background in its own session, no fds but 0, 1, 2
  local log=$1
  shift
  (
    for fd in /proc/$BASHPID/fd/*; do
      fd=${fd##*/}
      ((fd > 2)) && eval "exec $fd>&-"
    done
    exec setsid "$@" </dev/null >>"$log" 2>&1
  ) &
}

down() {
  local ns p pids dev t
  if [[ -f $STATE/broker.pid ]]; then
    p=$(<"$STATE/broker.pid")
    grep -qa hvdl-hosts-broker "/proc/$p/cmdline" 2>/dev/null && kill "$p" 2>/dev/null || true
  fi
  pids=()
  for ns in $(our_netns); do
    # everything running "on" that host (holder, its unshare parent, ranks, daemons)
    for p in $(ip netns pids "$ns" 2>/dev/null); do pids+=("$p"); done
  done
  ((${#pids[@]})) && kill -9 "${pids[@]}" 2>/dev/null || true
  for p in "${pids[@]}"; do  # wait (up to 5 s each) until they are gone; zombies count as gone
    for ((t = 0; t < 100; t++)); do
      [[ $(awk '{print $3}' "/proc/$p/stat" 2>/dev/null || echo Z) == Z ]] && break
      sleep 0.05
    done
  done
  for dev in $(our_veths); do
    ip link del "$dev" 2>/dev/null || true  # also removes the peer (eth0) and the qdiscs
  done
  for ns in $(our_netns); do
    ip netns del "$ns" 2>/dev/null || true
  done
  ip link del "$BRIDGE" 2>/dev/null || true
  if [[ -f $STATE/autogroup ]]; then  # the machine's scheduling as it was before `up`
    cat "$STATE/autogroup" >"$AUTOGROUP" 2>/dev/null || true
  fi
  rm -rf "$STATE"
}

up() {
  local k=${1:-} rate=$DEFAULT_RATE n name addr p t reason
  [[ $k =~ ^[0-9]+$ ]] && ((k >= 1 && k <= MAX_HOSTS)) \
    || die "usage: up K [--rate RATE] (1 <= K <= $MAX_HOSTS)"
  shift
  while (($#)); do
    case $1 in
      --rate) rate=${2:?--rate needs a value}; shift 2 ;;
      --rate=*) rate=${1#--rate=}; shift ;;
      *) die "up: unknown argument '$1'" ;;
    esac
  done
  rate_burst "$rate" >/dev/null || die "bad rate '$rate' (use tc units, e.g. 100mbit, 1gbit)"
  reason=$(check) || die "cannot create hosts: $reason"
  down
  trap '[[ -n ${up_done:-} ]] || { echo "hostctl.sh: up failed, removing it all" >&2; down; }' EXIT
  mkdir -p "$STATE"
  python3 -c 'import sys; print(sys.executable)' >"$STATE/python"
  readlink /proc/self/ns/pid >"$STATE/root-pidns"
  echo "$k" >"$STATE/k"
  # One scheduling group while hosts exist (`down` restores it); why: docs/test_hosts.md,
  # "One scheduling group".
  if [[ -w $AUTOGROUP ]] && cat "$AUTOGROUP" >"$STATE/autogroup" 2>/dev/null; then
    echo 0 >"$AUTOGROUP" 2>/dev/null || rm -f "$STATE/autogroup"
  fi
  echo "$rate" >"$STATE/rate"
  { echo "127.0.0.1 localhost"; echo "::1 localhost ip6-localhost ip6-loopback"
    for ((n = 0; n < k; n++)); do echo "$(host_addr "$n") $(host_name "$n")"; done
  } >"$STATE/hosts"
  printf 'nameserver 127.0.0.1\noptions timeout:1 attempts:1\n' >"$STATE/resolv.conf"

  ip link add "$BRIDGE" type bridge
  echo 1 >"/proc/sys/net/ipv6/conf/$BRIDGE/disable_ipv6" 2>/dev/null || true
  ip addr add "$BRIDGE_ADDR/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  for ((n = 0; n < k; n++)); do
    name=$(host_name "$n") addr=$(host_addr "$n")
    mkdir -m 1777 -p "$STATE/tmp/$name"
    ip netns add "$name"
    ip link add "hvdl-veth$n" type veth peer name eth0 netns "$name"
    echo 1 >"/proc/sys/net/ipv6/conf/hvdl-veth$n/disable_ipv6" 2>/dev/null || true
    ip netns exec "$name" sh -c 'echo 1 >/proc/sys/net/ipv6/conf/eth0/disable_ipv6' 2>/dev/null \
      || true
    ip link set "hvdl-veth$n" master "$BRIDGE" up
    ip -n "$name" link set lo up
    ip -n "$name" addr add "$addr/24" dev eth0
    ip -n "$name" link set eth0 up
    shape "$n" "$rate"
    # the holder: own UTS, IPC, PID and mount namespaces (own /proc and /dev/shm), hostname,
    # /etc/hosts
    spawn "$STATE/$name.log" ip netns exec "$name" unshare --uts --ipc --pid --mount --fork \
      --mount-proc sh -c 'hostname "$1" && mount --bind "$2/hosts" /etc/hosts || exit 1
        mount -t tmpfs -o mode=1777 hvdl-shm /dev/shm || exit 1
        mount --bind "$2/resolv.conf" /etc/resolv.conf 2>/dev/null || true
        : >"$2/$1.ready" && exec "$3" -c "$4" hvdl-hosts-holder' \
      holder "$name" "$STATE" "$(<"$STATE/python")" "$HOLDER_PY"
  done
  for ((n = 0; n < k; n++)); do
    name=$(host_name "$n")
    for ((t = 0; t < 200; t++)); do
      [[ -f $STATE/$name.ready ]] && p=$(holder_of "$name") && break
      sleep 0.05
    done
    [[ -f $STATE/$name.ready ]] && [[ -n ${p:-} ]] \
      || { cat "$STATE/$name.log" >&2 2>/dev/null; die "the holder of $name did not start"; }
    echo "$p" >"$STATE/$name.pid"
    p=
  done
  # the broker's environment is what `agent` commands get: a login environment, as over ssh
  spawn "$STATE/broker.log" env -i PATH="$PATH" HOME="${HOME:-/root}" USER="$(id -un)" \
    LOGNAME="$(id -un)" SHELL=/bin/sh LANG="${LANG:-C.UTF-8}" \
    "$(<"$STATE/python")" -c "$BROKER_PY" "$STATE" hvdl-hosts-broker
  echo $! >"$STATE/broker.pid"
  for ((t = 0; t < 200; t++)); do [[ -S $STATE/agent.sock ]] && break; sleep 0.05; done
  [[ -S $STATE/agent.sock ]] || { cat "$STATE/broker.log" >&2; die "the broker did not start"; }
  # verify: each host has its own hostname and PID namespace
  local root_pidns seen=" "
  root_pidns=$(<"$STATE/root-pidns")
  for ((n = 0; n < k; n++)); do
    name=$(host_name "$n")
    read -r h pidns < <(run "$name" sh -c 'echo "$(hostname) $(readlink /proc/self/ns/pid)"')
    [[ $h == "$name" ]] || die "$name: hostname is '$h'"
    [[ $pidns != "$root_pidns" && $seen != *" $pidns "* ]] || die "$name: not its own PID namespace"
    seen+="$pidns "
  done
  up_done=1
  echo "hostctl.sh: up: $k host(s) hvdl-host0..hvdl-host$((k - 1)) on $SUBNET.0/24, links $rate"
}

in_root_pidns() { [[ $(readlink /proc/self/ns/pid) == "$(cat "$STATE/root-pidns" 2>/dev/null)" ]]; }

run() {
  local host=${1:?usage: run HOST CMD [ARG...]}
  shift
  (($#)) || die "usage: run HOST CMD [ARG...]"
  valid_host "$host" || die "no host '$host' here (see \`hostctl.sh status\`)"
  if in_root_pidns; then
    exec nsenter -t "$(<"$STATE/$host.pid")" --net --uts --ipc --pid --mount --wd="$PWD" -- \
      env TMPDIR="$STATE/tmp/$host" "$@"
  fi
  # on a host already: only the broker can reach another host (login environment, like ssh)
  local q=() a
  for a in "$@"; do q+=("'${a//\'/\'\\\'\'}'"); done  # POSIX sh quoting: ' -> '\''
  exec "$(<"$STATE/python")" -c "$CLIENT_PY" "$STATE/agent.sock" "$host" "$PWD" "${q[@]}"
}

agent() {
  # Open MPI calls: AGENT [ssh options] HOST WORD... ; options are accepted and ignored
  while (($#)) && [[ $1 == -* ]]; do
    case $1 in -[opliFJ]) shift 2 ;; *) shift ;; esac
  done
  local host=${1:?usage: agent HOST CMDLINE...}
  shift
  [[ -f $STATE/python ]] || die "agent: no hosts are up (no $STATE)"
  exec "$(<"$STATE/python")" -c "$CLIENT_PY" "$STATE/agent.sock" "$host" "" "$@"
}

set_rate() {
  local rate=${1:?usage: rate RATE} n
  [[ -f $STATE/k ]] || die "rate: no hosts are up"
  rate_burst "$rate" >/dev/null || die "bad rate '$rate' (use tc units, e.g. 100mbit, 1gbit)"
  for ((n = 0; n < $(<"$STATE/k"); n++)); do shape "$n" "$rate"; done
  echo "$rate" >"$STATE/rate"
}

# mpi_yield_when_idle: the hosts share this machine's cores, so a job of 4 ranks on 2 hosts
# oversubscribes them while each host's Open MPI thinks it has cores to spare; ranks spinning in
# MPI's progress loop then starve the kernel's TCP work and each other (raw MPI_Allreduce of
# 16 MiB at 2x2: 1.96 s spinning, 0.14 s yielding), which no real cluster would show.
# Open MPI 5 (PRRTE) takes the agent and the daemons' interface as --prtemca plm_ssh_agent, Open
# MPI 4 (ORTE, e.g. Debian's) as --mca plm_rsh_agent: the version of ${MPIRUN:-mpirun} decides.
mpi_args() {
  local runtime=--prtemca agent=plm_ssh_agent
  if "${MPIRUN:-mpirun}" --version 2>/dev/null | grep -qE '\((Open MPI|OpenRTE)\) [1-4]\.'; then
    runtime=--mca agent=plm_rsh_agent
  fi
  echo "$runtime $agent $(realpath "$0")" \
    "$runtime oob_tcp_if_include $SUBNET.0/24 --mca btl_tcp_if_include $SUBNET.0/24" \
    "--mca mpi_yield_when_idle 1"
}

our_netns() { ip netns list 2>/dev/null | awk '$1 ~ /^hvdl-host[0-9]+$/ {print $1}'; }
our_veths() {
  ip -o link show 2>/dev/null | awk -F': ' '{sub(/@.*/, "", $2); print $2}' \
    | grep -E '^hvdl-veth[0-9]+$' || true
}

status() {  # exit 0: K hosts up and complete; 3: nothing of ours exists; 1: anything else
  local k=0 n name found=0 complete=1 p line rate
  if [[ -d $STATE ]]; then
    found=1
    k=$(cat "$STATE/k" 2>/dev/null || echo 0)
    echo "state:  $STATE (k=$k, rate $(cat "$STATE/rate" 2>/dev/null))"
  else
    complete=0
    echo "state:  $STATE absent"
  fi
  if ip link show "$BRIDGE" >/dev/null 2>&1; then
    found=1
    echo "bridge: $BRIDGE $BRIDGE_ADDR"
  else
    complete=0
    echo "bridge: absent"
  fi
  p=$(cat "$STATE/broker.pid" 2>/dev/null || true)
  if [[ -n $p ]] && grep -qa hvdl-hosts-broker "/proc/$p/cmdline" 2>/dev/null; then
    echo "broker: pid $p"
  else
    complete=0
    echo "broker: not running"
  fi
  for name in $({ our_netns; for ((n = 0; n < k; n++)); do host_name "$n"; done; } | sort -uV)
  do
    n=${name#hvdl-host} line="$name: $(host_addr "$n")"
    if our_netns | grep -qx "$name"; then found=1; else complete=0 line+=", no netns"; fi
    p=$(cat "$STATE/$name.pid" 2>/dev/null || true)
    if [[ -n $p && -d /proc/$p ]]; then line+=", holder $p"; else complete=0 line+=", no holder"; fi
    rate=$(tc qdisc show dev "hvdl-veth$n" 2>/dev/null | grep -o 'tbf .* rate [^ ]*' || true)
    line+=", link ${rate##* }"
    ((n < k)) || { complete=0 line+=" (leftover)"; }
    echo "$line"
  done
  for name in $(our_veths); do
    found=1
    ((${name#hvdl-veth} < k)) || { complete=0; echo "leftover veth: $name"; }
  done
  if ((!found)); then
    echo "nothing left: no hvdl hosts, veths, bridge or state"
    return 3
  fi
  ((complete && k > 0)) || return 1
}

cmd=${1:-}
(($#)) && shift
case $cmd in
  up | down | rate)
    # one up/down/rate at a time (fd 9 holds the lock; the long-lived processes do not inherit it)
    exec 9<"$0"
    flock -w 120 9 || die "another hostctl.sh up/down/rate has been running for 120 s"
    case $cmd in up) up "$@" ;; down) down ;; rate) set_rate "$@" ;; esac ;;
  run) run "$@" ;;
  agent) agent "$@" ;;
  hvdl-host* | -*) agent "$cmd" "$@" ;;  # plm_ssh_agent=hostctl.sh: called like ssh
  status) status ;;
  check) check ;;
  mpi-args) mpi_args ;;
  *) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
esac
