// Package grow measures how the costs of a sale grow with its size: for a
// voucher of N buyers (orders in MySQL, buyers in Redis) at each size
// asked, what a rebuild of its shard takes, what a buyer costs in Redis
// memory, what one more purchase costs Redis, and what the console's
// figures, the sweeper's pass and the reconcile take with the orders
// table that large, and, with a Worker, what the order worker's drain of
// a fixed backlog costs per order written at that table size. The
// command is `loadtest grow`; see loadtest/README.md.
//
// It works in a database and under a key prefix of its own: the database
// is created if missing, refused if it holds a voucher, and dropped at
// the end with every key under the prefix (unless Keep).
package grow

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"
	gormmysql "gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"seckill/internal/order"
	"seckill/internal/voucher"
	schema "seckill/sql"
)

// Config is one growth run.
type Config struct {
	// MySQLDSN names the database the run works in (created if missing).
	MySQLDSN string
	// RedisURL is a single Redis (redis://host:port/db).
	RedisURL string
	// Sizes are the buyers of the voucher measured at each step, ascending.
	Sizes []int
	// TableRows, when above the last size, adds orders of an ended voucher
	// until the orders table holds that many, then measures the last size
	// again (the table's growth apart from the voucher's).
	TableRows int
	// Purchases is how many new buyers measure a purchase at each step
	// (default 2,000).
	Purchases int
	// Worker, when set, measures the order worker at each step, last:
	// it has the purchases measured written first (not measured), then
	// a new voucher gets DrainOrders accepted orders on the stream and
	// Worker has a worker write them and says what that cost. A voucher
	// of its own, so that the drain's watch, which counts the voucher's
	// orders, costs MariaDB the same at every size. loadtest grow starts
	// `api serve` with SECKILL_ROLE=worker and measures it as `loadtest
	// drain` does.
	Worker func(context.Context, Backlog) (DrainCost, error)
	// DrainOrders is how many orders each drain writes (default 20,000).
	DrainOrders int
	// Keep leaves the database and the keys for a look afterwards.
	Keep bool
	// Log hears the progress.
	Log io.Writer
}

// Step is what was measured at one size.
type Step struct {
	Buyers    int   `json:"buyers"`     // the voucher's orders and Redis buyers
	TableRows int64 `json:"table_rows"` // orders in the table
	// Fill is how long writing the orders took (not a cost of the
	// service: it shows what the machine did).
	FillSeconds float64 `json:"fill_seconds"`
	// RebuildSeconds is the shard's rebuild (ready marker gone: the
	// voucher's state and buyers read from MySQL and written to Redis).
	RebuildSeconds float64 `json:"rebuild_seconds"`
	// BytesPerBuyer is the buyers hash's MEMORY USAGE over its buyers.
	BytesPerBuyer float64 `json:"redis_bytes_per_buyer"`
	// PurchaseRedisMicros is Redis's CPU (used_cpu_user + used_cpu_sys)
	// per accepted purchase of a new buyer, at this fill.
	PurchaseRedisMicros float64 `json:"purchase_redis_cpu_us"`
	// PurchaseMicros is the median time of one purchase, from this client.
	PurchaseMicros float64 `json:"purchase_us_median"`
	// FiguresMillis is the console's figures of the newest 50 vouchers
	// (the median of 5).
	FiguresMillis float64 `json:"console_figures_ms"`
	// SweepMillis is one pass of the sweeper (the median of 5).
	SweepMillis float64 `json:"sweeper_pass_ms"`
	// ReconcileMillis is `api reconcile`'s comparison (the median of 3).
	ReconcileMillis float64 `json:"reconcile_ms"`
	// Drain is the worker's drain of a backlog of DrainOrders (zero
	// without a Worker).
	Drain DrainCost `json:"drain"`
}

// Backlog is a drain for the Worker to make: Orders accepted orders of
// voucher VoucherID wait on the stream of a sale on RedisURL under
// KeyPrefix in Shards shards, and MySQL (MySQLDSN, the run's database)
// holds Expect orders of it once they are written.
type Backlog struct {
	VoucherID int64
	Orders    int
	Expect    int
	RedisURL  string
	MySQLDSN  string
	KeyPrefix string
	Shards    int
}

