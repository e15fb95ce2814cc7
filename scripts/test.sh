#!/usr/bin/env bash
# Runs every test of seckill on a fresh Debian 12 machine: installs the
# servers the tests start (redis-server, mariadb-server) when they are
# missing, then vets and runs all tests with the race detector. The tests
# start their own throwaway servers on free loopback ports.
set -euo pipefail
cd "$(dirname "$0")/.."

export PATH="$PATH:/usr/local/go/bin:/usr/sbin"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"

need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v mariadbd >/dev/null 2>&1 && command -v mariadb-install-db >/dev/null 2>&1 || need+=(mariadb-server)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}"
  $sudo apt-get update -q
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}"
fi
command -v go >/dev/null 2>&1 || { echo "go not found: install Go 1.26 (see README.md)" >&2; exit 1; }

go vet ./...
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then
  echo "not gofmt'd: $unformatted" >&2
  exit 1
fi
go test -race -count=1 -timeout 20m "$@" ./...
