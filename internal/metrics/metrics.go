// Package metrics is the service's Prometheus instrumentation: one registry
// that run builds and passes around (never the global default), the
// collectors on it, the hooks the purchase handler, the order writer and the
// stream consumer call, a Gin middleware for every route, and a sampler of
// the stream and delay-queue state in Redis.
//
// The hooks run on the hot path: they take no per-user labels and look up
// only series made when Metrics is built, so a purchase allocates nothing
// here.
package metrics

import (
	"database/sql"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"
)

const namespace = "seckill"

// PurchaseOutcomes are the answers a purchase can get: "accepted" or the
// error code of the answer. Any other outcome is counted as "other".
var PurchaseOutcomes = []string{
	"accepted", "sold_out", "already_purchased", "not_started", "ended",
	"not_ready", "voucher_not_found", "bad_request", "unavailable", "not_replicated", "busy", "entered", "drawing", "pow_required",
}

// LocalOutcomes are the answers an instance gives without Redis (see
// voucher.Refusals).
var LocalOutcomes = []string{"sold_out", "already_purchased", "not_started", "ended"}

// RebuildReasons are why a shard's sale state was rebuilt: its ready
// marker was gone (Redis lost the data), or the master holding it is
// another server or process than the one it was loaded on (a restart, a
// failover or a moved slot).
var RebuildReasons = []string{"missing", "master_changed"}

// DeadLetterReasons are the reasons the order writer gives; any other
// reason is counted as "other".
var DeadLetterReasons = []string{
	"undecodable", "unknown_voucher", "out_of_stock", "duplicate_buyer", "id_collision", "delivery_limit", "attempt_limit",
}

// Operations whose failures are counted; any other is counted as "other".
var (
	RedisOps = []string{"read", "reclaim", "ack", "delay", "lock", "give_back", "publish", "sample", "schedule_expiry", "settle", "unit_back"}
	MySQLOps = []string{"write", "pay", "cancel", "expire", "redeem", "refund", "unit_back"}
)

// OrderMoves are the moves of a written order (order.Action), OrderStates
// its states, PaymentOutcomes what a payment or a notification came to.
var (
	OrderMoves      = []string{"pay", "cancel", "expire", "redeem", "refund"}
	OrderStates     = []string{"awaiting_payment", "paid", "used", "cancelled", "refunded"}
	PaymentOutcomes = []string{"succeeded", "needs_refund", "duplicate", "refused"}
)

// Metrics owns the registry and every collector on it. Its methods are
// safe for concurrent use.
type Metrics struct {
	reg *prometheus.Registry
	// families describes each metric this package defines, for the
	// dashboard test.
	families map[string]Family

	purchases      map[string]prometheus.Counter
	purchasesLocal map[string]prometheus.Counter
	purchaseTook   prometheus.Histogram
	purchaseScript prometheus.Histogram

	httpRequests *prometheus.CounterVec
	httpTook     *prometheus.HistogramVec
	httpMu       sync.RWMutex
	httpSeries   map[httpKey]httpSeries

	ordersWritten prometheus.Counter
	ordersHealed  prometheus.Counter
	endsHealed    map[string]prometheus.Counter
	batchSize     prometheus.Histogram
	writeTook     prometheus.Histogram
	deadLetters   map[string]prometheus.Counter
	lockConflicts prometheus.Counter
	reclaimed     prometheus.Counter
	messages      map[string]prometheus.Counter // by outcome: ack, retry, pending
	redisErrors   map[string]prometheus.Counter
	mysqlErrors   map[string]prometheus.Counter

	streamLength  *prometheus.GaugeVec
	streamPending *prometheus.GaugeVec
	streamLag     *prometheus.GaugeVec
	delaySize     *prometheus.GaugeVec
	delayOverdue  *prometheus.GaugeVec
	shardReady    *prometheus.GaugeVec
	shardRebuilds *prometheus.CounterVec

	orderMoves  map[string]prometheus.Counter
	unitBack    prometheus.Histogram
	orderStates *prometheus.GaugeVec
	payments    map[string]prometheus.Counter
	refundsOwed prometheus.Gauge

	bucketStock    *prometheus.GaugeVec
	bucketMoves    map[string]prometheus.Counter
	bucketUnits    prometheus.Counter
	bucketOldest   prometheus.Gauge
	bucketPause    prometheus.Histogram
	bucketNotReady prometheus.Gauge
	bucketOff      prometheus.Gauge
	bucketMu       sync.Mutex
	bucketSeen     int // bucket_stock series set

	dbPrimary   *prometheus.GaugeVec
	dbSince     prometheus.Gauge
	dbWritable  prometheus.Gauge
	dbVerified  prometheus.Gauge
	dbChanges   prometheus.Counter
	dbRollbacks prometheus.Counter
	dbRestores  prometheus.Counter
	dbMu        sync.Mutex
	dbLabel     string // the server dbPrimary names now
}

