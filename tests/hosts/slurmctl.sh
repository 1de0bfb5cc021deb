#!/usr/bin/env bash
# slurmctl.sh - a real Slurm (Debian's slurm-wlm: slurmctld, slurmd, munge) on the test hosts
# of hostctl.sh, so that sbatch, srun, scancel, time limits and lost nodes can be tested as a
# cluster's users meet them.
#
#   - munged: one, on this machine, with a key made for the test bed; its socket is a file, which
#     every host reaches (the hosts share this machine's files);
#   - slurmctld: on this machine (the controller a cluster's login node talks to), listening on
#     the hosts' bridge address 10.213.0.254;
#   - slurmd -N hvdl-hostN: one per host, inside that host's namespaces (its network, hostname,
#     PID namespace): the tasks of a job run "on" that host;
#   - no cgroups (ProctrackType=proctrack/linuxproc, TaskPlugin=task/none), no accounting
#     database: `scontrol show job` (kept MinJobAge=600 s after the end) gives a job's state and
#     exit code; a TaskProlog gives each task its host's own TMPDIR, as a node-local /tmp would;
#   - 4 GPUs per node that are only device files (/dev/null's numbers): jobs that ask for GPUs
#     run, and each task sees the CUDA_VISIBLE_DEVICES Slurm binds it to;
#   - short timeouts, for tests: a node that does not answer is down after SlurmdTimeout=30 s
#     (Slurm's default: 300), a requeued job starts again after cred_expire=10 s (default: 120);
#   - two partitions: hvdl (the default) and urgent, whose jobs preempt hvdl's: SIGTERM, up to
#     GraceTime=30 s to finish, then the job is requeued (PreemptMode=REQUEUE).
#
# Usage (as root; the hosts hvdl-host0..K-1 must be up: hostctl.sh up K):
#   slurmctl.sh up K        start munged, slurmctld and K slurmds; wait until the K nodes are idle
#   slurmctl.sh down        stop them all, remove the state (idempotent)
#   slurmctl.sh status      exit 0: up and every node answers; 3: nothing of ours runs; 1: else
#   slurmctl.sh check       can it run here? exit 0, or 2 with the reason
#   slurmctl.sh env         print SLURM_CONF=...: what sbatch, srun and scontrol need
#   slurmctl.sh slurmd N    (re)start host N's slurmd (after a test stopped it)
# (HVDL_SLURM_KEEP_FAILED=1: a failed `up` leaves its state and logs for a look; `down` removes
# them.)
#
# e.g.  tests/hosts/hostctl.sh up 2 && tests/hosts/slurmctl.sh up 2
#       export $(tests/hosts/slurmctl.sh env)
#       srun -N 2 -n 4 hostname
#       tests/hosts/slurmctl.sh down && tests/hosts/hostctl.sh down
#
# The packages: apt-get install slurmd slurmctld slurm-client munge (scripts/install.sh --test
# installs them as root). State, logs and the configuration are in $HVDL_SLURM_STATE (default
# /run/hvdl-slurm); logs: $STATE/log/.
set -euo pipefail

STATE=${HVDL_SLURM_STATE:-/run/hvdl-slurm}
HOSTCTL="$(cd "$(dirname "$0")" && pwd)/hostctl.sh"
HOSTS_STATE=${HVDL_HOSTS_STATE:-/run/hvdl-hosts}
CTL_ADDR=10.213.0.254
CONF=$STATE/slurm.conf
MUNGE_SOCKET=$STATE/munge/munge.socket.2

die() { echo "slurmctl.sh: $*" >&2; exit 1; }

check() {
  local tool
  [[ $(id -u) -eq 0 ]] || { echo "not root"; return 2; }
  for tool in munged slurmctld slurmd sbatch srun scontrol sinfo; do
    command -v "$tool" >/dev/null 2>&1 || command -v "/usr/sbin/$tool" >/dev/null 2>&1 || {
      echo "$tool is not installed (apt-get install slurmd slurmctld slurm-client munge;" \
        "scripts/install.sh --test does it as root)"
      return 2
    }
  done
  "$HOSTCTL" check >/dev/null || { echo "test hosts cannot be made: $("$HOSTCTL" check 2>&1)"; return 2; }
}

pid_alive() { [[ -f $1 ]] && kill -0 "$(<"$1")" 2>/dev/null; }

# the PIDs (here) of our slurmds: processes whose command line names our configuration
slurmd_pids() {
  pgrep -f -- "slurmd -f $CONF" 2>/dev/null || true
}

