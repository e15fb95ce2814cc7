package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"seckill/internal/db"
	"seckill/internal/order"
	"seckill/internal/redact"
	"seckill/internal/redisconn"
)

// openRedis connects to the configured Redis (one server, or a Redis
// Cluster for a redis-cluster:// URL), or starts an in-process one
// (embedded mode). The returned func closes what was opened.
func openRedis(ctx context.Context, cfg config, log *slog.Logger) (redis.UniversalClient, func(), error) {
	target := redisconn.Target{Single: &redis.Options{}}
	var mr *miniredis.Miniredis
	stopClock := func() {}
	if cfg.embeddedRedis() {
		mr = miniredis.NewMiniRedis()
		if err := mr.StartAddr(cfg.EmbeddedRedisAddr); err != nil {
			return nil, nil, fmt.Errorf("start embedded redis: %w", err)
		}
		target.Single.Addr = mr.Addr()
		log.Info("embedded redis listening", "addr", mr.Addr())
		stopClock = runMiniredisClock(mr)
	} else {
		var err error
		target, err = redisconn.Parse(cfg.RedisURL)
		if err != nil {
			return nil, nil, fmt.Errorf("SECKILL_REDIS_URL: %w", err)
		}
	}
	// Short timeouts: when Redis is down, purchases answer 503 quickly
	// instead of piling up. The in-process Redis cannot be down, only slow
	// on a busy machine (its scripts run in Go under one lock): give it
	// longer.
	timeout := time.Second
	if cfg.embeddedRedis() {
		timeout = 10 * time.Second
	}
	pool := max(cfg.RedisPool, 4*runtime.GOMAXPROCS(0))
	// Purchases find connections ready: 16 idle per node, dialed at once
	// and kept as connections are taken. An instance that only runs the
	// worker holds a few long-lived connections, dialed as its loops first
	// need them: filling 16 per node (replicas too, on a cluster: about
	// 120 connections on 3 masters and 3 replicas) was about a tenth of
	// its CPU before /readyz answered.
	idle := 0
	if cfg.serveAPI() {
		idle = min(pool, 16)
	}
	rdb := target.Open(redisconn.Tuning{
		DialTimeout: timeout, ReadTimeout: timeout, WriteTimeout: timeout, PoolTimeout: timeout,
		// On a cluster the pool is per master.
		PoolSize: pool, MinIdleConns: idle,
		// One dial per try: a dead master refuses at once, and the
		// command's own retries (3, a few ms apart) try again; go-redis's
		// default 5 dials 100ms apart held each buyer of a dead bucket
		// 400ms before its 503.
		DialAttempts: 1,
	})
	closeAll := func() {
		_ = rdb.Close()
		stopClock()
		if mr != nil {
			mr.Close()
		}
	}
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := rdb.Ping(pctx).Err(); err != nil {
		log.Warn("redis does not answer yet; purchases fail until it does", "err", err)
	}
	if target.IsCluster() {
		log.Info("redis cluster", "seed_nodes", target.Cluster.Addrs)
	}
	return rdb, closeAll, nil
}

// runMiniredisClock advances the embedded Redis's TTL clock with the wall
// clock: miniredis expires keys only when told time passed.
func runMiniredisClock(mr *miniredis.Miniredis) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		last := time.Now()
		for {
			select {
			case <-done:
				return
			case now := <-t.C:
				mr.FastForward(now.Sub(last))
				last = now
			}
		}
	}()
	return func() { close(done); <-finished }
}

// openDB connects to the configured MySQL, or opens the embedded SQLite file
// in the data dir. With create (the service and "api migrate", which apply
// the migrations next) a MySQL database the DSN names that does not exist
// yet is created first, when the DSN's user may.
func openDB(ctx context.Context, cfg config, log *slog.Logger, create bool) (*gorm.DB, func(), error) {
	g, _, closeDB, err := openPrimaryDB(ctx, cfg, log, create)
	return g, closeDB, err
}

