#!/usr/bin/env bash
# cluster-up.sh: seckill as it runs in production, on this machine's loopback,
# from the installed binaries: redis-server (AOF, fsync always, noeviction),
# or a Redis Cluster of six such servers (SECKILL_CLUSTER_REDIS=cluster),
# a second redis-server for buyer locks only (no persistence), mariadbd (its
# own datadir), two or more API instances and nginx in front.
# Prints the URL and an admin token; scripts/cluster-down.sh stops it.
#
#   scripts/cluster-up.sh           start the cluster
#   scripts/cluster-up.sh worker    add an instance with SECKILL_ROLE=worker to a running cluster
#                                   (its /healthz, /readyz and /metrics on its own loopback port)
#   scripts/cluster-up.sh api       add an instance with SECKILL_ROLE=api outside nginx, with every
#                                   core of the machine, to measure one instance alone
#                                   (loadtest/README.md)
#   scripts/cluster-up.sh ceiling   add loadtest/ceiling (the bare purchase script behind Gin) on
#                                   the cluster's Redis, the yardstick of loadtest/README.md
#
# State (pids, logs, data, cluster.env) lives in SECKILL_CLUSTER_DIR, default
# .cluster/ in the repository; data is kept across down/up unless
# cluster-down.sh --purge. Settings, all optional:
#   SECKILL_CLUSTER_INSTANCES    API instances (2)
#   SECKILL_CLUSTER_HTTP_PORT    nginx (18080)
#   SECKILL_CLUSTER_API_PORT     first instance's port; the others follow (18081)
#   SECKILL_CLUSTER_API_PORTS    or each instance's port, space-separated
#   SECKILL_CLUSTER_REDIS        the sale's Redis: "single", one redis-server (the default), or
#                                "cluster", a Redis Cluster of 3 masters with 1 replica each
#                                (redis-server --cluster-enabled yes, created with
#                                redis-cli --cluster create); the instances get a
#                                redis-cluster:// URL naming every node, and SECKILL_SHARDS
#                                defaults to 3 so that the shards spread over the masters
#   SECKILL_CLUSTER_REDIS_PORT   redis-server (16379)
#   SECKILL_CLUSTER_REDIS_NODE_PORT  first cluster node's port; the other five follow (16400)
#   SECKILL_CLUSTER_REDIS_NODE_PORTS  or each node's port, space-separated (six)
#   SECKILL_CLUSTER_REDIS_BUS_PORTS   each node's cluster bus port, space-separated (default:
#                                its port + 10000)
#   SECKILL_CLUSTER_LOCK_REDIS_PORT  redis-server for buyer locks, no persistence (16380);
#                                the instances get it as SECKILL_LOCK_NODES
#   SECKILL_CLUSTER_MYSQL_PORT   mariadbd (13306)
#   SECKILL_CLUSTER_SOLO_PORT    the instance of "cluster-up.sh api" (18089)
#   SECKILL_CLUSTER_WORKER_PORT  probes and metrics of the first "cluster-up.sh worker"; the
#                                next ones follow (18101)
#   SECKILL_CLUSTER_CEILING_PORT the server of "cluster-up.sh ceiling" (18090)
#   SECKILL_CLUSTER_GOMAXPROCS   cores each instance behind nginx schedules Go code on: by default
#                                the machine's cores shared out among them (at least 1), as a CPU
#                                limit per container would; "auto" leaves Go's default (all cores)
#   SECKILL_CLUSTER_PROMETHEUS_PORT  also start Prometheus (Debian's prometheus package) on this
#                                port, scraping every instance with deploy/prometheus/alerts.yml
#                                loaded; unset: no Prometheus
#   SECKILL_CLUSTER_PROMETHEUS_INTERVAL  its scrape and rule evaluation interval (5s)
#   SECKILL_CLUSTER_WATCH_PID    stop the cluster when this process exits (tests)
#   SECKILL_API_BIN              use this api binary instead of building one
#   SECKILL_PAY_PROVIDER         the instances' payment provider: dev here (paying succeeds at
#                                once; this is a local load cluster, where the service's own
#                                default with a database server, off, would refuse every payment)
#   SECKILL_PAY_WINDOW, SECKILL_EXPIRY_SWEEP  the pay window and the sweep (service defaults 15m,
#                                30s); these three are also written to cluster.env, which
#                                "cluster-up.sh worker" sources
#   SECKILL_NGINX_PURCHASE_RATE, SECKILL_NGINX_PURCHASE_BURST, SECKILL_NGINX_PROXY_TIMEOUT
#                                nginx limits (20r/s, 40, 5s; see nginx/seckill.conf.template).
#                                A load test from one address needs a far higher rate.
# Every other SECKILL_* variable in the environment (SECKILL_ROLE,
# SECKILL_LOG_LEVEL, SECKILL_WORKER_BATCH, ...) reaches the instances.
set -euo pipefail
export PATH="$PATH:/usr/local/go/bin:/usr/sbin:/sbin"
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${SECKILL_CLUSTER_DIR:-$root/.cluster}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
run=$dir/run
logs=$dir/log

