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
	"github.com/glebarez/sqlite"
	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"
	gormmysql "gorm.io/driver/mysql"
	"gorm.io/gorm"
	gormlogger "gorm.io/gorm/logger"
)

// openRedis connects to the configured Redis, or starts an in-process one
// (embedded mode). The returned func closes what was opened.
func openRedis(ctx context.Context, cfg config, log *slog.Logger) (*redis.Client, func(), error) {
	opts := &redis.Options{}
	var mr *miniredis.Miniredis
	stopClock := func() {}
	if cfg.embeddedRedis() {
		mr = miniredis.NewMiniRedis()
		if err := mr.StartAddr("127.0.0.1:0"); err != nil {
			return nil, nil, fmt.Errorf("start embedded redis: %w", err)
		}
		opts.Addr = mr.Addr()
		stopClock = runMiniredisClock(mr)
	} else {
		var err error
		opts, err = redis.ParseURL(cfg.RedisURL)
		if err != nil {
			return nil, nil, fmt.Errorf("SECKILL_REDIS_URL: %w", err)
		}
	}
	// Short timeouts: when Redis is down, purchases answer 503 quickly
	// instead of piling up.
	opts.DialTimeout = time.Second
	opts.ReadTimeout = time.Second
	opts.WriteTimeout = time.Second
	opts.PoolTimeout = time.Second
	opts.PoolSize = max(cfg.RedisPool, 4*runtime.GOMAXPROCS(0))
	opts.MinIdleConns = min(opts.PoolSize, 16)
	rdb := redis.NewClient(opts)
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
// in the data dir.
func openDB(cfg config, log *slog.Logger) (*gorm.DB, func(), error) {
	gcfg := &gorm.Config{Logger: gormlogger.Discard, SkipDefaultTransaction: true}
	if cfg.embeddedDB() {
		if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
			return nil, nil, fmt.Errorf("data dir: %w", err)
		}
		path := filepath.Join(cfg.DataDir, "seckill.db")
		dsn := "file:" + path + "?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)&_pragma=foreign_keys(1)&_pragma=synchronous(NORMAL)"
		db, err := gorm.Open(sqlite.Open(dsn), gcfg)
		if err != nil {
			return nil, nil, fmt.Errorf("open sqlite %s: %w", path, err)
		}
		sqlDB, err := db.DB()
		if err != nil {
			return nil, nil, err
		}
		// SQLite has one writer; one connection avoids "database is locked".
		sqlDB.SetMaxOpenConns(1)
		return db, func() { _ = sqlDB.Close() }, nil
	}
	mc, err := mysql.ParseDSN(cfg.MySQLDSN)
	if err != nil {
		return nil, nil, fmt.Errorf("SECKILL_MYSQL_DSN: %w", err)
	}
	mc.ParseTime = true
	mc.Loc = time.UTC
	if mc.Timeout == 0 {
		mc.Timeout = 3 * time.Second
	}
	db, err := gorm.Open(gormmysql.New(gormmysql.Config{
		DSN: mc.FormatDSN(),
		// MariaDB 10.5+ would otherwise get INSERT ... RETURNING, which
		// changes what a duplicate insert reports.
		DisableWithReturning: true,
	}), gcfg)
	if err != nil {
		return nil, nil, fmt.Errorf("open mysql: %w", err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, nil, err
	}
	sqlDB.SetMaxOpenConns(32)
	sqlDB.SetMaxIdleConns(16)
	sqlDB.SetConnMaxLifetime(5 * time.Minute)
	return db, func() { _ = sqlDB.Close() }, nil
}

// embeddedSecret reads the token secret of the embedded mode from the data
// dir, creating it on first start; created reports a first start.
func embeddedSecret(dir string) (secret string, created bool, err error) {
	path := filepath.Join(dir, "token-secret")
	b, err := os.ReadFile(path)
	if err == nil {
		return string(b), false, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return "", false, fmt.Errorf("read token secret: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", false, fmt.Errorf("data dir: %w", err)
	}
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", false, err
	}
	secret = hex.EncodeToString(raw[:])
	if err := os.WriteFile(path, []byte(secret), 0o600); err != nil {
		return "", false, fmt.Errorf("write token secret: %w", err)
	}
	return secret, true, nil
}
