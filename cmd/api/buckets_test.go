package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/auth"
	"seckill/internal/redisconn"
	"seckill/internal/testenv"
	"seckill/internal/voucher"
)

// bucketsOut is what "api buckets" prints.
type bucketsOut struct {
	VoucherID int64 `json:"voucher_id"`
	NB        int   `json:"bucket_count"`
	Buckets   []struct {
		Bucket int    `json:"bucket"`
		Shard  int    `json:"shard"`
		Tag    string `json:"tag"`
		Slot   int    `json:"slot"`
		Master string `json:"master"`
		Stock  any    `json:"stock"`
		Alloc  any    `json:"alloc"`
		Out    any    `json:"out"`
		Ready  *bool  `json:"ready"`
		Fence  string `json:"fence"`
	} `json:"buckets"`
	Warning *string `json:"warning"`
}

// createBucketed puts a voucher of stock on sale now through the API,
// with buckets as given (nil: the field left out); it returns its id and
// the bucket count the answer shows.
func createBucketed(t testing.TB, base string, stock int, buckets any) (int64, int) {
	t.Helper()
	body := map[string]any{
		"title": "hot", "face_value": 500, "stock": stock,
		"begin_at": time.Now().Add(-time.Minute).Format(time.RFC3339), "end_at": time.Now().Add(time.Hour).Format(time.RFC3339),
	}
	if buckets != nil {
		body["buckets"] = buckets
	}
	status, got := call(t, "POST", base+"/api/v1/vouchers", token(t, 1, auth.RoleAdmin), body)
	if status != http.StatusCreated || got["redis_ready"] != true {
		t.Fatalf("create voucher with buckets %v: %d %v", buckets, status, got)
	}
	v := got["voucher"].(map[string]any)
	n, _ := v["buckets"].(float64)
	return int64(v["id"].(float64)), int(n)
}

// cliBuckets runs "api buckets id" with env and decodes its stdout, which
// must hold one JSON value alone.
func cliBuckets(t testing.TB, env map[string]string, id int64) bucketsOut {
	t.Helper()
	err, stdout, stderr := cliRun(env, "buckets", fmt.Sprint(id))
	if err != nil {
		t.Fatalf("api buckets %d: %v\n%s", id, err, stderr)
	}
	var out bucketsOut
	dec := json.NewDecoder(strings.NewReader(stdout))
	if err := dec.Decode(&out); err != nil || dec.More() {
		t.Fatalf("api buckets %d printed %q on stdout, want one JSON value alone (%v)", id, stdout, err)
	}
	return out
}

// stockSum adds the buckets' stock, failing on one that is not a number.
func stockSum(t testing.TB, out bucketsOut) int64 {
	t.Helper()
	var sum int64
	for _, b := range out.Buckets {
		switch s := b.Stock.(type) {
		case nil: // not loaded in this bucket
		case float64:
			sum += int64(s)
		default:
			t.Fatalf("bucket %d stock %v is not a number", b.Bucket, b.Stock)
		}
	}
	return sum
}

// bucketsService starts the service on the shared Redis with 4 shards
// under a prefix of the test's; it returns the prefix, the settings, the
// service and its Redis options.
func bucketsService(t *testing.T) (string, map[string]string, observed, *redis.Options) {
	t.Helper()
	prefix := testenv.Prefix(t)
	env := map[string]string{
		"SECKILL_REDIS_URL": testenv.RedisURL(t), "SECKILL_KEY_PREFIX": prefix, "SECKILL_MYSQL_DSN": testenv.MySQLDSN(t),
		"SECKILL_SHARDS": "4",
	}
	o := startObserved(t, env)
	opt, err := redis.ParseURL(env["SECKILL_REDIS_URL"])
	if err != nil {
		t.Fatal(err)
	}
	return prefix, env, o, opt
}