instances=${SECKILL_CLUSTER_INSTANCES:-2}
http_port=${SECKILL_CLUSTER_HTTP_PORT:-18080}
api_port=${SECKILL_CLUSTER_API_PORT:-18081}
redis_mode=${SECKILL_CLUSTER_REDIS:-single}
redis_port=${SECKILL_CLUSTER_REDIS_PORT:-16379}
redis_node_port=${SECKILL_CLUSTER_REDIS_NODE_PORT:-16400}
lock_redis_port=${SECKILL_CLUSTER_LOCK_REDIS_PORT:-16380}
mysql_port=${SECKILL_CLUSTER_MYSQL_PORT:-13306}
solo_port=${SECKILL_CLUSTER_SOLO_PORT:-18089}
worker_port=${SECKILL_CLUSTER_WORKER_PORT:-18101}
ceiling_port=${SECKILL_CLUSTER_CEILING_PORT:-18090}
prometheus_port=${SECKILL_CLUSTER_PROMETHEUS_PORT:-}
prometheus_interval=${SECKILL_CLUSTER_PROMETHEUS_INTERVAL:-5s}

say() { printf 'cluster: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

need() { command -v "$1" >/dev/null 2>&1 || die "$1 not found; scripts/deps.sh installs it"; }

# alive NAME: the process in run/NAME.pid runs and is still the program we
# started (its pid was not reused).
alive() {
  local f=$run/$1.pid pid exe
  [ -f "$f" ] || return 1
  read -r pid exe <"$f"
  [ -n "$pid" ] && [ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = "$exe" ]
}

# start NAME LOG PROGRAM ARGS...: runs PROGRAM in its own session (a Ctrl-C in
# this terminal does not reach it), output to LOG, and records its pid.
start() {
  local name=$1 log=$2 prog
  shift 2
  prog=$(readlink -f "$(command -v "$1")")
  setsid "$@" </dev/null >>"$log" 2>&1 &
  echo "$! $prog" >"$run/$name.pid"
}

# wait_for WHAT SECONDS NAME COMMAND...: polls COMMAND until it succeeds,
# failing early if process NAME exited.
wait_for() {
  local what=$1 secs=$2 name=$3
  shift 3
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    kill -0 "$(cut -d' ' -f1 "$run/$name.pid")" 2>/dev/null || die "$what exited while starting; see $logs/$name.log"
    [ $SECONDS -lt $deadline ] || die "$what not ready after ${secs}s; see $logs/$name.log"
    sleep 0.1
  done
}

# http_ok PORT PATH: GET answers 200 (bash only, no curl needed).
http_ok() {
  local line
  exec 3<>"/dev/tcp/127.0.0.1/$1" || return 1
  printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' "$2" >&3
  IFS= read -r -t 2 line <&3 || { exec 3>&-; return 1; }
  exec 3>&-
  [[ $line == "HTTP/1."?" 200"* ]]
}

# redis_ok PORT: the redis-server on PORT answers PING.
redis_ok() {
  local line
  exec 3<>"/dev/tcp/127.0.0.1/$1" || return 1
  printf 'PING\r\n' >&3
  IFS= read -r -t 2 line <&3 || { exec 3>&-; return 1; }
  exec 3>&-
  [ "$line" = $'+PONG\r' ]
}

# port_free PORT: PORT can be bound on loopback: nothing listens on it, and
# no connection uses it as its local port (an outgoing one may, in the
# ephemeral range). Connections in TIME-WAIT do not stop a bind.
port_free() {
  if command -v ss >/dev/null 2>&1; then
    ! ss -Htan "sport = :$1" 2>/dev/null | grep -qv '^TIME-WAIT'
  else
    ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
  fi
}

# admin_addr PORT: the admin listener (dead letters, reconcile, pprof) of
# the instance on PORT: loopback PORT + 10000, or off when that is no port
# or is taken (an instance stops at start on an address it cannot bind).
admin_addr() {
  local p=$(($1 + 10000))
  if [ "$p" -le 65535 ] && port_free "$p"; then echo "127.0.0.1:$p"; else echo off; fi
}

# redis_alive: the sale's Redis of a started cluster runs (its single
# server, or the first node of its Redis Cluster).
redis_alive() { alive redis || alive redis-node-1; }

# cluster_field PORT FIELD: FIELD of CLUSTER INFO on the node on PORT.
cluster_field() {
  redis-cli -h 127.0.0.1 -p "$1" cluster info 2>/dev/null | tr -d '\r' | sed -n "s/^$2://p"
}

# cluster_ready: every node says cluster_state:ok and knows all six, and
# every replica's link to its master is up.
cluster_ready() {
  local p role
  for p in "${node_ports[@]}"; do
    [ "$(cluster_field "$p" cluster_state)" = ok ] || return 1
    [ "$(cluster_field "$p" cluster_known_nodes)" = "${#node_ports[@]}" ] || return 1
    role=$(redis-cli -h 127.0.0.1 -p "$p" info replication 2>/dev/null | tr -d '\r')
    case "$role" in
      *role:slave*) [[ $role == *master_link_status:up* ]] || return 1 ;;
      *role:master*) ;;
      *) return 1 ;;
    esac
  done
}