// DrainCost is what writing a backlog cost: the CPU time (utime + stime)
// each server used over the drain, per order written, in µs.
type DrainCost struct {
	// TableRows are the orders in the table when the drain began.
	TableRows int64   `json:"table_rows"`
	Orders    int     `json:"orders"`  // written while the clock ran
	Seconds   float64 `json:"seconds"` // from the first order written to the last
	Worker    float64 `json:"worker_cpu_us"`
	Redis     float64 `json:"redis_cpu_us"`      // the sale's Redis
	Locks     float64 `json:"lock_redis_cpu_us"` // the buyer-lock Redis
	MariaDB   float64 `json:"mariadb_cpu_us"`
	Total     float64 `json:"total_cpu_us"` // their sum
}

// Result is a growth run: a step per size, and the slopes between them.
type Result struct {
	Steps []Step `json:"steps"`
	// Slopes are, per figure and between consecutive steps, the exponent
	// k of cost ~ size^k (0: flat, 1: linear), over the buyers, or over
	// the table's rows for the step that grew the table only.
	Slopes []Slope `json:"slopes"`
}

// Slope is how one figure grew from one step to the next.
type Slope struct {
	Figure   string  `json:"figure"`
	From, To int64   `json:"-"`
	Over     string  `json:"over"` // "buyers" or "table_rows"
	Range    string  `json:"range"`
	K        float64 `json:"k"`
}

// Ids as the service makes them: an order id of 19 digits (internal/idgen),
// a user id of 7 (internal/auth's first), so that Redis encodes them at
// their real size.
const (
	firstOrder = 1_000_000_000_000_000_000
	firstBuyer = 1_000_000
)

// run is one growth run's clients and counters.
type run struct {
	cfg    Config
	db     *gorm.DB
	rdb    *redis.Client
	keys   voucher.Keys
	warmer *voucher.Warmer
	sweep  *order.Sweeper
	store  *order.Store
	nextID int64 // the next order id
	nextU  int64 // the next buyer of the fill
	log    *slog.Logger
}

// Run measures every size of cfg, in order.
func Run(ctx context.Context, cfg Config) (Result, error) {
	cfg.Purchases = cmp.Or(cfg.Purchases, 2000)
	cfg.DrainOrders = cmp.Or(cfg.DrainOrders, 20_000)
	cfg.Log = cmp.Or[io.Writer](cfg.Log, io.Discard)
	if len(cfg.Sizes) == 0 || !slices.IsSorted(cfg.Sizes) || cfg.Sizes[0] < 1 {
		return Result{}, errors.New("sizes must be ascending and positive")
	}
	r, closeAll, err := open(ctx, cfg)
	if err != nil {
		return Result{}, err
	}
	defer closeAll()
	var res Result
	for _, n := range cfg.Sizes {
		s, err := r.step(ctx, n, 0)
		if err != nil {
			return res, err
		}
		res.Steps = append(res.Steps, s)
	}
	last := cfg.Sizes[len(cfg.Sizes)-1]
	if cfg.TableRows > 0 {
		s, err := r.step(ctx, last, cfg.TableRows)
		if err != nil {
			return res, err
		}
		res.Steps = append(res.Steps, s)
	}
	res.Slopes = slopes(res.Steps)
	return res, nil
}

