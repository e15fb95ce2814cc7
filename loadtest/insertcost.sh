#!/usr/bin/env bash
# insertcost.sh: what MariaDB spends writing an order, and what each index
# and the foreign key of `orders` add to it. A MariaDB of its own (started
# as scripts/cluster-up.sh starts it: no binary log, a log flush at every
# commit), the schema of sql/mysql, and copies of `orders` with one index
# (or the foreign key) dropped each, and one with only its primary key.
# Each round writes INSERTCOST_ORDERS orders into every copy, in
# transactions of 500 rows shaped as the worker's (the voucher's stock
# taken, one multi-row INSERT, COMMIT), the copies in turn (the order
# reversed every other round), each copy emptied (TRUNCATE) before its
# turn; the server's CPU (utime + stime from /proc) over each turn, divided
# by the orders, is printed per copy and round, then the medians.
#
#   loadtest/insertcost.sh
#
# Settings: INSERTCOST_DIR (/tmp/seckill-insertcost), INSERTCOST_PORT
# (28400), INSERTCOST_ORDERS (20000), INSERTCOST_ROUNDS (5).
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${INSERTCOST_DIR:-/tmp/seckill-insertcost}
port=${INSERTCOST_PORT:-28400}
orders=${INSERTCOST_ORDERS:-20000}
rounds=${INSERTCOST_ROUNDS:-5}
batch=500

rm -rf "$dir"
mkdir -p "$dir/tmp"
root_user=()
[ "$(id -u)" -eq 0 ] && root_user=(--user=root)
common=(--no-defaults "--datadir=$dir/data" "--tmpdir=$dir/tmp" --skip-name-resolve --innodb-log-file-size=64M "${root_user[@]}")
mariadb-install-db "${common[@]}" --auth-root-authentication-method=normal --skip-test-db >"$dir/install.log" 2>&1
mariadbd "${common[@]}" --port="$port" --bind-address=127.0.0.1 --socket="$dir/sock" --skip-log-bin \
  </dev/null >"$dir/mariadbd.log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true' EXIT
sql() { mariadb --no-defaults -h127.0.0.1 -P"$port" -uroot "$@"; }
# Up to 60 s, as scripts/cluster-up.sh waits: a loaded machine starts it slowly.
for _ in $(seq 600); do sql -e 'SELECT 1' >/dev/null 2>&1 && break; sleep 0.1; done
sql -e 'CREATE DATABASE seckill'
# A file that creates a trigger is one statement whose body holds ';': it
# goes to the client with a delimiter of its own.
for f in "$root"/sql/mysql/*.sql; do
  if grep -q '^CREATE TRIGGER' "$f"; then
    { cat "$f"; echo '//'; } | sql seckill --delimiter=//
  else
    sql seckill <"$f"
  fi
done
sql seckill -e "INSERT INTO vouchers (id, title, face_value, price, total_stock, stock, begin_at, end_at, created_at, updated_at)
  VALUES (1, 'insert cost', 100, 0, 1000000000, 1000000000, NOW(), NOW() + INTERVAL 1 DAY, NOW(), NOW())"

# Each copy: its name and what is dropped from a copy of orders. CREATE
# TABLE ... LIKE copies the indexes and checks, not the foreign key, which
# is added back where kept.
copies=(full nofk nodue nounitback nocode nobuyer pkonly)
drops() {
  case $1 in
    full | nofk) ;;
    nodue) echo "DROP INDEX idx_orders_due" ;;
    nounitback) echo "DROP INDEX idx_orders_unit_back" ;;
    nocode) echo "DROP INDEX uniq_orders_code" ;;
    nobuyer) echo "DROP INDEX uniq_orders_live_buyer" ;;
    pkonly) echo "DROP INDEX idx_orders_due, DROP INDEX idx_orders_unit_back, DROP INDEX uniq_orders_code, DROP INDEX uniq_orders_live_buyer, DROP INDEX idx_orders_voucher_accepted" ;;
  esac
}
for c in "${copies[@]}"; do
  sql seckill -e "CREATE TABLE o_$c LIKE orders"
  d=$(drops "$c")
  [ -z "$d" ] || sql seckill -e "ALTER TABLE o_$c $d"
  case $c in nofk | pkonly) ;; *) sql seckill -e "ALTER TABLE o_$c ADD CONSTRAINT fk_o_$c FOREIGN KEY (voucher_id) REFERENCES vouchers (id)" ;; esac
done

# statements TABLE FIRST_ID: the turn's transactions, the rows as the
# worker writes a paid order of a free voucher (a code each).
statements() {
  awk -v t="$1" -v first="$2" -v n="$orders" -v b="$batch" -v seed="$RANDOM" 'BEGIN {
    srand(seed); abc = "23456789ABCDEFGHJKLMNPQRSTUVWXYZ"; at = "2026-12-03 17:00:00.000"
    for (s = 0; s < n; s += b) {
      printf "BEGIN; UPDATE vouchers SET stock = stock - %d WHERE id = 1 AND stock >= %d;\n", b, b
      printf "INSERT INTO %s (id, user_id, voucher_id, accepted_at, created_at, status, live, amount, pay_deadline, paid_at, code) VALUES ", t
      for (i = 0; i < b; i++) {
        id = first + s + i; code = ""
        for (k = 0; k < 10; k++) code = code substr(abc, int(rand() * 32) + 1, 1)
        printf "%s(%d, %d, 1, '\''%s'\'', '\''%s'\'', '\''paid'\'', 1, 0, NULL, '\''%s'\'', '\''%s'\'')", (i ? "," : ""), id, id, at, at, at, code
      }
      printf ";\nCOMMIT;\n"
    }
  }'
}
cpu() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
tick_us=$((1000000 / $(getconf CLK_TCK)))
results=$dir/results.tsv
: >"$results"
next=1
for r in $(seq "$rounds"); do
  order=("${copies[@]}")
  if [ $((r % 2)) = 0 ]; then
    order=()
    for ((i = ${#copies[@]} - 1; i >= 0; i--)); do order+=("${copies[i]}"); done
  fi
  for c in "${order[@]}"; do
    sql seckill -e "TRUNCATE TABLE o_$c"
    statements "o_$c" "$next" >"$dir/turn.sql"
    next=$((next + orders))
    before=$(cpu)
    sql seckill <"$dir/turn.sql"
    after=$(cpu)
    us=$(awk -v d=$((after - before)) -v t="$tick_us" -v n="$orders" 'BEGIN { printf "%.1f", d * t / n }')
    printf '%s\t%s\t%s\n' "$r" "$c" "$us" >>"$results"
    echo "round $r $c: $us µs per order (load $(cut -d' ' -f1 /proc/loadavg))"
  done
done
echo "medians, µs of MariaDB's CPU per order written:"
for c in "${copies[@]}"; do
  awk -F'\t' -v c="$c" '$2 == c { print $3 }' "$results" | sort -n |
    awk -v c="$c" '{ v[NR] = $1 } END { printf "  %-11s %6.1f  (%s", c, (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2), v[1]; for (i = 2; i <= NR; i++) printf ", %s", v[i]; print ")" }'
done