# instance_env: the settings every instance gets. Buyer locks need no
# durability (MySQL's keys are the real guard): on the AOF Redis every lock
# write would wait for an fsync.
instance_env() {
  if [ "$redis_mode" = cluster ]; then
    export SECKILL_REDIS_URL=$cluster_url
    export SECKILL_SHARDS=${SECKILL_SHARDS:-3}
  else
    export SECKILL_REDIS_URL="redis://127.0.0.1:$redis_port/0"
  fi
  export SECKILL_LOCK_NODES="redis://127.0.0.1:$lock_redis_port/0"
  export SECKILL_MYSQL_DSN="root@tcp(127.0.0.1:$mysql_port)/seckill"
  SECKILL_TOKEN_SECRET=$(cat "$dir/token-secret")
  export SECKILL_TOKEN_SECRET
  # Payments: with a database server the service's default is off (no
  # free payments in production by accident). This is a local load
  # cluster, so the dev provider (paying succeeds at once) is its
  # default; SECKILL_PAY_PROVIDER chooses another. The pay window and the
  # sweep keep the service's defaults (15m, 30s) unless set: a measurement
  # of expiries sets seconds (loadtest/README.md).
  export SECKILL_PAY_PROVIDER=${SECKILL_PAY_PROVIDER:-dev}
  [ -z "${SECKILL_PAY_WINDOW:-}" ] || export SECKILL_PAY_WINDOW
  [ -z "${SECKILL_EXPIRY_SWEEP:-}" ] || export SECKILL_EXPIRY_SWEEP
}