// open makes the run's database (fresh, migrated), its clients and its
// service parts; closeAll drops what the run made unless Keep.
func open(ctx context.Context, cfg Config) (*run, func(), error) {
	dsn, err := mysql.ParseDSN(cfg.MySQLDSN)
	if err != nil || dsn.DBName == "" {
		return nil, nil, fmt.Errorf("--mysql must name a database (%v)", err)
	}
	if err := createDatabase(*dsn); err != nil {
		return nil, nil, err
	}
	dsn.ParseTime = true
	db, err := gorm.Open(gormmysql.Open(dsn.FormatDSN()), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		return nil, nil, err
	}
	var tables int64
	if err := db.Raw("SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = ?", dsn.DBName).Scan(&tables).Error; err != nil || tables > 0 {
		return nil, nil, fmt.Errorf("database %s holds %d tables (%v): the growth run needs a database of its own, new or empty", dsn.DBName, tables, err)
	}
	if _, err := schema.Apply(ctx, db); err != nil {
		return nil, nil, err
	}
	opt, err := redis.ParseURL(cfg.RedisURL)
	if err != nil {
		return nil, nil, fmt.Errorf("--redis: %w", err)
	}
	rdb := redis.NewClient(opt)
	r := &run{cfg: cfg, db: db, rdb: rdb, keys: voucher.NewKeys("grow"+strconv.FormatInt(time.Now().UnixNano(), 36), 1),
		store: order.NewStore(db), nextID: firstOrder, nextU: firstBuyer, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	r.warmer = voucher.NewWarmer(voucher.NewStore(db), voucher.NewState(rdb, r.keys), r.store, r.keys, time.Minute, r.log)
	life := order.NewLifecycle(db, rdb, r.keys, order.LifecycleConfig{}, r.log)
	r.sweep = order.NewSweeper(db, life, order.SweeperConfig{Observer: counted{}, Ready: life.ShardReady}, r.log)
	return r, func() { r.close(dsn.DBName) }, nil
}

// counted is the sweeper's observer: it hears the counts as the
// service's metrics would, and keeps nothing.
type counted struct{}

func (counted) States(map[string]int64) {}
func (counted) RefundsOwed(int64)       {}

// createDatabase creates dsn's database if it is missing.
func createDatabase(dsn mysql.Config) error {
	name := dsn.DBName
	dsn.DBName = ""
	conn, err := mysql.NewConnector(&dsn)
	if err != nil {
		return err
	}
	admin := sql.OpenDB(conn)
	defer admin.Close()
	_, err = admin.Exec("CREATE DATABASE IF NOT EXISTS `" + strings.ReplaceAll(name, "`", "``") + "`")
	return err
}

// close drops the run's keys and database, unless Keep.
func (r *run) close(dbName string) {
	defer r.rdb.Close()
	if sqlDB, err := r.db.DB(); err == nil {
		defer sqlDB.Close()
	}
	if r.cfg.Keep {
		fmt.Fprintf(r.cfg.Log, "kept database %s and keys %s*\n", dbName, r.keys.Prefix())
		return
	}
	ctx := context.Background()
	iter := r.rdb.Scan(ctx, 0, r.keys.Prefix()+"*", 1000).Iterator()
	for iter.Next(ctx) {
		r.rdb.Del(ctx, iter.Val())
	}
	r.db.Exec("DROP DATABASE `" + strings.ReplaceAll(dbName, "`", "``") + "`")
}

// step measures a voucher of n buyers; with table above the rows the
// table holds, orders of an ended voucher fill it to that first.
func (r *run) step(ctx context.Context, n, table int) (Step, error) {
	s := Step{Buyers: n}
	began := time.Now()
	if table > 0 {
		if err := r.fillTable(ctx, table-n); err != nil {
			return s, err
		}
	}
	v, err := r.voucher(ctx, n)
	if err != nil {
		return s, err
	}
	s.FillSeconds = time.Since(began).Seconds()
	if err := r.db.Raw("SELECT COUNT(*) FROM orders").Scan(&s.TableRows).Error; err != nil {
		return s, err
	}
	fmt.Fprintf(r.cfg.Log, "grow: voucher %d of %d buyers, %d orders in the table (filled in %.1fs)\n", v.ID, n, s.TableRows, s.FillSeconds)
	for _, m := range []func(context.Context, voucher.Voucher, *Step) error{r.rebuild, r.memory, r.purchases, r.figures, r.sweepPass, r.reconcile, r.drain} {
		if err := m(ctx, v, &s); err != nil {
			return s, err
		}
	}
	// The next step's voucher is the only one on sale: the rebuild and the
	// reconcile read the vouchers on sale.
	return s, r.db.Exec("UPDATE vouchers SET end_at = ? WHERE id = ?", time.Now().UTC(), v.ID).Error
}

// voucher creates a voucher on sale with n orders written (users from
// nextU on) and stock for the purchases measured after them.
func (r *run) voucher(ctx context.Context, n int) (voucher.Voucher, error) {
	begin := time.Now().Add(-time.Hour)
	v := voucher.Voucher{Title: fmt.Sprintf("grow %d", n), FaceValue: 100, TotalStock: n + r.cfg.Purchases, BeginAt: begin, EndAt: begin.Add(24 * time.Hour)}
	if err := voucher.NewStore(r.db).Create(ctx, &v); err != nil {
		return v, err
	}
	if err := r.orders(ctx, v.ID, n); err != nil {
		return v, err
	}
	v.Stock = v.TotalStock - n
	return v, r.db.Exec("UPDATE vouchers SET stock = ? WHERE id = ?", v.Stock, v.ID).Error
}

// fillTable adds paid orders of an ended voucher until the orders table
// holds rows (the step's voucher then adds its own).
func (r *run) fillTable(ctx context.Context, rows int) error {
	var have int64
	if err := r.db.Raw("SELECT COUNT(*) FROM orders").Scan(&have).Error; err != nil {
		return err
	}
	if int64(rows) <= have {
		return nil
	}
	add := rows - int(have)
	begin := time.Now().Add(-48 * time.Hour)
	v := voucher.Voucher{Title: "grow filler", FaceValue: 100, TotalStock: add, BeginAt: begin, EndAt: begin.Add(time.Hour)}
	if err := voucher.NewStore(r.db).Create(ctx, &v); err != nil {
		return err
	}
	if err := r.orders(ctx, v.ID, add); err != nil {
		return err
	}
	return r.db.Exec("UPDATE vouchers SET stock = 0 WHERE id = ?", v.ID).Error
}

// orders writes n paid orders of voucher vid, 5,000 rows a statement,
// accepted a minute ago (sold before the step measures), and counts them
// in the order counters as the writer does.
func (r *run) orders(ctx context.Context, vid int64, n int) error {
	const batch = 5000
	now := time.Now().Add(-time.Minute).UTC().Format("2006-01-02 15:04:05.000")
	var b strings.Builder
	for done := 0; done < n; {
		k := min(batch, n-done)
		b.Reset()
		b.WriteString("INSERT INTO orders (id, user_id, voucher_id, accepted_at, created_at, status, paid_at) VALUES ")
		for i := range k {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, "(%d,%d,%d,'%s','%s','paid','%s')", r.nextID, r.nextU, vid, now, now, now)
			r.nextID++
			r.nextU++
		}
		if err := r.db.WithContext(ctx).Exec(b.String()).Error; err != nil {
			return fmt.Errorf("write orders: %w", err)
		}
		done += k
	}
	err := r.db.WithContext(ctx).Exec(`INSERT INTO order_counts (voucher_id, status, cancel_reason, slot, n, amount) VALUES (?, 'paid', '', 0, ?, 0)
		ON DUPLICATE KEY UPDATE n = n + VALUES(n)`, vid, n).Error
	if err != nil {
		return fmt.Errorf("count orders: %w", err)
	}
	return nil
}

