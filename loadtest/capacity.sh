#!/usr/bin/env bash
# capacity.sh: the measurements of docs/capacity.md, on this machine's
# loopback. The sale's Redis is a Redis Cluster built afresh for every run
# (AOF, fsync always, noeviction, as scripts/cluster-up.sh runs it); MariaDB,
# the lock Redis and nginx come from scripts/cluster-up.sh, and its two
# instances (SECKILL_ROLE=api, GOMAXPROCS=1 each) are restarted on each new
# Redis Cluster behind the same nginx.
#
#   loadtest/capacity.sh masters   1, 2 and 3 masters (no replicas), SECKILL_SHARDS = masters,
#                                  rotated over CAPACITY_ROUNDS rounds, fresh servers per run
#   loadtest/capacity.sh wait      3 masters with a replica each, SECKILL_REDIS_WAIT_REPLICAS
#                                  0 and 1 alternated over CAPACITY_ROUNDS rounds
#   loadtest/capacity.sh worker    3x1 cluster: fill CAPACITY_ORDERS accepted purchases (of one voucher of
#                                  CAPACITY_BUCKETS buckets, default 1: 3 puts its orders on the 3 shards'
#                                  streams, written by concurrent batches against its one stock row), stop the
#                                  instances, drain with one SECKILL_ROLE=worker instance, and print the
#                                  drain rate, MariaDB's row-lock waits and time over the drain,
#                                  the Redis commands and CPU per order written (masters + lock Redis),
#                                  and, last, drain's CPU per order written by server (from /proc) and
#                                  their sum: worker_us=... redis_us=... lock_redis_us=... mariadb_us=...
#                                  then total_us_per_order=N
#   loadtest/capacity.sh total F   those two last lines from drain's --json file F
#   loadtest/capacity.sh refusals  1 master: CAPACITY_ORDERS purchases by as many buyers at a stock of
#                                  1% of them, and the Redis commands and CPU per purchase (mostly
#                                  sold_out refusals)
#   loadtest/capacity.sh buckets   3 masters (no replicas), SECKILL_SHARDS=3, one hot voucher
#                                  (--vouchers 1) with --buckets 1 and 3 alternated over CAPACITY_ROUNDS
#                                  rounds: purchases/s, the busiest master's CPU per purchase and each
#                                  master's share of the scripts (settings buckets=1, buckets=3)
#   loadtest/capacity.sh tail      3x1 cluster, SECKILL_SHARDS=3: stampede of CAPACITY_TAIL_USERS buyers on
#                                  CAPACITY_TAIL_STOCK units, --skew CAPACITY_TAIL_SKEW, --buckets 3 and 1
#                                  alternated: time from the first sold_out to the last sale, latency of the
#                                  last 1% of units (tail.tsv)
#   loadtest/capacity.sh summary   medians of results.tsv (and tail.tsv) per setting
#   loadtest/capacity.sh down      stop everything this script started
#
# Settings: CAPACITY_DIR (/tmp/seckill-capacity), CAPACITY_ROUNDS (3),
# CAPACITY_REQUESTS (30000 measured purchases per run, after CAPACITY_WARMUP,
# 3000), CAPACITY_C (256 connections), CAPACITY_VOUCHERS (6: one voucher
# lives on one shard, so a run buys several to spread over the masters),
# CAPACITY_ORDERS (30000), CAPACITY_TAIL_STOCK (30000), CAPACITY_TAIL_USERS
# (100000, 3 presses each), CAPACITY_TAIL_SKEW (0.8: that share of the buyers
# at home in bucket 0), CAPACITY_PORT (28200: nginx on it, instances on
# +1 and +2, the worker on +11, MariaDB +106, the lock Redis +180, unused
# single Redis +179, cluster nodes -800..-795 with bus ports -790..-785).
# Each run appends a line to $CAPACITY_DIR/results.tsv and writes its
# detail (bench JSON, per-master command stats, `api shards`) beside it;
# the tail target appends to $CAPACITY_DIR/tail.tsv. bench measures each
# Redis node's CPU per answer (redis@PORT); the busiest master's is the
# largest of the masters'. A service without buckets refuses the field
# (400): its buckets=3 runs fail; one whose answer does not name the count
# made is noted on bench's and stampede's stderr.
set -euo pipefail
export PATH="$PATH:/usr/local/go/bin:/usr/sbin:/sbin"
root=$(cd "$(dirname "$0")/.." && pwd)
work=${CAPACITY_DIR:-/tmp/seckill-capacity}
rounds=${CAPACITY_ROUNDS:-3}
requests=${CAPACITY_REQUESTS:-30000}
warmup=${CAPACITY_WARMUP:-3000}
conc=${CAPACITY_C:-256}
vouchers=${CAPACITY_VOUCHERS:-6}
orders=${CAPACITY_ORDERS:-30000}
tail_stock=${CAPACITY_TAIL_STOCK:-30000}
tail_users=${CAPACITY_TAIL_USERS:-100000}
tail_skew=${CAPACITY_TAIL_SKEW:-0.8}
port=${CAPACITY_PORT:-28200}
api_ports=($((port + 1)) $((port + 2)))
worker_port=$((port + 11))
# Below Linux's ephemeral range (32768-60999), where an outgoing connection
# could hold a port a fresh node wants.
node_ports=($(seq $((port - 800)) $((port - 795))))

