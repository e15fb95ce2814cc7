#!/usr/bin/env bash
# cluster-down.sh: stops what scripts/cluster-up.sh started, by the pids it
# recorded, and nothing else: nginx (and the ceiling server and Prometheus) first, then the
# instances (SIGTERM lets them finish the batch in flight), then MariaDB,
# Redis (or the nodes of the Redis Cluster) and the lock Redis.
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
  stop redis
  # The nodes of a Redis Cluster, together.
  for f in "$run"/redis-node-*.pid; do
    [ -e "$f" ] || continue
    stop "$(basename "$f" .pid)" &
  done
  wait
  stop redis-locks
fi
if $purge; then
  rm -rf "$dir"
  say "deleted $dir"
fi
