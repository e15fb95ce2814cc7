#!/usr/bin/env bash
# cluster-up.sh: seckill as it runs in production, on this machine's loopback,
# from the installed binaries: redis-server (AOF, fsync always, noeviction),
# or a Redis Cluster of six such servers (SECKILL_CLUSTER_REDIS=cluster),
# a second redis-server for buyer locks only (no persistence), mariadbd (its
# own datadir), or a replicated database (SECKILL_CLUSTER_DB: a primary and
# a semi-synchronous replica, or a three-node Galera cluster), two or more
# API instances and nginx in front.
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
#   scripts/cluster-up.sh db-failover  the replicated database loses a server: semisync kills -9 the
#                                   primary and promotes the replica (its relay log applied
#                                   first, then STOP SLAVE, RESET SLAVE ALL, read_only OFF);
#                                   galera kills -9 the first node of SECKILL_MYSQL_DSN still up
#                                   and waits for the others to drop it. Prints the primary, or
#                                   the cluster's size, after it
#   scripts/cluster-up.sh db-status    one line per database server: port, pid, alive, role,
#                                   read_only, GTID positions (binlog, slave), semi-sync or
#                                   wsrep state
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
#   SECKILL_CLUSTER_DB           the database: "single", one mariadbd (the default); "semisync",
#                                a primary and a replica (binary log with GTIDs, row format,
#                                semi-synchronous replication AFTER_SYNC, the replica read_only
#                                and replicating with MASTER_USE_GTID=slave_pos); or "galera",
#                                three MariaDB Galera nodes (mysqldump state transfer). The
#                                instances' SECKILL_MYSQL_DSN names every server,
#                                root@tcp(127.0.0.1:13306,127.0.0.1:13307)/seckill: they use
#                                the first one that takes writes
#   SECKILL_CLUSTER_MYSQL_PORT   mariadbd, or the first database server; the others follow (13306)
#   SECKILL_CLUSTER_MYSQL_PORTS  or each database server's port, space-separated (one, two or
#                                three, as SECKILL_CLUSTER_DB has servers)
#   SECKILL_CLUSTER_SEMISYNC_TIMEOUT_MS  rpl_semi_sync_master_timeout: how long a commit on the
#                                primary waits for the replica's acknowledgement before the
#                                primary goes on without it, asynchronously (10000)
#   SECKILL_CLUSTER_GALERA_PORTS each Galera node's group communication port (gmcast.listen_addr),
#                                space-separated (default: its SQL port + 10000)
#   SECKILL_CLUSTER_GALERA_IST_PORTS  each node's incremental state transfer port (ist.recv_addr;
#                                default: its SQL port + 20000)
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
#   SECKILL_NGINX_REAL_IP_FROM, SECKILL_NGINX_REAL_IP_HEADER
#                                a balancer in front of nginx (none, X-Forwarded-For; see
#                                nginx/seckill.conf.template): its "set_real_ip_from CIDR;"
#                                lines, and how it names the client; with proxy_protocol nginx
#                                listens with proxy_protocol (and is checked through it)
#   SECKILL_NGINX_HSTS_MAX_AGE   Strict-Transport-Security max-age (0: none; plain HTTP here)
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
db_mode=${SECKILL_CLUSTER_DB:-single}
semisync_timeout=${SECKILL_CLUSTER_SEMISYNC_TIMEOUT_MS:-10000}
galera_provider=/usr/lib/galera/libgalera_smm.so
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