export SECKILL_CLUSTER_DIR=$work/base
export SECKILL_CLUSTER_HTTP_PORT=$port SECKILL_CLUSTER_API_PORTS="${api_ports[*]}"
export SECKILL_CLUSTER_REDIS_PORT=$((port + 179)) SECKILL_CLUSTER_LOCK_REDIS_PORT=$((port + 180))
export SECKILL_CLUSTER_MYSQL_PORT=$((port + 106))
export SECKILL_NGINX_PURCHASE_RATE=1000000r/s SECKILL_NGINX_PURCHASE_BURST=1000000
export SECKILL_RATE_LIMIT=off SECKILL_LOG_LEVEL=warn SECKILL_ROLE=api SECKILL_ADMIN_ADDR=off
base=$SECKILL_CLUSTER_DIR
lt=$work/bin/loadtest
mkdir -p "$work/bin" "$work/nodes" "$work/runs"

say() { printf 'capacity: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

# start NAME PROGRAM ARGS...: in its own session, like cluster-up.sh's
# servers (autogroups: loadtest/README.md), pid recorded as cluster-up.sh does.
start() {
  local name=$1 prog
  shift
  prog=$(readlink -f "$(command -v "$1")")
  setsid "$@" </dev/null >>"$work/$name.log" 2>&1 9>&- &
  echo "$! $prog" >"$work/$name.pid"
}

# stop PIDFILE: TERM the process it names, if it still is that program, and wait.
stop() {
  local f=$1 pid exe
  [ -f "$f" ] || return 0
  read -r pid exe <"$f"
  if [ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = "$exe" ]; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 200); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
  fi
  rm -f "$f"
}

poll() { # poll SECONDS COMMAND...
  local deadline=$((SECONDS + $1))
  shift
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || return 1
    sleep 0.1
  done
}

http_ok() { curl -fsS -o /dev/null "http://127.0.0.1:$1$2"; }
field() { redis-cli -p "$1" cluster info | tr -d '\r' | sed -n "s/^$2://p"; }

base_up() {
  if [ -f "$base/cluster.env" ] && redis-cli -p "$SECKILL_CLUSTER_LOCK_REDIS_PORT" ping >/dev/null 2>&1; then
    :
  else
    "$root/scripts/cluster-down.sh" --purge >/dev/null 2>&1 || true
    # Without the lock's descriptor: the servers it leaves running would
    # hold the lock after this script ends, refusing the next measurement.
    "$root/scripts/cluster-up.sh" >"$work/base-up.log" 2>&1 9>&- || die "cluster-up.sh failed; see $work/base-up.log"
  fi
  set -a
  # shellcheck disable=SC1091
  . "$base/cluster.env"
  set +a
  [ -x "$lt" ] || (cd "$root" && go build -o "$lt" ./loadtest)
}