// TestCLIBuckets: on one Redis server with 4 shards, "api buckets"
// prints, alone on stdout, a voucher's id, its bucket count and each
// bucket: the shard Keys.BucketShard names, that shard's tag and slot, the
// server, its readiness and its live stock (the buckets' stocks add up to
// what is left after a purchase); three buckets on the one server get a
// warning naming it, one bucket none; with nothing in Redis but one
// shard's ready marker only that bucket is ready, and each field is null. An unknown or malformed voucher id
// is an error with nothing on stdout.
func TestCLIBuckets(t *testing.T) {
	t.Parallel()
	prefix, env, o, opt := bucketsService(t)
	keys := voucher.NewKeys(prefix, 4)

	hot, nb := createBucketed(t, o.base, 10, 3)
	if nb != 3 {
		t.Fatalf("created with buckets 3, shows %d", nb)
	}
	if st, body := call(t, "POST", fmt.Sprintf("%s/api/v1/vouchers/%d/orders", o.base, hot), token(t, 42, auth.RoleUser), nil); st != http.StatusAccepted {
		t.Fatalf("buy: %d %v", st, body)
	}
	out := cliBuckets(t, env, hot)
	if out.VoucherID != hot || out.NB != 3 || len(out.Buckets) != 3 {
		t.Fatalf("api buckets %d: %+v, want voucher %d with 3 buckets", hot, out, hot)
	}
	for b, got := range out.Buckets {
		shard := keys.BucketShard(hot, b, 3)
		if got.Bucket != b || got.Shard != shard || got.Tag != keys.Tag(shard) || got.Slot != redisconn.Slot(keys.Tag(shard)) ||
			got.Master != opt.Addr || got.Ready == nil || !*got.Ready {
			t.Errorf("bucket %d: %+v, want shard %d, tag %s, slot %d, master %s, ready", b, got, shard, keys.Tag(shard), redisconn.Slot(keys.Tag(shard)), opt.Addr)
		}
	}
	// A fence left on bucket 2 (as a rebuild holds it) is shown there.
	fences := keys.Tag(keys.BucketShard(hot, 2, 3)) + ":fences"
	rdbFence := redis.NewClient(opt)
	t.Cleanup(func() { _ = rdbFence.Close() })
	if err := rdbFence.HSet(t.Context(), fences, strconv.FormatInt(hot, 10), "3:a-token").Err(); err != nil {
		t.Fatal(err)
	}
	for b, got := range cliBuckets(t, env, hot).Buckets {
		if want := map[bool]string{true: "3:a-token"}[b == 2]; got.Fence != want {
			t.Errorf("bucket %d fence %q, want %q", b, got.Fence, want)
		}
	}
	rdbFence.HDel(t.Context(), fences, strconv.FormatInt(hot, 10))
	if sum := stockSum(t, out); sum != 9 {
		t.Errorf("the buckets hold %d units, want 9 (10 less one sold): %+v", sum, out)
	}
	if out.Warning == nil || !strings.Contains(*out.Warning, "buckets 0, 1, 2 on "+opt.Addr) {
		t.Errorf("3 buckets on one server: warning %v, want one naming %s", out.Warning, opt.Addr)
	}

	one, nb := createBucketed(t, o.base, 5, nil)
	if nb != 1 {
		t.Fatalf("created without buckets, shows %d", nb)
	}
	out = cliBuckets(t, env, one)
	if out.NB != 1 || len(out.Buckets) != 1 || out.Buckets[0].Shard != keys.Shard(one) || out.Warning != nil || stockSum(t, out) != 5 {
		t.Errorf("api buckets %d (one bucket): %+v, want shard %d with 5 units and no warning", one, out, keys.Shard(one))
	}

	// Under another prefix Redis holds nothing of the sale but the ready
	// marker of bucket 1's shard: only bucket 1 is ready, and none has a
	// state.
	bare := map[string]string{}
	for k, v := range env {
		bare[k] = v
	}
	bare["SECKILL_KEY_PREFIX"] = prefix + "_bare"
	bareKeys := voucher.NewKeys(bare["SECKILL_KEY_PREFIX"], 4)
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { _ = rdb.Close() })
	if err := rdb.Set(t.Context(), bareKeys.Ready(bareKeys.BucketShard(hot, 1, 3)), "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	for _, b := range cliBuckets(t, bare, hot).Buckets {
		if b.Ready == nil || *b.Ready != (b.Bucket == 1) || b.Stock != nil || b.Alloc != nil || b.Out != nil {
			t.Errorf("bucket %d with nothing in Redis but bucket 1's ready marker: %+v, want ready %v and null stock, alloc, out", b.Bucket, b, b.Bucket == 1)
		}
	}

	for _, arg := range []string{"987654321", "x", "0"} {
		err, stdout, _ := cliRun(env, "buckets", arg)
		if err == nil || stdout != "" {
			t.Errorf("api buckets %s: err %v, stdout %q; want an error and nothing on stdout", arg, err, stdout)
		}
	}
}

