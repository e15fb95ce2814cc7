#!/usr/bin/env bash
# cluster-down.sh: stops what scripts/cluster-up.sh started, by the pids it
# recorded, and nothing else: nginx (and the ceiling server and Prometheus) first, then the
# instances (SIGTERM lets them finish the batch in flight), then MariaDB (or
# the servers of the replicated database, one at a time), Redis (or the
# nodes of the Redis Cluster) and the lock Redis. It fails if a mariadbd on
# the cluster's data still runs afterwards.
#
#   scripts/cluster-down.sh           stop; keep the data for the next cluster-up.sh
#   scripts/cluster-down.sh --purge   stop and delete the state directory
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${SECKILL_CLUSTER_DIR:-$root/.cluster}
run=$dir/run
purge=false
case "${1:-}" in
  --purge) purge=true ;;
  "") ;;
  *) echo "usage: $0 [--purge]" >&2; exit 2 ;;
esac

say() { printf 'cluster: %s\n' "$*" >&2; }

# stop NAME: SIGTERM the recorded pid if it is still the program started
# (a pid can be reused once its process is gone), wait, then SIGKILL.
stop() {
  local name=$1 f=$run/$1.pid pid exe
  [ -f "$f" ] || return 0
  read -r pid exe <"$f"
  if [ -n "$pid" ] && [ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = "$exe" ]; then
    kill -TERM "$pid" 2>/dev/null || true
    local deadline=$((SECONDS + 30))
    while [ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = "$exe" ]; do
      if [ $SECONDS -ge $deadline ]; then
        say "$name (pid $pid) ignored SIGTERM for 30s; killing it"
        kill -KILL "$pid" 2>/dev/null || true
        break
      fi
      sleep 0.1
    done
    say "stopped $name (pid $pid)"
  fi
  rm -f "$f"
}

if [ -d "$run" ]; then
  # The watchdog runs this script itself when its watched process is gone;
  # it must not stop itself half-way.
  if [ -f "$run/watchdog.pid" ] && [ "$(cut -d' ' -f1 "$run/watchdog.pid")" != "$$" ]; then
    stop watchdog
  fi
  rm -f "$run/watchdog.pid"
  stop nginx
  stop ceiling
  stop prometheus
  for f in "$run"/api-*.pid "$run"/worker-*.pid; do
    [ -e "$f" ] || continue
    name=$(basename "$f" .pid)
    stop "$name" &
  done
  wait
  stop mariadb
  # The replicated database's servers (SECKILL_CLUSTER_DB), one at a time,
  # the last first: the Galera node stopped last is the one safe to
  # bootstrap the next start from. A server db-failover killed is gone
  # already; its pidfile goes.
  for i in 3 2 1; do
    stop "mariadb-$i"
  done
  stop redis
  # The nodes of a Redis Cluster, together.
  for f in "$run"/redis-node-*.pid; do
    [ -e "$f" ] || continue
    stop "$(basename "$f" .pid)" &
  done
  wait
  stop redis-locks
fi
# Nothing may be left running on the cluster's data, whatever the pidfiles
# said (a database server started but not recorded, one restarted by hand).
if [ -d "$dir" ]; then
  abs=$(cd "$dir" && pwd)
  left=$(for p in /proc/[0-9]*; do
    cmd=$(tr '\0' ' ' 2>/dev/null <"$p/cmdline") || continue
    case $cmd in *mariadbd*"--datadir=$abs/"*) echo "${p#/proc/}" ;; esac
  done)
  if [ -n "$left" ]; then
    say "mariadbd still runs on data in $abs: pid $(echo $left); not started by cluster-up.sh as recorded, so not stopped here"
    exit 1
  fi
fi
if $purge; then
  rm -rf "$dir"
  say "deleted $dir"
fi