# http_ok PORT PATH [proxy]: GET answers 200 (bash only, no curl needed);
# with "proxy", the connection opens with a PROXY protocol header.
http_ok() {
  local line
  exec 3<>"/dev/tcp/127.0.0.1/$1" || return 1
  [ "${3:-}" != proxy ] || printf 'PROXY TCP4 127.0.0.1 127.0.0.1 1024 %s\r\n' "$1" >&3
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

# db_cli PORT ARGS...: the mariadb client, as root, on the database server
# on PORT.
db_cli() { mariadb --no-defaults --protocol=tcp -h 127.0.0.1 -P "$1" -u root "${@:2}"; }

# db_sql PORT SQL: runs SQL there; rows tab-separated, no header.
db_sql() { db_cli "$1" -N -B -e "$2"; }

# db_var PORT NAME: the status variable NAME of the server on PORT.
db_var() { db_sql "$1" "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME='$2'"; }

# slave_field PORT FIELD: FIELD of SHOW SLAVE STATUS there, empty when the
# server replicates from no one.
slave_field() { db_cli "$1" -e 'SHOW SLAVE STATUS\G' | sed -n "s/^ *$2: //p"; }

# db_name I, db_dir I: the pidfile name and the state directory (datadir,
# tmpdir, pid file) of database server I (1, 2, 3) of SECKILL_CLUSTER_DB.
# The single server keeps the names it always had.
db_name() { if [ "$db_mode" = single ]; then echo mariadb; else echo "mariadb-$1"; fi; }
db_dir() { if [ "$db_mode" = single ]; then echo "$dir/mysql"; else echo "$dir/mysql-$db_mode-$1"; fi; }
db_pid() { cut -d' ' -f1 "$run/$(db_name "$1").pid" 2>/dev/null; }

# semisync_primary: the server (1 or 2) that is the semisync primary; it
# changes with db-failover and is kept with the data.
semisync_primary() { cat "$dir/mysql-semisync.primary" 2>/dev/null || echo 1; }

# db_install I: a new datadir for server I, unless it has one.
db_install() {
  local d log=$logs/mariadb-install-$1.log args
  d=$(db_dir "$1")
  [ -d "$d/data/mysql" ] && return 0
  mkdir -p "$d/tmp"
  args=(--no-defaults "--datadir=$d/data" "--tmpdir=$d/tmp" --skip-name-resolve --innodb-log-file-size=64M
    "${root_user[@]}" --auth-root-authentication-method=normal --skip-test-db)
  # One more try on a clean datadir before giving up, as for the single server.
  mariadb-install-db "${args[@]}" </dev/null >>"$log" 2>&1 || {
    rm -rf "$d/data"
    say "mariadb-install-db failed for database server $1; once more"
    mariadb-install-db "${args[@]}" </dev/null >>"$log" 2>&1
  } || die "mariadb-install-db failed for database server $1; see $log"
}

# db_start I ROLE [OPTIONS...]: starts database server I as "primary" or
# "replica" (semisync) or as a "galera" node, with the single server's
# options and those of its role.
db_start() {
  local i=$1 role=$2 d port args
  shift 2
  d=$(db_dir "$i")
  port=${db_ports[$((i - 1))]}
  args=(--no-defaults "--datadir=$d/data" "--tmpdir=$d/tmp" --skip-name-resolve --innodb-log-file-size=64M
    "${root_user[@]}" --port="$port" --bind-address=127.0.0.1 --socket=mysqld.sock --pid-file="$d/mariadbd.pid"
    --innodb-buffer-pool-size=256M --innodb-flush-log-at-trx-commit=1 --max-connections=500
    --character-set-server=utf8mb4 --collation-server=utf8mb4_unicode_ci)
  case $role in
    primary | replica)
      # Binary log with GTIDs on both, so that either can be the primary;
      # server_id is the server's number, whatever its role. The replica's
      # master side stays off: with it on and nobody replicating from it,
      # its first applied transaction waits rpl_semi_sync_master_timeout
      # for an acknowledgement (measured: the replica lagged that long).
      args+=(--server-id="$i" --log-bin=mysql-bin --relay-log=relay-bin --binlog-format=ROW
        --log-slave-updates=ON --gtid-strict-mode=ON --sync-binlog=1
        --rpl-semi-sync-slave-enabled=ON --rpl-semi-sync-master-wait-point=AFTER_SYNC
        --rpl-semi-sync-master-timeout="$semisync_timeout")
      if [ "$role" = primary ]; then
        args+=(--rpl-semi-sync-master-enabled=ON --read-only=OFF)
      else
        args+=(--rpl-semi-sync-master-enabled=OFF --read-only=ON --skip-slave-start)
      fi
      ;;
    galera)
      args+=(--skip-log-bin --binlog-format=ROW --innodb-autoinc-lock-mode=2 --wsrep-on=ON
        --wsrep-provider="$galera_provider" --wsrep-cluster-name=seckill
        --wsrep-cluster-address="gcomm://$(printf '127.0.0.1:%s,' "${galera_ports[@]}" | sed 's/,$//')"
        --wsrep-node-name="node$i" --wsrep-node-address=127.0.0.1
        --wsrep-provider-options="gmcast.listen_addr=tcp://127.0.0.1:${galera_ports[$((i - 1))]};ist.recv_addr=127.0.0.1:${ist_ports[$((i - 1))]}"
        --wsrep-sst-method=mysqldump --wsrep-sst-auth=root: --wsrep-sst-receive-address="127.0.0.1:$port")
      ;;
  esac
  start "mariadb-$i" "$logs/mariadb-$i.log" mariadbd "${args[@]}" "$@"
  db_started+=("$i")
}

