#!/usr/bin/env bash
# Mutation testing by hand, one mutation at a time: applies a small change
# to one file, runs a package's tests against it, says whether a test
# noticed (KILLED) or none did (SURVIVED), and puts the file back as it
# was, whatever happens (Ctrl-C included). Not part of the build or of CI.
#
#   scripts/mutate.sh [-t timeout] FILE MUTATION PACKAGE [RUN]
#
#   FILE      the file to change, e.g. internal/voucher/coalesce.go
#   MUTATION  a sed expression, applied with sed -E to FILE (address a
#             line to be sure of the spot: '212s/ < / <= /'), or the path
#             of a patch (*.patch or *.diff) that git apply takes
#   PACKAGE   the package whose tests run, e.g. ./internal/voucher/
#   RUN       optional -run filter
#   -t        how long the tests may run before the mutant counts as
#             killed by a hang (default 10m)
#
# It prints the change (diff) and one line:
#   KILLED <file>:<line> by <failing tests>    a test failed, or the run hung
#   SURVIVED <file>:<line>                     every test passed
#   NOT APPLIED / DOES NOT BUILD               no mutant to judge
# and exits 0 (killed), 1 (survived) or 2 (no mutant). The tests' output
# is kept in a log file whose path it prints.
#
# Tests run as CI runs them: CI=true go test -race -count=1.
set -euo pipefail
cd "$(dirname "$0")/.."

timeout=10m
while getopts "t:" opt; do
  case $opt in
    t) timeout=$OPTARG ;;
    *) sed -n '2,24p' "$0" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
if [ $# -lt 3 ] || [ $# -gt 4 ]; then
  sed -n '2,24p' "$0" >&2
  exit 2
fi
file=$1 mutation=$2 pkg=$3 run=${4:-}
[ -f "$file" ] || { echo "no file $file" >&2; exit 2; }

backup=$(mktemp)
log=$(mktemp "${TMPDIR:-/tmp}/mutate.XXXXXX")
cp -p "$file" "$backup"
restore() { cp -p "$backup" "$file" && rm -f "$backup"; }
trap restore EXIT
trap 'exit 130' INT TERM

case $mutation in
  *.patch|*.diff) git apply "$mutation" ;;
  *) sed -E -i -e "$mutation" "$file" ;;
esac
change=$(diff -U0 "$backup" "$file" || true)
if [ -z "$change" ]; then
  echo "NOT APPLIED $file: $mutation changed nothing"
  exit 2
fi
line=$(sed -nE 's/^@@ -([0-9]+).*/\1/p' <<<"$change" | head -1)
echo "$change" | tail -n +3
where="$file:$line"

args=(-race -count=1 -timeout "$timeout")
[ -n "$run" ] && args+=(-run "$run")
status=0
# In the background, so that a signal to this script is handled at once:
# timeout runs the tests in a process group of its own and passes a TERM
# on to all of it; the EXIT trap then puts the file back.
timeout --kill-after=30s "$timeout" env CI=true go test "${args[@]}" "$pkg" >"$log" 2>&1 &
tests=$!
trap 'kill -TERM "$tests" 2>/dev/null; wait "$tests"; exit 130' INT TERM
wait "$tests" || status=$?
trap - INT TERM

failed=$(sed -nE 's/^ *--- FAIL: ([^ ]+).*/\1/p' "$log" | sort -u | paste -sd' ' -)
if [ "$status" -eq 0 ]; then
  echo "SURVIVED $where   (log $log)"
  exit 1
elif grep -qE '\[(build|setup) failed\]|^# ' "$log" && [ -z "$failed" ]; then
  echo "DOES NOT BUILD $where   (log $log)"
  exit 2
elif [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
  echo "KILLED $where by a hang past $timeout ${failed:+($failed)}   (log $log)"
else
  echo "KILLED $where by ${failed:-a failed run (see log)}   (log $log)"
fi
exit 0