# redis_up MASTERS REPLICAS: a fresh Redis Cluster. 1 or 2 masters are made
# by hand (CLUSTER ADDSLOTSRANGE, CLUSTER MEET), 3 with redis-cli --cluster create.
# Every node says cluster-require-full-coverage no, as cluster-up.sh's: the
# instances refuse to start on one that says yes (SECKILL_FULL_COVERAGE).
redis_up() {
  local masters=$1 replicas=$2 n=$(($1 * (1 + $2))) i p
  used_ports=("${node_ports[@]:0:$n}")
  for i in $(seq 0 $((n - 1))); do
    p=${node_ports[$i]}
    rm -rf "$work/nodes/$i"
    mkdir -p "$work/nodes/$i"
    start "node-$i" redis-server --port "$p" --bind 127.0.0.1 --dir "$work/nodes/$i" --daemonize no \
      --cluster-enabled yes --cluster-config-file nodes.conf --cluster-port $((p + 10)) --cluster-node-timeout 5000 \
      --appendonly yes --appendfsync always --maxmemory-policy noeviction --save "" \
      --cluster-require-full-coverage no
  done
  for p in "${used_ports[@]}"; do poll 20 redis-cli -p "$p" ping || die "redis on $p did not start"; done
  case $masters in
    1) redis-cli -p "${used_ports[0]}" cluster addslotsrange 0 16383 >/dev/null ;;
    2)
      redis-cli -p "${used_ports[0]}" cluster addslotsrange 0 8191 >/dev/null
      redis-cli -p "${used_ports[1]}" cluster addslotsrange 8192 16383 >/dev/null
      redis-cli -p "${used_ports[0]}" cluster meet 127.0.0.1 "${used_ports[1]}" $((used_ports[1] + 10)) >/dev/null
      ;;
    *)
      # shellcheck disable=SC2046
      redis-cli --cluster create $(printf '127.0.0.1:%s ' "${used_ports[@]}") --cluster-replicas "$replicas" \
        --cluster-yes >"$work/cluster-create.log" 2>&1 || die "cluster create failed; see $work/cluster-create.log"
      ;;
  esac
  poll 60 cluster_ok || die "the Redis Cluster is not ok after 60s"
  cluster_url="redis-cluster://127.0.0.1:${used_ports[0]}"
  if [ "$n" -gt 1 ]; then
    cluster_url+="?$(printf 'addr=127.0.0.1:%s&' "${used_ports[@]:1}" | sed 's/&$//')"
  fi
}

cluster_ok() {
  local p
  for p in "${used_ports[@]}"; do
    [ "$(field "$p" cluster_state)" = ok ] && [ "$(field "$p" cluster_known_nodes)" = "${#used_ports[@]}" ] || return 1
    redis-cli -p "$p" info replication | tr -d '\r' | grep -q -e role:master -e master_link_status:up || return 1
  done
}

redis_down() {
  local i
  for i in $(seq 0 5); do stop "$work/node-$i.pid"; done
  rm -rf "$work/nodes"
  mkdir -p "$work/nodes"
}