# wait_db WHAT SECONDS COMMAND...: polls COMMAND until it succeeds, failing
# early if a database server started exited.
wait_db() {
  local what=$1 secs=$2 i
  shift 2
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    for i in "${db_started[@]}"; do
      alive "mariadb-$i" || die "database server $i (127.0.0.1:${db_ports[$((i - 1))]}) exited while waiting for $what; see $logs/mariadb-$i.log"
    done
    [ $SECONDS -lt $deadline ] || die "$what not after ${secs}s; see $logs/mariadb-*.log"
    sleep 0.2
  done
}

# semisync_clients N: the primary has N semi-synchronous replicas.
semisync_clients() { [ "$(db_var "${db_ports[$((db_primary - 1))]}" Rpl_semi_sync_master_clients)" = "$1" ]; }

# applied PORT POS: the replica on PORT has applied GTID position POS.
applied() { [ "$(db_sql "$1" "SELECT MASTER_GTID_WAIT('$2', 1)")" = 0 ]; }

# galera_synced N: every node is Synced in a cluster of N.
galera_synced() {
  local p
  for p in "${db_ports[@]}"; do
    [ "$(db_var "$p" wsrep_local_state_comment)" = Synced ] && [ "$(db_var "$p" wsrep_cluster_size)" = "$1" ] || return 1
  done
}