// openPrimaryDB is openDB, with the MySQL pool's db.Primary (nil for
// SQLite): which server its connections reach, for the database watcher.
func openPrimaryDB(ctx context.Context, cfg config, log *slog.Logger, create bool) (*gorm.DB, *db.Primary, func(), error) {
	if !cfg.embeddedDB() {
		g, p, err := db.OpenPrimary(cfg.MySQLDSN, 32)
		if db.IsUnknownDatabase(err) {
			if !create {
				return nil, nil, nil, fmt.Errorf("SECKILL_MYSQL_DSN: %w (the service and \"api migrate\" create it)", redact.DSNError(err, cfg.MySQLDSN))
			}
			if err := db.CreateMySQLDatabase(ctx, cfg.MySQLDSN); err != nil {
				return nil, nil, nil, fmt.Errorf("SECKILL_MYSQL_DSN: %w", redact.DSNError(err, cfg.MySQLDSN))
			}
			log.Info("database created", "mysql", redactDSN(cfg.MySQLDSN))
			g, p, err = db.OpenPrimary(cfg.MySQLDSN, 32)
		}
		if err != nil {
			return nil, nil, nil, fmt.Errorf("SECKILL_MYSQL_DSN: %w", redact.DSNError(err, cfg.MySQLDSN))
		}
		return g, p, func() { db.Close(g) }, nil
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, nil, nil, fmt.Errorf("data dir: %w", err)
	}
	g, err := db.OpenSQLite(filepath.Join(cfg.DataDir, "seckill.db"))
	if err != nil {
		return nil, nil, nil, err
	}
	return g, nil, func() { db.Close(g) }, nil
}

// openProbeDB opens the readiness probe's own pool of one connection to
// the database server (the one that takes writes, as the main pool's):
// requests holding every connection of the main pool then do not read as
// a database down. nil, and the probe uses the main pool, in the embedded
// mode: SQLite is a file in this process, its pool one connection.
func openProbeDB(cfg config) (*gorm.DB, func(), error) {
	if cfg.embeddedDB() {
		return nil, func() {}, nil
	}
	g, err := db.OpenMySQL(cfg.MySQLDSN, 1)
	if err != nil {
		return nil, nil, fmt.Errorf("SECKILL_MYSQL_DSN: %w", redact.DSNError(err, cfg.MySQLDSN))
	}
	return g, func() { db.Close(g) }, nil
}

// secretPath is where the embedded mode keeps its token secret.
func secretPath(dir string) string { return filepath.Join(dir, "token-secret") }

// readSecret reads the embedded mode's token secret from the data dir;
// the error wraps fs.ErrNotExist when there is none yet.
func readSecret(dir string) (string, error) {
	b, err := os.ReadFile(secretPath(dir))
	if err != nil {
		return "", fmt.Errorf("read token secret: %w", err)
	}
	return string(b), nil
}

// embeddedSecret reads the token secret of the embedded mode from the data
// dir, creating it on first start; created reports a first start.
func embeddedSecret(dir string) (secret string, created bool, err error) {
	secret, err = readSecret(dir)
	if !errors.Is(err, fs.ErrNotExist) {
		return secret, false, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", false, fmt.Errorf("data dir: %w", err)
	}
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", false, err
	}
	secret = hex.EncodeToString(raw[:])
	if err := os.WriteFile(secretPath(dir), []byte(secret), 0o600); err != nil {
		return "", false, fmt.Errorf("write token secret: %w", err)
	}
	return secret, true, nil
}

// openLocks connects to the buyer-lock nodes: the main Redis by default,
// or the independent Redis servers of SECKILL_LOCK_NODES (a majority of
// them must grant a lock).
func openLocks(cfg config, main redis.UniversalClient, log *slog.Logger) (*order.Locks, func(), error) {
	if len(cfg.LockNodes) == 0 {
		return order.NewLocks([]redis.UniversalClient{main}, cfg.LockTTL, log), func() {}, nil
	}
	nodes := make([]redis.UniversalClient, 0, len(cfg.LockNodes))
	closeAll := func() {
		for _, n := range nodes {
			_ = n.Close()
		}
	}
	for _, u := range cfg.LockNodes {
		target, err := redisconn.Parse(u)
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("SECKILL_LOCK_NODES: %w", err)
		}
		if target.IsCluster() {
			closeAll()
			return nil, nil, fmt.Errorf("SECKILL_LOCK_NODES: %s: each lock node is one independent Redis server (redis://), not a cluster; "+
				"to take the locks on the sale's cluster leave SECKILL_LOCK_NODES empty", redactURL(u))
		}
		// A batch takes its locks all at once: as many connections as the
		// main Redis has. A dead node must not hold up the others: fail
		// fast.
		nodes = append(nodes, target.Open(redisconn.Tuning{
			PoolSize:    max(cfg.RedisPool, 4*runtime.GOMAXPROCS(0)),
			DialTimeout: 200 * time.Millisecond, ReadTimeout: 500 * time.Millisecond, WriteTimeout: 500 * time.Millisecond,
		}))
	}
	return order.NewLocks(nodes, cfg.LockTTL, log), closeAll, nil
}