// EndsHealed are how an order ended, as the heal writes an end the
// database lost again (voucher.EndedCancelled, EndedExpired,
// EndedRefunded).
var EndsHealed = []string{"cancelled", "expired", "refunded"}

// BucketMoveResults are how a transfer of units between a voucher's
// buckets ended: applied (the receiver took them in) or returned (given
// back to the donor: the receiver refused them, or their mover died).
var BucketMoveResults = []string{"applied", "returned"}

// New builds the registry with the Go runtime and process collectors and
// every metric of the service, each labelled series made up front.
func New() *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry(), families: map[string]Family{}, httpSeries: map[httpKey]httpSeries{}}
	m.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	purchases := m.counterVec("purchases_total", "Purchases by outcome: accepted or the error code of the answer.", "outcome")
	m.purchases = series(purchases, PurchaseOutcomes)
	m.purchasesLocal = series(m.counterVec("purchases_answered_locally_total",
		"Purchases the instance refused from what Redis told it lately, without a Redis round trip, by outcome (also counted in seckill_purchases_total).", "outcome"),
		LocalOutcomes)
	m.purchaseTook = m.histogram("purchase_duration_seconds", "Time the purchase handler took, from route match to answer.",
		[]float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5})
	m.purchaseScript = m.histogram("purchase_script_duration_seconds", "Time of the purchase script call to Redis.",
		[]float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1})

	m.httpRequests = m.counterVec("http_requests_total", "HTTP requests by route template, method and status.", "route", "method", "status")
	m.httpTook = m.histogramVec("http_request_duration_seconds", "HTTP request latency by route template and method.",
		[]float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}, "route", "method")

	m.ordersWritten = m.counter("orders_written_total", "Orders committed to the database (redeliveries of written orders not counted).")
	m.ordersHealed = m.counter("orders_healed_total", "Orders written again after the database lost them (a failover to a replica that had not received them): Redis still held them. Also counted in seckill_orders_written_total.")
	m.endsHealed = series(m.counterVec("order_ends_healed_total", "Cancellations, expiries and refunds written again after the database lost them: Redis still knew the order had ended, by how it ended.", "how"), EndsHealed)
	m.dbPrimary = m.gaugeVec("database_primary_info", "1 for the database server this instance writes to (its name and server_id as it reports them); the series of an earlier server is removed when another takes over.", "server")
	m.dbSince = m.gauge("database_primary_since_seconds", "When this instance first saw the database server it writes to now (Unix seconds).")
	m.dbWritable = m.gauge("database_writable", "1 while the database server this instance reaches takes writes (read_only off, a ready Galera node), 0 while it does not (a replica, a node cut off) or does not answer.")
	m.dbVerified = m.gauge("database_verified", "1 while the database server this instance writes to is verified: it holds every commit the sale's Redis saw it make (or what it lacked was written back); 0 while it is not, and the instance's workers wait.")
	m.dbChanges = m.counter("database_primary_changes_total", "Times this instance found its database address reaching another server than before: a failover or a switchover.")
	m.dbRollbacks = m.counter("database_rollbacks_total", "Times this instance found the database lacking commits the sale's Redis had seen it make: a failover to a replica that had not received them. The service writes back what Redis still holds.")
	m.dbRestores = m.counter("database_restores_total", "Times this instance found the database of another lineage than the sale's Redis knew: it was restored from a dump. Redis is rebuilt from it; nothing is written back.")
	m.batchSize = m.histogram("worker_batch_size", "Stream messages per batch the order writer handled.",
		[]float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000})
	m.writeTook = m.histogram("order_write_duration_seconds", "Time of a batch's database transaction, retries included.",
		[]float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10})
	m.deadLetters = series(m.counterVec("dead_letters_total", "Messages dead-lettered, by reason.", "reason"), DeadLetterReasons)
	m.lockConflicts = m.counter("lock_conflicts_total", "Messages whose buyer lock was held elsewhere (retried through the delay queue).")
	m.reclaimed = m.counter("reclaimed_entries_total", "Stream entries claimed from a stalled consumer.")
	m.messages = series(m.counterVec("worker_messages_total", "Stream messages by what the consumer did with them: ack, retry (delay queue) or pending.", "outcome"),
		[]string{"ack", "retry", "pending"})
	m.redisErrors = series(m.counterVec("redis_errors_total", "Failed Redis calls by operation.", "op"), RedisOps)
	m.mysqlErrors = series(m.counterVec("mysql_errors_total", "Failed database transactions by operation.", "op"), MySQLOps)

	m.streamLength = m.gaugeVec("stream_length", "Entries in a shard's order stream (acknowledged ones are deleted).", "shard")
	m.streamPending = m.gaugeVec("stream_pending", "Entries delivered to the order writers and not yet acknowledged, per shard.", "shard")
	m.streamLag = m.gaugeVec("stream_lag", "Entries not yet delivered to the order writers' group, per shard.", "shard")
	m.delaySize = m.gaugeVec("delay_queue_size", "Messages waiting in a shard's delay queue.", "shard")
	m.delayOverdue = m.gaugeVec("delay_queue_oldest_overdue_seconds", "How long the most overdue delay-queue message is past its due time, per shard.", "shard")
	m.shardReady = m.gaugeVec("shard_ready", "1 while a shard's sale state is loaded in Redis (its ready marker is there), 0 while purchases in it answer not_ready.", "shard")
	m.orderMoves = series(m.counterVec("order_moves_total", "Written orders moved between states, by move: pay, cancel (by the buyer), expire (unpaid at the deadline), redeem, refund.", "move"), OrderMoves)
	m.unitBack = m.histogram("order_unit_back_seconds", "How long after its pay deadline an expired order's unit was back on sale in Redis.",
		[]float64{.05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300})
	m.orderStates = m.gaugeVec("orders", "Written orders by state, counted by the order sweeper (every worker instance; take the max).", "state")
	for _, st := range OrderStates {
		m.orderStates.WithLabelValues(st)
	}
	m.payments = series(m.counterVec("payments_total", "Payments and gateway notifications by outcome: succeeded (order paid), needs_refund (paid after the order was cancelled, or paid twice), duplicate (a notification seen before), refused (bad signature, stale, unknown, wrong amount).", "outcome"), PaymentOutcomes)
	m.refundsOwed = m.gauge("payments_needing_refund", "Payments whose money is owed back (they arrived after their order was cancelled, paid an order twice, or their order was refunded) and are not marked refunded yet, counted by the order sweeper.")
	m.bucketStock = m.gaugeVec("bucket_stock", "Units on sale in bucket number <bucket> of the live vouchers of more than one bucket, summed over them, read every 250ms by every instance (buckets not ready count 0; see bucket_not_ready).", "bucket")
	m.bucketOff = m.gauge("bucket_units_unaccounted", "Units the buckets of live vouchers of more than one bucket miss or count twice: for each voucher whose buckets are all ready with no transfer open, the difference between its total and the sum of its buckets' allocs, summed as positive numbers, as of the last read.")
	m.bucketNotReady = m.gauge("bucket_not_ready", "Buckets of live vouchers of more than one bucket whose shard is not ready (its master failing over or being rebuilt), as of the last read.")
	m.bucketMoves = series(m.counterVec("bucket_transfers_total", "Transfers of units between a voucher's buckets this instance closed, by result: applied, or returned to the donor.", "result"), BucketMoveResults)
	m.bucketUnits = m.counter("bucket_units_moved_total", "Units this instance moved between buckets (applied transfers).")
	m.bucketOldest = m.gauge("bucket_transfer_oldest_seconds", "Age of the oldest transfer between buckets still open in a journal, as this instance's recovery loop last saw it (0: none).")
	m.bucketPause = m.histogram("bucket_rebuild_pause_seconds", "How long a bucket's rebuild kept its voucher's other buckets fenced (no units move out of them; a dry bucket's buyers answer busy): from its fences set to the others' lifted.",
		[]float64{.1, .25, .5, 1, 2, 3, 5, 7.5, 10, 15, 30, 60})
	m.shardRebuilds = m.counterVec("shard_rebuilds_total", "Shard sale states this instance rebuilt from the database, by shard and reason: missing (Redis lost the data) or master_changed (restart, failover or moved slot).", "shard", "reason")
	return m
}