# apis_up SHARDS [ENV=VALUE...]: the two instances behind nginx, restarted on
# the current Redis Cluster (cluster-up.sh's pid files, so cluster-down.sh
# stops them too).
apis_up() {
  local shards=$1 i p
  shift
  apis_down
  for i in 1 2; do
    p=${api_ports[$((i - 1))]}
    (
      [ $# -eq 0 ] || export "$@"
      GOMAXPROCS=1 SECKILL_REDIS_URL="$cluster_url" SECKILL_SHARDS="$shards" \
        SECKILL_ADDR="127.0.0.1:$p" start "api-$i" "$base/bin/api" serve
    )
    cp "$work/api-$i.pid" "$base/run/api-$i.pid"
  done
  for p in "${api_ports[@]}"; do poll 60 http_ok "$p" /readyz || die "instance on $p not ready; see $work/api-*.log"; done
  poll 30 http_ok "$SECKILL_CLUSTER_HTTP_PORT" /readyz || die "nginx does not answer /readyz"
}

apis_down() {
  local i
  for i in 1 2; do
    [ -f "$work/api-$i.pid" ] || cp "$base/run/api-$i.pid" "$work/api-$i.pid" 2>/dev/null || true
    stop "$work/api-$i.pid"
    rm -f "$base/run/api-$i.pid"
  done
}

# cpu_ticks PID...: user+system clock ticks of these processes.
cpu_ticks() {
  local t=0 p
  for p in "$@"; do
    [ -r "/proc/$p/stat" ] && t=$((t + $(sed 's/.*) //' "/proc/$p/stat" | awk '{print $12 + $13}')))
  done
  echo "$t"
}
pids_of() { local f; for f in "$@"; do [ -f "$f" ] && cut -d' ' -f1 "$f"; done; }
nginx_pids() { local m; m=$(pids_of "$base/run/nginx.pid"); echo "$m" $(pgrep -P "$m"); }

# measure SETTING SHARDS ROUND [BENCH_FLAGS...]: one bench run through nginx
# (BENCH_FLAGS after the defaults, so they override them), with the CPU
# each tier used and each master's command stats over it.
measure() {
  local name=$1 shards=$2 r=$3 out=$work/runs/$1-r$3 hz
  shift 3
  hz=$(getconf CLK_TCK)
  mkdir -p "$out"
  SECKILL_REDIS_URL=$cluster_url SECKILL_SHARDS=$shards "$base/bin/api" shards >"$out/shards.txt" 2>&1 || true
  local redis_p api_p nginx_p
  redis_p=$(pids_of "$work"/node-*.pid)
  api_p=$(pids_of "$work"/api-*.pid)
  nginx_p=$(nginx_pids)
  "$lt" redisstat --redis "$cluster_url" --out "$out/before.json"
  local r0 a0 n0 l0
  r0=$(cpu_ticks $redis_p) a0=$(cpu_ticks $api_p) n0=$(cpu_ticks $nginx_p)
  "$lt" bench --rounds 1 --target "${name//=/-}=$SECKILL_URL" --vouchers "$vouchers" --requests "$requests" \
    --warmup "$warmup" -c "$conc" --redis "$cluster_url" --json "$out/bench.json" "$@" >"$out/bench.txt" 2>"$out/bench.log" ||
    die "bench failed; see $out/bench.log"
  local r1 a1 n1 load1 all
  r1=$(cpu_ticks $redis_p) a1=$(cpu_ticks $api_p) n1=$(cpu_ticks $nginx_p)
  load1=$(cut -d' ' -f1 /proc/loadavg)
  all=$((requests + warmup))
  "$lt" redisstat --redis "$cluster_url" --since "$out/before.json" --per "$all" --json "$out/redis.json" >"$out/redis.txt"
  local rps p50 p99 non202 spread
  rps=$(jq '.[0].median_requests_per_second' "$out/bench.json")
  p50=$(jq '.[0].median_p50_ms' "$out/bench.json")
  p99=$(jq '.[0].median_p99_ms' "$out/bench.json")
  non202=$(jq '.[0].non_202_answers' "$out/bench.json")
  spread=$(jq -r '[.[] | (.commands.evalsha.calls // 0)] | map(tostring) | join("/")' "$out/redis.json")
  local evalsha_us busiest shares
  evalsha_us=$(jq '[.[] | .commands.evalsha // {calls:0,usec:0}] | (map(.usec) | add) / (map(.calls) | add)' "$out/redis.json")
  busiest=$(busiest_master "$out")
  shares=$(jq -r '[.[] | (.script_share // 0) * 1000 | round / 1000 | tostring] | join("/")' "$out/redis.json")
  printf '%s\t%s\t%.0f\t%.2f\t%.2f\t%s\t%.1f\t%.1f\t%.1f\t%.2f\t%s\t%s\t%s\t%s\n' "$name" "$r" "$rps" "$p50" "$p99" "$non202" \
    "$(echo "($r1 - $r0) * 1000000 / $hz / $all" | bc -l)" "$(echo "($a1 - $a0) * 1000000 / $hz / $all" | bc -l)" \
    "$(echo "($n1 - $n0) * 1000000 / $hz / $all" | bc -l)" "$evalsha_us" "$spread" "$load1" "$busiest" "$shares" | tee -a "$work/results.tsv"
}

# busiest_master RUNDIR: the largest CPU per answer (µs) bench measured on a
# master (redis@PORT, PORT one of redisstat's masters), - when none was.
busiest_master() {
  jq -r --slurpfile masters "$1/redis.json" '
    ($masters[0] | map(.addr | split(":")[-1] | "redis@" + .)) as $labels
    | [.[0].cpu_us_per_answer[]? | select(.label as $l | $labels | index($l)) | .median_us_per_answer]
    | if length == 0 then "-" else max * 10 | round / 10 | tostring end' "$1/bench.json"
}

header() {
  [ -s "$work/results.tsv" ] || printf 'setting\tround\tpurchases/s\tp50_ms\tp99_ms\tnon202\tredis_cpu_us/purchase\tapi_cpu_us/purchase\tnginx_cpu_us/purchase\tevalsha_usec/call\tevalsha_calls_per_master\tload1\tbusiest_master_cpu_us/purchase\tscript_share_per_master\n' >"$work/results.tsv"
}

masters() {
  local r m order
  for r in $(seq 1 "$rounds"); do
    # Rotated, so that no setting always runs first in a round.
    case $((r % 3)) in 1) order="1 2 3" ;; 2) order="2 3 1" ;; 0) order="3 1 2" ;; esac
    for m in $order; do
      say "round $r/$rounds: $m master(s), $m shard(s)"
      redis_up "$m" 0
      apis_up "$m"
      measure "masters-$m" "$m" "$r"
      apis_down
      redis_down
    done
  done
}