// rebuild drops the shard's ready marker and times the rebuild that
// follows (one Warm: the shard's vouchers read from MySQL, written to
// Redis, the shard reopened).
func (r *run) rebuild(ctx context.Context, v voucher.Voucher, s *Step) error {
	shard := r.keys.Shard(v.ID)
	if err := r.rdb.Del(ctx, r.keys.Ready(shard)).Err(); err != nil {
		return err
	}
	began := time.Now()
	if _, err := r.warmer.Warm(ctx); err != nil {
		return fmt.Errorf("rebuild: %w", err)
	}
	s.RebuildSeconds = time.Since(began).Seconds()
	if n, err := r.rdb.Exists(ctx, r.keys.Ready(shard)).Result(); err != nil || n != 1 {
		return fmt.Errorf("the shard did not reopen after its rebuild (%v)", err)
	}
	if got, err := r.rdb.HLen(ctx, r.keys.Buyers(v.ID)).Result(); err != nil || got != int64(s.Buyers) {
		return fmt.Errorf("the rebuild wrote %d buyers of %d (%v)", got, s.Buyers, err)
	}
	return nil
}

// memory reads the buyers hash's size in Redis.
func (r *run) memory(ctx context.Context, v voucher.Voucher, s *Step) error {
	bytes, err := r.rdb.MemoryUsage(ctx, r.keys.Buyers(v.ID), 0).Result()
	if err != nil {
		return fmt.Errorf("memory usage: %w", err)
	}
	s.BytesPerBuyer = float64(bytes) / float64(s.Buyers)
	return nil
}