// Registry is the registry every collector is on.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Family describes one metric the service defines.
type Family struct {
	Type   string // counter, gauge or histogram
	Labels []string
}

// Families describes every metric the service defines, by name (a
// histogram by its base name), whether or not it has a series yet. The Go
// runtime, process and database pool metrics are not in it: Gather lists
// those.
func (m *Metrics) Families() map[string]Family { return m.families }

// WatchDB adds the database pool's statistics (go_sql_*).
func (m *Metrics) WatchDB(db *sql.DB) {
	m.reg.MustRegister(collectors.NewDBStatsCollector(db, "seckill"))
}

// WatchRedisPool adds the Redis client pool's statistics.
func (m *Metrics) WatchRedisPool(stats func() *redis.PoolStats) {
	gauge := func(name, help string, v func(*redis.PoolStats) uint32) {
		m.families[namespace+"_"+name] = Family{Type: "gauge"}
		m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: namespace, Name: name, Help: help},
			func() float64 { return float64(v(stats())) }))
	}
	counter := func(name, help string, v func(*redis.PoolStats) uint32) {
		m.families[namespace+"_"+name] = Family{Type: "counter"}
		m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: namespace, Name: name, Help: help},
			func() float64 { return float64(v(stats())) }))
	}
	gauge("redis_pool_connections", "Connections in the Redis client pool.", func(s *redis.PoolStats) uint32 { return s.TotalConns })
	gauge("redis_pool_idle_connections", "Idle connections in the Redis client pool.", func(s *redis.PoolStats) uint32 { return s.IdleConns })
	counter("redis_pool_timeouts_total", "Waits for a free Redis connection that timed out.", func(s *redis.PoolStats) uint32 { return s.Timeouts })
}