wait_cost() {
  local r w
  for r in $(seq 1 "$rounds"); do
    for w in 0 1; do
      [ $((r % 2)) -eq 0 ] && w=$((1 - w))
      say "round $r/$rounds: 3x1 cluster, SECKILL_REDIS_WAIT_REPLICAS=$w"
      redis_up 3 1
      apis_up 3 SECKILL_REDIS_WAIT_REPLICAS="$w"
      measure "wait-$w" 3 "$r"
      apis_down
      redis_down
    done
  done
}

# buckets: one hot voucher on 3 masters, its stock in 1 bucket or in 3,
# alternated (the first of a round swaps each round).
buckets() {
  local r b
  for r in $(seq 1 "$rounds"); do
    for b in 1 3; do
      [ $((r % 2)) -eq 0 ] && b=$((4 - b))
      say "round $r/$rounds: 3 masters, one voucher in $b bucket(s)"
      redis_up 3 0
      apis_up 3
      measure "buckets=$b" 3 "$r" --vouchers 1 --buckets "$b"
      apis_down
      redis_down
    done
  done
}

# tail_cost: the end of a skewed sale on a 3x1 cluster, with 3 buckets and 1.
tail_cost() {
  local r b out rc
  [ -s "$work/tail.tsv" ] || printf 'setting\tround\tpurchases/s\taccepted\tsold_out\tsold_out_to_last_sale_ms\tlast1pct_p50_ms\tlast1pct_p99_ms\thome0_buyers\tcheck\tscript_share_per_master\tload1\n' >"$work/tail.tsv"
  for r in $(seq 1 "$rounds"); do
    for b in 3 1; do
      [ $((r % 2)) -eq 0 ] && b=$((4 - b))
      out=$work/runs/tail-buckets=$b-r$r
      mkdir -p "$out"
      say "round $r/$rounds: 3x1 cluster, stampede of $tail_users buyers on $tail_stock units, skew $tail_skew, $b bucket(s)"
      redis_up 3 1
      apis_up 3
      # A worker writes the orders, so the stampede's check can run.
      SECKILL_ROLE=worker SECKILL_REDIS_URL="$cluster_url" SECKILL_SHARDS=3 SECKILL_ADDR="127.0.0.1:$worker_port" \
        start worker "$base/bin/api" serve
      rc=0
      "$lt" stampede --url "$SECKILL_URL" --stock "$tail_stock" --users "$tail_users" --buckets "$b" --skew "$tail_skew" \
        -c "$conc" --redis "$cluster_url" --shards 3 --json "$out/stampede.json" >"$out/stampede.txt" 2>"$out/stampede.log" || rc=$?
      [ "$rc" -le 1 ] && [ -s "$out/stampede.json" ] || die "stampede failed; see $out/stampede.log"
      jq -r --arg setting "buckets=$b" --arg round "$r" --arg load1 "$(cut -d' ' -f1 /proc/loadavg)" '
        .summary as $s | [$setting, $round, ($s.requests_per_second | round), ($s.outcomes["202 accepted"] // 0), ($s.outcomes["409 sold_out"] // 0),
          ($s.tail.sold_out_to_last_sale_ms // "-"), ($s.tail.last_1pct_latency_ms.p50 // "-"), ($s.tail.last_1pct_latency_ms.p99 // "-"),
          ($s.home_0_buyers // "-"), (if $s.check.ok then "ok" else "FAILED" end),
          ([.scripts_by_master[]? | .script_share * 1000 | round / 1000 | tostring] | join("/")), $load1] | map(tostring) | join("\t")' \
        "$out/stampede.json" | tee -a "$work/tail.tsv"
      stop "$work/worker.pid"
      apis_down
      redis_down
    done
  done
}

worker() {
  local out=$work/runs/worker vid accepted drain_pid
  mkdir -p "$out"
  say "3x1 cluster: $orders accepted purchases, then one worker drains them"
  redis_up 3 1
  apis_up 3
  "$lt" redisstat --redis "$cluster_url" --out "$out/fill-before.json"
  "$lt" --users "$orders" --stock "$orders" --buckets "${CAPACITY_BUCKETS:-1}" -c "$conc" --verify=false --quiet --json "$out/fill.json" >"$out/fill.txt" 2>&1
  "$lt" redisstat --redis "$cluster_url" --since "$out/fill-before.json" --per "$orders" --json "$out/fill-redis.json" >"$out/fill-redis.txt"
  vid=$(jq .voucher_id "$out/fill.json")
  apis_down
  "$lt" redisstat --redis "$cluster_url" --redis "$SECKILL_LOCK_NODES" --out "$out/drain-before.json"
  rowlocks >"$out/rowlocks-before.txt"
  # What was accepted: with buckets a few buyers at the very end may be
  # answered 503 busy (units in transit) instead.
  accepted=$(jq '.outcomes["202 accepted"] // 0' "$out/fill.json")
  # The watch first, then the worker (counted from its start, start-up
  # included), as loadtest/README.md runs drain: every order is written
  # under the watch, and drain measures the CPU of the worker, the Redis
  # nodes, the lock Redis and MariaDB over it (/proc).
  "$lt" drain --redis "$cluster_url" --shards 3 --voucher "$vid" --expect "$accepted" --pids "service:$work/worker.pid" \
    --json "$out/drain.json" >"$out/drain.txt" 2>&1 &
  drain_pid=$!
  if ! poll 60 grep -q 'start the worker now' "$out/drain.txt"; then
    kill -TERM "$drain_pid" 2>/dev/null || true
    die "drain did not begin its watch; see $out/drain.txt"
  fi
  SECKILL_ROLE=worker SECKILL_REDIS_URL="$cluster_url" SECKILL_SHARDS=3 SECKILL_ADDR="127.0.0.1:$worker_port" \
    start worker "$base/bin/api" serve
  wait "$drain_pid" || die "drain failed; see $out/drain.txt"
  rowlocks >"$out/rowlocks-after.txt"
  stop "$work/worker.pid"
  paste "$out/rowlocks-before.txt" "$out/rowlocks-after.txt" |
    awk '{ printf "mariadb %s over the drain: %d\n", $1, $4 - $2 }' >>"$out/drain.txt"
  "$lt" redisstat --redis "$cluster_url" --redis "$SECKILL_LOCK_NODES" --since "$out/drain-before.json" --per "$orders" \
    --json "$out/drain-redis.json" >"$out/drain-redis.txt"
  redis_down
  cat "$out/drain.txt" "$out/fill-redis.txt" "$out/drain-redis.txt"
  cpu_total "$out/drain.json"
}

# cpu_total DRAIN_JSON: the CPU per order written that drain measured
# (its --json), by server, on one line: worker_us (service), redis_us
# (every node of the sale's Redis, redis or redis@PORT), lock_redis_us
# (locks or locks@PORT), mariadb_us (database); then, the last line,
# total_us_per_order, their sum. A server drain did not measure is an error.
cpu_total() {
  local parts
  parts=$(jq -r '
    def part($name): [.cpu_us_per_order[]? | select(.label | split("@")[0] == $name) | .us_per_order]
      | if length == 0 then error("drain measured no \($name) process") else add end;
    [part("service"), part("redis"), part("locks"), part("database")] | . + [add] | map(tostring) | join(" ")' "$1") ||
    die "no CPU per order in $1"
  # shellcheck disable=SC2086
  LC_ALL=C printf 'worker_us=%.1f redis_us=%.1f lock_redis_us=%.1f mariadb_us=%.1f\ntotal_us_per_order=%.1f\n' $parts
}

# rowlocks prints MariaDB's row-lock counters (name, value), for the
# contention of concurrent batches on one voucher's stock row.
rowlocks() {
  mariadb --no-defaults --protocol=tcp -h 127.0.0.1 -P "$SECKILL_CLUSTER_MYSQL_PORT" -u root -N -B \
    -e "SHOW GLOBAL STATUS WHERE Variable_name IN ('Innodb_row_lock_waits', 'Innodb_row_lock_time')"
}

refusals() {
  local out=$work/runs/refusals
  mkdir -p "$out"
  say "1 master: $orders purchases at a stock of $((orders / 100))"
  redis_up 1 0
  apis_up 1
  "$lt" redisstat --redis "$cluster_url" --out "$out/before.json"
  "$lt" --users "$orders" --stock $((orders / 100)) -c "$conc" --verify=false --quiet --json "$out/run.json" >"$out/run.txt" 2>&1
  "$lt" redisstat --redis "$cluster_url" --since "$out/before.json" --per "$orders" --json "$out/redis.json" >"$out/redis.txt"
  apis_down
  redis_down
  cat "$out/run.txt" "$out/redis.txt"
}

# medians FILE MEDIAN_COLUMNS LIST_COLUMNS SPLIT_COLUMNS: per setting (column
# 1), the median of each MEDIAN column over the runs (of an even count, the
# mean of the middle two; a run whose value is not a number is left out, -
# when none is), each LIST column's values run by run, and each SPLIT
# column's median part by part (a/b/c: one part per master).
medians() {
  awk -F'\t' -v med="$2" -v lst="$3" -v spl="$4" '
    function median(k, i, parts,   m, j, x, y, t, a) {
      m = 0
      for (j = 1; j <= n[k]; j++) if ((k, i, j) in v && v[k, i, j] ~ /^-?[0-9.]+$/) a[++m] = v[k, i, j] + 0
      if (m == 0) return "-"
      for (x = 1; x <= m; x++) for (y = x + 1; y <= m; y++) if (a[y] < a[x]) { t = a[x]; a[x] = a[y]; a[y] = t }
      return (m % 2) ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
    }
    NR == 1 { for (i = 1; i <= NF; i++) h[i] = $i; next }
    {
      k = $1; s[k] = 1; r = ++n[k]
      for (i = 3; i <= NF; i++) v[k, i, r] = $i
      for (c in S) { np = split($c, p, "/"); for (q = 1; q <= np; q++) v[k, c "." q, r] = p[q]; if (np > w[k, c]) w[k, c] = np }
    }
    BEGIN { nm = split(med, M, ","); nl = split(lst, L, ","); ns = split(spl, P, ","); for (i = 1; i <= ns; i++) S[P[i]] = 1 }
    END {
      for (k in s) {
        line = k " (" n[k] " runs):"
        for (i = 1; i <= nm; i++) line = line " " (M[i] in h ? h[M[i]] : "column" M[i]) "=" median(k, M[i])
        o = 0; print k "\t" o++ "\t" line
        for (i = 1; i <= ns; i++) {
          c = P[i]; line = ""
          for (q = 1; q <= w[k, c]; q++) line = line (q > 1 ? "/" : "") median(k, c "." q)
          if (line != "") print k "\t" o++ "\t   " (c in h ? h[c] : "column" c) " (median): " line
        }
        for (i = 1; i <= nl; i++) {
          c = L[i]; line = ""
          for (j = 1; j <= n[k]; j++) line = line " " v[k, c, j]
          print k "\t" o++ "\t   " (c in h ? h[c] : "column" c) ":" line
        }
      }
    }' "$1" | sort -t "$(printf '\t')" -k1,1 -k2,2n | cut -f3-
}

# summary: medians per setting of results.tsv, with each run's evalsha
# calls per master and load, and of tail.tsv when there is one.
summary() {
  medians "${CAPACITY_RESULTS:-$work/results.tsv}" 3,4,5,6,7,8,9,10,13 11,12 14
  local tail=${CAPACITY_TAIL_RESULTS:-$work/tail.tsv}
  if [ -s "$tail" ]; then
    echo "tail ($tail):"
    medians "$tail" 3,4,5,6,7,8,9 10,12 11
  fi
}

cleanup() { apis_down; stop "$work/worker.pid"; redis_down; }
# One measurement at a time: a second would take the first's ports and servers.
lock() {
  exec 9>"$work/lock"
  flock -n 9 || die "another loadtest/capacity.sh runs on $work"
}
case ${1:-} in
  masters) lock; trap cleanup EXIT; base_up; header; masters; summary ;;
  wait) lock; trap cleanup EXIT; base_up; header; wait_cost; summary ;;
  buckets) lock; trap cleanup EXIT; base_up; header; buckets; summary ;;
  tail) lock; trap cleanup EXIT; base_up; tail_cost; summary ;;
  worker) lock; trap cleanup EXIT; base_up; worker ;;
  total) cpu_total "${2:?usage: capacity.sh total DRAIN_JSON}" ;; # what worker ends with, from a drain's --json
  refusals) lock; trap cleanup EXIT; base_up; refusals ;;
  summary) summary ;;   # CAPACITY_RESULTS names another results file
  down)
    lock
    apis_down
    stop "$work/worker.pid"
    redis_down
    "$root/scripts/cluster-down.sh" >/dev/null 2>&1 || true
    ;;
  *) sed -n '2,/^set -euo/p' "$0" | sed '$d' >&2; exit 2 ;;
esac