if [ "${1:-}" = "worker" ]; then
  [ -f "$dir/cluster.env" ] && redis_alive || die "no cluster runs in $dir; start one with scripts/cluster-up.sh"
  set -a
  # shellcheck disable=SC1091
  . "$dir/cluster.env"
  set +a
  n=1
  while [ -f "$run/worker-$n.pid" ]; do n=$((n + 1)); done
  # Its probes and metrics on a loopback port of its own, like an API
  # instance's; at info level, so that its start can be seen in its log.
  port=$((worker_port + n - 1))
  port_free "$port" || die "port $port is taken; choose another with SECKILL_CLUSTER_WORKER_PORT"
  SECKILL_ROLE=worker SECKILL_LOG_LEVEL=info SECKILL_ADDR="127.0.0.1:$port" \
    SECKILL_ADMIN_ADDR="${SECKILL_ADMIN_ADDR:-$(admin_addr "$port")}" \
    start "worker-$n" "$logs/worker-$n.log" "$dir/bin/api" serve
  wait_for "worker-$n" 30 "worker-$n" http_ok "$port" /readyz
  say "worker-$n started on 127.0.0.1:$port (/healthz, /readyz, /metrics; pid $(cut -d' ' -f1 "$run/worker-$n.pid"))"
  exit 0
fi

if [ "${1:-}" = "ceiling" ]; then
  [ -f "$dir/cluster.env" ] && redis_alive || die "no cluster runs in $dir; start one with scripts/cluster-up.sh"
  alive ceiling && die "the ceiling server already runs (pid $(cut -d' ' -f1 "$run/ceiling.pid"))"
  port_free "$ceiling_port" || die "port $ceiling_port is taken; choose another with SECKILL_CLUSTER_CEILING_PORT"
  need go
  (cd "$root" && go build -o "$dir/bin/ceiling" ./loadtest/ceiling)
  # On the cluster's Redis (one server or the Redis Cluster) with its shards.
  set -a
  # shellcheck disable=SC1091
  . "$dir/cluster.env"
  set +a
  # Started like the instances (its own session): servers compared with
  # each other must be scheduled alike (loadtest/README.md, "autogroups").
  # Its pprof listener takes the admin listener's place (port + 10000), and
  # is left out where that is no port or is taken, as an instance's is.
  pprof=$(admin_addr "$ceiling_port")
  [ "$pprof" = off ] && pprof=""
  start ceiling "$logs/ceiling.log" "$dir/bin/ceiling" --addr "127.0.0.1:$ceiling_port" \
    --redis "$SECKILL_REDIS_URL" --shards "$SECKILL_SHARDS" --pprof "$pprof"
  wait_for "ceiling server" 30 ceiling grep -q 'ceiling server listening' "$logs/ceiling.log"
  say "ceiling ready: http://127.0.0.1:$ceiling_port (pid $(cut -d' ' -f1 "$run/ceiling.pid"))"
  exit 0
fi

if [ "${1:-}" = "api" ]; then
  [ -f "$dir/cluster.env" ] && redis_alive || die "no cluster runs in $dir; start one with scripts/cluster-up.sh"
  alive api-solo && die "the solo instance already runs (pid $(cut -d' ' -f1 "$run/api-solo.pid"))"
  port_free "$solo_port" || die "port $solo_port is taken; choose another with SECKILL_CLUSTER_SOLO_PORT"
  set -a
  # shellcheck disable=SC1091
  . "$dir/cluster.env"
  set +a
  solo_admin=$(admin_addr "$solo_port")
  say "api-solo on 127.0.0.1:$solo_port (admin $solo_admin), not behind nginx"
  SECKILL_ROLE=api SECKILL_ADDR="127.0.0.1:$solo_port" SECKILL_ADMIN_ADDR="$solo_admin" \
    start api-solo "$logs/api-solo.log" "$dir/bin/api" serve
  wait_for api-solo 60 api-solo http_ok "$solo_port" /readyz
  say "api-solo ready: http://127.0.0.1:$solo_port (pid $(cut -d' ' -f1 "$run/api-solo.pid"))"
  exit 0
fi

case $redis_mode in
  single | cluster) ;;
  *) die "SECKILL_CLUSTER_REDIS=$redis_mode: want single or cluster" ;;
esac
need redis-server
[ "$redis_mode" = single ] || need redis-cli
need mariadbd
need mariadb-install-db
need mariadb
need nginx
[ -z "$prometheus_port" ] || need prometheus
mkdir -p "$run" "$logs" "$dir/redis" "$dir/redis-locks" "$dir/mysql" "$dir/nginx/logs" "$dir/nginx/temp" "$dir/bin"
for name in nginx redis redis-node-{1..6} redis-locks mariadb prometheus; do
  alive "$name" && die "a cluster already runs in $dir (scripts/cluster-down.sh stops it)"
