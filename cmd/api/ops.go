package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strconv"

	"seckill/internal/order"
	"seckill/internal/voucher"
)

// opsClients opens what the operator commands need: the database and Redis
// of the running service (real servers; embedded mode's Redis is gone with
// its process).
func opsClients(ctx context.Context, cfg config, log *slog.Logger) (*order.DeadLetters, *voucher.Warmer, func(), error) {
	if cfg.embeddedRedis() {
		return nil, nil, nil, fmt.Errorf("set SECKILL_REDIS_URL (and SECKILL_MYSQL_DSN) to the service's servers; or use the admin routes of a running embedded service")
	}
	rdb, closeRedis, err := openRedis(ctx, cfg, log)
	if err != nil {
		return nil, nil, nil, err
	}
	db, closeDB, err := openDB(ctx, cfg, log, false)
	if err != nil {
		closeRedis()
		return nil, nil, nil, err
	}
	keys := saleKeys(cfg, rdb)
	vstore := voucher.NewStore(db)
	warmer := voucher.NewWarmer(vstore, voucher.NewState(rdb, keys), order.NewStore(db), keys, cfg.Warm, log)
	dead := order.NewDeadLetters(db, newReserver(cfg, rdb, keys))
	return dead, warmer, func() { closeDB(); closeRedis() }, nil
}

// dlqCommand runs "api dlq list [--limit N]" and "api dlq replay ID".
func dlqCommand(ctx context.Context, cfg config, log *slog.Logger, args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("usage: api dlq list [--limit N] | api dlq replay ID")
	}
	dead, _, closeAll, err := opsClients(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer closeAll()
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	switch args[0] {
	case "list":
		fs := flag.NewFlagSet("dlq list", flag.ContinueOnError)
		limit := fs.Int("limit", 50, "how many, newest first")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		ds, err := dead.List(ctx, *limit, 0)
		if err != nil {
			return err
		}
		return enc.Encode(ds)
	case "replay":
		if len(args) != 2 {
			return fmt.Errorf("usage: api dlq replay ID")
		}
		id, err := strconv.ParseInt(args[1], 10, 64)
		if err != nil || id <= 0 {
			return fmt.Errorf("dead letter id must be a positive integer")
		}
		d, err := dead.Replay(ctx, id)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "dead letter %d replayed: order %d is pending again\n", d.ID, *d.OrderID)
		return nil
	}
	return fmt.Errorf("unknown dlq command %q", args[0])
}

// reconcileCommand runs "api reconcile": it prints every difference
// between Redis and the database, and fails when there is one.
func reconcileCommand(ctx context.Context, cfg config, log *slog.Logger, stdout io.Writer) error {
	_, warmer, closeAll, err := opsClients(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer closeAll()
	diffs, err := warmer.Reconcile(ctx)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(map[string]any{"consistent": len(diffs) == 0, "differences": diffs}); err != nil {
		return err
	}
	if len(diffs) > 0 {
		return fmt.Errorf("%d differences between Redis and the database", len(diffs))
	}
	return nil
}