// WatchAloneWrites adds the count of writes (accepted purchases and
// transfer steps) that a master with no replica confirmed alone
// (redisconn.Replicas).
func (m *Metrics) WatchAloneWrites(n func() int64) {
	name := "redis_writes_without_replica_total"
	m.families[namespace+"_"+name] = Family{Type: "counter"}
	m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: namespace, Name: name,
		Help: "Writes that asked for replica confirmation (SECKILL_REDIS_WAIT_REPLICAS) and were confirmed by a master that has no replica at all: accepted purchases and transfer steps. Such a master's loss would lose them."},
		func() float64 { return float64(n()) }))
}

// WatchRebuild adds how long the shard rebuild this instance is running
// has run (0: none).
func (m *Metrics) WatchRebuild(running func() time.Duration) {
	name := "rebuild_running_seconds"
	m.families[namespace+"_"+name] = Family{Type: "gauge"}
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: namespace, Name: name,
		Help: "How long the shard rebuild this instance is running has run, 0 when none: its shard answers not_ready meanwhile."},
		func() float64 { return running().Seconds() }))
}

// Purchase records one purchase: its outcome, the handler's time and the
// script's time (0 when the script did not run).
func (m *Metrics) Purchase(outcome string, took, script time.Duration) {
	m.pick(m.purchases, outcome).Inc()
	m.purchaseTook.Observe(took.Seconds())
	if script > 0 {
		m.purchaseScript.Observe(script.Seconds())
	}
}

// AnsweredLocally records a purchase answered without Redis; Purchase
// records it too.
func (m *Metrics) AnsweredLocally(outcome string) { m.pick(m.purchasesLocal, outcome).Inc() }

// Batch records one batch the order writer handled.
func (m *Metrics) Batch(size int, took time.Duration) {
	m.batchSize.Observe(float64(size))
	m.writeTook.Observe(took.Seconds())
}