# up_semisync: the primary and its replica, replicating semi-synchronously.
# After a db-failover the promoted server stays the primary; the one killed
# may hold transactions the new primary never received (commits it had
# not yet sent when it died), so its datadir is made anew and filled from
# the primary's binary log.
up_semisync() {
  local i port pids=() p pos
  db_primary=$(semisync_primary)
  for i in $(seq 1 ${#db_ports[@]}); do
    if [ -e "$(db_dir "$i")/stale" ]; then
      say "database server $i was the primary db-failover killed: its datadir is made anew, a replica of server $db_primary"
      rm -rf "$(db_dir "$i")"
    fi
  done
  for i in $(seq 1 ${#db_ports[@]}); do
    [ -d "$(db_dir "$i")/data/mysql" ] || say "creating the datadir of database server $i"
    db_install "$i" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || die "mariadb-install-db failed; see $logs/mariadb-install-*.log"; done
  for i in $(seq 1 ${#db_ports[@]}); do
    if [ "$i" = "$db_primary" ]; then
      say "mariadbd primary (server $i) on 127.0.0.1:${db_ports[$((i - 1))]}"
      db_start "$i" primary
    else
      say "mariadbd replica (server $i) on 127.0.0.1:${db_ports[$((i - 1))]}"
      db_start "$i" replica
    fi
  done
  for i in "${db_started[@]}"; do
    wait_db "database server $i" 60 db_sql "${db_ports[$((i - 1))]}" 'SELECT 1'
  done
  for i in "${db_started[@]}"; do
    [ "$i" = "$db_primary" ] && continue
    port=${db_ports[$((i - 1))]}
    db_sql "$port" "STOP SLAVE; CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT=${db_ports[$((db_primary - 1))]}, MASTER_USER='root', MASTER_PASSWORD='', MASTER_USE_GTID=slave_pos; START SLAVE" 2>/dev/null ||
      die "the replica on 127.0.0.1:$port does not replicate; see $logs/mariadb-$i.log"
  done
  wait_db "the replica's semi-synchronous connection (Rpl_semi_sync_master_clients = $((${#db_ports[@]} - 1)) on the primary)" 60 \
    semisync_clients $((${#db_ports[@]} - 1))
  # A replica made anew replays the primary's whole binary log: wait until
  # it holds what the primary held at start, so that a db-failover right
  # after the start has no backlog to apply.
  pos=$(db_sql "${db_ports[$((db_primary - 1))]}" 'SELECT @@gtid_binlog_pos')
  for i in "${db_started[@]}"; do
    [ "$i" = "$db_primary" ] && continue
    wait_db "database server $i applying the primary's binary log up to $pos" 120 applied "${db_ports[$((i - 1))]}" "$pos"
  done
  echo "$db_primary" >"$dir/mysql-semisync.primary"
}

# up_galera: three Galera nodes. The first is bootstrapped (a new cluster);
# with kept data, the node stopped last, the one grastate.dat calls
# safe_to_bootstrap, is. The others join and receive its state (IST, or
# SST by mysqldump: rsync's fails when mariadbd runs as root).
up_galera() {
  local i kept=0 pids=() p
  db_primary=1
  for i in $(seq 1 ${#db_ports[@]}); do
    [ -f "$(db_dir "$i")/data/grastate.dat" ] || continue
    kept=1
    if grep -q '^safe_to_bootstrap: *1' "$(db_dir "$i")/data/grastate.dat"; then db_primary=$i; fi
  done
  if [ $kept = 1 ] && ! grep -q '^safe_to_bootstrap: *1' "$(db_dir "$db_primary")/data/grastate.dat"; then
    die "no Galera node in $dir/mysql-galera-* is safe to bootstrap (grastate.dat): every one stopped uncleanly; cluster-down.sh --purge starts afresh"
  fi
  for i in $(seq 1 ${#db_ports[@]}); do
    [ -d "$(db_dir "$i")/data/mysql" ] || say "creating the datadir of Galera node $i"
    db_install "$i" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || die "mariadb-install-db failed; see $logs/mariadb-install-*.log"; done
  say "Galera node $db_primary on 127.0.0.1:${db_ports[$((db_primary - 1))]} bootstraps the cluster"
  db_start "$db_primary" galera --wsrep-new-cluster
  wait_db "Galera node $db_primary" 60 galera_node_synced "${db_ports[$((db_primary - 1))]}"
  for i in $(seq 1 ${#db_ports[@]}); do
    [ "$i" = "$db_primary" ] && continue
    say "Galera node $i on 127.0.0.1:${db_ports[$((i - 1))]} joins"
    db_start "$i" galera
  done
  wait_db "every Galera node Synced, wsrep_cluster_size ${#db_ports[@]}" 120 galera_synced ${#db_ports[@]}
}

galera_node_synced() { [ "$(db_var "$1" wsrep_local_state_comment)" = Synced ]; }

# db_load: the database settings of the cluster in $dir (db.env, written
# when its database started).
db_load() {
  [ -f "$dir/db.env" ] || die "no cluster database in $dir; start one with scripts/cluster-up.sh"
  # shellcheck disable=SC1091
  . "$dir/db.env"
  read -r -a db_ports <<<"$db_ports_list"
}

# db_status: one line per database server.
db_status() {
  local i port pid up role ro binlog slave state fmt='%-6s %-8s %-5s %-8s %-9s %-22s %-22s %s\n'
  printf "$fmt" port pid alive role read_only gtid_binlog_pos gtid_slave_pos state
  for i in $(seq 1 ${#db_ports[@]}); do
    port=${db_ports[$((i - 1))]}
    pid=$(db_pid "$i")
    if ! alive "$(db_name "$i")" || ! db_sql "$port" 'SELECT 1' >/dev/null 2>&1; then
      up=no
      alive "$(db_name "$i")" && up="yes (no answer)"
      printf "$fmt" "$port" "${pid:--}" "$up" - - - - -
      continue
    fi
    IFS=$'\t' read -r ro binlog slave < <(db_sql "$port" 'SELECT IF(@@read_only, "ON", "OFF"), @@gtid_binlog_pos, @@gtid_slave_pos')
    case $db_mode in
      single) role=single state=- ;;
      galera)
        role=galera
        state="wsrep=$(db_var "$port" wsrep_local_state_comment) size=$(db_var "$port" wsrep_cluster_size) component=$(db_var "$port" wsrep_cluster_status) last_committed=$(db_var "$port" wsrep_last_committed)"
        ;;
      semisync)
        if [ -n "$(slave_field "$port" Slave_IO_Running)" ]; then
          role=replica
          state="semi-sync slave=$(db_var "$port" Rpl_semi_sync_slave_status) io=$(slave_field "$port" Slave_IO_Running) sql=$(slave_field "$port" Slave_SQL_Running) io_pos=$(slave_field "$port" Gtid_IO_Pos)"
        else
          role=primary
          state="semi-sync clients=$(db_var "$port" Rpl_semi_sync_master_clients) status=$(db_var "$port" Rpl_semi_sync_master_status)"
        fi
        ;;
    esac
    printf "$fmt" "$port" "$pid" yes "$role" "$ro" "${binlog:--}" "${slave:--}" "$state"
  done
}

# kill_server I: SIGKILL database server I and wait until it is gone.
kill_server() {
  local name pid exe
  name=$(db_name "$1")
  read -r pid exe <"$run/$name.pid"
  kill -KILL "$pid"
  while [ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = "$exe" ]; do sleep 0.05; done
}

# now_ms: milliseconds since the epoch.
now_ms() { echo $(($(date +%s%N) / 1000000)); }

# failover_semisync: kill -9 the primary and promote the replica. The
# replica first applies all it received (STOP SLAVE IO_THREAD, then
# MASTER_GTID_WAIT up to its Gtid_IO_Pos): with AFTER_SYNC every commit the
# primary acknowledged is at least in the replica's relay log, and RESET
# SLAVE ALL would delete what was not applied yet.
failover_semisync() {
  local p r="" i t0 io waited status pport rport
  t0=$(now_ms)
  p=$(semisync_primary)
  for i in $(seq 1 ${#db_ports[@]}); do
    [ "$i" != "$p" ] && alive "mariadb-$i" && [ -n "$(slave_field "${db_ports[$((i - 1))]}" Slave_IO_Running 2>/dev/null)" ] && r=$i
  done
  pport=${db_ports[$((p - 1))]}
  [ -n "$r" ] || die "no replica runs to promote (the primary is server $p on 127.0.0.1:$pport; see scripts/cluster-up.sh db-status)"
  rport=${db_ports[$((r - 1))]}
  if alive "mariadb-$p"; then
    status=$(db_var "$pport" Rpl_semi_sync_master_status 2>/dev/null || echo unknown)
    kill_server "$p"
    say "killed the primary, server $p on 127.0.0.1:$pport (pid $(db_pid "$p")), with SIGKILL; its semi-sync was $status$([ "$status" = ON ] && echo ": every commit it acknowledged is on the replica")"
  else
    say "the primary, server $p on 127.0.0.1:$pport, is already down"
  fi
  # Its data may hold commits never sent: the next cluster-up.sh makes it
  # anew as a replica.
  touch "$(db_dir "$p")/stale"
  db_sql "$rport" 'STOP SLAVE IO_THREAD'
  io=$(slave_field "$rport" Gtid_IO_Pos)
  if [ -n "$io" ]; then
    waited=$(db_sql "$rport" "SELECT MASTER_GTID_WAIT('$io', 60)")
    [ "$waited" = 0 ] || die "the replica on 127.0.0.1:$rport did not apply its relay log up to $io within 60s; not promoted"
  fi
  db_sql "$rport" 'STOP SLAVE; RESET SLAVE ALL; SET GLOBAL read_only=OFF'
  echo "$r" >"$dir/mysql-semisync.primary"
  say "promoted in $(($(now_ms) - t0)) ms; it has no replica until the next cluster-up.sh makes server $p one"
  echo "primary: server $r on 127.0.0.1:$rport (pid $(db_pid "$r"), gtid_binlog_pos $(db_sql "$rport" 'SELECT @@gtid_binlog_pos'))"
}

# cluster_sizes I...: each listed node's wsrep_cluster_size, space-separated.
cluster_sizes() {
  local i out=()
  for i in "$@"; do out+=("$(db_var "${db_ports[$((i - 1))]}" wsrep_cluster_size 2>/dev/null)"); done
  echo "${out[*]}"
}

# failover_galera: kill -9 the first node of the DSN still up; the others
# drop it from the cluster after their suspicion timeout (about 6 s).
failover_galera() {
  local v="" i t0 rest=() want deadline status
  t0=$(now_ms)
  for i in $(seq 1 ${#db_ports[@]}); do
    if alive "mariadb-$i"; then
      if [ -z "$v" ]; then v=$i; else rest+=("$i"); fi
    fi
  done
  [ -n "$v" ] || die "no Galera node runs"
  [ ${#rest[@]} -gt 0 ] || die "only node $v runs: killing it would leave no database"
  kill_server "$v"
  say "killed Galera node $v on 127.0.0.1:${db_ports[$((v - 1))]} (pid $(db_pid "$v")) with SIGKILL"
  want=$(printf "${#rest[@]} %.0s" "${rest[@]}")
  deadline=$((SECONDS + 60))
  until [ "$(cluster_sizes "${rest[@]}") " = "$want" ]; do
    [ $SECONDS -lt $deadline ] || die "the other nodes still report cluster sizes $(cluster_sizes "${rest[@]}") after 60s"
    sleep 0.2
  done
  say "the others dropped it in $(($(now_ms) - t0)) ms"
  # Fewer than half of the nodes the cluster had lose quorum: what is left
  # is a non-Primary component and refuses queries.
  status=$(db_var "${db_ports[$((rest[0] - 1))]}" wsrep_cluster_status)
  echo "cluster size: ${#rest[@]} (nodes $(printf '127.0.0.1:%s ' $(for i in "${rest[@]}"; do echo "${db_ports[$((i - 1))]}"; done) | sed 's/ $//')), component $status$([ "$status" = Primary ] || echo ": no quorum, the nodes refuse queries")"
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
  # Every database server, in port order: the service uses the first one
  # that takes writes.
  export SECKILL_MYSQL_DSN="root@tcp($db_hosts)/seckill"
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

if [ "${1:-}" = "db-status" ]; then
  db_load
  db_status
  exit 0
fi

if [ "${1:-}" = "db-failover" ]; then
  db_load
  case $db_mode in
    semisync) failover_semisync ;;
    galera) failover_galera ;;
    *) die "SECKILL_CLUSTER_DB=$db_mode: one database server, nothing to fail over to" ;;
  esac
  exit 0
fi

[ -z "${1:-}" ] || die "unknown command $1: want none, worker, api, ceiling, db-failover or db-status"

case $redis_mode in
  single | cluster) ;;
  *) die "SECKILL_CLUSTER_REDIS=$redis_mode: want single or cluster" ;;
esac
case $db_mode in
  single) db_servers=1 ;;
  semisync) db_servers=2 ;;
  galera) db_servers=3 ;;
  *) die "SECKILL_CLUSTER_DB=$db_mode: want single, semisync or galera" ;;
esac
[ "$semisync_timeout" -ge 0 ] 2>/dev/null || die "SECKILL_CLUSTER_SEMISYNC_TIMEOUT_MS=$semisync_timeout: want milliseconds"
need redis-server
[ "$redis_mode" = single ] || need redis-cli
need mariadbd
need mariadb-install-db
need mariadb
need nginx
[ "$db_mode" != galera ] || [ -f "$galera_provider" ] || die "$galera_provider not found; apt-get install galera-4"
[ -z "$prometheus_port" ] || need prometheus
mkdir -p "$run" "$logs" "$dir/redis" "$dir/redis-locks" "$dir/nginx/logs" "$dir/nginx/temp" "$dir/bin"
for name in nginx redis redis-node-{1..6} redis-locks mariadb mariadb-{1..3} prometheus; do
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
read -r -a db_ports <<<"${SECKILL_CLUSTER_MYSQL_PORTS:-}"
if [ ${#db_ports[@]} -eq 0 ]; then
  for i in $(seq 0 $((db_servers - 1))); do db_ports+=($((mysql_port + i))); done
fi
[ ${#db_ports[@]} -eq $db_servers ] ||
  die "SECKILL_CLUSTER_DB=$db_mode has $db_servers database servers: SECKILL_CLUSTER_MYSQL_PORTS names ${#db_ports[@]} ports"
mysql_port=${db_ports[0]}
db_hosts=$(printf '127.0.0.1:%s,' "${db_ports[@]}" | sed 's/,$//')
galera_ports=()
ist_ports=()
if [ "$db_mode" = galera ]; then
  read -r -a galera_ports <<<"${SECKILL_CLUSTER_GALERA_PORTS:-}"
  read -r -a ist_ports <<<"${SECKILL_CLUSTER_GALERA_IST_PORTS:-}"
  if [ ${#galera_ports[@]} -eq 0 ]; then
    for p in "${db_ports[@]}"; do galera_ports+=($((p + 10000))); done
  fi
  if [ ${#ist_ports[@]} -eq 0 ]; then
    for p in "${db_ports[@]}"; do ist_ports+=($((p + 20000))); done
  fi
  [ ${#galera_ports[@]} -eq 3 ] && [ ${#ist_ports[@]} -eq 3 ] ||
    die "a Galera cluster here has three nodes: SECKILL_CLUSTER_GALERA_PORTS and _IST_PORTS name three ports each"
fi
for p in "$http_port" "${redis_ports[@]}" "$lock_redis_port" "${db_ports[@]}" "${galera_ports[@]}" "${ist_ports[@]}" "${api_ports[@]}" $prometheus_port; do
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
# Temporary files in a directory of its own (every database server has one):
# servers sharing /tmp have had the installer fail on a temporary table
# another one removed.
db_started=()
if [ "$db_mode" = single ]; then
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
  db_primary=1
else
  "up_$db_mode"
fi
# Where the cluster's database is, for db-status and db-failover.
{
  echo "db_mode='$db_mode'"
  echo "db_ports_list='${db_ports[*]}'"
} >"$dir/db.env"
db_sql "${db_ports[$((db_primary - 1))]}" 'CREATE DATABASE IF NOT EXISTS seckill CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci'

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
nginx_listen="127.0.0.1:$http_port"
real_ip_header=${SECKILL_NGINX_REAL_IP_HEADER:-X-Forwarded-For}
nginx_check=()
if [ "$real_ip_header" = proxy_protocol ]; then
  # Behind an L4 balancer that sends the PROXY protocol: nginx expects its
  # header on every connection.
  nginx_listen+=" proxy_protocol"
  nginx_check=(proxy)
fi
sed -e "s|\${SECKILL_NGINX_LISTEN}|$nginx_listen|g" \
  -e "s|\${SECKILL_NGINX_REAL_IP_FROM}|${SECKILL_NGINX_REAL_IP_FROM:-}|g" \
  -e "s|\${SECKILL_NGINX_REAL_IP_HEADER}|$real_ip_header|g" \
  -e "s|\${SECKILL_NGINX_HSTS_MAX_AGE}|${SECKILL_NGINX_HSTS_MAX_AGE:-0}|g" \
  -e "s|\${SECKILL_NGINX_CACHE_DIR}|cache|g" \
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
wait_for nginx 30 nginx http_ok "$http_port" /readyz "${nginx_check[@]}"

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
  echo "SECKILL_CLUSTER_DB='$db_mode'"
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
case $db_mode in
  single) db_desc=MariaDB ;;
  semisync) db_desc="MariaDB (a primary and a semi-synchronous replica)" ;;
  galera) db_desc="MariaDB Galera (3 nodes)" ;;
esac
cat <<EOF

seckill cluster is up: nginx in front of $instances instances, $redis_desc, a lock Redis and $db_desc on loopback.

  URL          http://127.0.0.1:$http_port
  instances    ${urls[*]}
  admin token  $admin
  settings     $dir/cluster.env   (set -a; . $dir/cluster.env; set +a)
  logs         $logs/
  database     $SECKILL_MYSQL_DSN$([ "$db_mode" = single ] || echo "   (scripts/cluster-up.sh db-status, db-failover)")
${cluster_url:+  redis        $cluster_url   (SECKILL_SHARDS=$SECKILL_SHARDS)
  see it       redis-cli -c -p ${node_ports[0]} cluster nodes
}${prometheus_port:+  prometheus   http://127.0.0.1:$prometheus_port (alerts: /alerts)
}
  stop with    scripts/cluster-down.sh  (--purge also deletes the data)
EOF
