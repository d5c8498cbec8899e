#!/usr/bin/env bash
# A real single-node SLURM cluster on this machine, for tests and trying the SLURM launcher.
#
#   scripts/slurm-local.sh start    # writes the config, starts slurmctld + slurmd, waits until the
#                                   # node is idle; prints `export SLURM_CONF=...` (idempotent)
#   scripts/slurm-local.sh status   # daemons, node state, queue
#   scripts/slurm-local.sh stop     # cancels jobs, stops both daemons; nothing is left running
#   scripts/slurm-local.sh env      # prints `export SLURM_CONF=...` only
#
# State lives under ${MONARCH_SLURM_DIR:-/tmp/monarch-slurm} (config, state, spool, logs, pids).
# AuthType=auth/none and CredType=cred/none: no munge, for a machine you alone use. The node is
# NodeName=localhost (`slurmd -N localhost`) with this machine's CPUs (at least
# ${MONARCH_SLURM_CPUS:-4}, overcommitted when fewer are real, so tests with 2+ tasks fit on small
# machines) and memory, in partition `debug`. Ports: ${MONARCH_SLURM_PORT:-16817} (slurmctld)
# and the next one (slurmd). Must run as root (slurmd starts job steps as their users).
set -euo pipefail

DIR=${MONARCH_SLURM_DIR:-/tmp/monarch-slurm}
PORT=${MONARCH_SLURM_PORT:-16817}
MIN_CPUS=${MONARCH_SLURM_CPUS:-4}
DEADLINE_S=${MONARCH_SLURM_START_TIMEOUT:-30}
CONF=$DIR/slurm.conf
export SLURM_CONF=$CONF

die() { echo "slurm-local: $*" >&2; exit 1; }

need_root() {
  [ "$(id -u)" -eq 0 ] || die "must run as root (slurmd runs job steps as their users); you are uid $(id -u)"
  for b in slurmctld slurmd sinfo scontrol; do
    command -v "$b" >/dev/null 2>&1 || die "$b not found: install slurm-wlm (scripts/setup-deps.sh)"
  done
}

running() {  # pid -> 0 while it exists and is not a zombie
  [ -d "/proc/$1" ] && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null
}

daemon_pid() {  # daemon name -> prints its pid and returns 0 while that daemon of this cluster runs
  # The pidfile first: slurmd and slurmctld write it only after they daemonize and load their
  # plugins, some milliseconds after the command that started them has returned. Until then,
  # find the daemon by its command line, which names this cluster's config.
  local f=$DIR/$1.pid p
  if [ -s "$f" ]; then
    p=$(cat "$f")
    # Not a zombie: daemons reparented to an init that does not reap stay as zombies.
    if grep -qx "$1" "/proc/$p/comm" 2>/dev/null && running "$p"; then echo "$p"; return 0; fi
  fi
  for p in $(pgrep -x "$1" 2>/dev/null || true); do
    if tr '\0' '\n' <"/proc/$p/cmdline" 2>/dev/null | grep -qxF "$CONF" && running "$p"; then
      echo "$p"; return 0
    fi
  done
  return 1
}

pid_alive() { daemon_pid "$1" >/dev/null; }

died() {  # daemon name -> exits with the reason and the end of that daemon's log
  echo "slurm-local: $1 exited; the end of $DIR/log/$1.log:" >&2
  tail -n 20 "$DIR/log/$1.log" >&2 2>/dev/null || echo "(no log)" >&2
  exit 1
}

write_conf() {
  mkdir -p "$DIR/state" "$DIR/spool" "$DIR/log"
  local cpus mem
  cpus=$(nproc)
  [ "$cpus" -ge "$MIN_CPUS" ] || cpus=$MIN_CPUS
  mem=$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)
  cat >"$CONF.tmp" <<EOF
# Written by scripts/slurm-local.sh; regenerated on each start.
ClusterName=monarch-local
SlurmctldHost=localhost
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
DefMemPerCPU=256
SlurmdParameters=config_overrides
ReturnToService=2
MailProg=/bin/true
KillWait=2
MinJobAge=120
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=30
MessageTimeout=10
PlugStackConfig=$DIR/plugstack.conf
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
  : >"$DIR/plugstack.conf"
  mv "$CONF.tmp" "$CONF"
}

node_state() { sinfo -h -N -n localhost -o '%T' 2>/dev/null | head -1; }