// Healed counts orders written again after the database lost them.
func (m *Metrics) Healed(orders int) { m.ordersHealed.Add(float64(orders)) }

// EndHealed counts an end written again after the database lost it.
func (m *Metrics) EndHealed(how string) { m.pick(m.endsHealed, how).Inc() }

// DatabaseSeen records the database server this instance reaches now
// (label), since when, and whether it takes writes; changed says it is
// another server than before.
func (m *Metrics) DatabaseSeen(label string, since time.Time, writable, changed bool) {
	m.dbMu.Lock()
	defer m.dbMu.Unlock()
	if label != m.dbLabel {
		if m.dbLabel != "" {
			m.dbPrimary.DeleteLabelValues(m.dbLabel)
		}
		m.dbPrimary.WithLabelValues(label).Set(1)
		m.dbLabel = label
	}
	m.dbSince.Set(float64(since.Unix()))
	if writable {
		m.dbWritable.Set(1)
	} else {
		m.dbWritable.Set(0)
	}
	if changed {
		m.dbChanges.Inc()
	}
}

// DatabaseDown records that the database did not answer: it takes no
// writes.
func (m *Metrics) DatabaseDown() { m.dbWritable.Set(0); m.dbVerified.Set(0) }

// DatabaseVerified records whether the database server is verified.
func (m *Metrics) DatabaseVerified(ok bool) {
	if ok {
		m.dbVerified.Set(1)
	} else {
		m.dbVerified.Set(0)
	}
}

// DatabaseRolledBack counts a database found lacking commits Redis saw.
func (m *Metrics) DatabaseRolledBack() { m.dbRollbacks.Inc() }

// DatabaseRestored counts a database found of another lineage.
func (m *Metrics) DatabaseRestored() { m.dbRestores.Inc() }

// Written counts orders newly committed.
func (m *Metrics) Written(orders int) { m.ordersWritten.Add(float64(orders)) }

// DeadLettered counts one new dead letter.
func (m *Metrics) DeadLettered(reason string) { m.pick(m.deadLetters, reason).Inc() }

// LockConflicts counts messages whose buyer lock was held elsewhere.
func (m *Metrics) LockConflicts(n int) { m.lockConflicts.Add(float64(n)) }

// Reclaimed counts entries claimed from a stalled consumer.
func (m *Metrics) Reclaimed(n int) { m.reclaimed.Add(float64(n)) }

// Outcomes counts what the consumer did with a batch's messages.
func (m *Metrics) Outcomes(acked, retried, pending int) {
	m.messages["ack"].Add(float64(acked))
	m.messages["retry"].Add(float64(retried))
	m.messages["pending"].Add(float64(pending))
}

// ShardRebuilt counts one rebuild of a shard's sale state by this
// instance.
func (m *Metrics) ShardRebuilt(shard int, reason string) {
	if !slices.Contains(RebuildReasons, reason) {
		reason = "other"
	}
	m.shardRebuilds.WithLabelValues(strconv.Itoa(shard), reason).Inc()
}

// BucketStocks sets the stock of each bucket number summed over the live
// vouchers of more than one bucket (stocks: voucher -> stock by bucket,
// -1 for a bucket not ready), and how many buckets are not ready. No
// label carries a voucher id.
func (m *Metrics) BucketStocks(stocks map[int64][]int64) {
	var (
		sum      []int64
		notReady int
	)
	for _, bs := range stocks {
		for b, n := range bs {
			for len(sum) <= b {
				sum = append(sum, 0)
			}
			if n < 0 {
				notReady++
				continue
			}
			sum[b] += n
		}
	}
	m.bucketMu.Lock()
	defer m.bucketMu.Unlock()
	for b := len(sum); b < m.bucketSeen; b++ {
		m.bucketStock.DeleteLabelValues(strconv.Itoa(b))
	}
	for b, n := range sum {
		m.bucketStock.WithLabelValues(strconv.Itoa(b)).Set(float64(n))
	}
	m.bucketSeen = len(sum)
	m.bucketNotReady.Set(float64(notReady))
}

// BucketUnaccounted sets the units the buckets' allocs miss or count
// twice (bucket.Pass.Unaccounted).
func (m *Metrics) BucketUnaccounted(units int64) { m.bucketOff.Set(float64(units)) }