done
read -r -a api_ports <<<"${SECKILL_CLUSTER_API_PORTS:-}"
if [ ${#api_ports[@]} -eq 0 ]; then
  for i in $(seq 0 $((instances - 1))); do api_ports+=($((api_port + i))); done
fi
instances=${#api_ports[@]}
redis_ports=("$redis_port")
if [ "$redis_mode" = cluster ]; then
  read -r -a node_ports <<<"${SECKILL_CLUSTER_REDIS_NODE_PORTS:-}"
  [ ${#node_ports[@]} -gt 0 ] || read -r -a node_ports <<<"$(seq -s ' ' "$redis_node_port" $((redis_node_port + 5)))"
  read -r -a bus_ports <<<"${SECKILL_CLUSTER_REDIS_BUS_PORTS:-}"
  if [ ${#bus_ports[@]} -eq 0 ]; then
    for p in "${node_ports[@]}"; do bus_ports+=($((p + 10000))); done
  fi
  [ ${#node_ports[@]} -eq 6 ] && [ ${#bus_ports[@]} -eq 6 ] ||
    die "a Redis Cluster here has six nodes: SECKILL_CLUSTER_REDIS_NODE_PORTS and _BUS_PORTS name six ports each"
  redis_ports=("${node_ports[@]}" "${bus_ports[@]}")
  # Every node is a seed: the client finds the cluster through any of them.
  cluster_url="redis-cluster://127.0.0.1:${node_ports[0]}?$(printf 'addr=127.0.0.1:%s&' "${node_ports[@]:1}" | sed 's/&$//')"
fi
for p in "$http_port" "${redis_ports[@]}" "$lock_redis_port" "$mysql_port" "${api_ports[@]}" $prometheus_port; do
  [ "$p" -ge 1 ] 2>/dev/null && [ "$p" -le 65535 ] || die "port $p is no port"
  port_free "$p" || die "port $p is taken; choose others with SECKILL_CLUSTER_*_PORT"
done

if [ -n "${SECKILL_ADMIN_ADDR:-}" ] && [ "$SECKILL_ADMIN_ADDR" != off ] && [ "$instances" -gt 1 ]; then
  die "SECKILL_ADMIN_ADDR=$SECKILL_ADMIN_ADDR would be one address for $instances instances: leave it unset (each gets its port + 10000) or set it to off"
fi

# On any failure, stop what was started: a failed command (set -e) or a
# die, whose exit an ERR trap does not see.
trap 'rc=$?; if [ $rc -ne 0 ]; then say "start failed; stopping what was started"; SECKILL_CLUSTER_DIR=$dir "$root/scripts/cluster-down.sh" >&2 || true; fi' EXIT

if [ -n "${SECKILL_API_BIN:-}" ]; then
  cp "$SECKILL_API_BIN" "$dir/bin/api"
else
  need go
  say "building the api binary"
  (cd "$root" && go build -o "$dir/bin/api" ./cmd/api)
fi
if [ ! -s "$dir/token-secret" ]; then
  (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$dir/token-secret")
fi

if [ "$redis_mode" = cluster ]; then
  # Six nodes, each with the single server's durability, its own dir (its
  # AOF and nodes.conf) and its own session; a replica is promoted when its
  # master stays unreachable for cluster-node-timeout. Meanwhile the other
  # masters keep serving their shards (cluster-require-full-coverage no):
  # one master down stops only its shards' sale, not the whole sale.
  say "Redis Cluster nodes on 127.0.0.1:${node_ports[*]} (appendonly, fsync always, noeviction)"
  for i in 1 2 3 4 5 6; do
    mkdir -p "$dir/redis-node-$i"
    start "redis-node-$i" "$logs/redis-node-$i.log" redis-server --port "${node_ports[$((i - 1))]}" \
      --bind 127.0.0.1 --dir "$dir/redis-node-$i" --daemonize no --cluster-enabled yes \
      --cluster-config-file nodes.conf --cluster-port "${bus_ports[$((i - 1))]}" --cluster-node-timeout 5000 \
      --cluster-require-full-coverage no \
      --appendonly yes --appendfsync always --maxmemory-policy noeviction --save ""
  done
  for i in 1 2 3 4 5 6; do
    wait_for "redis-node-$i" 30 "redis-node-$i" redis_ok "${node_ports[$((i - 1))]}"
  done
  # Fresh nodes each know only themselves: create the cluster. Nodes kept
  # from an earlier cluster-up.sh know each other from nodes.conf and meet
  # again by themselves.
  known=()
  for p in "${node_ports[@]}"; do known+=("$(cluster_field "$p" cluster_known_nodes)"); done
  if [ "${known[*]}" = "1 1 1 1 1 1" ]; then
    say "creating the Redis Cluster: 3 masters, 1 replica each"
    # shellcheck disable=SC2046
    redis-cli --cluster create $(printf '127.0.0.1:%s ' "${node_ports[@]}") --cluster-replicas 1 --cluster-yes \
      >"$logs/redis-cluster-create.log" 2>&1 || die "redis-cli --cluster create failed; see $logs/redis-cluster-create.log"
  elif [ "${known[*]}" != "6 6 6 6 6 6" ]; then
    die "the nodes in $dir/redis-node-* know ${known[*]} nodes, want all 1 (new) or all 6; cluster-down.sh --purge starts afresh"
  fi
  deadline=$((SECONDS + 60))
  until cluster_ready; do
    [ $SECONDS -lt $deadline ] || die "the Redis Cluster is not ok after 60s (cluster_state:ok on every node, every replica's master link up); see $logs/redis-node-*.log"
    sleep 0.2
  done
else
  say "redis-server on 127.0.0.1:$redis_port (appendonly, fsync always, noeviction)"
  start redis "$logs/redis.log" redis-server --port "$redis_port" --bind 127.0.0.1 --dir "$dir/redis" \
    --daemonize no --appendonly yes --appendfsync always --maxmemory-policy noeviction --save ""
  wait_for redis-server 30 redis redis_ok "$redis_port"
fi

say "redis-server for buyer locks on 127.0.0.1:$lock_redis_port (no persistence)"
start redis-locks "$logs/redis-locks.log" redis-server --port "$lock_redis_port" --bind 127.0.0.1 \
  --dir "$dir/redis-locks" --daemonize no --appendonly no --save "" --maxmemory-policy noeviction
wait_for "redis-server for locks" 30 redis-locks redis_ok "$lock_redis_port"

root_user=()
[ "$(id -u)" -eq 0 ] && root_user=(--user=root) # mariadbd refuses root otherwise
# Temporary files in a directory of its own: servers sharing /tmp have had
# the installer fail on a temporary table another one removed.
mkdir -p "$dir/mysql/tmp"
common=(--no-defaults "--datadir=$dir/mysql/data" "--tmpdir=$dir/mysql/tmp" --skip-name-resolve
  --innodb-log-file-size=64M "${root_user[@]}")
if [ ! -d "$dir/mysql/data/mysql" ]; then
  say "creating the mariadb datadir"
  install_db() {
    mariadb-install-db "${common[@]}" --auth-root-authentication-method=normal --skip-test-db \
      </dev/null >>"$logs/mariadb-install.log" 2>&1
  }
  # One more try on a clean datadir before giving up: a failed run of the
  # whole suite costs far more than a second install.
  install_db || { rm -rf "$dir/mysql/data"; say "mariadb-install-db failed; once more"; install_db; } ||
    die "mariadb-install-db failed; see $logs/mariadb-install.log"
fi
say "mariadbd on 127.0.0.1:$mysql_port"
# The socket path is relative to the datadir: a deep absolute path can pass
# the 108-byte limit of socket names.
start mariadb "$logs/mariadb.log" mariadbd "${common[@]}" --port="$mysql_port" --bind-address=127.0.0.1 \
  --socket=mysqld.sock --pid-file="$dir/mysql/mariadbd.pid" --skip-log-bin \
  --innodb-buffer-pool-size=256M --innodb-flush-log-at-trx-commit=1 --max-connections=500 \
  --character-set-server=utf8mb4 --collation-server=utf8mb4_unicode_ci
mysql_cli=(mariadb --no-defaults --protocol=tcp -h 127.0.0.1 -P "$mysql_port" -u root)
wait_for mariadbd 60 mariadb "${mysql_cli[@]}" -e 'SELECT 1'
"${mysql_cli[@]}" -e 'CREATE DATABASE IF NOT EXISTS seckill CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci'

instance_env
# Instances sharing a machine each get their share of its cores: Go's
# default, every core for each, has them preempt one another, and it costs
# about a tenth of the throughput through nginx (loadtest/README.md).
procs=${SECKILL_CLUSTER_GOMAXPROCS:-$(($(nproc) / instances))}
[ "$procs" = auto ] || [ "$procs" -ge 1 ] 2>/dev/null || procs=1
urls=()
upstreams=""
for i in $(seq 1 "$instances"); do
  port=${api_ports[$((i - 1))]}
  # Each instance's admin listener on its own loopback port: the API port
  # + 10000 (admin_addr).
  admin_listen=${SECKILL_ADMIN_ADDR:-$(admin_addr "$port")}
  say "api-$i on 127.0.0.1:$port (admin $admin_listen, GOMAXPROCS $procs)"
  if [ "$procs" = auto ]; then
    SECKILL_ADDR="127.0.0.1:$port" SECKILL_ADMIN_ADDR="$admin_listen" \
      start "api-$i" "$logs/api-$i.log" "$dir/bin/api" serve
  else
    GOMAXPROCS=$procs SECKILL_ADDR="127.0.0.1:$port" SECKILL_ADMIN_ADDR="$admin_listen" \
      start "api-$i" "$logs/api-$i.log" "$dir/bin/api" serve
  fi
  urls+=("http://127.0.0.1:$port")
  upstreams+="server 127.0.0.1:$port max_fails=1 fail_timeout=2s; "
done
for i in $(seq 1 "$instances"); do
  wait_for "api-$i" 60 "api-$i" http_ok "${api_ports[$((i - 1))]}" /readyz
done

say "nginx on 127.0.0.1:$http_port"
cp "$root/nginx/nginx.conf" "$dir/nginx/nginx.conf"
sed -e "s|\${SECKILL_NGINX_LISTEN}|127.0.0.1:$http_port|g" \
  -e "s|\${SECKILL_UPSTREAM_SERVERS}|$upstreams|g" \
  -e "s|\${SECKILL_NGINX_PURCHASE_RATE}|${SECKILL_NGINX_PURCHASE_RATE:-20r/s}|g" \
  -e "s|\${SECKILL_NGINX_PURCHASE_BURST}|${SECKILL_NGINX_PURCHASE_BURST:-40}|g" \
  -e "s|\${SECKILL_NGINX_PROXY_TIMEOUT}|${SECKILL_NGINX_PROXY_TIMEOUT:-5s}|g" \
  -e "s|\${SECKILL_NGINX_ACCESS_LOG}|logs/access.log|g" \
  "$root/nginx/seckill.conf.template" >"$dir/nginx/seckill.conf"
if grep -n '\${[A-Z_]*}' "$dir/nginx/seckill.conf" >&2; then die "unfilled placeholders in $dir/nginx/seckill.conf"; fi
nginx_args=(-p "$dir/nginx/" -e logs/error.log -c "$dir/nginx/nginx.conf")
nginx "${nginx_args[@]}" -t -q >"$logs/nginx.log" 2>&1 || die "nginx -t failed; see $logs/nginx.log"
start nginx "$logs/nginx.log" nginx "${nginx_args[@]}" -g 'daemon off;'
wait_for nginx 30 nginx http_ok "$http_port" /readyz

if [ -n "$prometheus_port" ]; then
  # Scrapes each instance directly (an instance answers 404 to /metrics
  # that came through nginx), with the alert rules of deploy/prometheus.
  say "prometheus on 127.0.0.1:$prometheus_port (scrape and rules every $prometheus_interval)"
  mkdir -p "$dir/prometheus/data"
  cp "$root/deploy/prometheus/alerts.yml" "$dir/prometheus/alerts.yml"
  {
    echo "global: {scrape_interval: $prometheus_interval, scrape_timeout: $prometheus_interval, evaluation_interval: $prometheus_interval}"
    echo "rule_files: [alerts.yml]"
    echo "scrape_configs:"
    echo "  - job_name: seckill-api"
    echo "    static_configs:"
    echo "      - targets: [$(printf '"127.0.0.1:%s",' "${api_ports[@]}" | sed 's/,$//')]"
  } >"$dir/prometheus/prometheus.yml"
  start prometheus "$logs/prometheus.log" prometheus --config.file="$dir/prometheus/prometheus.yml" \
    --storage.tsdb.path="$dir/prometheus/data" --web.listen-address="127.0.0.1:$prometheus_port"
  wait_for prometheus 60 prometheus http_ok "$prometheus_port" /-/ready
fi

admin=$("$dir/bin/api" token --user 1 --admin --ttl 24h)
{
  echo "# written by scripts/cluster-up.sh; source it: set -a; . $dir/cluster.env; set +a"
  echo "SECKILL_URL='http://127.0.0.1:$http_port'"
  echo "SECKILL_API_URLS='${urls[*]}'"
  echo "SECKILL_ADMIN_TOKEN='$admin'"
  echo "SECKILL_TOKEN_SECRET='$SECKILL_TOKEN_SECRET'"
  echo "SECKILL_REDIS_URL='$SECKILL_REDIS_URL'"
  echo "SECKILL_LOCK_NODES='$SECKILL_LOCK_NODES'"
  echo "SECKILL_MYSQL_DSN='$SECKILL_MYSQL_DSN'"
  echo "SECKILL_KEY_PREFIX='${SECKILL_KEY_PREFIX:-seckill}'"
  echo "SECKILL_SHARDS='${SECKILL_SHARDS:-1}'"
  echo "SECKILL_CLUSTER_REDIS='$redis_mode'"
  # The pay settings, so that "cluster-up.sh worker" (which sources this
  # file) expires orders as the cluster's instances were told to.
  echo "SECKILL_PAY_PROVIDER='$SECKILL_PAY_PROVIDER'"
  [ -z "${SECKILL_PAY_WINDOW:-}" ] || echo "SECKILL_PAY_WINDOW='$SECKILL_PAY_WINDOW'"
  [ -z "${SECKILL_EXPIRY_SWEEP:-}" ] || echo "SECKILL_EXPIRY_SWEEP='$SECKILL_EXPIRY_SWEEP'"
  [ -z "$prometheus_port" ] || echo "SECKILL_PROMETHEUS_URL='http://127.0.0.1:$prometheus_port'"
} >"$dir/cluster.env"
chmod 600 "$dir/cluster.env"

if [ -n "${SECKILL_CLUSTER_WATCH_PID:-}" ]; then
  # Tear everything down once the watched process is gone, even if it died
  # without running cluster-down.sh (a test binary that was killed).
  start watchdog "$logs/watchdog.log" bash -c \
    'while kill -0 "$1" 2>/dev/null; do sleep 1; done; SECKILL_CLUSTER_DIR="$2" exec "$3/scripts/cluster-down.sh"' \
    watchdog "$SECKILL_CLUSTER_WATCH_PID" "$dir" "$root"
fi
trap - EXIT

redis_desc=Redis
[ "$redis_mode" = single ] || redis_desc="a Redis Cluster (3 masters, 3 replicas)"
cat <<EOF

seckill cluster is up: nginx in front of $instances instances, $redis_desc, a lock Redis and MariaDB on loopback.

  URL          http://127.0.0.1:$http_port
  instances    ${urls[*]}
  admin token  $admin
  settings     $dir/cluster.env   (set -a; . $dir/cluster.env; set +a)
  logs         $logs/
${cluster_url:+  redis        $cluster_url   (SECKILL_SHARDS=$SECKILL_SHARDS)
  see it       redis-cli -c -p ${node_ports[0]} cluster nodes
}${prometheus_port:+  prometheus   http://127.0.0.1:$prometheus_port (alerts: /alerts)
}
  stop with    scripts/cluster-down.sh  (--purge also deletes the data)
EOF