start() {
  need_root
  if pid_alive slurmctld && pid_alive slurmd; then
    case "$(node_state)" in idle*|mixed*|allocated*)
      echo "slurm-local: already running (state under $DIR)" >&2
      echo "export SLURM_CONF=$CONF"
      return 0 ;;
    esac
  fi
  stop_daemons quiet
  write_conf
  # -c: clear state saved by an earlier run (its jobs are gone).
  slurmctld -c -f "$CONF" || die "slurmctld failed to start; see $DIR/log/slurmctld.log"
  local end=$(( $(date +%s) + DEADLINE_S ))
  until scontrol ping 2>/dev/null | grep -q 'is UP'; do
    [ "$(date +%s)" -lt "$end" ] || die "slurmctld not answering after ${DEADLINE_S}s; see $DIR/log/slurmctld.log"
    pid_alive slurmctld || died slurmctld
    sleep 0.2
  done
  slurmd -N localhost -f "$CONF" || die "slurmd failed to start; see $DIR/log/slurmd.log"
  local s=""
  while :; do
    s=$(node_state)
    case "$s" in idle*|mixed*|allocated*) break ;; esac
    if [[ "$s" == down* || "$s" == drain* ]]; then
      scontrol update NodeName=localhost State=RESUME >/dev/null 2>&1 || true
    fi
    [ "$(date +%s)" -lt "$end" ] || die "node localhost is '${s:-unknown}' after ${DEADLINE_S}s (want idle); see $DIR/log/slurmd.log"
    pid_alive slurmd || died slurmd
    sleep 0.2
  done
  echo "slurm-local: up, node localhost $s, state under $DIR" >&2
  echo "export SLURM_CONF=$CONF"
}

stop_daemons() {  # [quiet]: stop whatever runs, wait until gone
  local d p any=0
  for d in slurmd slurmctld; do
    if p=$(daemon_pid "$d"); then
      any=1
      kill -TERM "$p" 2>/dev/null || true
      for _ in $(seq 1 30); do running "$p" || break; sleep 0.1; done  # 3 s, then SIGKILL
      if running "$p"; then kill -KILL "$p" 2>/dev/null || true; fi
      for _ in $(seq 1 50); do running "$p" || break; sleep 0.1; done
      if running "$p"; then die "$d (pid $p) did not exit"; fi
    fi
    rm -f "$DIR/$d.pid"
  done
  # Job steps (slurmstepd) outlive slurmd by design; end those of this cluster (they inherit
  # slurmd's SLURM_CONF=$CONF) with their processes.
  # Same for the jobs' processes (SLURM_JOB_ID set; the config exported by sbatch or slurmd).
  local env
  for p in $(pgrep -x slurmstepd 2>/dev/null || true) $(ls /proc | grep -E '^[0-9]+$'); do
    [ "$p" != "$$" ] || continue
    env=$( { tr '\0' '\n' <"/proc/$p/environ"; } 2>/dev/null) || continue
    grep -qxF "SLURM_CONF=$CONF" <<<"$env" || continue
    if [ "$(cat "/proc/$p/comm" 2>/dev/null)" = slurmstepd ] || grep -q '^SLURM_JOB_ID=' <<<"$env"; then
      kill -KILL "$p" 2>/dev/null || true
      any=1
    fi
  done
  [ "${1:-}" = quiet ] || [ $any -eq 1 ] || echo "slurm-local: nothing was running" >&2
}

stop() {
  need_root
  if pid_alive slurmctld; then
    scancel --full --quiet --user=root 2>/dev/null || true
    # Give running steps the chance to end through slurmd (bounded), then stop the daemons.
    local end=$(( $(date +%s) + 10 ))
    while [ -n "$(squeue -h -o %i 2>/dev/null)" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 0.2; done
  fi
  stop_daemons
  echo "slurm-local: stopped" >&2
}

status() {
  local rc=0 p
  for d in slurmctld slurmd; do
    if p=$(daemon_pid "$d"); then echo "$d: running (pid $p)"; else echo "$d: not running"; rc=1; fi
  done
  if [ $rc -eq 0 ]; then
    echo "node localhost: $(node_state)"
    squeue
  fi
  echo "export SLURM_CONF=$CONF"
  return $rc
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  env) echo "export SLURM_CONF=$CONF" ;;
  *) echo "usage: $0 start|stop|status|env" >&2; exit 2 ;;
esac
