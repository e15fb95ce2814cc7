package main

import (
	"context"
	"encoding/json"
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
	warmer.LeaseTTL(cfg.RebuildLease)
	replicas := confirmAlone(cfg, rdb)
	mover := newMover(cfg, rdb, keys, replicas, crashHooks{}, nil, log)
	// Reconcile counts the units of moves under way through the mover.
	warmer.Quiesce(mover)
	dead := order.NewDeadLetters(db, newReserver(cfg, rdb, keys, replicas, mover))
	return dead, warmer, func() { closeDB(); closeRedis() }, nil
}

// dlqList runs "api dlq list [--limit N]".
func dlqList(ctx context.Context, e *cmdEnv, limit int) error {
	if limit < 1 || limit > 500 {
		return fmt.Errorf("--limit must be from 1 to 500")
	}
	dead, _, closeAll, err := opsClients(ctx, e.cfg, e.log)
	if err != nil {
		return err
	}
	defer closeAll()
	ds, err := dead.List(ctx, limit, 0)
	if err != nil {
		return err
	}
	return printJSON(e.stdout, ds)
}

// dlqReplay runs "api dlq replay ID".
func dlqReplay(ctx context.Context, e *cmdEnv) error {
	id, err := strconv.ParseInt(e.args[0], 10, 64)
	if err != nil || id <= 0 {
		return fmt.Errorf("dead letter id must be a positive integer")
	}
	dead, _, closeAll, err := opsClients(ctx, e.cfg, e.log)
	if err != nil {
		return err
	}
	defer closeAll()
	d, err := dead.Replay(ctx, id)
	if err != nil {
		return err
	}
	return printJSON(e.stdout, map[string]any{"dead_letter": d, "status": "pending"})
}

// reconcileCommand runs "api reconcile": it prints every difference
// between Redis and the database, and fails when there is one.
func reconcileCommand(ctx context.Context, e *cmdEnv) error {
	_, warmer, closeAll, err := opsClients(ctx, e.cfg, e.log)
	if err != nil {
		return err
	}
	defer closeAll()
	diffs, err := warmer.Reconcile(ctx)
	if err != nil {
		return err
	}
	if err := printJSON(e.stdout, map[string]any{"consistent": len(diffs) == 0, "differences": diffs}); err != nil {
		return err
	}
	if len(diffs) > 0 {
		return fmt.Errorf("%d differences between Redis and the database", len(diffs))
	}
	return nil
}

// recountCommand runs "api recount": every voucher's order counters set
// to what its orders say, and the vouchers whose counters were wrong
// printed. It needs the database only.
func recountCommand(ctx context.Context, e *cmdEnv) error {
	g, closeDB, err := openDB(ctx, e.cfg, e.log, false)
	if err != nil {
		return err
	}
	defer closeDB()
	fixed, err := order.RecountAll(ctx, g)
	if fixed == nil {
		fixed = []order.Recount{}
	}
	// The vouchers fixed before an error are fixed: they are printed too.
	if perr := printJSON(e.stdout, map[string]any{"recounted": len(fixed), "vouchers": fixed}); err == nil {
		err = perr
	}
	return err
}

// printJSON writes v to w, indented: an operator command's result.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