# the PIDs (here) of the slurmstepds on the test hosts (a job step's daemon: "slurmstepd: [J.S]")
slurmstepd_pids() {
  local ns p
  for ns in $(ip netns list 2>/dev/null | awk '$1 ~ /^hvdl-host[0-9]+$/ {print $1}'); do
    for p in $(ip netns pids "$ns" 2>/dev/null); do
      [[ $(cat "/proc/$p/comm" 2>/dev/null) == slurmstepd ]] && echo "$p"
    done
  done
  return 0
}

down() {
  local p t
  export SLURM_CONF=$CONF
  if pid_alive "$STATE/slurmctld.pid"; then
    scancel --quiet --user=root >/dev/null 2>&1 || true  # the steps end their tasks
    for t in $(seq 100); do
      [[ -z $(squeue -h -t running,completing 2>/dev/null) ]] && break
      sleep 0.1
    done
    scontrol shutdown >/dev/null 2>&1 || true  # ends slurmctld and every slurmd it reaches
  fi
  for t in $(seq 50); do
    [[ -z $(slurmd_pids) ]] && ! pid_alive "$STATE/slurmctld.pid" && break
    sleep 0.1
  done
  # what is left: a step whose job was not ended keeps its slurmstepd (it would answer the
  # next Slurm's step of the same id: job ids start at 1 again)
  for p in $(slurmd_pids) $(cat "$STATE/slurmctld.pid" 2>/dev/null || true) \
           $(slurmstepd_pids); do
    kill -9 "$p" 2>/dev/null || true
  done
  if pid_alive "$STATE/munged.pid"; then kill "$(<"$STATE/munged.pid")" 2>/dev/null || true; fi
  for t in $(seq 50); do pid_alive "$STATE/munged.pid" || break; sleep 0.1; done
  rm -rf "$STATE"
}

write_conf() {
  local k=$1 last=$(($1 - 1))
  cat >"$CONF" <<EOF
# made by tests/hosts/slurmctl.sh up $k
ClusterName=hvdl
SlurmctldHost=$(hostname -s)($CTL_ADDR)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET,cred_expire=10
CredType=cred/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool/%n
TmpFS=$STATE/nodetmp
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd-%n.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
TaskProlog=$STATE/task_prolog.sh
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SlurmdTimeout=30
SlurmctldTimeout=10
MessageTimeout=5
KillWait=10
MinJobAge=600
InactiveLimit=0
PropagateResourceLimits=NONE
SlurmdParameters=config_overrides
GresTypes=gpu
NodeName=hvdl-host[0-$last] CPUs=4 Gres=gpu:4 State=UNKNOWN
JobRequeue=1
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
PartitionName=hvdl Nodes=hvdl-host[0-$last] Default=YES MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE GraceTime=30
PartitionName=urgent Nodes=hvdl-host[0-$last] MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF
EOF
  local n addrs=()
  for ((n = 0; n < k; n++)); do addrs+=("10.213.0.$((n + 1))"); done
  sed -i "s/^NodeName=.*/& NodeAddr=$(IFS=,; echo "${addrs[*]}")/" "$CONF"
  # Four "GPUs" per node, so that scripts asking for them (--gpus-per-task) run: Slurm counts
  # only GPUs it has device files for, so each is a character device (/dev/null's numbers).
  # Slurm binds them as on a GPU node: each task's CUDA_VISIBLE_DEVICES names its own.
  mkdir -p "$STATE/dev"
  for n in 0 1 2 3; do mknod "$STATE/dev/gpu$n" c 1 3 || die "mknod $STATE/dev/gpu$n failed"; done
  echo "NodeName=hvdl-host[0-$last] Name=gpu File=$STATE/dev/gpu[0-3]" >"$STATE/gres.conf"
  cat >"$STATE/task_prolog.sh" <<EOF
#!/bin/sh
# Each task gets its host's own TMPDIR (the hosts share this machine's /tmp).
echo "export TMPDIR=$HOSTS_STATE/tmp/\$(hostname)"
EOF
  chmod 755 "$STATE/task_prolog.sh"
}

start_slurmd() {
  local name=hvdl-host$1
  mkdir -p "$STATE/spool/$name"
  # slurmd looks at /sys/fs/cgroup even with no cgroup plugin in use (it finds cgroup v1 from a
  # tmpfs there, then wants the systemd hierarchy); `ip netns exec` gave the host a sysfs of its
  # own, without them. Mounted in the host's own mount namespace: gone with the host.
  # TmpFS ($STATE/nodetmp) is the host's own TMPDIR there: Slurm's PMIx plugin makes its
  # folders in TmpFS under names of the job and step alone, and the hosts share /tmp.
  "$HOSTCTL" run "$name" sh -c 'mountpoint -q /sys/fs/cgroup || {
      mount -t tmpfs -o mode=755 hvdl-cgroup /sys/fs/cgroup && mkdir /sys/fs/cgroup/systemd &&
      mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd; } &&
    mount --bind "$1" "$2"' mount "$HOSTS_STATE/tmp/$name" "$STATE/nodetmp" \
    || die "cannot mount /sys/fs/cgroup or $STATE/nodetmp on $name"
  "$HOSTCTL" run "$name" /usr/sbin/slurmd -f "$CONF" -N "$name" \
    >>"$STATE/log/slurmd-$name.start" 2>&1 9<&- || die "slurmd on $name did not start:
$(tail -20 "$STATE/log/slurmd-$name.log" "$STATE/log/slurmd-$name.start" 2>/dev/null)"
}

wait_idle() {  # wait_idle K SECONDS: until K nodes are idle
  local k=$1 t idle
  for ((t = 0; t < $2 * 10; t++)); do
    idle=$(sinfo -h -N -t idle -o '%N' 2>/dev/null | sort -u | wc -l)
    ((idle >= k)) && return 0
    sleep 0.1
  done
  return 1
}

up() {
  local k=${1:-} n reason
  [[ $k =~ ^[0-9]+$ ]] && ((k >= 1)) || die "usage: up K"
  reason=$(check) || die "cannot run Slurm here: $reason"
  for ((n = 0; n < k; n++)); do
    [[ -f $HOSTS_STATE/hvdl-host$n.pid ]] || die "hvdl-host$n is not up (hostctl.sh up $k first)"
  done
  down
  [[ -n ${HVDL_SLURM_KEEP_FAILED:-} ]] || trap '[[ -n ${up_done:-} ]] || { echo "slurmctl.sh: up failed, removing it all" >&2; down; }' EXIT
  mkdir -p -m 755 "$STATE" "$STATE/log" "$STATE/ctld" "$STATE/spool" "$STATE/nodetmp"
  mkdir -p -m 700 "$STATE/munge"
  write_conf "$k"
  export SLURM_CONF=$CONF

  head -c 1024 /dev/urandom >"$STATE/munge/munge.key"
  chmod 400 "$STATE/munge/munge.key"
  munged --force --socket="$MUNGE_SOCKET" --key-file="$STATE/munge/munge.key" \
    --pid-file="$STATE/munged.pid" --log-file="$STATE/log/munged.log" \
    --seed-file="$STATE/munge/seed" >>"$STATE/log/munged.start" 2>&1 9<&- \
    || die "munged did not start: $(cat "$STATE/log/munged.start" "$STATE/log/munged.log" 2>/dev/null)"

  /usr/sbin/slurmctld -f "$CONF" -c -i >>"$STATE/log/slurmctld.start" 2>&1 9<&- \
    || die "slurmctld did not start: $(tail -20 "$STATE/log/slurmctld.log" 2>/dev/null)"
  for ((n = 0; n < k; n++)); do start_slurmd "$n"; done
  wait_idle "$k" 30 || die "the nodes are not idle after 30 s:
$(sinfo -N 2>&1; tail -20 "$STATE"/log/*.log)"
  up_done=1
  echo "slurmctl.sh: up: slurmctld on $CTL_ADDR, slurmd on hvdl-host0..hvdl-host$((k - 1))," \
    "SLURM_CONF=$CONF"
}

status() {
  local k
  if [[ ! -d $STATE ]] && [[ -z $(slurmd_pids) ]] && [[ -z $(slurmstepd_pids) ]]; then
    echo "nothing left: no slurmctld, slurmd, munged or state"
    return 3
  fi
  export SLURM_CONF=$CONF
  k=$(grep -c . <(sinfo -h -N -o '%N' 2>/dev/null | sort -u) || true)
  sinfo -N 2>&1 || true
  pid_alive "$STATE/munged.pid" && pid_alive "$STATE/slurmctld.pid" && ((k > 0)) \
    && [[ -z $(sinfo -h -N -t down,drain,fail,unknown -o '%N' 2>/dev/null) ]] || return 1
}

cmd=${1:-}
(($#)) && shift
case $cmd in
  up | down)
    # one up/down at a time (fd 9 holds the lock; the daemons are started without it)
    exec 9<"$0"
    flock -w 120 9 || die "another slurmctl.sh up/down has been running for 120 s"
    case $cmd in up) up "$@" ;; down) down ;; esac ;;
  status) status ;;
  check) check ;;
  env) echo "SLURM_CONF=$CONF" ;;
  slurmd) start_slurmd "${1:?usage: slurmd N}" ;;
  *) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
esac
