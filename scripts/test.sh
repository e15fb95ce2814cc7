#!/usr/bin/env bash
# Runs every test of seckill on a fresh Debian 12 machine: installs what
# the tests use (redis-server, mariadb-server, galera-4, nginx, chromium, promtool) when it is
# missing, then vets and runs all tests with the race detector, then the
# Helm chart's tests (deploy/helm). The tests start their own throwaway
# servers on free loopback ports.
set -euo pipefail
cd "$(dirname "$0")/.."

# Installs redis-server, mariadb-server, galera-4, nginx, chromium, node and prometheus with
# apt-get when they are missing.
source scripts/deps.sh
command -v go >/dev/null 2>&1 || { echo "go not found: install Go 1.26 (see README.md)" >&2; exit 1; }

go vet ./...
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then
  echo "not gofmt'd: $unformatted" >&2
  exit 1
fi
# Screenshots of the shop page from the browser test land here.
export SECKILL_ARTIFACTS="${SECKILL_ARTIFACTS:-$PWD/artifacts}"
mkdir -p "$SECKILL_ARTIFACTS"
go test -race -count=1 -timeout 20m "$@" ./...

# The Helm chart's tests (deploy/helm): a module of its own, since it builds
# Helm and the Kubernetes modules: about 9 minutes on a cold build cache on
# two cores, under a minute warm. Without the race detector, which would
# build them all again. -short skips them outside CI; CI always runs them.
if [[ " $* " == *" -short "* && "${CI:-}" != true ]]; then
  echo "-short: skipping the Helm chart's tests (deploy/helm); CI runs them" >&2
else
  (cd deploy/helm && go vet ./... && go test -count=1 -timeout 10m "$@" ./...)
fi