// BucketMoves counts transfers between buckets closed since the last
// call, and the units the applied ones moved.
func (m *Metrics) BucketMoves(applied, returned, units int64) {
	m.bucketMoves["applied"].Add(float64(applied))
	m.bucketMoves["returned"].Add(float64(returned))
	m.bucketUnits.Add(float64(units))
}

// BucketOldest sets the age of the oldest open transfer between buckets.
func (m *Metrics) BucketOldest(d time.Duration) { m.bucketOldest.Set(d.Seconds()) }

// BucketRebuildPause records how long a bucket's rebuild kept the
// voucher's other buckets fenced.
func (m *Metrics) BucketRebuildPause(d time.Duration) { m.bucketPause.Observe(d.Seconds()) }

// Moved counts one move of a written order.
func (m *Metrics) Moved(move string) { m.pick(m.orderMoves, move).Inc() }

// UnitBack records how late after its deadline an expired order's unit
// was back on sale.
func (m *Metrics) UnitBack(late time.Duration) { m.unitBack.Observe(max(late, 0).Seconds()) }

// States sets the count of written orders in each state.
func (m *Metrics) States(counts map[string]int64) {
	for st, n := range counts {
		if slices.Contains(OrderStates, st) {
			m.orderStates.WithLabelValues(st).Set(float64(n))
		}
	}
}

// RefundsOwed sets the count of payments waiting for a refund.
func (m *Metrics) RefundsOwed(n int64) { m.refundsOwed.Set(float64(n)) }

// Payment counts one payment or notification by outcome.
func (m *Metrics) Payment(outcome string) { m.pick(m.payments, outcome).Inc() }

// RedisError counts a failed Redis call.
func (m *Metrics) RedisError(op string) { m.pick(m.redisErrors, op).Inc() }

// MySQLError counts a failed database transaction.
func (m *Metrics) MySQLError(op string) { m.pick(m.mysqlErrors, op).Inc() }

// pick returns the series of a known label value, or the "other" one.
func (m *Metrics) pick(s map[string]prometheus.Counter, v string) prometheus.Counter {
	if c, ok := s[v]; ok {
		return c
	}
	return s["other"]
}

// series makes the series of each value, plus "other".
func series(v *prometheus.CounterVec, values []string) map[string]prometheus.Counter {
	out := make(map[string]prometheus.Counter, len(values)+1)
	for _, s := range append(slices.Clone(values), "other") {
		out[s] = v.WithLabelValues(s)
	}
	return out
}

func (m *Metrics) gauge(name, help string) prometheus.Gauge {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Name: name, Help: help})
	m.add(name, Family{Type: "gauge"}, g)
	return g
}

func (m *Metrics) counter(name, help string) prometheus.Counter {
	c := prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: name, Help: help})
	m.add(name, Family{Type: "counter"}, c)
	return c
}

func (m *Metrics) counterVec(name, help string, labels ...string) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: name, Help: help}, labels)
	m.add(name, Family{Type: "counter", Labels: labels}, c)
	return c
}

func (m *Metrics) gaugeVec(name, help string, labels ...string) *prometheus.GaugeVec {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: name, Help: help}, labels)
	m.add(name, Family{Type: "gauge", Labels: labels}, g)
	return g
}

func (m *Metrics) histogram(name, help string, buckets []float64) prometheus.Histogram {
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: namespace, Name: name, Help: help, Buckets: buckets})
	m.add(name, Family{Type: "histogram"}, h)
	return h
}

func (m *Metrics) histogramVec(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: namespace, Name: name, Help: help, Buckets: buckets}, labels)
	m.add(name, Family{Type: "histogram", Labels: labels}, h)
	return h
}

func (m *Metrics) add(name string, f Family, c prometheus.Collector) {
	m.reg.MustRegister(c)
	m.families[namespace+"_"+name] = f
}

// statusText holds "100" to "599" so that labelling a status allocates
// nothing.
var statusText = func() [600]string {
	var t [600]string
	for i := 100; i < 600; i++ {
		t[i] = itoa3(i)
	}
	return t
}()

func itoa3(n int) string {
	return string([]byte{byte('0' + n/100), byte('0' + n/10%10), byte('0' + n%10)})
}