// purchases buys one unit for each of Purchases new buyers, one at a time
// through the service's Reserver, and reads Redis's CPU around them.
func (r *run) purchases(ctx context.Context, v voucher.Voucher, s *Step) error {
	res := voucher.NewReserver(r.rdb, r.keys)
	before, err := redisCPU(ctx, r.rdb)
	if err != nil {
		return err
	}
	took, err := r.buy(ctx, res, v.ID, r.cfg.Purchases)
	if err != nil {
		return err
	}
	after, err := redisCPU(ctx, r.rdb)
	if err != nil {
		return err
	}
	s.PurchaseRedisMicros = (after - before) * 1e6 / float64(r.cfg.Purchases)
	s.PurchaseMicros = median(took)
	return nil
}

// buy makes n purchases of voucher vid by new buyers, one at a time, and
// returns how long each took in µs.
func (r *run) buy(ctx context.Context, res *voucher.Reserver, vid int64, n int) ([]float64, error) {
	took := make([]float64, 0, n)
	for range n {
		u, id := r.nextU, r.nextID
		r.nextU++
		r.nextID++
		began := time.Now()
		if _, err := res.Reserve(ctx, vid, u, id); err != nil {
			return nil, fmt.Errorf("purchase of buyer %d: %w", u, err)
		}
		took = append(took, float64(time.Since(began).Microseconds()))
	}
	return took, nil
}

// drain, with a Worker, has the purchases measured written, then
// measures the drain of a new voucher's DrainOrders accepted orders.
func (r *run) drain(ctx context.Context, v voucher.Voucher, s *Step) error {
	if r.cfg.Worker == nil {
		return nil
	}
	if _, err := r.backlog(ctx, v.ID, r.cfg.Purchases, s.Buyers+r.cfg.Purchases); err != nil {
		return fmt.Errorf("write the purchases measured: %w", err)
	}
	begin := time.Now().Add(-time.Hour)
	d := voucher.Voucher{Title: "grow drain", FaceValue: 100, TotalStock: r.cfg.DrainOrders, BeginAt: begin, EndAt: begin.Add(24 * time.Hour)}
	if err := voucher.NewStore(r.db).Create(ctx, &d); err != nil {
		return err
	}
	if _, err := r.warmer.Warm(ctx); err != nil {
		return fmt.Errorf("load the drain's voucher: %w", err)
	}
	if _, err := r.buy(ctx, voucher.NewReserver(r.rdb, r.keys), d.ID, r.cfg.DrainOrders); err != nil {
		return err
	}
	fmt.Fprintf(r.cfg.Log, "grow: %d accepted orders of voucher %d on the stream; a worker drains them\n", r.cfg.DrainOrders, d.ID)
	cost, err := r.backlog(ctx, d.ID, r.cfg.DrainOrders, r.cfg.DrainOrders)
	if err != nil {
		return err
	}
	s.Drain = cost
	return r.db.Exec("UPDATE vouchers SET end_at = ? WHERE id = ?", time.Now().UTC(), d.ID).Error
}

// backlog has the Worker write the n orders of voucher vid on the stream,
// expect of its orders in MySQL then, and checks they all were.
func (r *run) backlog(ctx context.Context, vid int64, n, expect int) (DrainCost, error) {
	var rows int64
	if err := r.db.Raw("SELECT COUNT(*) FROM orders").Scan(&rows).Error; err != nil {
		return DrainCost{}, err
	}
	cost, err := r.cfg.Worker(ctx, Backlog{VoucherID: vid, Orders: n, Expect: expect,
		RedisURL: r.cfg.RedisURL, MySQLDSN: r.cfg.MySQLDSN, KeyPrefix: r.keys.Prefix(), Shards: r.keys.Shards()})
	switch {
	case err != nil:
		return cost, fmt.Errorf("drain: %w", err)
	case cost.Orders != n || cost.Total <= 0:
		return cost, fmt.Errorf("drain: %d orders written of %d, %.1f µs CPU per order", cost.Orders, n, cost.Total)
	}
	cost.TableRows = rows
	return cost, nil
}

