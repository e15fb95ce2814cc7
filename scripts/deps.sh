#!/usr/bin/env bash
# Installs, with apt-get, what the tests and the local cluster need and the
# machine lacks: redis-server and redis-cli, mariadb-server and its client, galera-4, nginx, chromium,
# node and prometheus (its promtool checks the alert rules).
# Source it or run it; it does nothing when everything is there.
set -euo pipefail
export PATH="$PATH:/usr/local/go/bin:/usr/sbin:/sbin"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"

need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
# redis-cli creates the Redis Clusters of the tests and the local cluster.
command -v redis-cli >/dev/null 2>&1 || need+=(redis-tools)
{ command -v mariadbd && command -v mariadb-install-db; } >/dev/null 2>&1 || need+=(mariadb-server)
# The backup and restore drill runs the guide's mariadb-dump and mariadb.
{ command -v mariadb && command -v mariadb-dump; } >/dev/null 2>&1 || need+=(mariadb-client)
# The Galera cluster tests load its provider into mariadbd.
[ -e /usr/lib/galera/libgalera_smm.so ] || need+=(galera-4)
command -v nginx >/dev/null 2>&1 || need+=(nginx)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v node >/dev/null 2>&1 || need+=(nodejs)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing with apt-get: ${need[*]}"
  $sudo apt-get update -q
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}"
  # Debian's prometheus package enables and starts a server on :9090 where
  # systemd runs; the tests start their own, so leave none running.
  if [[ " ${need[*]} " == *" prometheus "* ]]; then
    if command -v systemctl >/dev/null 2>&1; then
      $sudo systemctl disable --now prometheus >/dev/null 2>&1 || true
    fi
  fi
fi