// TestCLIBucketsSettle: a move cut after its take (journaled on bucket
// 0, its units out of bucket 0's stock and alloc, not applied) is listed
// by "api buckets" with no mark, and "api buckets settle" decides it at
// once, long before the recovery loop would (15 s): refused, its units
// back in bucket 0, nothing owed, the allocs adding up to the stock. A
// voucher of one bucket has nothing to settle: an error.
func TestCLIBucketsSettle(t *testing.T) {
	t.Parallel()
	prefix, env, o, opt := bucketsService(t)
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { _ = rdb.Close() })
	keys := voucher.NewKeys(prefix, 4)
	hot, _ := createBucketed(t, o.base, 90, 3)
	donor := keys.BucketShard(hot, 0, 3)
	// A take of 2 units toward bucket 1, as take.lua writes it.
	tx := rdb.TxPipeline()
	state := keys.StateAt(donor, hot)
	tx.HIncrBy(t.Context(), state, "stock", -2)
	tx.HIncrBy(t.Context(), state, voucher.FieldAlloc, -2)
	tx.HIncrBy(t.Context(), state, voucher.FieldOut, 2)
	tx.HSet(t.Context(), keys.Tag(donor)+":transfers", "cut-move", fmt.Sprintf("%d:1:2:3:%d", hot, time.Now().UnixMilli()))
	if _, err := tx.Exec(t.Context()); err != nil {
		t.Fatal(err)
	}

	err, stdout, stderr := cliRun(env, "buckets", fmt.Sprint(hot))
	if err != nil {
		t.Fatalf("api buckets: %v\n%s", err, stderr)
	}
	var listed struct {
		Moves []map[string]any `json:"moves"`
	}
	if err := json.Unmarshal([]byte(stdout), &listed); err != nil {
		t.Fatal(err)
	}
	if len(listed.Moves) != 1 || listed.Moves[0]["id"] != "cut-move" || listed.Moves[0]["from_bucket"] != 0.0 ||
		listed.Moves[0]["to_bucket"] != 1.0 || listed.Moves[0]["units"] != 2.0 || listed.Moves[0]["mark"] != "" {
		t.Fatalf("api buckets moves %v, want the cut move of 2 units from bucket 0 to 1, no mark", listed.Moves)
	}

	err, stdout, stderr = cliRun(env, "buckets", "settle", fmt.Sprint(hot))
	if err != nil {
		t.Fatalf("api buckets settle: %v\n%s", err, stderr)
	}
	var settled struct {
		Settled []map[string]any `json:"settled"`
		Running bool             `json:"rebuild_running"`
		Buckets []struct {
			Alloc, Out float64
		} `json:"buckets"`
	}
	if err := json.Unmarshal([]byte(stdout), &settled); err != nil {
		t.Fatal(err)
	}
	if len(settled.Settled) != 1 || settled.Settled[0]["outcome"] != "refused" || settled.Running {
		t.Fatalf("api buckets settle: %s, want the move refused", stdout)
	}
	var alloc float64
	for b, got := range settled.Buckets {
		alloc += got.Alloc
		if got.Out != 0 {
			t.Errorf("bucket %d still owes %v units", b, got.Out)
		}
	}
	if alloc != 90 {
		t.Errorf("allocs add up to %v, want 90", alloc)
	}
	if n, _ := rdb.HLen(t.Context(), keys.Tag(donor)+":transfers").Result(); n != 0 {
		t.Errorf("%d moves still journaled", n)
	}

	one, _ := createBucketed(t, o.base, 5, nil)
	if err, stdout, _ := cliRun(env, "buckets", "settle", fmt.Sprint(one)); err == nil || stdout != "" {
		t.Errorf("api buckets settle on one bucket: err %v, stdout %q; want an error", err, stdout)
	}
}

// TestBucketsOnCluster: on a real cluster of three masters with three
// shards, a voucher created with "buckets": "auto" has 3 buckets, and
// "api buckets" puts each on the master the cluster itself says serves
// its state hash, three different ones, without a warning.
func TestBucketsOnCluster(t *testing.T) {
	t.Parallel()
	cl := testenv.StartCluster(t, testenv.ClusterOptions{Masters: 3, Replicas: -1})
	prefix := testenv.Prefix(t)
	env := map[string]string{
		"SECKILL_REDIS_URL": cl.URL(), "SECKILL_KEY_PREFIX": prefix, "SECKILL_MYSQL_DSN": testenv.MySQLDSN(t),
		"SECKILL_SHARDS": "3",
	}
	o := startObserved(t, env)
	keys := voucher.NewClusterKeys(prefix, 3)

	id, nb := createBucketed(t, o.base, 30, "auto")
	if nb != 3 {
		t.Fatalf(`"buckets": "auto" on 3 masters: %d buckets, want 3`, nb)
	}
	out := cliBuckets(t, env, id)
	if out.NB != 3 || len(out.Buckets) != 3 || out.Warning != nil {
		t.Fatalf("api buckets %d: %+v, want 3 buckets and no warning", id, out)
	}
	masters := map[string]bool{}
	for _, b := range out.Buckets {
		if want := cl.MasterOf(t, keys.StateAt(b.Shard, id)).Addr; b.Master != want {
			t.Errorf("api buckets says bucket %d (shard %d) lives on %s, the cluster says %s", b.Bucket, b.Shard, b.Master, want)
		}
		masters[b.Master] = true
	}
	if len(masters) != 3 || stockSum(t, out) != 30 {
		t.Errorf("api buckets %d: %+v, want 30 units on 3 masters", id, out)
	}
}