// redisCPU is the Redis process's CPU seconds so far.
func redisCPU(ctx context.Context, rdb *redis.Client) (float64, error) {
	info, err := rdb.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, err
	}
	var total float64
	for _, line := range strings.Split(info, "\n") {
		k, val, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_user" || k == "used_cpu_sys") {
			f, err := strconv.ParseFloat(val, 64)
			if err != nil {
				return 0, fmt.Errorf("info cpu %s: %w", k, err)
			}
			total += f
		}
	}
	return total, nil
}

func (r *run) figures(ctx context.Context, _ voucher.Voucher, s *Step) (err error) {
	s.FiguresMillis, err = timed(5, func() error {
		_, err := r.store.Figures(ctx, time.Now(), 50)
		return err
	})
	return err
}

func (r *run) sweepPass(ctx context.Context, _ voucher.Voucher, s *Step) (err error) {
	s.SweepMillis, err = timed(5, func() error { return r.sweep.Sweep(ctx) })
	return err
}

func (r *run) reconcile(ctx context.Context, _ voucher.Voucher, s *Step) (err error) {
	s.ReconcileMillis, err = timed(3, func() error {
		d, err := r.warmer.Reconcile(ctx)
		if err == nil && len(d) > 0 {
			err = fmt.Errorf("reconcile found %d differences, first %+v", len(d), d[0])
		}
		return err
	})
	return err
}

// timed runs f n times and returns its median time in ms.
func timed(n int, f func() error) (float64, error) {
	ms := make([]float64, 0, n)
	for range n {
		began := time.Now()
		if err := f(); err != nil {
			return 0, err
		}
		ms = append(ms, float64(time.Since(began).Microseconds())/1000)
	}
	return median(ms), nil
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// Figures are the figures a growth run follows, with how each is read
// from a step. Those OverTable follow the orders table's rows when the
// drain began, at every step; the others the voucher's buyers.
var Figures = []struct {
	Name      string
	Of        func(Step) float64
	OverTable bool
}{
	{"rebuild_seconds", func(s Step) float64 { return s.RebuildSeconds }, false},
	{"redis_bytes_per_buyer", func(s Step) float64 { return s.BytesPerBuyer }, false},
	{"purchase_redis_cpu_us", func(s Step) float64 { return s.PurchaseRedisMicros }, false},
	{"console_figures_ms", func(s Step) float64 { return s.FiguresMillis }, false},
	{"sweeper_pass_ms", func(s Step) float64 { return s.SweepMillis }, false},
	{"reconcile_ms", func(s Step) float64 { return s.ReconcileMillis }, false},
	{"drain_cpu_us_per_order", func(s Step) float64 { return s.Drain.Total }, true},
	{"drain_worker_cpu_us", func(s Step) float64 { return s.Drain.Worker }, true},
	{"drain_mariadb_cpu_us", func(s Step) float64 { return s.Drain.MariaDB }, true},
}

// slopes are each figure's exponents between consecutive steps, over the
// buyers, or over the table's rows for the figures that follow them and
// for the step that grew the table only.
func slopes(steps []Step) []Slope {
	var out []Slope
	for i := 1; i < len(steps); i++ {
		a, b := steps[i-1], steps[i]
		for _, f := range Figures {
			over, x0, x1 := "buyers", int64(a.Buyers), int64(b.Buyers)
			switch {
			case f.OverTable:
				over, x0, x1 = "table_rows", a.Drain.TableRows, b.Drain.TableRows
			case a.Buyers == b.Buyers:
				over, x0, x1 = "table_rows", a.TableRows, b.TableRows
			}
			y0, y1 := f.Of(a), f.Of(b)
			if y0 <= 0 || y1 <= 0 || x0 == x1 {
				continue
			}
			out = append(out, Slope{Figure: f.Name, From: x0, To: x1, Over: over, Range: fmt.Sprintf("%d->%d", x0, x1),
				K: math.Log(y1/y0) / math.Log(float64(x1)/float64(x0))})
		}
	}
	return out
}
